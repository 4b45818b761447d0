"""Fitting eq:joint-law: recovery on synthetic runs, hold-out, bootstrap intervals, CSV validation, storage."""
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import inproc
import pytest

from scaleplan.errors import SpecError
from scaleplan.mosaic.law import NAMES, PAPER_JOINT_LAW
from scaleplan.mosaic.law_fit import Runs, _bca, fit_joint_law, heldout_mask, read_runs_csv

sys.path.insert(0, str(Path(__file__).parent))
from synth import synthetic_runs


@pytest.fixture(scope="module")
def fitted():
    return fit_joint_law(Runs(synthetic_runs(noise=0.002, seed=1)), n_bootstrap=12, n_restarts=4, seed=0)


def test_recovers_beta_and_eta_within_5_percent(fitted):
    assert fitted.converged
    assert fitted.law.beta == pytest.approx(PAPER_JOINT_LAW.beta, rel=0.05)
    assert fitted.law.eta == pytest.approx(PAPER_JOINT_LAW.eta, rel=0.05)


def test_heldout_rmse_near_noise_level(fitted):
    # 0.2% multiplicative noise on losses near 2 nats is ~0.004 nats of scatter per run
    assert 0.001 < fitted.heldout_rmse < 0.012


def test_json_shape_and_intervals(fitted):
    j = fitted.to_json()
    assert set(j) == {"coefficients", "ci95", "heldout_rmse", "identified", "n_runs", "n_ridge_samples", "support"}
    assert j["n_ridge_samples"] == fitted.n_near_optimal >= 1
    assert j["support"]["s_max"] == max(synthetic_runs(seed=1).s)
    assert tuple(j["coefficients"]) == NAMES and set(j["ci95"]) == set(NAMES)
    assert set(j["identified"]) <= set(NAMES) and j["n_runs"] == len(synthetic_runs(seed=1))
    for lo, hi in j["ci95"].values():
        assert lo <= hi
    lo, hi = j["ci95"]["beta"]
    assert lo < j["coefficients"]["beta"] * 1.02 and hi > j["coefficients"]["beta"] * 0.98


def test_holdout_is_top_ten_percent_by_n_act_per_g():
    df = pd.DataFrame({"g": [1] * 10 + [4] * 20, "n_act": list(range(10)) + list(range(20))})
    m = heldout_mask(df)
    assert m[:10].sum() == 1 and m[9]
    assert m[10:].sum() == 2 and m[-1] and m[-2]


def test_bca_reduces_to_percentile_without_bias_or_skew():
    rng = np.random.default_rng(0)
    boot = rng.standard_normal(20001)
    jack = np.linspace(-1, 1, 101)  # symmetric: zero acceleration
    lo, hi = _bca(0.0, boot, jack)
    assert lo == pytest.approx(-1.96, abs=0.05) and hi == pytest.approx(1.96, abs=0.05)


def _write(tmp_path, df, name="runs.csv"):
    p = tmp_path / name
    df.to_csv(p, index=False)
    return p


def test_bad_csvs_name_column_and_row(tmp_path):
    df = synthetic_runs()
    with pytest.raises(SpecError, match="column loss"):
        read_runs_csv(_write(tmp_path, df.drop(columns=["loss"])))
    bad = df.copy()
    bad.loc[3, "d"] = -5
    with pytest.raises(SpecError, match="row 5, column d"):
        read_runs_csv(_write(tmp_path, bad))
    bad = df.copy().astype({"s": object})
    bad.loc[0, "s"] = "abc"
    with pytest.raises(SpecError, match="row 2, column s"):
        read_runs_csv(_write(tmp_path, bad))
    bad = df.copy()
    bad.loc[7, "s"] = 0.5  # inconsistent with 1 - n_act/n_tot
    with pytest.raises(SpecError, match="row 9, column s"):
        read_runs_csv(_write(tmp_path, bad))


def _cli(*args):
    return inproc.cli(*args)  # in-process (tests/inproc.py)


def test_cli_fit_stores_runs_and_fit(tmp_path):
    from sqlalchemy import create_engine, text

    db = tmp_path / "law.db"
    csv = _write(tmp_path, synthetic_runs(seed=2))
    p = _cli("law", "fit", str(csv), "--bootstrap", "0", "--restarts", "0", "--db", str(db), "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["n_runs"] == len(synthetic_runs(seed=2))
    assert out["coefficients"]["beta"] == pytest.approx(0.207, rel=0.05)
    with create_engine(f"sqlite:///{db}").connect() as c:
        assert c.execute(text("select count(*) from law_run")).scalar() == out["n_runs"]
        assert c.execute(text("select count(*) from law_fit")).scalar() == 1
    # the stored fit is usable by name
    p = _cli("law", "eval", "--n-tot", "1e10", "--s", "0.9", "--d", "1e10", "--g", "4", "--law", "joint",
             "--db", str(db), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["law"].startswith("db:")


def test_cli_fit_bad_csv_exit_2_nothing_written(tmp_path):
    db = tmp_path / "law.db"
    bad = synthetic_runs()
    bad.loc[0, "n_tot"] = float("nan")
    p = _cli("law", "fit", str(_write(tmp_path, bad)), "--db", str(db))
    assert p.returncode == 2 and "row 2, column n_tot" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not db.exists()
