"""The training stack inside an evaluation (scaleplan/stack.py): a calibration is in force for its own stack
only, the host launches what the stack launches beyond the law's (estimator/kernel_counts.py), the all-gather
dispatcher's exchange, and the memory each stack feature takes, against hand counts of Megatron-Core's
tensors (estimator/stack_memory.py)."""
from __future__ import annotations

import numpy as np
import pytest
from scaleplan.estimator import Estimator
from scaleplan.estimator.analytic import ALPHA_INTRA_S
from scaleplan.estimator.dispatch import full_recompute_units
from scaleplan.estimator.kernels import layer_kernels
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.memory import memory_breakdown
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.stages import layer_totals, stage_dispatch

from scaleplan.db import calibrations as store
from scaleplan.db import session as dbs
from scaleplan.specs import Layout, parse_spec
from scaleplan.stack import Stack

from .conftest import context, moe_spec

P = "p6-b200.48xlarge"
DEEPEP = Stack(dispatcher="deepep")


def _spec(stack: dict | None = None, **over):
    return parse_spec({**moe_spec(optimizer={"optimizer_type": "adamw"}, **over), "stack": stack or {}})


def test_a_calibration_is_applied_to_plans_of_its_own_stack_only(sqlite_url):
    with dbs.session_scope(sqlite_url) as s:
        store.store_calibration(s, P, "dispatch", {"t_gap_s": 9e-5, "kappa0": 700.0}, inputs={}, residuals=[],
                                cv_error=None, n_obs=1, notes="")
    est = Estimator(P, db_url=sqlite_url)
    bare = Estimator(P, db_url=sqlite_url, use_calibration=False)
    assert est.dispatch.t_gap_s == 9e-5 and bare.dispatch.t_gap_s != 9e-5
    other = est.for_stack(DEEPEP, "bf16")
    assert other.dispatch == bare.dispatch and other is est.for_stack(DEEPEP, "bf16")
    lay = [Layout(pp=2, ep=8)]
    mine, theirs = (est.estimate(_spec(st), 32, lay)[0] for st in ({}, {"dispatcher": "deepep"}))
    assert mine.t_iter_s != bare.estimate(_spec(), 32, lay)[0].t_iter_s
    assert theirs.t_iter_s == bare.estimate(_spec({"dispatcher": "deepep"}), 32, lay)[0].t_iter_s
    # a calibration of the DeepEP stack is that stack's, and the paper's stack keeps its own
    with dbs.session_scope(sqlite_url) as s:
        store.store_calibration(s, P, "dispatch", {"t_gap_s": 3e-5}, inputs={}, residuals=[], cv_error=None,
                                n_obs=1, notes="", stack=DEEPEP.key())
    est = Estimator(P, db_url=sqlite_url)
    assert est.for_stack(DEEPEP, "bf16").dispatch.t_gap_s == 3e-5 and est.dispatch.t_gap_s == 9e-5


def test_the_grouped_kernel_takes_the_per_expert_gemm_launches_off_the_host(recorded_db):
    """TE's GroupedLinear launches one cuBLAS GEMM per local expert: fc1 and fc2 forward (twice under full
    recompute) and their data and weight gradients, 8 per expert; the grouped kernel launches 8 in all. On 16
    local experts the host launches 120 fewer kernels per MoE layer (eight per expert, less the grouped kernel's
    eight), at the law's t_gap each: two stock stacks apart in that option alone (GEMMs count one launch each at
    any framework scale)."""
    est = Estimator(P, db_url=recorded_db, use_calibration=False)
    g = geometry(_spec().model)
    lay = ParallelLayout.of(pp=2, dp=2, ep=8, ckpt=np.array([3]))
    per_stack = []
    for st in (Stack(permute_fusion=True), Stack(permute_fusion=True, grouped_gemm="grouped")):
        ctx = context(est, g, lay, E_loc=[16.0])
        ctx = type(ctx)(**{**ctx.__dict__, "stack": st})
        per_stack.append(float(stage_dispatch(ctx, est.dispatch, ctx.shapes.first)[0]))
    n_moe = np.asarray(ctx.shapes.first.n_moe, dtype=float)
    units = float(full_recompute_units(lay.ckpt)[0])
    assert per_stack[0] - per_stack[1] == pytest.approx(float(n_moe[0]) * 120 * units * est.dispatch.t_gap_s)


def test_the_all_gather_dispatcher_moves_ep_over_k_times_the_all_to_alls_bytes_after_the_shared_expert():
    """MoEAllGatherTokenDispatcher gathers every EP rank's tokens (then reduce-scatters the combine): on
    analytic links, the 700M's K = 3 over EP 8 moves 8/3 the all-to-all's bytes; the shared expert runs after
    it, not under it (no --moe-shared-expert-overlap)."""
    est = Estimator.from_frames(P, {})
    g = geometry(_spec().model)
    lay = ParallelLayout.of(ep=np.array([8]), ckpt=np.array([0]))
    k = {}
    for st in (Stack(), Stack(dispatcher="allgather")):
        ctx = context(est, g, lay)
        k[st.dispatcher] = layer_kernels(type(ctx)(**{**ctx.__dict__, "stack": st}))
    # each of a pass's two exchanges: 7 ring steps of intra-node latency, then (7/8) of its buffer at the link
    bw_part = {d: kk.a2a_f[0] / 2 - 7 * ALPHA_INTRA_S for d, kk in k.items()}
    assert bw_part["allgather"] / bw_part["alltoall"] == pytest.approx(8 / 3, rel=1e-6)
    kk, fw, ck = k["allgather"], np.zeros(1), lay.ckpt
    apart, under = layer_totals(kk, ck, fw, True, overlap=False), layer_totals(kk, ck, fw, True)
    hidden = min(kk.sh_f[0], kk.a2a_f[0]) + min(kk.sh_b[0], kk.a2a_b[0])
    assert apart.moe[0] - under.moe[0] == pytest.approx(hidden)


# the small model of tests/test_stack.py: 4 layers (the first dense), d 1024, 8 experts of width 1024
MODEL = {"n_layers": 4, "hidden_sz": 1024, "inter_sz": 2048, "n_q_heads": 8, "n_kv_heads": 8, "head_dim": 128,
         "vocab_sz": 32000, "moe": {"n_experts": 8, "experts_per_token": 2, "expert_inter_sz": 1024}}
D = 1024
# linear-layer parameters by hand: attention QKV (d x 3 x 8 x 128) and output (1024 x d) on 4 layers, the dense
# SwiGLU MLP (d x 2 x 2048 + 2048 x d), 3 MoE layers of 8 SwiGLU experts (d x 2 x 1024 + 1024 x d)
LINEAR = 4 * (D * 3 * 1024 + 1024 * D) + (D * 2 * 2048 + 2048 * D) + 3 * 8 * (D * 2 * 1024 + 1024 * D)
OTHER = 2 * 32000 * D + 3 * 8 * D  # untied embedding and output layer, the routers


def _mem(precision: str, stack: Stack, non_tn: bool = True):
    g = geometry(parse_spec({"model": {**MODEL, "precision": precision}, "stack": {}}).model)
    m = memory_breakdown(g, ParallelLayout.of(ckpt=np.array([0])), 8, 1024, "adamw", stack=stack, non_tn=non_tn)
    return {k: float(v[0]) for k, v in m.items()}


def test_the_gradient_buffer_is_fp32_unless_the_stack_reduces_in_bf16():
    fp32, bf16 = _mem("bf16", Stack()), _mem("bf16", Stack(grads_fp32=False))
    assert fp32["weights"] == pytest.approx(2 * (LINEAR + OTHER), rel=1e-3)
    assert fp32["grads"] == pytest.approx(4 * (LINEAR + OTHER), rel=1e-3)
    assert bf16["grads"] == pytest.approx(2 * (LINEAR + OTHER), rel=1e-3)


@pytest.mark.parametrize("stack, non_tn, per_linear", [
    (Stack(fp8_recipe="tensorwise"), True, 2 + 1),            # bf16 weight + one FP8 copy (Blackwell)
    (Stack(fp8_recipe="tensorwise"), False, 2 + 2),           # + its transpose (Hopper's TN-only FP8 GEMMs)
    (Stack(fp8_recipe="mxfp8"), True, 2 + 2 * (1 + 1 / 32)),  # row- and column-wise MXFP8 with E8M0 scales
    (Stack(fp8_recipe="mxfp8", fp8_param=True), True, 2 * (1 + 1 / 32)),  # FP8 primary weights: no bf16 copy
])
def test_fp8_weights_as_transformer_engine_keeps_them(stack, non_tn, per_linear):
    m = _mem("fp8", stack, non_tn)
    assert m["weights"] == pytest.approx(per_linear * LINEAR + 2 * OTHER, rel=1e-3)
    # the optimizer's fp32 master and moments are the bf16 model's
    assert m["optimizer"] == pytest.approx(_mem("bf16", Stack())["optimizer"])
