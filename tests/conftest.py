"""Shared fixtures: the recorded tables from ../shared (read at test time, never copied) and databases."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SCALEPLAN_SHARED", REPO.parent / "shared"))
RECORDED = SHARED / "recorded" / "dmlc-scaleplan"
VALIDATION = SHARED / "validation"
PAPER = SHARED / "paper"  # the paper's LaTeX source: ../shared/paper/mosaic.tex

# OpenMP threads that sleep when idle, and one of them where a command does not choose, in this process
# and every process it starts (libgomp and torch read these once, at their first import, which comes
# after this file). On a shared 2-core machine, spinning OpenMP threads wait at every tiny op's barrier
# for a thread whose core another process holds: a 8x64x64 matmul took 12 ms instead of 30 us, a bench
# probe minutes instead of seconds, and the tests' CPU time grew with the machine's load. The tests
# check values, not parallel speed; commands that set their threads (validate's cores / nproc) keep
# them. A value the caller exported wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """The compiled-table and ridge-sample caches ($SCALEPLAN_CACHE) of this test session in its own
    temporary folder, for the session's processes and their children: a run neither reads what an
    earlier run or the user left in ~/.cache/scaleplan nor leaves hundreds of files there."""
    prev = os.environ.get("SCALEPLAN_CACHE")
    os.environ["SCALEPLAN_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if prev is None:
        os.environ.pop("SCALEPLAN_CACHE", None)
    else:
        os.environ["SCALEPLAN_CACHE"] = prev


@pytest.fixture(scope="session")
def recorded_dir() -> Path:
    if not RECORDED.is_dir():
        pytest.skip(f"recorded tables not found at {RECORDED}")
    return RECORDED


@pytest.fixture(scope="session")
def validation_dir() -> Path:
    if not VALIDATION.is_dir():
        pytest.skip(f"validation data not found at {VALIDATION}")
    return VALIDATION


@pytest.fixture(scope="session")
def paper_tex() -> str:
    """The paper's LaTeX source (the specification), for tests that read its printed tables."""
    tex = sorted(PAPER.glob("*.tex")) if PAPER.is_dir() else []
    if len(tex) != 1:
        pytest.skip(f"the paper's source (one .tex file) not found in {PAPER}")
    return tex[0].read_text()


@pytest.fixture(scope="session")
def validation_counts(validation_dir) -> dict[str, int]:
    """Rows per sweep of shared/validation/mfu_sweeps.csv in file order, read with the csv module (not the
    code under test): the published file grows as sweeps are added."""
    import csv

    counts: dict[str, int] = {}
    with open(validation_dir / "mfu_sweeps.csv", newline="") as f:
        for row in csv.DictReader(f):
            counts[row["sweep"]] = counts.get(row["sweep"], 0) + 1
    return counts


@pytest.fixture(scope="session")
def recorded_db(tmp_path_factory, recorded_dir) -> str:
    """An SQLite URL with ../shared/recorded/dmlc-scaleplan imported (once per test session)."""
    from scaleplan.db import session as dbs
    from scaleplan.db.importers import import_scaleplan_dir

    url = f"sqlite:///{tmp_path_factory.mktemp('recorded') / 'recorded.db'}"
    dbs.upgrade(url)
    with dbs.session_scope(url) as s:
        import_scaleplan_dir(s, recorded_dir)
    return url


@pytest.fixture(scope="session")
def recorded_holdouts(recorded_db):
    """holdouts(name, peak) -> ``estimator.holdout.<name>(frames, peak)`` ("all_holdouts",
    "depth_holdouts") on the recorded B200 tables, computed once per session and peak (several
    seconds each): the composition tests and the search's evidence check read the same hold-outs."""
    from scaleplan.db.measurements import load_frames
    from scaleplan.estimator import holdout

    frames = load_frames(recorded_db, "p6-b200.48xlarge")
    memo: dict = {}

    def holdouts(name: str, peak: float):
        if (name, peak) not in memo:
            memo[name, peak] = getattr(holdout, name)(frames, peak)
        return memo[name, peak]

    return holdouts


@pytest.fixture(scope="session")
def runtime_fitted_db(tmp_path_factory, recorded_db, validation_dir) -> tuple[str, dict]:
    """(SQLite URL, fit_runtime's result): a copy of recorded_db with the validation sweeps added as
    observed runs and the runtime calibration fitted and stored (once per test session: the fit takes
    ~10 s). Tests only read it; one that writes makes its own copy."""
    import sqlite3

    from scaleplan.calibrate.observations import add_runs
    from scaleplan.calibrate.runner import fit_runtime

    path = tmp_path_factory.mktemp("fitted") / "fitted.db"
    src, dst = sqlite3.connect(recorded_db.removeprefix("sqlite:///")), sqlite3.connect(str(path))
    with dst:
        src.backup(dst)  # WAL-safe copy
    src.close()
    dst.close()
    url = f"sqlite:///{path}"
    add_runs(url, validation_dir / "mfu_sweeps.csv", validation_dir / "models.yaml")
    return url, fit_runtime(url)


@pytest.fixture()
def sqlite_url(tmp_path) -> str:
    """A fresh, migrated SQLite database."""
    from scaleplan.db import session as dbs

    url = f"sqlite:///{tmp_path / 'test.db'}"
    dbs.upgrade(url)
    return url


def _pg_url() -> str | None:
    url = os.environ.get("SCALEPLAN_TEST_PG_URL")
    if not url:
        return None
    try:
        from sqlalchemy import create_engine, text

        with create_engine(url).connect() as c:
            c.execute(text("select 1"))
    except Exception:
        return None
    return url


@pytest.fixture()
def pg_url() -> str:
    """A clean PostgreSQL database (schema dropped and re-created), or skip when no server is configured."""
    url = _pg_url()
    if url is None:
        pytest.skip("no PostgreSQL server (set SCALEPLAN_TEST_PG_URL)")
    from sqlalchemy import create_engine, text

    eng = create_engine(url)
    with eng.begin() as c:
        c.execute(text("DROP SCHEMA public CASCADE"))
        c.execute(text("CREATE SCHEMA public"))
    eng.dispose()
    from scaleplan.db import session as dbs

    dbs.get_engine.cache_clear()
    return url
