"""``python -m scaleplan ARGS`` = ``scaleplan ARGS``; the form torchrun starts on every rank of a
multi-node collectives sweep (``torchrun ... -m scaleplan bench run --suite collectives ...``)."""

from scaleplan.console import main

if __name__ == "__main__":
    main()
