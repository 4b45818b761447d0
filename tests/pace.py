"""Time budgets scaled to this machine: a hang guard or a "refused at once" bound is a quiet-machine
budget times how much slower a fixed reference workload runs here and now than on a quiet machine.

A busy or slow machine (other processes on the cores, a slower CPU) stretches the reference as
much as it stretches the test's own work, so a budget never fails because of the machine, only
because the code under test got slower relative to plain Python and numpy.
"""
from __future__ import annotations

import functools
import time

import numpy as np

# wall seconds of one reference() on an idle 2-core x86 machine (the CI runner class), measured
# as the least of three runs; only the ratio to it is used
QUIET_REFERENCE_S = 0.025


def reference() -> float:
    """A fixed mix of interpreter work and small numpy kernels (about QUIET_REFERENCE_S when idle)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((128, 128))
    acc = 0
    for i in range(150_000):
        acc += (i * 7) % 13
    for _ in range(40):
        a = np.tanh(a @ a.T / 128)
    return acc + float(np.sort(rng.standard_normal(100_000))[0] + a[0, 0])


def _reference_s(repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        reference()
        best = min(best, time.perf_counter() - t0)
    return best


@functools.lru_cache(maxsize=1)
def slowdown() -> float:
    """How many times slower than a quiet machine this one runs now (>= 1; measured once a process)."""
    return max(1.0, _reference_s() / QUIET_REFERENCE_S)


def budget(quiet_s: float) -> float:
    """``quiet_s`` (a budget that holds on a quiet 2-core machine) scaled to this machine's pace."""
    return quiet_s * slowdown()
