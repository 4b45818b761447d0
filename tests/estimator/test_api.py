"""estimator/api.py: the Estimator reads chi_sys (eq:desync) and the dispatch law from the Calibration rows
in force (its profile's, the newest of each kind, or the one given by id)."""

import pytest
from scaleplan.estimator import Estimator

from scaleplan.db.models import Calibration
from scaleplan.db.session import session_scope
from scaleplan.specs import Layout, parse_spec

from .conftest import moe_spec


def _add(url, kind, version, coeffs):
    with session_scope(url) as s:
        s.add(Calibration(profile="p6-b200.48xlarge", kind=kind, version=version, coefficients=coeffs, n_obs=3))


def test_chi_sys_from_newest_calibration(sqlite_url):
    _add(sqlite_url, "chi_sys", 1, {"c_a2a": 9.0, "c_pp": 9.0, "c_ovl": 9.0})
    _add(sqlite_url, "chi_sys", 2, {"c_a2a": 0.5, "c_pp": 0.1, "c_ovl": -0.2})
    est = Estimator("p6-b200.48xlarge", db_url=sqlite_url)
    spec = parse_spec(moe_spec(data={"seqlen": 8192, "gbs": 512}))
    # EP=16 spans 2 nodes (a2a term); PP=8 on 128 devices: stages are DP=16 ranks apart, so each of
    # the 7 stage boundaries leaves the node (no in-node overlap credit)
    r = est.estimate(spec, 128, [Layout(pp=8, ep=16, mbs=1)])[0]
    ci = r.chi_inputs
    assert ci["ep_nodes"] == 2 and ci["pp_nodes"] == 8 and ci["deep_pp_in_node"] is False
    expect = 1 + 0.5 * ci["t_a2a_s"] / r.t_analytic_s + 0.1 * 7
    assert r.chi_sys == pytest.approx(expect)
    assert r.t_iter_s == pytest.approx(expect * r.t_analytic_s)
    # two stages of 8 ranks each: one stage boundary between two nodes
    r1 = est.estimate(spec, 16, [Layout(pp=2, ep=8, mbs=1)])[0]
    assert r1.chi_sys == pytest.approx(1 + 0.1 * 1)
    # a shallow pipeline inside one node (8 devices, stages 4 ranks apart): no correction
    r0 = est.estimate(spec, 8, [Layout(pp=2, ep=4, mbs=1)])[0]
    assert r0.chi_sys == 1.0
    # use_calibration=False is the analytic time
    raw = Estimator("p6-b200.48xlarge", db_url=sqlite_url, use_calibration=False)
    assert raw.estimate(spec, 128, [Layout(pp=8, ep=16, mbs=1)])[0].chi_sys == 1.0


def test_dispatch_law_from_calibration_row(sqlite_url):
    _add(sqlite_url, "dispatch", 1, {"t_gap_s": 1e-3, "kappa0": 100.0, "kappa1": 0.0, "t_host_s": 0.0})
    est = Estimator("p6-b200.48xlarge", db_url=sqlite_url)
    assert est.dispatch.t_gap_s == 1e-3 and est.dispatch.kappa0 == 100.0
    spec = parse_spec(moe_spec())
    r = est.estimate(spec, 32, [Layout(pp=1, ep=8, mbs=1, ckpt="full")])[0]
    # 16 layers x 100 kernels x 1 ms = 1.6 s per micro-batch, far above the GPU time: dispatch-bound
    n_mb = 256 / 32
    assert r.breakdown_s["dispatch_floor"] > 0
    assert r.t_analytic_s >= n_mb * 1.6


def test_calibration_id_must_belong_to_profile(sqlite_url):
    from scaleplan.errors import SpecError

    with pytest.raises(SpecError):
        Estimator("p6-b200.48xlarge", db_url=sqlite_url, calibration_id=12345)


def test_evaluate_under_other_chi_coefficients_is_the_estimate_under_them(sqlite_url):
    """Estimator.evaluate + Evaluation.t_iter_with(c) (the runtime fit's shortcut) gives the step time the
    estimator reports with c stored as its chi_sys calibration, plan by plan."""
    from scaleplan.estimator.desync import ChiCoefficients

    spec = parse_spec(moe_spec(data={"seqlen": 8192, "gbs": 512}))
    lays = [Layout(pp=8, ep=16, mbs=1), Layout(pp=2, ep=8, mbs=2), Layout(pp=1, ep=4, mbs=1)]
    ev = Estimator("p6-b200.48xlarge", db_url=sqlite_url).evaluate(spec, 128, lays)
    _add(sqlite_url, "chi_sys", 1, {"c_a2a": 0.5, "c_pp": 0.1, "c_ovl": -0.2, "c_level": 0.03})
    calibrated = Estimator("p6-b200.48xlarge", db_url=sqlite_url).estimate(spec, 128, lays)
    got = ev.t_iter_with(ChiCoefficients(c_a2a=0.5, c_pp=0.1, c_ovl=-0.2, c_level=0.03))
    assert got == pytest.approx([r.t_iter_s for r in calibrated], rel=1e-12)
    assert len(set(got / ev.t_analytic)) == 3  # the three plans have three different chi
