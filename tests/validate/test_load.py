"""The loaded-machine rule of scaleplan.validate.load, with the quantities given."""
from __future__ import annotations

import pytest

from scaleplan.validate.load import LOADAVG_MAX_PER_CPU, OTHERS_SHARE_MAX, assess, machine_busy_s


def _assess(**over):
    kw = {"cpus": 2, "threads": 1, "world_size": 1, "loadavg_before": 0.2, "loadavg_after": 1.1, "wall_s": 10.0,
          "own_cpu_s": 9.5, "machine_busy_s": 10.0}
    return assess(**{**kw, **over})


def test_quiet_machine_is_not_loaded():
    r = _assess()
    assert not r.loaded and r.warning is None
    assert r.others_cpu_s == pytest.approx(0.5) and r.others_share == pytest.approx(0.5 / 20)
    assert r.own_util == pytest.approx(0.95)


def test_other_processes_taking_cpu_during_the_steps_is_loaded():
    # others took 6 of the 20 CPU-seconds the 2 CPUs had during 10 s: 30% > 15%
    r = _assess(machine_busy_s=15.5)
    assert r.others_share == pytest.approx(0.3) and r.others_share > OTHERS_SHARE_MAX
    assert r.loaded and "30%" in r.warning and "timings absorb" in r.warning


def test_high_load_average_before_is_loaded_even_without_proc_stat():
    r = _assess(loadavg_before=LOADAVG_MAX_PER_CPU * 2 + 0.5, machine_busy_s=None)
    assert r.loaded and r.others_share is None and "load average 1.50" in r.warning


def test_dp_processes_count_as_own_cpu():
    r = _assess(world_size=2, own_cpu_s=19.0, machine_busy_s=19.5)
    assert not r.loaded and r.own_util == pytest.approx(0.95)


def test_proc_stat_is_monotone_where_present():
    a = machine_busy_s()
    if a is None:
        pytest.skip("no /proc/stat")
    sum(i * i for i in range(200_000))
    assert machine_busy_s() >= a
