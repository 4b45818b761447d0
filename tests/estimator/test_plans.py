"""estimator/plans.py: plan enumeration (P_disc) invariants, ranking and the infeasible counts."""
import math

import numpy as np
from scaleplan.estimator import Estimator, PlanConstraints
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.plans import enumerate_plans

from scaleplan.geometry import ladder_model
from scaleplan.specs import Layout, parse_spec

from .conftest import moe_spec


def test_enumerated_plans_satisfy_p_disc():
    g = geometry(ladder_model(8, 128, 3, 4))
    c = PlanConstraints(vpp=(1, 2), etp=(1, 2), fold_experts=True)
    pl, counts, total = enumerate_plans(g, 512, 2048, c, seqlen=8192)
    tp, cp, pp, dp, ep, etp, vpp, mbs = (getattr(pl, f) for f in ("tp", "cp", "pp", "dp", "ep", "etp", "vpp", "mbs"))
    assert np.all(tp * cp * pp * dp == 512)
    assert np.all((tp * cp * dp) % (ep * etp) == 0) and np.all(g.E % ep == 0)  # the expert mesh folds over the stage
    assert np.any(dp % ep != 0) and np.any(tp % etp != 0)  # EP need not divide DP, ETP TP (folding, asked for)
    paper = enumerate_plans(g, 512, 2048, PlanConstraints(vpp=(1, 2), etp=(1, 2)), seqlen=8192)[0]
    assert np.all(paper.dp % paper.ep == 0) and np.all(paper.tp % paper.etp == 0)  # the paper's P_disc by default
    assert 0 < len(paper) < len(pl)
    first, last = pl.decoder_first_pipeline_num_layers, pl.decoder_last_pipeline_num_layers
    even = (first == 0) & (last == 0)
    assert np.all(2048 % (dp * mbs) == 0) and np.all(np.where(even, g.L % (pp * vpp), 0) == 0)
    # an uneven split where the even one does not exist: first and last a multiple of VPP, the rest even
    middle = (g.L - first - last) / np.maximum(pp - 2, 1)
    assert np.all(even | ((first % vpp == 0) & (last % vpp == 0) & (middle % vpp == 0) & (first <= middle)))
    assert np.all(g.nq % tp == 0) and np.all((g.nkv % tp == 0) | (tp % g.nkv == 0))
    assert np.all(g.dexp % etp == 0) and np.all((vpp == 1) | (pp > 1)) and np.all(tp <= 8)
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
