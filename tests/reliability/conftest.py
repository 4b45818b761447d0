"""Fixtures for the reliability tests: a database per dialect, and a figures log for the report.

``SCALEPLAN_RELIABILITY_FIGURES=path.json`` makes the tests write what they exercised (writers x
rows, crash trials, migrations, fuzz examples, rows lost) so ``benchmarks/reliability_report.py``
prints figures taken from a real run rather than typed in.
"""
from __future__ import annotations

import contextlib
import io
import json
import os

import pytest


def _record(key: str, n: int = 1) -> None:
    """Append ``{key: n}`` as one JSON line to $SCALEPLAN_RELIABILITY_FIGURES (no-op when unset)."""
    path = os.environ.get("SCALEPLAN_RELIABILITY_FIGURES")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({key: n}) + "\n")


@pytest.fixture(scope="session")
def record():
    """``record(key, n)`` adds n to a figure of the reliability report."""
    return _record


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def any_db(request, tmp_path) -> str:
    """An empty database of each dialect (not migrated): a SQLite file, or the test PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'rel.db'}"
    return request.getfixturevalue("pg_url")



def _fresh_pg() -> str | None:
    """The test PostgreSQL database with its public schema dropped and re-created; None when none."""
    from sqlalchemy import create_engine, text

    from scaleplan.db import session as dbs

    url = os.environ.get("SCALEPLAN_TEST_PG_URL")
    if not url:
        return None
    try:
        eng = create_engine(url)
        with eng.begin() as c:
            c.execute(text("DROP SCHEMA public CASCADE"))
            c.execute(text("CREATE SCHEMA public"))
        eng.dispose()
    except Exception:
        return None
    dbs.get_engine.cache_clear()
    return url


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def migrated_db(request, tmp_path_factory) -> str:
    """A database of each dialect migrated to head, shared by one test module (tests use their own runs)."""
    from scaleplan.db import session as dbs

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('rel') / 'rel.db'}"
    else:
        url = _fresh_pg()
        if url is None:
            pytest.skip("no PostgreSQL server (set SCALEPLAN_TEST_PG_URL)")
    dbs.upgrade(url)
    return url


def run_cli(*argv: str) -> tuple[int, str, str]:
    """The CLI in-process (``scaleplan.cli.main``): (exit status, stdout, stderr).

    Output is caught by swapping sys.stdout/sys.stderr, which the rich consoles and typer.echo
    look up at print time, so this works inside hypothesis tests (no function-scoped capsys).
    """
    from scaleplan.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="session")
def cli():
    return run_cli
