"""Collectives with 2 gloo processes on localhost: launched by bench run, and run under torchrun."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pace import budget
from scaleplan.bench import runner
from scaleplan.bench.config import parse_preset
from sqlalchemy import select

from scaleplan.db import models as m
from scaleplan.db.session import session_scope

from .conftest import tiny_preset

SIZES = [256, 4096]
BLOCK = {
    "dtypes": ["fp32"],
    "sizes_bytes": SIZES,
    "layouts": ["contiguous", "strided"],
    "nproc": 2,
    "timeout_s": 90,  # the suite's own hang guard (s), scaled to this machine's pace where the block is used
}


def _block() -> dict:
    return {**BLOCK, "timeout_s": budget(BLOCK["timeout_s"])}


# nccl-tests bus factors at n = 2, written out
FACTOR_N2 = {"all_reduce": 1.0, "reduce_scatter": 0.5, "all_gather": 0.5, "all_to_all": 0.5, "send_recv": 1.0}


def _points(url, run_id):
    with session_scope(url) as s:
        return list(s.scalars(select(m.CollectivePoint).where(m.CollectivePoint.run_id == run_id)))


def _check_rows(rows):
    # world 2: one group of 2 (strided would be the same group, so it is not measured twice)
    assert {(r.collective, r.size_bytes) for r in rows} == {(c, s) for c in FACTOR_N2 for s in SIZES}
    for r in rows:
        assert r.status == "OK", r.note
        assert (r.group_size, r.world_size, r.layout, r.inter_node, r.backend) == (
            2,
            2,
            "contiguous",
            False,
            "gloo",
        )
        assert r.t_p10_s <= r.t_s <= r.t_p90_s
        assert r.algbw_gbps == pytest.approx(r.size_bytes / r.t_s / 1e9)
        assert r.busbw_gbps == pytest.approx(r.algbw_gbps * FACTOR_N2[r.collective])


def test_bench_run_launches_two_gloo_ranks(sqlite_url):
    events = []
    res = runner.run_preset(parse_preset(tiny_preset({"collectives": _block()})), sqlite_url, device="cpu",
                            on_event=lambda kind, info: events.append((kind, info)))
    assert res[0].status == "complete" and res[0].measured == len(FACTOR_N2) * len(SIZES)
    # rank 0 reported each stored point to this process as it went (the bar's ETA comes from these)
    done = [(i["done"], i["total"]) for k, i in events if k == "suite_progress"]
    n = len(FACTOR_N2) * len(SIZES)
    assert done == [(i, n) for i in range(1, n + 1)]
    _check_rows(_points(sqlite_url, res[0].run_id))
    with session_scope(sqlite_url) as s:
        run = s.get(m.BenchRun, res[0].run_id)
        assert (run.status, run.world_size) == ("complete", 2)


def test_bench_run_under_torchrun(sqlite_url, tmp_path):
    import yaml

    preset = tmp_path / "p.yaml"
    preset.write_text(yaml.safe_dump(tiny_preset({"collectives": _block()})))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "scaleplan",
        "bench",
        "run",
        "--preset",
        str(preset),
        "--suite",
        "collectives",
        "--db",
        sqlite_url,
        "--device",
        "cpu",
        "--json",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=budget(120), env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    # the current collectives API: no FutureWarning per call (reduce_scatter_tensor, all_gather_into_tensor)
    assert "FutureWarning" not in p.stderr and "deprecated" not in p.stderr, p.stderr[-2000:]
    # one progress bar, drawn by rank 0 only (its final frame: the other rank draws nothing)
    n = len(FACTOR_N2) * len(SIZES)
    assert p.stderr.count(f"{n}/{n}") == 1 and "ETA" in p.stderr, p.stderr[-2000:]
    with session_scope(sqlite_url) as s:
        runs = list(s.scalars(select(m.BenchRun)))
    assert len(runs) == 1 and runs[0].status == "complete" and runs[0].world_size == 2  # rank 0 alone wrote
    _check_rows(_points(sqlite_url, runs[0].id))
