"""The one progress bar of every command: a rich bar with ETA on stderr.

A neutral module (it imports nothing of scaleplan): library code (the MOSAIC plan search, the benchmark
sweeps) and the CLI both draw through it, so no library module needs the CLI to show progress.
"""
from __future__ import annotations


def make_bar(console=None, disable: bool = False, **kw):
    """A rich Progress (description, bar, done/total, elapsed, ETA) on ``console`` (default: stderr);
    ``kw`` go to rich's Progress (e.g. ``transient``)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=console or Console(stderr=True),
                    disable=disable, **kw)


def transient_bar(disable: bool = False, console=None):
    """A :func:`make_bar` that disappears when done: for work of a few seconds inside a command."""
    return make_bar(console=console, disable=disable, transient=True)
