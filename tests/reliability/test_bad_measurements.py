"""Bad measurements are refused: in Python (whole batch, one-line error) and by the database itself.

Policy (scaleplan/db/validation.py): a batch with any bad row is rejected atomically; the error
names the table, row index, column and value; nothing of the batch is written, and what was
stored before is untouched. The CHECK constraints refuse NaN/inf/<=0 times again when Python is
bypassed (raw SQLAlchemy Core insert), on SQLite and PostgreSQL.
"""
from __future__ import annotations

import math

import pytest
from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError, StatementError

from scaleplan.db import models as m
from scaleplan.db import session as dbs
from scaleplan.db.importers import insert_points
from scaleplan.db.validation import MeasurementError, validate_rows

BAD_TIMES = [math.nan, math.inf, -math.inf, 0.0, -1e-3]


def _run(url: str, suite: str = "gemm") -> int:
    with dbs.session_scope(url) as s:
        run = m.BenchRun(suite=suite, profile="cpu-local")
        s.add(run)
        s.flush()
        return run.id


def _gemm(run_id: int, i: int, **kw) -> dict:
    return dict(run_id=run_id, m=i + 1, n=8, k=8, dtype="bf16", t_s=1e-5 * (i + 1)) | kw


def _count(url: str, run_id: int, table=m.GemmPoint) -> int:
    with dbs.session_scope(url) as s:
        return s.scalar(select(func.count()).select_from(table).where(table.run_id == run_id))


@pytest.fixture()
def db(migrated_db) -> str:
    return migrated_db


BAD_ROWS = [("t_s", v) for v in BAD_TIMES] + [
    ("t_p90_s", math.nan), ("t_p10_s", 0.0),       # optional times are checked too
    ("flops_per_s", math.inf),                      # any non-finite float
    ("m", -4), ("m", 0), ("m", 2.5), ("m", True), ("m", "64"),  # key columns of the wrong type / sign
    ("m", 2**31), ("n_rep", 2**70),                 # beyond PostgreSQL's 32-bit INTEGER
    ("dtype", None), ("status", "FAST"), ("t_s", None),  # missing key, unknown status, OK without time
    ("tflops", 3.0), ("M", 64),                     # keys that are not columns of gemm_point
]


@pytest.mark.parametrize("column,value", BAD_ROWS, ids=[f"{c}={v!r}" for c, v in BAD_ROWS])
def test_bad_row_rejects_batch_atomically(db, column, value):
    run_id = _run(db)
    with dbs.session_scope(db) as s:  # earlier, good data
        assert insert_points(s, m.GemmPoint, [_gemm(run_id, 100)]) == 1
    batch = [_gemm(run_id, i) for i in range(10)]
    batch[6] = batch[6] | {column: value}
    with pytest.raises(MeasurementError) as ei:
        with dbs.session_scope(db) as s:
            insert_points(s, m.GemmPoint, batch)
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(f"gemm_point row 6: {column}="), msg
    assert (ei.value.index, ei.value.column) == (6, column)
    assert _count(db, run_id) == 1  # nothing of the bad batch landed; the earlier row is still there
    with dbs.session_scope(db) as s:  # the same batch minus the bad row goes in whole
        assert insert_points(s, m.GemmPoint, batch[:6] + batch[7:]) == 9
    assert _count(db, run_id) == 10


def test_not_ok_rows_keep_null_times_and_earlier_batches_survive_a_rejection(db):
    run_id = _run(db)
    rows = [_gemm(run_id, 0, t_s=None, status="OOM", note="out of memory"), _gemm(run_id, 1)]
    with dbs.session_scope(db) as s:
        assert insert_points(s, m.GemmPoint, rows) == 2
    # one transaction, first batch fine, second bad: the transaction rolls back as a whole
    with pytest.raises(MeasurementError):
        with dbs.session_scope(db) as s:
            insert_points(s, m.GemmPoint, [_gemm(run_id, 2)])
            insert_points(s, m.GemmPoint, [_gemm(run_id, 3, t_s=math.nan)])
    assert _count(db, run_id) == 2
    with dbs.session_scope(db) as s:
        st = dict(s.execute(select(m.GemmPoint.m, m.GemmPoint.status).where(m.GemmPoint.run_id == run_id)).all())
    assert st == {1: "OOM", 2: "OK"}


def test_numpy_scalars_become_plain_python():
    np = pytest.importorskip("numpy")
    row = validate_rows(m.GemmPoint, [dict(run_id=np.int64(1), m=np.int32(2), n=2, k=2, dtype="bf16",
                                           t_s=np.float32(1e-3))])[0]
    assert type(row["run_id"]) is int and type(row["m"]) is int and type(row["t_s"]) is float
    with pytest.raises(MeasurementError, match="t_s=nan"):
        validate_rows(m.GemmPoint, [dict(run_id=1, m=2, n=2, k=2, dtype="bf16", t_s=np.float64("nan"))])


@pytest.mark.parametrize("suite", sorted(m.MEASUREMENT_TABLES))
@pytest.mark.parametrize("value", BAD_TIMES, ids=repr)
def test_database_checks_reject_bad_times_without_python(db, suite, value):
    """Raw Core insert (no validation): the CHECK constraints themselves refuse the row."""
    table = m.MEASUREMENT_TABLES[suite]
    run_id = _run(db, suite)
    good = _minimal_row(table, run_id)
    time_col = next(c.name.removesuffix("_present_when_ok") for c in table.__table__.constraints
                    if (c.name or "").endswith("_present_when_ok"))
    eng = dbs.get_engine(db)
    with eng.begin() as c:  # the minimal row is accepted, so the failure below is the time alone
        c.execute(insert(table.__table__), [good])
    with pytest.raises((IntegrityError, StatementError)):
        with eng.begin() as c:
            c.execute(insert(table.__table__), [good | {"note": "bad", time_col: value, **_other_key(table)}])
    assert _count(db, run_id, table) == 1


def _minimal_row(table, run_id: int) -> dict:
    """Every required column of ``table`` filled with a small valid value; the OK time = 1 ms."""
    row = {"run_id": run_id, "status": "OK"}
    for c in table.__table__.columns:
        if c.name in row or c.primary_key or c.nullable or c.default is not None or c.server_default is not None:
            continue
        row[c.name] = {"INTEGER": 4, "BIGINT": 4, "BOOLEAN": True}.get(str(c.type), "x")
    for c in table.__table__.constraints:
        if (c.name or "").endswith("_present_when_ok"):
            row[c.name.removesuffix("_present_when_ok")] = 1e-3
    return row


def _other_key(table) -> dict:
    """Change one integer key column so the bad row does not merely collide with the good one."""
    name = next(c.name for c in table.__table__.columns if str(c.type) == "INTEGER" and not c.nullable
                and c.name not in ("id", "run_id"))
    return {name: 8}
