"""Compiled tables cached on disk per SQLite database state (estimator/table_build.py: cached_tables)."""
import sqlite3

import pytest
from scaleplan.estimator import table_build as T

from scaleplan.db import session as dbs


@pytest.fixture()
def db(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEPLAN_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "t.db"
    url = f"sqlite:///{path}"
    dbs.upgrade(url)
    return url, path


def test_second_command_reads_the_cache_and_a_write_invalidates_it(db, monkeypatch):
    url, path = db
    build = T.cached_tables.__wrapped__  # past the per-process memo, as a new command would be
    first = build(url, "p6-b200.48xlarge", 2.25e15)
    assert len(list((path.parent / "cache").glob("tables-*.pkl"))) == 1

    def no_db(*a, **k):
        raise AssertionError("read the database although nothing changed")

    monkeypatch.setattr(T, "load_frames", no_db)
    again = build(url, "p6-b200.48xlarge", 2.25e15)
    assert isinstance(again, T.Tables) and again.n_points == first.n_points
    # any write changes the file's state: the next command must read the database again
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE touched (x INTEGER)")
    with pytest.raises(AssertionError, match="read the database"):
        build(url, "p6-b200.48xlarge", 2.25e15)


def test_server_databases_and_unreadable_entries_are_not_cached(db, monkeypatch):
    url, path = db
    cache = path.parent / "cache"
    frames = T.load_frames(url, "p6-b200.48xlarge")  # an empty database's frames, served for any URL below
    monkeypatch.setattr(T, "load_frames", lambda u, prof: frames)
    assert isinstance(T.cached_tables.__wrapped__("postgresql+psycopg://u@h/db", "p", 1.0), T.Tables)
    assert not list(cache.glob("tables-*.pkl"))  # a server database has no cheap state to key a file by
    T.cached_tables.__wrapped__(url, "p6-b200.48xlarge", 2.25e15)
    (entry,) = cache.glob("tables-*.pkl")
    entry.write_bytes(b"not a pickle")  # a corrupt entry is rebuilt, not trusted
    assert isinstance(T.cached_tables.__wrapped__(url, "p6-b200.48xlarge", 2.25e15), T.Tables)
