"""`scaleplan db` in a fresh process, as a user and CI run it: nothing imported beforehand.

In-process tests import SQLAlchemy before the CLI runs, so they cannot see a failure that only a fresh
interpreter shows (a lazily loaded `sqlalchemy` parent broke `db upgrade`'s migrations env)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scaleplan.lazy import lazy_module


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scaleplan", *args], capture_output=True, text=True, timeout=300)


def test_upgrade_then_status_and_stats_each_in_a_fresh_process(tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    up = _run("db", "upgrade", "--db", url, "--json")
    assert up.returncode == 0, up.stderr
    st = _run("db", "status", "--db", url, "--json")
    assert st.returncode == 0, st.stderr
    status = json.loads(st.stdout)
    assert status["revision"] == status["head"] == json.loads(up.stdout)["revision"]
    stats = _run("db", "stats", "--db", url, "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["bench_runs"] == 0


def test_lazy_module_refuses_sqlalchemy():
    with pytest.raises(ValueError, match="sqlalchemy"):
        lazy_module("sqlalchemy")
