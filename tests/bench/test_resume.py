"""A run killed mid-sweep (SIGKILL) and resumed ends with exactly the points of an uninterrupted
run, none duplicated; SIGTERM marks the run interrupted."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import yaml
from pace import budget
from scaleplan.bench import runner, store
from scaleplan.bench.config import parse_preset
from sqlalchemy import func, select, text
from typer.testing import CliRunner

from scaleplan import cli
from scaleplan.db import models as m
from scaleplan.db.session import session_scope

from .conftest import tiny_preset

# 96 small points of 10-40 ms each (many repetitions, capped by the per-point budget), so a
# signal sent after the first few lands mid-sweep
GRID = {
    "gemm": {
        "dtypes": ["fp32", "bf16"],
        "m": [2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24],
        "n": [64, 128],
        "k": [64, 128],
    }
}
N_POINTS = 96
SLOW = {"warmup": 1, "reps": 2000, "min_reps": 2, "max_time_s": 0.04}


def _preset_file(tmp_path):
    p = tmp_path / "grid.yaml"
    p.write_text(yaml.safe_dump(tiny_preset(GRID, timing=SLOW)))
    return p


def _cli(*args):
    return [sys.executable, "-m", "scaleplan", "bench", *args]


def _count(url) -> int:
    with session_scope(url) as s:
        return s.scalar(select(func.count()).select_from(m.GemmPoint))


def _start_and_signal(url, preset, sig, after_points: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        _cli("run", "--preset", str(preset), "--db", url, "--device", "cpu"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + budget(60)
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if _count(url) >= after_points:
                break
        except Exception:  # the schema may not exist yet
            pass
        time.sleep(0.02)
    assert proc.poll() is None, "the sweep finished before it could be interrupted"
    proc.send_signal(sig)
    proc.wait(timeout=budget(60))
    return proc


def _keys(url, run_id):
    with session_scope(url) as s:
        return [
            (r.m, r.n, r.k, r.dtype)
            for r in s.execute(
                select(m.GemmPoint.m, m.GemmPoint.n, m.GemmPoint.k, m.GemmPoint.dtype).where(
                    m.GemmPoint.run_id == run_id
                )
            )
        ]


def test_sigkill_then_resume_matches_uninterrupted(sqlite_url, tmp_path):
    preset = _preset_file(tmp_path)
    proc = _start_and_signal(sqlite_url, preset, signal.SIGKILL, after_points=3)
    assert proc.returncode == -signal.SIGKILL
    with session_scope(sqlite_url) as s:
        run = s.scalars(select(m.BenchRun)).one()
        run_id, status = run.id, run.status
    partial = _count(sqlite_url)
    with session_scope(sqlite_url) as s:
        digest = s.get(m.BenchRun, run_id).config_hash
    assert store.unfinished_runs(sqlite_url, digest) == [run_id]  # what `bench run` points the user at
    assert status == "running" and 3 <= partial < N_POINTS

    res = CliRunner().invoke(cli.app, ["bench", "run", "--resume", str(run_id), "--db", sqlite_url, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)["runs"][0]
    assert out["already_stored"] == partial and out["measured"] == N_POINTS - partial

    resumed = _keys(sqlite_url, run_id)
    full = runner.run_preset(
        parse_preset(tiny_preset(GRID, timing={"warmup": 0, "reps": 1, "min_reps": 1})),
        sqlite_url,
        device="cpu",
    )[0]
    assert len(resumed) == len(set(resumed)) == N_POINTS
    assert set(resumed) == set(_keys(sqlite_url, full.run_id))
    with session_scope(sqlite_url) as s:
        assert s.get(m.BenchRun, run_id).status == "complete"
    assert store.unfinished_runs(sqlite_url, digest) == []
    again = runner.resume_runs([run_id], sqlite_url)[0]  # measures nothing, adds nothing
    assert (again.measured, again.already_stored) == (0, N_POINTS)
    with session_scope(sqlite_url) as s:
        dup = s.execute(
            text(
                "SELECT count(*) FROM (SELECT run_id, m, n, k, dtype FROM gemm_point "
                "GROUP BY run_id, m, n, k, dtype HAVING count(*) > 1)"
            )
        ).scalar()
    assert dup == 0


def test_sigterm_marks_interrupted(sqlite_url, tmp_path):
    proc = _start_and_signal(sqlite_url, _preset_file(tmp_path), signal.SIGTERM, after_points=2)
    assert proc.returncode == 130
    with session_scope(sqlite_url) as s:
        run = s.scalars(select(m.BenchRun)).one()
        assert run.status == "interrupted" and run.ended_at is not None


def test_a_stop_signal_during_a_write_is_held_until_it_commits():
    """The handler raises at once outside a write, and only after the write inside one."""
    import pytest

    with pytest.raises(KeyboardInterrupt):
        runner.SigtermAsInterrupt.raise_interrupt(signal.SIGTERM, None)
    done = []
    with pytest.raises(KeyboardInterrupt), store.held_signals():
        runner.SigtermAsInterrupt.raise_interrupt(signal.SIGTERM, None)
        done.append("committed")
    assert done == ["committed"]
    with store.held_signals():  # nothing pending any more
        pass
