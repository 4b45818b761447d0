"""``python -m scaleplan.bench ARGS`` = ``scaleplan bench ARGS`` (handy under torchrun: ``torchrun ... -m
scaleplan.bench run --suite collectives ...``)."""

import sys

from scaleplan.cli import main

if __name__ == "__main__":
    main(["bench", *sys.argv[1:]])
