"""estimator/stages.py: each pipeline stage's work from the blocks the shapes record counts on it, checked by
hand on the 700M model (16 blocks, block 0 dense, 128 experts) at PP 2 (stage 0: 1 dense + 7 MoE blocks,
stage 1: 8 MoE blocks)."""
import numpy as np
import pytest
from scaleplan.estimator import Estimator
from scaleplan.estimator.ckpt import CkptMode, full_recompute_units, kernel_units
from scaleplan.estimator.dispatch import DispatchLaw
from scaleplan.estimator.kernels import layer_kernels
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.stages import dp_windows, layer_totals, stage_dispatch

from scaleplan.specs import parse_spec

from .conftest import moe_spec

LAW = DispatchLaw(kappa0=600.0, kappa1=7.0, t_gap_s=20e-6, t_host_s=1e-3, t_ep_host_s=5e-3)


def _ctx(ep: int = 8):
    est = Estimator.from_frames("p6-b200.48xlarge", {})
    g = geometry(parse_spec(moe_spec()).model)
    return est, est.model.context(g, ParallelLayout.of(pp=2, dp=16, ep=ep, ckpt="full"), 8192, 256)


@pytest.mark.parametrize("ep", [1, 8])
def test_each_stage_launches_the_ep_token_path_once_per_moe_block_it_holds(ep):
    _, ctx = _ctx(ep)
    u = float(full_recompute_units(np.array([CkptMode.FULL]))[0])
    kappa = 600.0 + 7.0 * 128 / ep  # kernels per block and micro-batch, full-recompute units
    for st, n_moe in ((ctx.shapes.first, 7), (ctx.shapes.last, 8)):
        want = 8 * kappa * u * 20e-6 + (n_moe * 5e-3 * u if ep > 1 else 0.0) + 1e-3
        assert float(stage_dispatch(ctx, LAW, st)[0]) == pytest.approx(want, rel=1e-12)


def test_dp_windows_are_each_stages_own_pass():
    est, ctx = _ctx()
    k = layer_kernels(ctx)
    lt = layer_totals(k, ctx.lay.ckpt, np.zeros(1), True)
    st = [ctx.shapes.first, ctx.shapes.last]
    quiet = [np.zeros(1), np.zeros(1)]  # no host time: the GPU passes set the windows
    fwd, bwd = dp_windows(ctx, k, lt, st, quiet)
    moe_b = k.attn_b + k.sd_b + k.ew_b + k.tp_b + k.cp_b + k.moe_b + k.sh_b
    dense_b = k.attn_b + k.sd_b + k.ew_b + k.tp_b + k.cp_b + k.dense_b
    assert float(bwd[0, 0]) == pytest.approx(float(dense_b[0] + 7 * moe_b[0]), rel=1e-12)
    assert float(bwd[1, 0]) == pytest.approx(float(8 * moe_b[0]), rel=1e-12)
    # a host slower than both passes sets them: its forward share (1 of the mode's kernel units) and the rest
    slow = [np.full(1, 10.0), np.full(1, 20.0)]
    fwd, bwd = dp_windows(ctx, k, lt, st, slow)
    share = 1.0 / float(kernel_units(np.array([CkptMode.FULL]))[0])
    assert fwd[:, 0].tolist() == pytest.approx([10 * share, 20 * share])
    assert bwd[:, 0].tolist() == pytest.approx([10 * (1 - share), 20 * (1 - share)])
