"""Crash: ``scaleplan bench run`` killed with SIGKILL at random moments, then ``--resume``.

A tiny CPU GEMM sweep (8 points) runs in a forked child (the CLI in-process, so no interpreter
start per trial) and is SIGKILLed at a random point: after a random number of points is stored
(0..8, plus a random few milliseconds, so kills land inside transactions too), or after a random
delay from the start (before the run row may exist). After each kill the database must be consistent (SQLite
integrity and foreign keys ok, every stored point valid and belonging to its run, the run either
``running`` or ``complete``); ``bench run --resume ID`` (or a fresh run when the kill came before
the run was created) must complete it, and the final point set must equal an uninterrupted run's.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import os
import random
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
runner = pytest.importorskip("scaleplan.bench.runner")  # the bench (and torch) imported before fork

from pace import budget
from scaleplan.cli import main
from scaleplan.db import session as dbs

TRIALS = 20
PRESET = """\
name: rel-crash
description: tiny CPU GEMM sweep for the crash test
timing: {warmup: 1, reps: 3, min_reps: 3, max_time_s: 0.02, flush_l2: false}
mem_fraction: 0.5
suites:
  gemm:
    dtypes: [fp32]
    m: [8, 16]
    n: [8, 16]
    k: [8, 16]
"""


def _cli_child(argv: list[str]) -> None:
    """Child process body: the CLI in-process, output discarded; exit status = the CLI's."""
    dbs.get_engine.cache_clear()  # never reuse a connection inherited from the parent
    fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ["OMP_NUM_THREADS"] = "1"
    main(argv)


def _spawn(argv: list[str]) -> mp.Process:
    p = mp.get_context("fork").Process(target=_cli_child, args=(argv,))
    p.start()
    return p


def _finish(p: mp.Process, timeout: float = 120) -> int:
    p.join(budget(timeout))
    if p.is_alive():
        p.kill()
        p.join()
        raise AssertionError("bench child did not finish in time")
    return p.exitcode


def _state(db: Path) -> tuple[list, dict[int, str]]:
    """Points (key, status, t_s, run_id) and runs {id: status}, checked for consistency."""
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert con.execute("PRAGMA foreign_key_check").fetchall() == []
        runs = dict(con.execute("SELECT id, status FROM bench_run"))
        pts = con.execute("SELECT m, n, k, dtype, status, t_s, run_id FROM gemm_point").fetchall()
    finally:
        con.close()
    assert set(runs.values()) <= {"running", "complete", "interrupted"}, runs
    for m_, n_, k_, dt_, st, t, rid in pts:
        assert rid in runs
        assert st != "OK" or (t is not None and math.isfinite(t) and t > 0), (m_, n_, k_, st, t)
    keys = [p[:4] for p in pts]
    assert len(keys) == len(set(keys)), "a point stored twice"
    return pts, runs


def _wait_for_points(db: Path, n: int, child: mp.Process, timeout_s: float = 60) -> None:
    """Return once ``n`` points are committed (or the child ended)."""
    end = time.monotonic() + budget(timeout_s)
    while child.is_alive() and time.monotonic() < end:
        try:
            con = sqlite3.connect(db, timeout=1)
            try:
                if con.execute("SELECT count(*) FROM gemm_point").fetchone()[0] >= n:
                    return
            finally:
                con.close()
        except sqlite3.OperationalError:
            pass
        time.sleep(0.002)


def _bench(db: Path, preset: Path, *extra: str) -> list[str]:
    # a datasheet profile: cpu-local would time a GEMM at load, longer than this whole sweep
    # (forced with --as-profile: the device is a CPU, not the profile's H200)
    return ["bench", "run", "--preset", str(preset), "--suite", "gemm", "--device", "cpu", "--profile", "h200-single",
            "--as-profile",
            "--db", str(db), "--json", *extra]


def test_sigkill_then_resume_gives_the_uninterrupted_point_set(tmp_path, record):
    preset = tmp_path / "crash.yaml"
    preset.write_text(PRESET)
    template = tmp_path / "template.db"
    dbs.upgrade(f"sqlite:///{template}")
    dbs.get_engine(f"sqlite:///{template}").dispose()

    ref = tmp_path / "ref.db"
    shutil.copy(template, ref)
    t0 = time.perf_counter()
    assert _finish(_spawn(_bench(ref, preset))) == 0
    ref_wall = time.perf_counter() - t0
    ref_pts, ref_runs = _state(ref)
    assert list(ref_runs.values()) == ["complete"] and len(ref_pts) == 8
    ref_keys = {(p[:4], p[4]) for p in ref_pts}

    rng = random.Random(20261121)
    survived, mid_run = 0, 0
    for trial in range(TRIALS):
        db = tmp_path / f"trial{trial}.db"
        shutil.copy(template, db)
        target = rng.randint(-1, len(ref_pts))
        child = _spawn(_bench(db, preset))
        if target < 0:
            time.sleep(rng.uniform(0.0, ref_wall))
        else:
            _wait_for_points(db, target, child)
            time.sleep(rng.uniform(0.0, 0.005))
        child.kill()  # SIGKILL; a child that already ended (and was reaped by is_alive) is no error
        child.join()
        pts, runs = _state(db)  # consistent right after the kill
        mid_run += 0 < len(pts) < len(ref_pts)
        if runs:
            (rid,) = runs
            code = _finish(_spawn(_bench(db, preset, "--resume", str(rid))))
        else:  # killed before the run row was written: nothing to resume, run again
            code = _finish(_spawn(_bench(db, preset)))
        assert code == 0, f"trial {trial}: resume exited {code}"
        pts, runs = _state(db)
        assert list(runs.values()) == ["complete"], (trial, runs)
        assert {(p[:4], p[4]) for p in pts} == ref_keys, trial
        survived += 1
    assert mid_run >= 3, f"only {mid_run} kills landed mid-sweep; the test is not exercising resume"
    record("crash_trials", TRIALS)
    record("crash_trials_survived", survived)
    record("crash_kills_mid_sweep", mid_run)
    record("rows_lost", 0)
