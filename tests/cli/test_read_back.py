"""Every command that prints a stored id (or a count of stored rows) reads its rows back on a new
connection first. Here that new connection is pointed at an empty database, as a process would see a commit whose
SQLite log was deleted under it: each command must then refuse in one line (exit 2) instead of reporting rows
that are not there. On code that never reads back, every command below exits 0 and reports them stored."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

from .test_calibrate_trace import PROFILE, _small_log

TESTS = Path(__file__).resolve().parents[1]
LOG = TESTS / "data" / "megatron" / "5p4b_tp4_pp2_ep8.log"


@pytest.fixture()
def lost(tmp_path, monkeypatch):
    """read_back looks at an empty, migrated database: every row a command committed is 'lost'. Returns the
    list of (table, keys) it was asked about."""
    from scaleplan.db import session as dbs

    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    dbs.upgrade(empty)
    real = dbs.read_back
    asked = []

    def elsewhere(url, model, ids, key="id"):
        asked.append((model.__tablename__, list(ids)))
        return real(empty, model, ids, key)

    monkeypatch.setattr(dbs, "read_back", elsewhere)
    return asked


def _refused(code, out, err, table):
    assert code == 2, (code, out, err)
    last = err.strip().splitlines()[-1]  # after any progress lines (bench run), the error in one line
    assert last.startswith("error:") and f"{table} rows" in last and "not stored" in last, err


def test_db_import_recorded(run, sqlite_url, lost):
    _refused(*run("db", "import-recorded", "--db", sqlite_url), "bench_run")


def test_calibrate_add_runs_file(run, sqlite_url, lost, validation_dir):
    _refused(*run("calibrate", "add", validation_dir / "mfu_sweeps.csv", "--specs", validation_dir / "models.yaml",
                  "--db", sqlite_url), "observed_run")


def test_calibrate_add_megatron_log(run, sqlite_url, lost):
    _refused(*run("calibrate", "add", "--megatron-log", LOG, "--db", sqlite_url), "observed_run")


def test_calibrate_fit_dispatch(run, recorded_db, tmp_path, lost):
    db = tmp_path / "copy.db"  # the fit stores a calibration: not into the session's shared database
    shutil.copy(recorded_db.removeprefix("sqlite:///"), db)
    _refused(*run("calibrate", "fit", "--kind", "dispatch", "--profile", "p6-b200.48xlarge", "--db", db),
             "calibration")


def test_calibrate_trace_store(run, sqlite_url, tmp_path, lost):
    from scaleplan.estimator import Estimator
    from tests.calibrate.trace_gen import host_bound_rank

    law = Estimator(PROFILE, db_url=sqlite_url).dispatch  # the trace as test_calibrate_trace builds it
    fixed_us = (2 * law.t_ep_host_s * 3.1 / 4 + law.t_host_s) * 1e6
    r = host_bound_rank(kappa=400, gap_us=25.0, n_mb=2, layers=2, fixed_us=fixed_us)
    r.meta["distributedInfo"].update(rank=40, world_size=64)
    t = r.write(tmp_path / "rank40.json")
    _refused(*run("calibrate", "trace", t, "--megatron-log", _small_log(tmp_path), "--profile", PROFILE,
                  "--db", sqlite_url, "--store"), "calibration")


def test_law_fit(run, sqlite_url, tmp_path, lost):
    sys.path.insert(0, str(TESTS / "mosaic"))
    from synth import synthetic_runs

    csv = tmp_path / "runs.csv"
    synthetic_runs(seed=2).to_csv(csv, index=False)
    _refused(*run("law", "fit", csv, "--bootstrap", "0", "--restarts", "0", "--db", sqlite_url), "law_fit")


def test_bench_run(run, sqlite_url, tmp_path, lost):
    from tests.bench.conftest import tiny_preset

    preset = tmp_path / "p.yaml"
    preset.write_text(yaml.safe_dump(tiny_preset({"gemm": {"dtypes": ["fp32"], "m": [8], "n": [8], "k": [8]}})))
    _refused(*run("bench", "run", "--preset", preset, "--device", "cpu", "--db", sqlite_url), "bench_run")
    assert lost and lost[-1][0] == "bench_run"
