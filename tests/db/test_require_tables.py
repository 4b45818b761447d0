"""A benchmark pointed at a database without measured tables refuses in one line (exit 2) and creates
nothing, instead of reporting the all-analytic model's figures as if they were the tables'."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = ["estimator_accuracy.py", "compose_accuracy.py", "coupled_delay.py", "ep_slot_floor.py",
           "mosaic_findings.py", "estimator_speed.py", "model_checks.py"]


def _run(script: str, db: str):
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--db", db], capture_output=True,
                          text=True, timeout=300, cwd=REPO)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_missing_file_is_refused_and_not_created(script, tmp_path):
    db = tmp_path / "rec.db"
    p = _run(script, f"sqlite:///{db}")
    assert p.returncode == 2 and p.stdout == "", (p.stdout, p.stderr)
    assert p.stderr.startswith("error: --db") and "no such database file" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not db.exists()


def test_an_empty_database_is_refused(sqlite_url):
    p = _run("estimator_accuracy.py", sqlite_url)
    assert p.returncode == 2 and "no measured tables of p6-b200.48xlarge" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_a_database_with_tables_is_accepted(recorded_db):
    from scaleplan.db.measurements import require_tables

    assert require_tables(recorded_db, "p6-b200.48xlarge") == recorded_db
