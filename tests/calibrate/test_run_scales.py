"""Runtime-scale fit (calibrate fit --kind dispatch --from-runs) on synthetic step times from the estimator."""
from __future__ import annotations

import numpy as np
import pytest
from scaleplan.calibrate.run_scales import BOUNDS, fit_run_scales
from scaleplan.estimator import Estimator

from scaleplan.errors import ScaleplanError
from scaleplan.specs import Layout
from tests.estimator.test_cpu_serial import SERIAL, _ops_frame, _spec

# gbs 4: mbs 1, 2, 4 -> 4, 2, 1 micro-batches: the same compute, host time in proportion to n_mb
CASES = [(ck, mbs) for ck in ("none", "full") for mbs in (1, 2, 4)]


def _times(s_h: float, s_k: float = 1.0, cases=CASES) -> np.ndarray:
    """Step times (seconds) of serial-dispatch runs at the given scales (ops rows for two ckpt modes)."""
    import pandas as pd

    frames = {"dispatch": pd.concat([_ops_frame(ckpt="none"), _ops_frame(ckpt="full")], ignore_index=True)}
    est = Estimator.from_frames(SERIAL, frames, extrapolate="clamp", host_scale=s_h, kernel_scale=s_k)
    return np.array([est.estimate(_spec(ckpt=ck), 1, [Layout(mbs=mbs, ckpt=ck, dp=1)])[0].t_analytic_s
                     for ck, mbs in cases])


@pytest.mark.parametrize("s_true", [(0.6, 1.8), (2.3, 0.7), (1.0, 3.0)])
def test_recovers_known_scales(s_true):
    fit = fit_run_scales(_times, _times(*s_true))
    assert (fit.host_scale, fit.kernel_scale) == pytest.approx(s_true, rel=0.005)
    assert fit.fitted == ["host_scale", "kernel_scale"] and fit.n_obs == len(CASES) and not fit.at_bound
    assert max(abs(r) for r in fit.residuals) < 1e-3


def test_one_host_share_fits_host_scale_only():
    """Runs that all split host and kernel time alike cannot tell the two apart: kernel_scale stays 1."""
    same = [("none", 1)] * 3
    t_meas = _times(1.5, 1.5, same)
    fit = fit_run_scales(lambda a, b: _times(a, b, same), t_meas)
    assert fit.fitted == ["host_scale"] and fit.kernel_scale == 1.0
    assert any("kernel_scale not identifiable" in n for n in fit.notes)
    assert abs(fit.residuals[0]) < 0.01 < abs(fit.residuals_before[0])  # host alone absorbs the level


def test_params_limits_what_is_fitted():
    fit = fit_run_scales(_times, _times(0.6, 1.8), params=("host_scale",))
    assert fit.fitted == ["host_scale"] and fit.kernel_scale == 1.0
    assert fit.host_scale != pytest.approx(0.6, rel=0.01)  # host alone cannot reproduce both scales
    assert max(abs(r) for r in fit.residuals) > 1e-3


def test_scale_beyond_the_bounds_stops_at_the_bound():
    fit = fit_run_scales(_times, _times(8.0, 1.0))
    assert fit.host_scale == pytest.approx(BOUNDS[1], rel=1e-3) and "host_scale" in fit.at_bound and fit.notes


def test_refuses_without_observations():
    with pytest.raises(ScaleplanError, match="0 observed run"):
        fit_run_scales(_times, [])


def test_refuses_when_neither_scale_matters():
    with pytest.raises(ScaleplanError, match="not identifiable"):
        fit_run_scales(lambda a, b: np.array([1.0, 2.0]), [1.1, 2.2])


def test_runner_stores_a_dispatch_row_the_estimator_reproduces(recorded_db, validation_dir, tmp_path,
                                                               validation_counts):
    """fit --kind dispatch --from-runs on the published B200 sweeps: the stored row predicts what the
    fit reported, a refit does not compound the scales, a benchmark refit keeps them and the block gap."""
    from scaleplan.calibrate.evaluate import estimator_predictor, observed_from_db
    from scaleplan.calibrate.observations import add_runs
    from scaleplan.calibrate.runner import fit_dispatch_floor, fit_scales_from_runs

    from scaleplan.db.session import session_scope

    from .fakes import copy_sqlite

    url = copy_sqlite(recorded_db, tmp_path / "hs.db")
    add_runs(url, validation_dir / "mfu_sweeps.csv", validation_dir / "models.yaml")
    prof = "p6-b200.48xlarge"
    gap0 = Estimator(prof, url).dispatch.t_gap_s
    out = fit_scales_from_runs(url, prof)
    assert out["n_obs"] == sum(validation_counts.values()) and out["version"] == 1
    # a GPU profile: kernel tables are device-timed, only the host terms are fitted
    assert out["fitted"] == ["host_scale"] and out["kernel_scale"] == 1.0
    assert BOUNDS[0] < out["host_scale"] < BOUNDS[1]
    assert out["coefficients"]["t_gap_s"] == pytest.approx(gap0)  # the base law is written out unchanged
    with session_scope(url) as s:
        obs = {o.id: o for o in observed_from_db(s, prof)}
    runs = out["runs"][:3]
    preds = estimator_predictor(prof, url)([obs[r["id"]] for r in runs])  # newest row in force
    for r, p in zip(runs, preds):
        assert p.t_analytic_s == pytest.approx(r["t_pred_after_s"], rel=1e-9)
    again = fit_scales_from_runs(url, prof)
    for k in ("host_scale", "kernel_scale"):  # a refit does not compound the scales
        assert again[k] == pytest.approx(out[k], rel=1e-6), k
    assert again["version"] == 2
    bench = fit_dispatch_floor(url, prof)
    for k in ("host_scale", "kernel_scale"):
        assert bench["coefficients"][k] == pytest.approx(out[k]), k
    assert bench["coefficients"]["t_gap_s"] == pytest.approx(gap0)


def test_cli_fits_both_scales_on_a_cpu_profile(tmp_path):
    """`calibrate fit --kind dispatch --from-runs --profile cpu-local`: runs timed by the estimator itself
    at known scales (analytic tables: the kernel-count law is the host side) give the scales back, and
    the estimator then uses the stored row."""
    import json

    import yaml
    from typer.testing import CliRunner

    from scaleplan.cli import app
    from scaleplan.specs import parse_spec

    model = {"n_layers": 3, "hidden_sz": 128, "inter_sz": 320, "n_q_heads": 4, "n_kv_heads": 2, "head_dim": 32,
             "vocab_sz": 2048, "precision": "bf16",
             "moe": {"n_experts": 8, "experts_per_token": 2, "expert_inter_sz": 160, "shared_expert_inter_sz": 160}}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({"tiny": {"model": model}}))
    db = str(tmp_path / "cpu.db")
    truth = Estimator("cpu-local", db, extrapolate="clamp", use_calibration=False, host_scale=0.5, kernel_scale=2.0)
    rows = ["sweep,model,n_devices,gbs,seqlen,tp,cp,pp,ep,dp,mbs,ckpt,measured_t_iter_s"]
    for ck in ("none", "full"):
        for mbs in (1, 2, 4, 8):
            spec = parse_spec({"model": model, "data": {"gbs": 8, "seqlen": 128, "microbatch_sz": mbs},
                               "performance": {"activation_checkpointing_type": ck},
                               "hardware": {"node_type": "cpu-local"}})
            t = truth.estimate(spec, 1, [Layout(mbs=mbs, ckpt=ck, dp=1)])[0].t_analytic_s
            rows.append(f"s,tiny,1,8,128,1,1,1,1,1,{mbs},{ck},{t!r}")
    (tmp_path / "runs.csv").write_text("\n".join(rows) + "\n")
    r = CliRunner().invoke(app, ["calibrate", "add", str(tmp_path / "runs.csv"), "--specs", str(tmp_path / "m.yaml"),
                                 "--db", db, "--profile", "cpu-local", "--json"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["calibrate", "fit", "--kind", "dispatch", "--from-runs", "--profile", "cpu-local",
                                 "--db", db, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["fitted"] == ["host_scale", "kernel_scale"]
    assert (out["host_scale"], out["kernel_scale"]) == pytest.approx((0.5, 2.0), rel=0.005)
    est = Estimator("cpu-local", db, extrapolate="clamp")
    assert (est.host_scale, est.kernel_scale) == pytest.approx((0.5, 2.0), rel=0.005)
