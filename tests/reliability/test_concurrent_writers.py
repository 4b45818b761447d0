"""Concurrent writers: 8 processes x 2,000 GEMM points into one database at once (SQLite file, PostgreSQL).

Each writer goes through the bench's code path (``insert_points`` in small transactions, each
wrapped in ``with_retry``). Besides its own 2,000 points every writer also re-writes the same 200
shared points in its own shuffled order, so the unique key and ON CONFLICT DO NOTHING are exercised
under contention (and PostgreSQL can deadlock on the unique index, which must be retried).
Checked: every point present exactly once, no error reached any writer, SQLite integrity_check ok.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import random
import traceback

from sqlalchemy import func, select, text

from pace import budget
from scaleplan.db import models as m
from scaleplan.db import session as dbs
from scaleplan.db.importers import insert_points

WRITERS = 8
ROWS = 2000
SHARED = 200
BATCH = 25
TIMEOUT_S = 240


def _point(run_id: int, mm: int, nn: int) -> dict:
    # t_s is a function of the key, so a duplicate write carries identical values
    return dict(run_id=run_id, m=mm, n=nn, k=64, dtype="bf16", t_s=1e-6 * (mm + nn), backend="torch")


def _writer(url: str, run_id: int, w: int, barrier, out) -> None:
    """One writer process: its own points (m = w+1) and the shared ones (m = 10_000), in batches."""
    try:
        dbs.get_engine.cache_clear()  # never reuse a connection inherited from the parent
        rows = [_point(run_id, w + 1, i + 1) for i in range(ROWS)]
        shared = [_point(run_id, 10_000, i + 1) for i in range(SHARED)]
        random.Random(w).shuffle(shared)
        rows += shared
        random.Random(100 + w).shuffle(rows)
        attempts = [0]

        def write(batch):
            def txn():
                attempts[0] += 1
                with dbs.session_scope(url) as s:
                    return insert_points(s, m.GemmPoint, batch)
            return dbs.with_retry(txn)

        barrier.wait(timeout=budget(60))
        inserted = sum(write(rows[i:i + BATCH]) for i in range(0, len(rows), BATCH))
        out.put((w, inserted, attempts[0] - math.ceil(len(rows) / BATCH), None))
    except BaseException:  # report everything: a failure must reach the test, not vanish
        out.put((w, 0, 0, traceback.format_exc().strip().splitlines()[-1]))


def _run_writers(url: str) -> tuple[int, int, list]:
    dbs.upgrade(url)
    with dbs.session_scope(url) as s:
        run = m.BenchRun(suite="gemm", profile="cpu-local", source="measured", status="running")
        s.add(run)
        s.flush()
        run_id = run.id
    dbs.get_engine(url).dispose()
    dbs.get_engine.cache_clear()
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(WRITERS), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(url, run_id, w, barrier, out)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    results = [out.get(timeout=budget(TIMEOUT_S)) for _ in procs]
    for p in procs:
        p.join(timeout=budget(30))
    return run_id, sum(r[1] for r in results), results


def test_concurrent_writers_every_row_exactly_once(any_db, record):
    url = any_db
    run_id, inserted, results = _run_writers(url)
    errors = [r[3] for r in results if r[3]]
    assert not errors, errors
    expected = WRITERS * ROWS + SHARED
    assert inserted == expected  # RETURNING counted each point once across all writers
    with dbs.session_scope(url) as s:
        n = s.scalar(select(func.count()).select_from(m.GemmPoint).where(m.GemmPoint.run_id == run_id))
        distinct = s.execute(select(m.GemmPoint.m, m.GemmPoint.n).distinct()).all()
        per_writer = dict(s.execute(select(m.GemmPoint.m, func.count()).group_by(m.GemmPoint.m)).all())
        bad_t = s.scalar(select(func.count()).select_from(m.GemmPoint)
                         .where(func.abs(m.GemmPoint.t_s - 1e-6 * (m.GemmPoint.m + m.GemmPoint.n)) > 1e-15))
    assert n == expected and len(distinct) == expected
    assert per_writer == {**{w + 1: ROWS for w in range(WRITERS)}, 10_000: SHARED}
    assert bad_t == 0
    if url.startswith("sqlite"):
        with dbs.get_engine(url).connect() as c:
            assert c.execute(text("PRAGMA integrity_check")).scalar() == "ok"
    record(f"writers_{url.split(':')[0].split('+')[0]}", WRITERS)
    record(f"rows_held_{url.split(':')[0].split('+')[0]}", n)
    record("rows_lost", expected - n)
    record("writer_retries", sum(r[2] for r in results))
