"""The ``scaleplan`` console script (and ``python -m scaleplan``): the process ends with the command, so the
cyclic garbage collector is tuned for a short-lived process before anything is imported.

A command allocates its objects (the imported modules', the estimator's arrays and records) and frees them
by reference count; at Python's default thresholds (a young-generation pass every 700 allocations) the
collector ran over a hundred times a command, each pass over every young object and the older generations'
passes over the imported modules' objects. At :data:`GC_THRESHOLDS` it runs a few times. Unreachable cycles
are still collected, later; in-process callers of :func:`scaleplan.cli.main` (tests) keep their own settings.
"""
from __future__ import annotations

import gc

#: gc.set_threshold's for a console command: allocations between two young-generation passes, and young
#: (middle) passes between two middle (old) ones (Python's: 700, 10, 10)
GC_THRESHOLDS = (200_000, 50, 1000)


def main() -> None:
    """Tune the collector, then run the CLI (:func:`scaleplan.cli.main`) on ``sys.argv``."""
    gc.set_threshold(*GC_THRESHOLDS)
    from scaleplan.cli import main as cli_main

    cli_main()
