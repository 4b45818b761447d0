"""Migrations keep data: from every revision (with rows in every table) up to head and back.

Parametrised over the revisions in db_migrations (alembic ScriptDirectory), so a new revision is
covered without editing this file. Rows are written at each revision's own schema through
SQLAlchemy Core reflection (not the current ORM models), with values derived from the reflected
column types; after ``upgrade head`` and after ``downgrade`` back to the revision, every row of
every table that exists in both schemas is still there, value for value.
"""
from __future__ import annotations

import datetime as dt

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import JSON, Boolean, DateTime, Float, Integer, MetaData, String, inspect, select

from scaleplan.db import session as dbs

ROWS_PER_TABLE = 3
T0 = dt.datetime(2026, 1, 2, 3, 4, 5)


def _revisions() -> list[str]:
    script = ScriptDirectory.from_config(dbs.alembic_config("sqlite://"))
    return [r.revision for r in script.walk_revisions()][::-1]  # base-most first


def _value(col, i: int, table: str):
    """A value for column ``col`` of row ``i`` that meets the schema's CHECKs (sizes > 0, known status)."""
    t = col.type
    if col.name == "status":
        return "complete" if table == "bench_run" else ("OK", "OOM", "OK")[i % 3]
    if isinstance(t, Boolean):
        return bool(i % 2)
    if isinstance(t, Integer):
        return 2 + i
    if isinstance(t, Float):
        return 0.25 + 0.125 * i  # > 0, < 1 (fractions such as s) and finite
    if isinstance(t, DateTime):
        return T0 + dt.timedelta(minutes=i)
    if isinstance(t, JSON):
        return {"row": i, "col": col.name}
    if isinstance(t, String):
        s = f"{col.name}-{i}"
        return s[: t.length] if t.length else s
    return f"{col.name}-{i}"


def _fill(url: str) -> dict[str, list[dict]]:
    """Insert ROWS_PER_TABLE rows into every table of the current schema (parents first)."""
    eng = dbs.get_engine(url)
    md = MetaData()
    md.reflect(eng)
    written: dict[str, list[dict]] = {}
    with eng.begin() as c:
        for t in md.sorted_tables:
            if t.name == "alembic_version":
                continue
            rows = []
            for i in range(ROWS_PER_TABLE):
                row = {}
                for col in t.columns:
                    fk = next(iter(col.foreign_keys), None)
                    if col.primary_key:
                        row[col.name] = 100 + i
                    elif fk is not None:
                        row[col.name] = 100 + i % ROWS_PER_TABLE  # parents use the same ids
                    elif col.name == "status" and i % 3 == 1 and t.name != "bench_run":
                        row[col.name] = "OOM"
                    else:
                        row[col.name] = _value(col, i, t.name)
                rows.append(row)
            c.execute(t.insert(), rows)
            written[t.name] = rows
    return written


def _snapshot(url: str, tables: list[str]) -> dict[str, dict[int, dict]]:
    eng = dbs.get_engine(url)
    md = MetaData()
    md.reflect(eng, only=[t for t in tables if t in inspect(eng).get_table_names()])
    with eng.connect() as c:
        return {t.name: {r._mapping["id"]: dict(r._mapping) for r in c.execute(select(t))} for t in md.sorted_tables}


def _same(before: dict, after: dict) -> None:
    """Every table and row of ``before`` is in ``after`` with equal values on the shared columns."""
    for name, rows in before.items():
        assert name in after, f"table {name} lost"
        assert set(after[name]) == set(rows), f"{name}: rows {set(rows) - set(after[name])} lost"
        for pk, row in rows.items():
            for col, v in row.items():
                if col in after[name][pk]:
                    assert after[name][pk][col] == v, (name, pk, col)


@pytest.mark.parametrize("revision", _revisions())
def test_upgrade_from_revision_with_data_and_back(any_db, revision, record):
    url = any_db
    dbs.upgrade(url, revision)
    written = _fill(url)
    assert written and all(len(r) == ROWS_PER_TABLE for r in written.values())
    before = _snapshot(url, list(written))
    assert sum(len(r) for r in before.values()) == ROWS_PER_TABLE * len(written)
    dbs.upgrade(url, "head")
    after_up = _snapshot(url, list(written))
    _same(before, after_up)
    dbs.downgrade(url, revision)
    _same(before, _snapshot(url, list(written)))
    dbs.upgrade(url, "head")
    _same(before, _snapshot(url, list(written)))
    record("migrations_checked")
    record("migration_rows_checked", sum(len(r) for r in before.values()))
    record("rows_lost", 0)


def test_round_trip_base_head_gives_the_same_schema(any_db, record):
    url = any_db
    dbs.upgrade(url, "head")
    eng = dbs.get_engine(url)

    def schema():
        insp = inspect(eng)
        return {t: sorted((c["name"], str(c["type"]), c["nullable"]) for c in insp.get_columns(t))
                for t in insp.get_table_names()}

    first = schema()
    dbs.downgrade(url, "base")
    assert set(inspect(eng).get_table_names()) <= {"alembic_version"}
    dbs.upgrade(url, "head")
    assert schema() == first
    assert dbs.current_revision(url) == dbs.head_revision()
    record("migrations_checked")
