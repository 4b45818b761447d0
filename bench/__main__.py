"""``python -m scaleplan.bench`` moved to ``python -m scaleplan bench`` (the bench layer does not import
the command line, docs/architecture.md); this stub only says so, with exit status 2."""

import sys

if __name__ == "__main__":
    print("error: python -m scaleplan.bench is now python -m scaleplan bench "
          f"(torchrun ... -m scaleplan bench {' '.join(sys.argv[1:])})", file=sys.stderr)
    sys.exit(2)
