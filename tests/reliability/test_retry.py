"""``with_retry``: transient lock errors are retried with backoff, others surface at once.

The real-lock case shrinks SQLite's busy timeout to 50 ms and holds an exclusive lock from another
connection for longer than that: a bare write fails with "database is locked", the same write
inside ``with_retry`` waits it out and lands exactly once.
"""
from __future__ import annotations

import sqlite3
import threading

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from scaleplan.db import models as m
from scaleplan.db import session as dbs
from scaleplan.db.importers import insert_points


def _op_error(msg: str) -> OperationalError:
    return OperationalError("INSERT ...", {}, sqlite3.OperationalError(msg))


def _flaky(fail_with: list[str], result=7):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= len(fail_with):
            raise _op_error(fail_with[len(calls) - 1])
        return result
    return fn, calls


@pytest.mark.parametrize("msg", ["database is locked", "database table is locked",
                                 "could not serialize access due to concurrent update", "deadlock detected"])
def test_transient_errors_are_retried(msg):
    fn, calls = _flaky([msg, msg])
    assert dbs.with_retry(fn, base_delay_s=0.001) == 7
    assert len(calls) == 3


def test_other_errors_surface_immediately():
    fn, calls = _flaky(["no such table: gemm_point"])
    with pytest.raises(OperationalError, match="no such table"):
        dbs.with_retry(fn, base_delay_s=0.001)
    assert len(calls) == 1


def test_retries_are_bounded():
    fn, calls = _flaky(["database is locked"] * 10)
    with pytest.raises(OperationalError, match="locked"):
        dbs.with_retry(fn, attempts=4, base_delay_s=0.001)
    assert len(calls) == 4


def test_real_lock_held_past_the_busy_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(dbs, "SQLITE_BUSY_TIMEOUT_MS", 50)
    url = f"sqlite:///{tmp_path / 'locked.db'}"
    dbs.get_engine.cache_clear()
    dbs.upgrade(url)
    with dbs.session_scope(url) as s:
        run = m.BenchRun(suite="gemm", profile="cpu-local")
        s.add(run)
        s.flush()
        run_id = run.id
    row = {"run_id": run_id, "m": 1, "n": 1, "k": 1, "dtype": "fp32", "t_s": 1e-6}

    def write():
        with dbs.session_scope(url) as s:
            return insert_points(s, m.GemmPoint, [row])

    holder = sqlite3.connect(tmp_path / "locked.db", isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    with pytest.raises(OperationalError, match="locked"):
        write()  # without retry the user would see this
    release = threading.Timer(0.4, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        assert dbs.with_retry(write, attempts=10, base_delay_s=0.05) == 1
    finally:
        release.join()
        holder.close()
    with dbs.session_scope(url) as s:
        assert s.scalar(select(func.count()).select_from(m.GemmPoint)) == 1
    dbs.get_engine.cache_clear()
