"""estimator/kernels.py (layer_kernels): the EP tile correction: each of the E/EP local experts sees EP*T*B*K/E rows (balanced routing)."""
from dataclasses import replace

import numpy as np
import pytest
from scaleplan.estimator import Estimator
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.kernels import layer_kernels
from scaleplan.estimator.sources import Recorder

from scaleplan.specs import Layout, parse_spec

from .conftest import grouped_frame, moe_spec


def _expert_fwd(est, spec, layouts, n=32):
    g = geometry(spec.model)
    pl = ParallelLayout.from_specs(layouts, n)
    ctx = est.model.context(g, pl, spec.data.seqlen)
    ctx = replace(ctx, rec=Recorder(len(pl), "error"))
    rec = ctx.rec
    k = layer_kernels(ctx)
    return k.ex_f, rec


def test_work_proportional_table_gives_ep_invariant_expert_time():
    # a grouped table whose time is proportional to the work num_gemms * tokens_per_expert:
    # under the corrected key the expert time is the same for every EP (same rows per rank);
    # the uncorrected key (tile T*B*K/E with E/EP groups) would shrink it by EP
    law = lambda ng, tpe: 1e-7 * ng * tpe
    est = Estimator.from_frames("p6-b200.48xlarge", {"grouped_gemm": grouped_frame(2048, 1280, law)})
    spec = parse_spec(moe_spec())
    lays = [Layout(pp=2, ep=e, mbs=1) for e in (1, 2, 4, 8)]
    t, rec = _expert_fwd(est, spec, lays)
    assert not rec.has_oor.any()
    assert np.allclose(t, t[0], rtol=1e-9)
    assert (rec.src["experts"] <= 1).all()  # measured / interpolated, not analytic


def test_launch_bound_table_rewards_ep():
    # a launch-bound table (time per GEMM, independent of rows): expert time falls as 1/EP
    law = lambda ng, tpe: 2e-5 * ng
    est = Estimator.from_frames("p6-b200.48xlarge", {"grouped_gemm": grouped_frame(2048, 1280, law)})
    spec = parse_spec(moe_spec())
    t, _ = _expert_fwd(est, spec, [Layout(pp=2, ep=1), Layout(pp=2, ep=8)])
    act = t[0] - 2e-5 * 128  # the SwiGLU element-wise part, EP-invariant
    assert t[1] - act == pytest.approx(2e-5 * 16, rel=1e-6)


def test_lookup_keys_use_the_corrected_tile(sqlite_url):
    est = Estimator("p6-b200.48xlarge", db_url=sqlite_url)
    spec = parse_spec(moe_spec())
    for ep in (1, 4, 8):
        pts = est.lookups(spec, 32, [Layout(pp=2, ep=ep, mbs=2)])["grouped_gemm"]
        tiles = {p["tokens_per_expert"] for p in pts}
        groups = {p["num_gemms"] for p in pts}
        # T_seq*B*K/E = 8192*2*3/128 = 384 rows per expert without EP; EP multiplies the tile
        assert tiles == {ep * 8192 * 2 * 3 // 128} and groups == {128 // ep}


def test_capacity_factor_sizes_the_routed_rows():
    from scaleplan.estimator.shapes import plan_shapes

    base = moe_spec()
    g1 = geometry(parse_spec(base).model)
    g2 = geometry(parse_spec(moe_spec(model={**base["model"], "moe": {**base["model"]["moe"],
                                                                      "capacity_factor": 1.25}})).model)
    lay = ParallelLayout.of(ep=8, mbs=1)
    s1, s2 = plan_shapes(g1, lay, 8192), plan_shapes(g2, lay, 8192)
    assert float(s1.R[0]) == 8192 * 3 and float(s2.R[0]) == pytest.approx(1.25 * 8192 * 3)
    assert float(s2.tile[0]) == pytest.approx(1.25 * float(s1.tile[0])) and float(s2.a2a_bytes[0]) == pytest.approx(
        1.25 * float(s1.a2a_bytes[0]))
