"""Tables you can trust: runs are stored and read by hardware identity.

`bench run --profile p6-b200.48xlarge` on a CPU is refused (one line naming both) and stores
nothing; `--as-profile` stores it with the flag; the estimator's tables skip a measured run whose
device is not the profile's GPU however new it is; imported runs carry the GPU of their own rows.
"""
from __future__ import annotations

import datetime as dt
import json

import pytest
import yaml
from sqlalchemy import func, select

from scaleplan.db import models as m
from scaleplan.db import session as dbs
from scaleplan.db.identity import gpu_model, matches
from tests.reliability.conftest import run_cli

from .conftest import tiny_preset

GEMM = {"gemm": {"dtypes": ["fp32"], "m": [8], "n": [8], "k": [8]}}


@pytest.mark.parametrize("name,model", [
    ("NVIDIA B200", "B200"), ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA A100-SXM4-40GB", "A100"),
    ("NVIDIA GH200 480GB", "GH200"), ("cpu", "cpu"), (None, None)])
def test_gpu_model_tokens(name, model):
    assert gpu_model(name) == model


def test_matching_rule():
    assert matches("NVIDIA H100 80GB HBM3", "cuda", "NVIDIA H100 PCIe")  # same model, other board
    assert not matches("NVIDIA B200", "cpu", None)
    assert not matches("NVIDIA B200", "cuda", "NVIDIA A100-SXM4-40GB")
    assert matches("cpu", "cpu", None)
    assert matches("NVIDIA B200", None, None)  # nothing recorded: cannot judge, kept


@pytest.fixture()
def cli():
    return run_cli


@pytest.fixture()
def preset(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(tiny_preset(GEMM)))
    return str(p)


def _runs(url):
    with dbs.session_scope(url) as s:
        return s.execute(select(m.BenchRun.profile, m.BenchRun.as_profile, m.BenchRun.device)).all()


def test_cpu_run_under_a_b200_profile_is_refused(cli, preset, sqlite_url):
    code, out, err = cli("bench", "run", "--preset", preset, "--device", "cpu", "--profile", "p6-b200.48xlarge",
                         "--db", sqlite_url)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "NVIDIA B200" in err and "cpu" in err and "--as-profile" in err
    assert _runs(sqlite_url) == []  # nothing stored, not even a 'running' run


def test_as_profile_stores_the_flag(cli, preset, sqlite_url):
    code, out, err = cli("bench", "run", "--preset", preset, "--device", "cpu", "--profile", "p6-b200.48xlarge",
                         "--as-profile", "--db", sqlite_url, "--json")
    assert code == 0, err
    assert _runs(sqlite_url) == [("p6-b200.48xlarge", True, "cpu")]
    code, out, _ = cli("bench", "runs", "--db", sqlite_url, "--json")
    assert json.loads(out)["runs"][0]["as_profile"] is True


def _gemm_run(s, profile, device, gpu, t_s, started, source="measured", as_profile=False):
    run = m.BenchRun(suite="gemm", profile=profile, source=source, status="complete", device=device,
                     gpu_name=gpu, started_at=started, as_profile=as_profile,
                     source_file=f"f{started.timestamp()}" if source == "imported" else None)
    s.add(run)
    s.flush()
    s.add(m.GemmPoint(run_id=run.id, m=256, n=1024, k=1024, dtype="bf16", t_s=t_s, status="OK"))


def test_tables_pick_runs_by_hardware_not_by_age(sqlite_url):
    """The issue's case: a B200 GEMM (17 us) and a newer CPU run of the same point (267 us) under the
    B200 profile: the table keeps 17 us; a forced (--as-profile) run is read, being asked for."""
    from scaleplan.db.measurements import load_frames

    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    with dbs.session_scope(sqlite_url) as s:
        _gemm_run(s, "p6-b200.48xlarge", "cuda", "NVIDIA B200", 17e-6, t0)
        _gemm_run(s, "p6-b200.48xlarge", "cpu", None, 267e-6, t0 + dt.timedelta(days=1))
    df = load_frames(sqlite_url, "p6-b200.48xlarge")["gemm"]
    assert list(df["t_s"]) == [17e-6]
    with dbs.session_scope(sqlite_url) as s:
        _gemm_run(s, "p6-b200.48xlarge", "cpu", None, 300e-6, t0 + dt.timedelta(days=2), as_profile=True)
    df = load_frames(sqlite_url, "p6-b200.48xlarge")["gemm"]
    assert sorted(df["t_s"]) == [17e-6, 300e-6]


def test_imported_runs_name_their_own_gpu(recorded_db):
    """sdpa_fwd_bwd_timings holds A100, H200 and B200 rows: each profile's run names its own GPU
    (the B200 run showed `NVIDIA A100-SXM4-40GB`); files without a GPU column get the profile's GPU."""
    from scaleplan.profiles import profile_file

    with dbs.session_scope(recorded_db) as s:
        rows = s.execute(select(m.BenchRun.source_file, m.BenchRun.profile, m.BenchRun.gpu_name)
                         .where(m.BenchRun.source == "imported")).all()
    by_file = {(f.split("#")[0], p): g for f, p, g in rows}
    assert by_file[("sdpa_fwd_bwd_timings.parquet", "p6-b200.48xlarge")] == "NVIDIA B200"
    assert by_file[("sdpa_fwd_bwd_timings.parquet", "p5en.48xlarge")] == "NVIDIA H200"
    assert by_file[("sdpa_fwd_bwd_timings.parquet", "p4d.24xlarge")] == "NVIDIA A100-SXM4-40GB"
    for (f, p), g in by_file.items():
        assert gpu_model(g) == gpu_model(profile_file(p).gpu_name), (f, p, g)


def test_migration_relabels_imported_runs(tmp_path):
    """A database imported before the fix (the B200 SDPA run labelled A100) is corrected by `db upgrade`."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    dbs.upgrade(url, "0003")
    with dbs.get_engine(url).begin() as c:
        c.exec_driver_sql("INSERT INTO bench_run (suite, profile, source, source_file, status, gpu_name, started_at) "
                          "VALUES ('sdpa', 'p6-b200.48xlarge', 'imported', 'x#p6', 'imported', "
                          "'NVIDIA A100-SXM4-40GB', '2026-01-01')")
    dbs.upgrade(url)
    with dbs.session_scope(url) as s:
        assert s.scalar(select(m.BenchRun.gpu_name)) == "NVIDIA B200"
        assert s.scalar(select(func.count()).select_from(m.BenchRun).where(m.BenchRun.as_profile)) == 0
