"""One module per measurement table. Each exposes ``NAME``, ``TABLE`` (ORM class), ``KEY`` (the
table's unique key columns besides run_id), ``Config`` (its preset block), ``expand(cfg, ctx) ->
list[key dict]`` and ``measure(point, ctx) -> dict`` of value columns (raising on failure; the
runner stores the failure's status). ``collectives`` is multi-process and has its own launcher.
"""

from __future__ import annotations

import importlib
from types import ModuleType

SUITE_NAMES = ("gemm", "grouped_gemm", "sdpa", "router", "elementwise", "vocab", "collectives", "dispatch",
               "allocator")


def get_suite(name: str) -> ModuleType:
    """The suite module by name. Raises SpecError for an unknown suite."""
    from scaleplan.errors import SpecError

    if name not in SUITE_NAMES:
        raise SpecError("--suite", name, ", ".join(SUITE_NAMES))
    return importlib.import_module(f"scaleplan.bench.suites.{name}")
