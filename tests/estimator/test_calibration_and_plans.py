"""chi_sys (eq:desync) and the dispatch law from Calibration rows; plan enumeration invariants."""
import math

import numpy as np
import pytest
from scaleplan.estimator import Estimator, PlanConstraints
from scaleplan.estimator.geom import geometry
from scaleplan.estimator.plans import enumerate_plans

from scaleplan.db.models import Calibration
from scaleplan.db.session import session_scope
from scaleplan.geometry import ladder_model
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


def test_enumerated_plans_satisfy_p_disc():
    g = geometry(ladder_model(8, 128, 3, 4))
    c = PlanConstraints(vpp=(1, 2), etp=(1, 2))
    pl, counts, total = enumerate_plans(g, 512, 2048, c, seqlen=8192)
    tp, cp, pp, dp, ep, etp, vpp, mbs = (getattr(pl, f) for f in ("tp", "cp", "pp", "dp", "ep", "etp", "vpp", "mbs"))
    assert np.all(tp * cp * pp * dp == 512)
    assert np.all(dp % ep == 0) and np.all(g.E % ep == 0)
    assert np.all(2048 % (dp * mbs) == 0) and np.all(g.L % (pp * vpp) == 0)
    assert np.all(g.nq % tp == 0) and np.all((g.nkv % tp == 0) | (tp % g.nkv == 0))
    assert np.all(tp % etp == 0) and np.all((vpp == 1) | (pp > 1)) and np.all(tp <= 8)
    assert total == len(pl) + sum(counts.values())
    assert len(np.unique(np.stack([tp, cp, pp, ep, etp, vpp, mbs, pl.ckpt], 1), axis=0)) == len(pl)


def test_layouts_ranked_and_counted(sqlite_url):
    est = Estimator("p6-b200.48xlarge", db_url=sqlite_url)
    spec = parse_spec(moe_spec())
    res = est.layouts(spec, 32, PlanConstraints(mem_fraction=0.5), top=None)
    assert res.n_feasible == len(res.ranked) > 0
    assert res.n_plans == res.n_feasible + sum(res.infeasible_counts.values())
    assert all(r.mem_per_device_gb <= 0.5 * est.profile.hbm_bytes / 1e9 for r in res.ranked)
    assert res.infeasible_counts.get("memory", 0) > 0
    mfu = [r.mfu for r in res.ranked]
    assert mfu == sorted(mfu, reverse=True) and all(math.isfinite(m) for m in mfu)


def test_dense_model_and_tp_cp_vpp_plans(sqlite_url):
    est = Estimator("p6-b200.48xlarge", db_url=sqlite_url)
    dense = moe_spec()
    dense["model"] = {k: v for k, v in dense["model"].items() if k != "moe"}
    spec = parse_spec(dense)
    lays = [Layout(tp=2, cp=2, pp=2, mbs=1), Layout(tp=1, pp=4, vpp=2, mbs=1), Layout(tp=4, pp=1)]
    res = est.estimate(spec, 32, lays)
    assert all(r.mfu > 0 and r.feasible for r in res)
    assert res[1].breakdown_s["bubble"] < est.estimate(spec, 32, [Layout(pp=4, mbs=1)])[0].breakdown_s["bubble"]
    assert res[0].breakdown_s["tp_comm"] > 0 and res[2].breakdown_s["ep_a2a"] == 0.0
