"""The same run/resume path against PostgreSQL (skipped without SCALEPLAN_TEST_PG_URL)."""

from __future__ import annotations

import pytest
from scaleplan.bench import runner, store
from scaleplan.bench.config import parse_preset
from sqlalchemy import func, select

from scaleplan.db import models as m
from scaleplan.db.session import session_scope, upgrade

from .conftest import TINY_SUITES, tiny_preset

pytestmark = pytest.mark.postgres


def test_run_and_resume_on_postgres(pg_url):
    upgrade(pg_url)
    suites = {k: TINY_SUITES[k] for k in ("gemm", "sdpa", "dispatch")}
    res = runner.run_preset(parse_preset(tiny_preset(suites)), pg_url, device="cpu")
    assert all(r.status == "complete" and r.by_status == {"OK": r.points} for r in res)
    again = runner.resume_runs([r.run_id for r in res], pg_url)
    assert [(a.measured, a.already_stored) for a in again] == [(0, r.points) for r in res]
    with session_scope(pg_url) as s:
        for r in res:
            table = m.MEASUREMENT_TABLES[r.suite]
            assert (
                s.scalar(select(func.count()).select_from(table).where(table.run_id == r.run_id)) == r.points
            )
    listed = {x["id"]: x for x in store.list_runs(pg_url)}
    assert all(listed[r.run_id]["status"] == "complete" for r in res)
