"""Time budgets scaled to this machine: a hang guard or a "refused at once" bound is a quiet-machine
budget times how much slower this machine runs a test's work here and now than a quiet one does.

Two factors, each at least 1: the CPU's speed (the CPU seconds of a fixed reference workload over
what a quiet CI runner spends on it) and the share of a core a process gets (the 1-minute load
average over the cores: with 8 runnable processes on 2 cores each gets a quarter). A slower CPU or
a busy machine stretches the test's own work by the same factors, so a budget fails only when the
code under test got slower, never because of the machine. The share is a load average, not the
wall time of a short reference: the least of a few 25 ms runs catches a quiet moment, while a
command under test runs for seconds to minutes at the machine's sustained load.
"""
from __future__ import annotations

import os
import time

import numpy as np

# CPU seconds of one reference() on an idle 2-core x86 machine (the CI runner class) with one BLAS
# thread (tests/conftest.py sets OMP_NUM_THREADS=1), the least of three runs; only the ratio is used
QUIET_REFERENCE_S = 0.025
REMEASURE_AFTER_S = 5.0  # the load changes during a session: a budget uses a recent measurement


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


def _reference_cpu_s(repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        reference()
        best = min(best, time.process_time() - t0)
    return best


def core_share_factor() -> float:
    """1 / the share of a core a runnable process gets now: load average (1 min) over cores, >= 1."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


_last: list[float] = []  # [monotonic time of the last measurement, its slowdown]


def slowdown() -> float:
    """How many times longer than on a quiet machine a test's work takes here now (>= 1); measured
    again when the last measurement is older than REMEASURE_AFTER_S."""
    now = time.monotonic()
    if not _last or now - _last[0] > REMEASURE_AFTER_S:
        speed = max(1.0, _reference_cpu_s() / QUIET_REFERENCE_S)
        _last[:] = [now, speed * core_share_factor()]
    return _last[1]


def budget(quiet_s: float) -> float:
    """``quiet_s`` (a budget that holds on a quiet 2-core machine) scaled to this machine's pace."""
    return quiet_s * slowdown()
