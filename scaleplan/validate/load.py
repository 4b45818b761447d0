"""Is the machine quiet enough to trust a measured step time?

A measured step on a CPU absorbs whatever else runs on its cores, so a prediction checked on a busy
machine is judged against the other processes' share as much as against the model. Two signals, both
kept with the figures:

* the 1-minute load average before and after the timed steps (``os.getloadavg``), against the
  CPUs this process may use;
* during the timed steps, the CPU seconds the whole machine spent busy (``/proc/stat``: user,
  nice, system, irq, softirq, steal) minus the CPU seconds of the run's own processes
  (``time.process_time`` of every rank, summed): what other processes took, as a share of the
  machine's capacity over the same wall time (``others_share``); and the run's own CPU seconds
  per wall second and per thread (``own_util``, for a compute-bound step close to 1 on a quiet
  machine, as threads spin or compute).

Rule (documented, tested): the run is *loaded* when others took more than ``OTHERS_SHARE_MAX``
of the machine during the timed steps, or when the load average before the run already exceeded
``LOADAVG_MAX_PER_CPU`` per usable CPU. Where /proc/stat does not exist only the load average
decides.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

OTHERS_SHARE_MAX = 0.15  # other processes' share of the machine's CPU capacity during the timed steps
LOADAVG_MAX_PER_CPU = 0.5  # 1-minute load average per usable CPU before the run


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def loadavg_1m() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def machine_busy_s() -> float | None:
    """CPU seconds all CPUs have spent busy since boot (/proc/stat), None where unavailable."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if first[0] != "cpu":
        return None
    v = [int(x) for x in first[1:]]
    busy = v[0] + v[1] + v[2] + sum(v[5:8])  # user nice system (idle iowait skipped) irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


@dataclass
class LoadReport:
    """What the machine did while the steps were timed; ``loaded`` and ``warning`` by the module's rule."""

    cpus: int
    threads: int
    world_size: int
    loadavg_before: float | None
    loadavg_after: float | None
    wall_s: float
    own_cpu_s: float
    machine_busy_s: float | None
    others_cpu_s: float | None = None
    others_share: float | None = None
    own_util: float | None = None
    loaded: bool = False
    reasons: list[str] = field(default_factory=list)

    @property
    def warning(self) -> str | None:
        return ("machine loaded: " + "; ".join(self.reasons) + " (timings absorb the contention)") if self.loaded else None

    def to_dict(self) -> dict:
        return {**asdict(self), "warning": self.warning}


def assess(*, cpus: int, threads: int, world_size: int, loadavg_before: float | None,
           loadavg_after: float | None, wall_s: float, own_cpu_s: float,
           machine_busy_s: float | None) -> LoadReport:
    """Apply the rule to the measured quantities (seconds; load averages in runnable processes)."""
    r = LoadReport(cpus, threads, world_size, loadavg_before, loadavg_after, wall_s, own_cpu_s, machine_busy_s)
    if wall_s > 0:
        r.own_util = own_cpu_s / (wall_s * threads * world_size)
        if machine_busy_s is not None:
            r.others_cpu_s = max(0.0, machine_busy_s - own_cpu_s)
            r.others_share = r.others_cpu_s / (wall_s * cpus)
            if r.others_share > OTHERS_SHARE_MAX:
                r.reasons.append(f"other processes used {r.others_share:.0%} of the {cpus} CPUs during the timed "
                                 f"steps (> {OTHERS_SHARE_MAX:.0%})")
    if loadavg_before is not None and loadavg_before > LOADAVG_MAX_PER_CPU * cpus:
        r.reasons.append(f"load average {loadavg_before:.2f} before the run on {cpus} CPUs "
                         f"(> {LOADAVG_MAX_PER_CPU} per CPU)")
    r.loaded = bool(r.reasons)
    return r
