"""Fit -> store -> report through the database, with a fake predictor of known physics."""
import csv
import json

import pytest
from scaleplan.calibrate.observations import add_runs
from scaleplan.calibrate.runner import build_report, fit_chi_sys, fit_dispatch_floor
from typer.testing import CliRunner

from scaleplan.errors import ScaleplanError

from .fakes import copy_sqlite, fake_predictor, synthetic_csv

TRUE = {"c_a2a": 1.0, "c_pp": 0.5, "c_ovl": -0.2}
SWEEP_KEYS = {"sweep": str, "n": int, "mape_before": float, "mape_after": float, "loso_mape": float,
              "spearman": float, "top1_in_top2": bool}


@pytest.fixture()
def synth_db(tmp_path, sqlite_url, validation_dir):
    add_runs(sqlite_url, synthetic_csv(tmp_path / "synth.csv", TRUE), validation_dir / "models.yaml")
    return sqlite_url


def test_fit_recovers_coefficients_and_versions(synth_db):
    out = fit_chi_sys(synth_db, predictor=fake_predictor)
    for t, v in TRUE.items():
        assert out["coefficients"][t] == pytest.approx(v, abs=0.05), t
    assert out["version"] == 1 and out["kind"] == "chi_sys"
    again = fit_chi_sys(synth_db, predictor=fake_predictor)
    assert again["version"] == 2 and again["calibration_id"] != out["calibration_id"]


def test_report_json_shape_and_improvement(synth_db, tmp_path):
    fit_chi_sys(synth_db, predictor=fake_predictor)
    rep = build_report(synth_db, predictor=fake_predictor, plot=str(tmp_path / "parity.png"))
    assert {"calibration_id", "coefficients", "sweeps"} <= set(rep)
    assert set(rep["coefficients"]) == {"c_a2a", "c_pp", "c_ovl"}
    assert [s["sweep"] for s in rep["sweeps"]] == ["A", "B"]
    for s in rep["sweeps"]:
        for k, typ in SWEEP_KEYS.items():
            assert isinstance(s[k], typ), k
        assert s["reference_mape"] is None  # no peer predictions in this file
        # the fake 'measurement' is the fake prediction / chi_true with 1% noise: calibrated MAPE ~1%
        assert s["mape_after"] < 0.03 < s["mape_before"]
        assert s["top1_in_top2"]
    assert rep["sweeps"][1]["normalized"] and not rep["sweeps"][0]["normalized"]
    assert (tmp_path / "parity.png").stat().st_size > 1000
    json.dumps(rep)  # serialisable as is


def test_report_without_calibration_is_identity(synth_db):
    rep = build_report(synth_db, predictor=fake_predictor)
    assert rep["calibration_id"] is None
    for s in rep["sweeps"]:
        assert s["mape_after"] == pytest.approx(s["mape_before"])


def test_too_few_observations_refused(tmp_path, sqlite_url, validation_dir):
    p = tmp_path / "two.csv"
    p.write_text("sweep,model,n_devices,gbs,seqlen,tp,cp,pp,ep,dp,mbs,measured_t_iter_s\n"
                 "s,moe-700m,32,256,8192,1,1,2,8,16,1,5.0\ns,moe-700m,32,256,8192,1,1,1,8,32,1,6.0\n")
    add_runs(sqlite_url, p, validation_dir / "models.yaml")
    with pytest.raises(ScaleplanError, match="refused: 2 observation"):
        fit_chi_sys(sqlite_url, predictor=fake_predictor)


def test_no_observations_message(sqlite_url):
    with pytest.raises(ScaleplanError, match="no observed runs"):
        fit_chi_sys(sqlite_url, predictor=fake_predictor)


def test_dispatch_fit_on_recorded(recorded_db, tmp_path):
    url = copy_sqlite(recorded_db, tmp_path / "rec.db")
    out = fit_dispatch_floor(url)
    # recorded B200 chained GEMMs: dispatch-bound wall ~14-16 us per kernel (small M)
    co = out["coefficients"]
    assert 8e-6 < co["t_gap_chain_s"] < 20e-6
    # the profile's block-level law (profiler traces) is what the chain cannot identify: kept
    from scaleplan.profiles import load_profile

    block = load_profile("p6-b200.48xlarge").dispatch
    assert (co["t_gap_s"], co["kappa0"], co["kappa1"], co["t_host_s"]) == (
        block.t_gap_s, block.kappa0, block.kappa1, block.t_host_s)
    assert out["identified"] == ["t_gap_chain_s"]
    assert "E_loc" in out["unidentified"]["kappa1"]
    assert out["version"] == 1
    # a second fit takes the first calibration as its prior and gives version 2
    again = fit_dispatch_floor(url)
    assert again["version"] == 2 and again["coefficients"]["t_gap_s"] == block.t_gap_s


def test_cli_add_list_and_errors(tmp_path, validation_dir):
    from scaleplan.cli import app

    db = str(tmp_path / "cli.db")
    r = CliRunner().invoke(app, ["calibrate", "add", str(validation_dir / "mfu_sweeps.csv"), "--specs",
                                 str(validation_dir / "models.yaml"), "--db", db, "--json"])
    assert r.exit_code == 0, r.output
    with open(validation_dir / "mfu_sweeps.csv", newline="") as f:
        n_rows = sum(1 for _ in csv.DictReader(f))  # every run of the file is valid: all stored
    assert json.loads(r.stdout)["inserted"] == n_rows
    r = CliRunner().invoke(app, ["calibrate", "list", "--db", db, "--json"])
    assert r.exit_code == 0 and sum(o["n"] for o in json.loads(r.stdout)["observations"]) == n_rows
    import subprocess
    import sys

    bad = subprocess.run([sys.executable, "-c", "from scaleplan.cli import main; main()", "calibrate", "fit",
                          "--kind", "bogus", "--db", db], check=False, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stdout == ""
    assert "--kind" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    # an MFU column with no declared FLOP count: refused in one line, exit 2, nothing stored
    mfu_only = tmp_path / "mfu.csv"
    mfu_only.write_text("sweep,model,n_devices,gbs,seqlen,tp,cp,pp,ep,dp,mbs,real_mfu_pct_est\n"
                        "s,moe-700m,32,256,8192,1,1,2,8,16,1,6.48\n")
    add = [sys.executable, "-c", "from scaleplan.cli import main; main()", "calibrate", "add", str(mfu_only),
           "--specs", str(validation_dir / "models.yaml"), "--db", db]
    bad = subprocess.run(add, check=False, capture_output=True, text=True)
    assert bad.returncode == 2 and "--mfu-flops" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    ok = subprocess.run(add + ["--mfu-flops", "6n", "--json"], check=False, capture_output=True, text=True)
    assert ok.returncode == 0 and json.loads(ok.stdout)["step_time_from"] == {"mfu:6n": 1}


def test_single_sweep_uses_leave_one_out(tmp_path, sqlite_url, validation_dir):
    p = synthetic_csv(tmp_path / "synth.csv", TRUE)
    lines = p.read_text().splitlines()
    p.write_text("\n".join([lines[0]] + [ln for ln in lines[1:] if ln.startswith("A,")]) + "\n")
    add_runs(sqlite_url, p, validation_dir / "models.yaml")
    out = fit_chi_sys(sqlite_url, predictor=fake_predictor)
    (row,) = out["sweeps"]
    assert row["cv"] == "loo" and row["loso_mape"] < 0.03


def test_reference_metrics_in_step_time(sqlite_url, validation_dir):
    """The CSV's reference predictions scored by our metrics in step time (its reference_pred_step_s
    against real_step_s_est, by hand below: 12.1% on 700M, 9.6% on 5.4B; the paper's sec:mfu-pred
    9.6% / 9.0% are MFU MAPEs in another count), top-5 overlap 100% (5.4B)."""
    import pandas as pd

    add_runs(sqlite_url, validation_dir / "mfu_sweeps.csv", validation_dir / "models.yaml")
    rep = build_report(sqlite_url, predictor=fake_predictor, mode="absolute")
    by = {r["sweep"]: r for r in rep["sweeps"]}
    df = pd.read_csv(validation_dir / "mfu_sweeps.csv")
    for name, g in df.groupby("sweep"):
        want = (g.reference_pred_step_s / g.real_step_s_est - 1).abs().mean()
        assert by[name]["reference_mape"] == pytest.approx(want, rel=1e-6), name
    assert by["700m-32dev"]["reference_mape"] == pytest.approx(0.121, abs=0.001)
    assert by["5p4b-256dev"]["topk_overlap"]["reference"]["5"] == 1.0
    # by hand from the CSV (the paper's 80%/90% for 700M is not what its CSV's reference column gives):
    # measured top-5 {pp2ep8, pp1ep8, pp2ep4, pp1ep4, pp1ep2} = reference top-5 (1.0, .951, .882, .823, .797);
    # the 5 measured-worst have reference <= .596 < .667, the lowest reference of the measured top-10
    assert by["700m-32dev"]["topk_overlap"]["reference"]["5"] == 1.0
    assert by["700m-32dev"]["topk_overlap"]["reference"]["10"] == 1.0
    # best measured (pp2 ep8) is third by the reference: not in its top 2
    assert by["700m-32dev"]["reference_top1_in_top2"] is False


@pytest.mark.postgres
def test_add_fit_report_on_postgres(pg_url, tmp_path, validation_dir):
    add_runs(pg_url, synthetic_csv(tmp_path / "synth.csv", TRUE), validation_dir / "models.yaml")
    assert add_runs(pg_url, tmp_path / "synth.csv", validation_dir / "models.yaml")["inserted"] == 0
    out = fit_chi_sys(pg_url, predictor=fake_predictor)
    assert out["coefficients"]["c_pp"] == pytest.approx(TRUE["c_pp"], abs=0.05)
    rep = build_report(pg_url, predictor=fake_predictor)
    assert rep["calibration_id"] == out["calibration_id"]


def test_runs_the_estimator_refuses_are_left_out_and_listed(synth_db):
    from scaleplan.calibrate.evaluate import Prediction

    def picky(obs):  # refuses every pp=16 run
        return [Prediction.failed("out of range") if o.layout["pp"] == 16 else p
                for o, p in zip(obs, fake_predictor(obs))]

    out = fit_chi_sys(synth_db, predictor=picky)
    assert out["skipped"] and all(s["layout"]["pp"] == 16 for s in out["skipped"])
    # without pp=16 no pipeline spans nodes: c_pp is no longer identifiable
    assert "c_pp" not in out["free"] and out["coefficients"]["c_a2a"] == pytest.approx(TRUE["c_a2a"], abs=0.05)


def test_the_stored_runtime_calibration_carries_every_fitted_host_scale(tmp_path, recorded_db, validation_dir,
                                                                        monkeypatch):
    # a runtime fit that frees ep_host_scale must store it: the estimator built on the calibration then
    # runs the law the fit chose (the row used to carry host_scale alone, so ep_host_scale fell back to 1)
    from scaleplan.calibrate import joint
    from scaleplan.calibrate.runner import fit_runtime
    from scaleplan.estimator import Estimator

    url = copy_sqlite(recorded_db, tmp_path / "rt.db")
    add_runs(url, validation_dir / "mfu_sweeps.csv", validation_dir / "models.yaml")
    real = joint.fit_joint

    def freeing_both(t_pred, t_meas, sweeps=None, terms=None):
        f = real(t_pred, t_meas, sweeps, terms)
        return joint.JointFit({**f.params, "host_scale": 0.9, "ep_host_scale": 1.3}, ["host_scale", "ep_host_scale"],
                              {}, f.residuals, f.residuals_before)

    monkeypatch.setattr(joint, "fit_joint", freeing_both)
    fit_runtime(url, sweeps=["5p4b-256dev"])
    est = Estimator("p6-b200.48xlarge", url)
    assert (est.host_scale, est.ep_host_scale) == (0.9, 1.3)
