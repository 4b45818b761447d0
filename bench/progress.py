"""Progress of a benchmark sweep: the bar (:func:`scaleplan.progress.make_bar`) on stderr, and the line
protocol by which collectives ranks started by ``bench run`` report their progress to the parent process.

Only one process draws: the ``bench`` command itself, or rank 0 under a user's torchrun. A rank
launched by ``bench run`` (``--managed``) prints ``PROGRESS_TAG {"done": i, "total": n}`` lines on
stdout instead, which the parent turns into ``suite_progress`` events for its own bar.
"""
from __future__ import annotations

import json
import sys
from typing import Any

from scaleplan.progress import make_bar

PROGRESS_TAG = "SCALEPLAN_PROGRESS "


def progress_line(done: int, total: int) -> str:
    return PROGRESS_TAG + json.dumps({"done": int(done), "total": int(total)})


def parse_progress(line: str) -> tuple[int, int] | None:
    """(done, total) from a :func:`progress_line`, else None."""
    if not line.startswith(PROGRESS_TAG):
        return None
    try:
        d: dict[str, Any] = json.loads(line[len(PROGRESS_TAG):])
        return int(d["done"]), int(d["total"])
    except (ValueError, KeyError, TypeError):
        return None


class RankProgress:
    """Rank 0's progress through a distributed sweep of ``total`` points: a bar on stderr when the
    user started torchrun, progress lines on stdout when ``bench run`` launched the ranks
    (``managed``), nothing on the other ranks."""

    def __init__(self, rank: int, total: int, managed: bool, description: str = "collectives"):
        self.total, self.done = total, 0
        self.mode = "none" if rank != 0 else ("lines" if managed else "bar")
        self._bar = None
        if self.mode == "bar":
            self._bar = make_bar()
            self._bar.start()
            self._task = self._bar.add_task(description, total=total)

    def advance(self) -> None:
        self.done += 1
        if self.mode == "bar":
            self._bar.advance(self._task)
        elif self.mode == "lines":
            print(progress_line(self.done, self.total), flush=True, file=sys.stdout)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
