"""Database reads cached per SQLite state (scaleplan/db/state_cache.py): a planner command whose database
did not change reads the calibration rows and table runs from the cache, and every commit is seen."""
from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest
from scaleplan.db import state_cache
from scaleplan.db.calibrations import calibrations_in_force, store_calibration
from scaleplan.db.session import session_scope

PROF = "p6-b200.48xlarge"


def _store(url: str, c_a2a: float) -> None:
    with session_scope(url) as s:
        store_calibration(s, PROF, "chi_sys", {"c_a2a": c_a2a}, inputs={}, residuals=[], cv_error=None,
                          n_obs=1, notes="test")


def test_unchanged_database_is_read_once_and_every_commit_is_seen(sqlite_url):
    calls = []

    def read(tag):
        calls.append(tag)
        return {"read": len(calls)}

    first = state_cache.cached_read("t", sqlite_url, "k", (__name__,), lambda: read("a"))
    again = state_cache.cached_read("t", sqlite_url, "k", (__name__,), lambda: read("b"))
    assert first == again == {"read": 1} and calls == ["a"]  # the second call did not read
    other_key = state_cache.cached_read("t", sqlite_url, "k2", (__name__,), lambda: read("c"))
    assert other_key == {"read": 2}
    # commits in quick succession (one mtime tick apart at most): each one is a new state
    seen = []
    for v in (0.1, 0.2, 0.3):
        _store(sqlite_url, v)
        seen.append(calibrations_in_force(sqlite_url, PROF)["chi_sys"].coefficients["c_a2a"])
    assert seen == [0.1, 0.2, 0.3]


def test_a_corrupt_entry_is_read_again(sqlite_url):
    state_cache.cached_read("t", sqlite_url, "k", (__name__,), lambda: [1])
    path = state_cache.cache_path("t", sqlite_url, "k", (__name__,))
    path.write_bytes(b"not a pickle")
    assert state_cache.cached_read("t", sqlite_url, "k", (__name__,), lambda: [2]) == [2]


def test_rebuilding_the_wal_index_is_not_a_new_state(tmp_path):
    """A writer that exits without closing leaves its log and wal-index; the next connection to open
    the database rebuilds the wal-index (new change counter and header checksum, same commits). The
    state must stay the same, or every planner command after such a writer reads the database again."""
    db = tmp_path / "x.db"
    writer = (f"import os, sqlite3\nc = sqlite3.connect({str(db)!r}); c.execute('PRAGMA journal_mode=WAL')\n"
              "c.execute('create table t(a)')\nfor i in range(5):\n    c.execute('insert into t values (?)', (i,)); c.commit()\n"
              "os._exit(0)")
    subprocess.run([sys.executable, "-c", writer], check=True)
    before = state_cache.db_state(f"sqlite:///{db}")
    shm_header = (db.parent / "x.db-shm").read_bytes()[:48]
    reader = sqlite3.connect(db)
    assert reader.execute("select count(*) from t").fetchone() == (5,)
    assert (db.parent / "x.db-shm").read_bytes()[:48] != shm_header  # the reader did rebuild the index
    assert state_cache.db_state(f"sqlite:///{db}") == before
    reader.execute("insert into t values (5)")
    reader.commit()
    assert state_cache.db_state(f"sqlite:///{db}") != before
    reader.close()


@pytest.mark.parametrize("url", ["postgresql+psycopg://u@h/db", "sqlite://", "sqlite:////no/such/file.db"])
def test_no_state_no_cache(url):
    assert state_cache.db_state(url) is None and state_cache.cache_path("t", url, "k", (__name__,)) is None
    calls = []
    for _ in range(2):
        state_cache.cached_read("t", url, "k", (__name__,), lambda: calls.append(1))
    assert len(calls) == 2


def test_opening_and_closing_the_database_is_not_a_new_state(tmp_path):
    """A connection creates an empty log and wal-index when it opens a WAL database and the last one
    to close deletes them: no row changed, so no new state (a command that opens the database midway
    must key all its reads alike)."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    c = sqlite3.connect(tmp_path / "x.db")
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("create table t(a)")
    c.commit()
    c.close()
    assert not (tmp_path / "x.db-wal").exists()
    before = state_cache.db_state(url)
    c = sqlite3.connect(tmp_path / "x.db")
    assert c.execute("select count(*) from t").fetchone() == (0,)
    assert (tmp_path / "x.db-wal").exists() and state_cache.db_state(url) == before
    c.close()
    assert state_cache.db_state(url) == before


def test_a_planner_command_on_an_unchanged_database_does_not_import_sqlalchemy(recorded_db, tmp_path):
    """A `layouts` after one on the same unchanged database reads tables, calibrations and provenance
    from the cache: SQLAlchemy (~0.2 s of CPU) is not imported, and the answer is the same. On a copy
    of the recorded tables that no other connection holds, as a user's database between commands."""
    db = tmp_path / "copy.db"
    src, dst = sqlite3.connect(recorded_db.removeprefix("sqlite:///")), sqlite3.connect(db)
    with dst:
        src.backup(dst)
    src.close()
    dst.execute("PRAGMA journal_mode=WAL")
    dst.close()
    spec = tmp_path / "s.yaml"
    spec.write_text("model: {n_layers: 4, hidden_sz: 1024, inter_sz: 2816, n_q_heads: 8, n_kv_heads: 8, "
                    "head_dim: 128, vocab_sz: 32000, moe: {n_experts: 16, experts_per_token: 2, "
                    "expert_inter_sz: 704}}\ndata: {gbs: 64, seqlen: 4096}\nhardware: {node_type: p6-b200.48xlarge}\n")
    code = ("import json, sys; from scaleplan.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('sqlalchemy.'))), file=sys.stderr)")
    argv = [sys.executable, "-c", code, "--json", "layouts", str(spec), "--devices", "16", "--db", f"sqlite:///{db}"]
    runs = [subprocess.run(argv, capture_output=True, text=True, check=True) for _ in range(3)]
    assert runs[0].stdout == runs[1].stdout == runs[2].stdout
    imported = [r.stderr.strip().splitlines()[-1] for r in runs]
    assert imported[0] != "[]" and imported[1:] == ["[]", "[]"], [i[:80] for i in imported]


def test_reading_the_state_keeps_this_process_s_sqlite_locks(tmp_path):
    """db_state reads the database's header and wal-index while this process's engine holds the database.
    Closing a descriptor of a file drops every POSIX lock the process holds on it, so a read-and-close let
    another process take itself for the last connection, checkpoint and delete the -wal log this process
    then committed into, unseen by anyone else (`validate --nproc 2 --bench` lost its stored run so). Every
    commit made after the state was read must be visible to a fresh process."""
    from sqlalchemy import text

    db = tmp_path / "locks.db"
    url = f"sqlite:///{db}"
    with session_scope(url) as s:  # the engine keeps its connection pooled: the database stays open here
        s.execute(text("create table t(a)"))
        s.execute(text("insert into t values (1)"))
    assert (tmp_path / "locks.db-wal").exists()
    assert state_cache.db_state(url) is not None
    other = f"import sqlite3\nc = sqlite3.connect({str(db)!r})\nc.execute('select count(*) from t').fetchall()\nc.close()"
    subprocess.run([sys.executable, "-c", other], check=True)  # opens and closes, as a bench torchrun rank does
    with session_scope(url) as s:
        s.execute(text("insert into t values (2)"))
    count = f"import sqlite3\nprint(sqlite3.connect({str(db)!r}).execute('select count(*) from t').fetchone()[0])"
    seen = subprocess.run([sys.executable, "-c", count], check=True, capture_output=True, text=True).stdout
    assert seen.strip() == "2"
