"""The runtime scales host_scale and kernel_scale (calibrate fit --kind dispatch --from-runs) in the estimator."""
from __future__ import annotations

import pytest
from scaleplan.estimator import Estimator

from scaleplan.profiles import DispatchDefaults, load_profile
from scaleplan.specs import Layout
from tests.estimator.test_cpu_serial import HOST, N_MB, SERIAL, _ops_frame, _spec

LAY = [Layout(mbs=1, ckpt="none", dp=1)]


def _serial(**kw):
    return Estimator.from_frames(SERIAL, {"dispatch": _ops_frame()}, extrapolate="clamp", **kw)


def test_serial_host_time_scales_and_compute_does_not():
    base = _serial().estimate(_spec(), 1, LAY)[0]
    s = 2.5
    r = _serial(host_scale=s).estimate(_spec(), 1, LAY)[0]
    host_mb = HOST["dense"] + 2 * HOST["moe"] + HOST["microbatch"]  # 1 dense + 2 MoE layers
    step = HOST["step_dense"] + 2 * HOST["step_moe"] + HOST["step"]
    assert r.breakdown_s["dispatch_floor"] == pytest.approx(s * N_MB * host_mb, rel=1e-9)
    # the optimizer's host ops scale too; its compute part stays
    assert r.breakdown_s["optimizer"] - base.breakdown_s["optimizer"] == pytest.approx((s - 1) * step, rel=1e-9)
    for k in ("attn_proj", "sdpa", "experts", "vocab"):
        assert r.breakdown_s[k] == pytest.approx(base.breakdown_s[k], rel=1e-12), k
    # the cached tables are not touched: a fresh unscaled estimator gives the base time again
    assert _serial().estimate(_spec(), 1, LAY)[0].t_iter_s == pytest.approx(base.t_iter_s, rel=1e-12)


def test_serial_kernel_time_scales_and_host_time_does_not():
    base = _serial().estimate(_spec(), 1, LAY)[0]
    s = 1.7
    r = _serial(kernel_scale=s).estimate(_spec(), 1, LAY)[0]
    assert r.breakdown_s["dispatch_floor"] == pytest.approx(base.breakdown_s["dispatch_floor"], rel=1e-12)
    for k in ("attn_proj", "sdpa", "experts", "router", "shared_expert", "dense_mlp", "elementwise", "vocab"):
        assert base.breakdown_s[k] > 0, k
        assert r.breakdown_s[k] == pytest.approx(s * base.breakdown_s[k], rel=1e-9), k
    # the optimizer: its roofline part scales, its host ops (the ops:step* rows) do not
    step_host = HOST["step_dense"] + 2 * HOST["step_moe"] + HOST["step"]
    assert r.breakdown_s["optimizer"] - step_host == pytest.approx(s * (base.breakdown_s["optimizer"] - step_host),
                                                                  rel=1e-9)
    assert "kernel time x1.7" in " ".join(r.warnings) and not any("fitted on" in w for w in base.warnings)


def test_kernel_scale_leaves_collectives_alone():
    two = [Layout(mbs=1, ckpt="none", dp=2)]
    base = _serial().estimate(_spec(), 2, two)[0]
    r = _serial(kernel_scale=3.0).estimate(_spec(), 2, two)[0]
    assert base.breakdown_s["dp_comm"] > 0
    assert r.breakdown_s["dp_comm"] == pytest.approx(base.breakdown_s["dp_comm"], rel=1e-12)


def test_gpu_law_host_terms_scale():
    prof = load_profile("h200-single").model_copy(update={"dispatch": DispatchDefaults(
        t_gap_s=20e-6, kappa0=600, kappa1=7, t_host_s=1e-3, source="test")})
    est = Estimator.from_frames(prof, {}, host_scale=3.0)
    assert (est.dispatch.t_gap_s, est.dispatch.t_host_s) == pytest.approx((60e-6, 3e-3))
    assert (est.dispatch.kappa0, est.dispatch.kappa1) == (600, 7)  # kernel counts are not host time


def test_stored_dispatch_row_host_scale_is_applied(sqlite_url):
    from scaleplan.db.calibrations import store_calibration

    from scaleplan.db.session import session_scope

    prof = "h200-single"
    before = Estimator(prof, sqlite_url)
    with session_scope(sqlite_url) as s:
        store_calibration(s, prof, "dispatch", {"host_scale": 0.5}, inputs={}, residuals=[], cv_error=None,
                          n_obs=1, notes=None)
    after = Estimator(prof, sqlite_url)
    assert (after.host_scale, after.kernel_scale) == (0.5, 1.0)  # a row without kernel_scale: 1
    assert after.dispatch.t_gap_s == pytest.approx(0.5 * before.dispatch.t_gap_s)
    assert after.dispatch.t_host_s == pytest.approx(0.5 * before.dispatch.t_host_s)
    # an explicit host_scale (the fit's trial values) overrides the stored one
    assert Estimator(prof, sqlite_url, host_scale=1.0).dispatch.t_gap_s == pytest.approx(before.dispatch.t_gap_s)
    # without calibration the stored row is ignored
    assert Estimator(prof, sqlite_url, use_calibration=False).host_scale == 1.0


def test_bad_host_scale_is_a_spec_error():
    from scaleplan.errors import SpecError

    with pytest.raises(SpecError):
        _serial(host_scale=-1.0)
    with pytest.raises(SpecError, match="kernel_scale"):
        _serial(kernel_scale=float("nan"))
