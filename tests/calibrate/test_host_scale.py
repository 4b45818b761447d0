"""host_scale fit (calibrate fit --kind dispatch --from-runs) on synthetic step times from the estimator."""
from __future__ import annotations

import numpy as np
import pytest
from scaleplan.calibrate.host_scale import BOUNDS, fit_host_scale
from scaleplan.estimator import Estimator

from scaleplan.errors import ScaleplanError
from scaleplan.specs import Layout
from tests.estimator.test_cpu_serial import SERIAL, _ops_frame, _spec

CASES = [(ck, mbs) for ck in ("none", "full") for mbs in (1, 2, 4)]


def _times(s: float) -> np.ndarray:
    """Step times (seconds) of six serial-dispatch runs at host scale s (ops rows for two ckpt modes)."""
    import pandas as pd

    frames = {"dispatch": pd.concat([_ops_frame(ckpt="none"), _ops_frame(ckpt="full")], ignore_index=True)}
    est = Estimator.from_frames(SERIAL, frames, extrapolate="clamp", host_scale=s)
    return np.array([est.estimate(_spec(ckpt=ck), 1, [Layout(mbs=mbs, ckpt=ck, dp=1)])[0].t_analytic_s
                     for ck, mbs in CASES])


@pytest.mark.parametrize("s_true", [0.6, 2.3])
def test_recovers_a_known_host_scale(s_true):
    rng = np.random.default_rng(1)
    t_meas = _times(s_true) * np.exp(rng.normal(0, 0.002, len(CASES)))
    fit = fit_host_scale(_times, t_meas)
    assert fit.host_scale == pytest.approx(s_true, rel=0.02)
    assert fit.n_obs == len(CASES) and not fit.at_bound
    assert max(abs(r) for r in fit.residuals) < 0.01 < max(abs(r) for r in fit.residuals_before)


def test_scale_beyond_the_bounds_stops_at_the_bound():
    fit = fit_host_scale(_times, _times(8.0))
    assert fit.host_scale == pytest.approx(BOUNDS[1], rel=1e-3) and fit.at_bound and fit.notes


def test_refuses_without_observations():
    with pytest.raises(ScaleplanError, match="0 observed run"):
        fit_host_scale(_times, [])


def test_refuses_when_host_time_never_matters():
    with pytest.raises(ScaleplanError, match="not identifiable"):
        fit_host_scale(lambda s: np.array([1.0, 2.0]), [1.1, 2.2])


def test_runner_stores_a_dispatch_row_the_estimator_reproduces(recorded_db, validation_dir, tmp_path):
    """fit --kind dispatch --from-runs on the published B200 sweeps: the stored row predicts what the
    fit reported, a refit does not compound the scale, a benchmark refit keeps it and the block gap."""
    from scaleplan.calibrate.evaluate import estimator_predictor, observed_from_db
    from scaleplan.calibrate.observations import add_runs
    from scaleplan.calibrate.runner import fit_dispatch_floor, fit_host_scale_from_runs

    from scaleplan.db.session import session_scope

    from .fakes import copy_sqlite

    url = copy_sqlite(recorded_db, tmp_path / "hs.db")
    add_runs(url, validation_dir / "mfu_sweeps.csv", validation_dir / "models.yaml")
    prof = "p6-b200.48xlarge"
    gap0 = Estimator(prof, url).dispatch.t_gap_s
    out = fit_host_scale_from_runs(url, prof)
    assert BOUNDS[0] < out["host_scale"] < BOUNDS[1] and out["n_obs"] == 20 and out["version"] == 1
    assert out["coefficients"]["t_gap_s"] == pytest.approx(gap0)  # the base law is written out unchanged
    with session_scope(url) as s:
        obs = {o.id: o for o in observed_from_db(s, prof)}
    runs = out["runs"][:3]
    preds = estimator_predictor(prof, url)([obs[r["id"]] for r in runs])  # newest row in force
    for r, p in zip(runs, preds):
        assert p.t_analytic_s == pytest.approx(r["t_pred_after_s"], rel=1e-9)
    again = fit_host_scale_from_runs(url, prof)
    assert again["host_scale"] == pytest.approx(out["host_scale"], rel=1e-6) and again["version"] == 2
    bench = fit_dispatch_floor(url, prof)
    assert bench["coefficients"]["host_scale"] == pytest.approx(out["host_scale"])
    assert bench["coefficients"]["t_gap_s"] == pytest.approx(gap0)
