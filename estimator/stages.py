"""The work of each pipeline stage per micro-batch: one layer's totals (forward, backward, what the
checkpoint mode recomputes, the framework kernels), then each stage's GPU time, exposed EP all-to-all and
host dispatch from the blocks the shapes record counts on it (:class:`~scaleplan.estimator.shapes.StageCounts`),
and the stage whose layers pace the step. Seconds per micro-batch, arrays over plans."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scaleplan.estimator.ckpt import FULL_UNITS, recompute
from scaleplan.estimator.context import EvalContext
from scaleplan.estimator.dispatch import DispatchLaw, dispatch_time, ep_host_time
from scaleplan.estimator.kernel_counts import counted_as_stock, expert_bias_kernels, stack_extra_kernels
from scaleplan.estimator.kernels import LayerKernels, bias_product_bytes
from scaleplan.estimator.pipeline import Middle, StageWork
from scaleplan.estimator.shapes import StageCounts

from scaleplan.stack import stack_from_key


@dataclass(frozen=True)
class LayerTotals:
    """One block's seconds per micro-batch (arrays over plans): forward, backward, recompute and framework
    kernels together (``moe``, ``dense``), their forward and backward parts, and the all-to-all wire time
    the shared expert leaves exposed per MoE block (``a2a_x``)."""

    common_f: np.ndarray  # attention, SDPA, element-wise, TP and CP comm, forward
    common_b: np.ndarray  # the same, backward
    dense_f: np.ndarray   # a dense block, forward
    dense_b: np.ndarray   # a dense block, backward
    moe: np.ndarray       # an MoE block in all (zeros for a dense model)
    dense: np.ndarray     # a dense block in all
    a2a_x: np.ndarray     # exposed all-to-all per MoE block (fwd, recompute, bwd)
    fw: np.ndarray        # the framework kernels of one block (fwd + bwd + recompute)
    moe_f: np.ndarray     # an MoE block's forward on the GPU, without its exposed all-to-all and framework kernels
    fw_f: np.ndarray      # the framework kernels' forward share (they issue with the layer's kernels: 1 unit)


def layer_totals(k: LayerKernels, ckc: np.ndarray, fw: np.ndarray, is_moe: bool,
                 overlap: bool = True, modules: Iterable[str] | None = None, mla: bool = False) -> LayerTotals:
    """:class:`LayerTotals` from the kernels ``k``, the checkpoint mode codes ``ckc`` and one block's
    framework kernels ``fw``; the shared expert runs under the routed all-to-all (the max of the two) where
    the stack ``overlap``s them (--moe-shared-expert-overlap: the alltoall and flex dispatchers), else after it.
    ``modules``: what the stack's selective checkpointing recomputes (estimator/recompute.py; None: core_attn);
    ``mla``: the attention's input norm is a separate module too."""
    common_f, common_b = k.common()
    both = np.maximum if overlap else np.add
    moe_lf = common_f + k.moe_f + both(k.sh_f, k.a2a_f)
    moe_lb = common_b + k.moe_b + both(k.sh_b, k.a2a_b)
    den_lf, den_lb = common_f + k.dense_f, common_b + k.dense_b
    r = recompute(ckc, modules)
    part_f = r.sdpa * k.sd_f + r.mla_up * k.mla_up_f
    rc_moe = np.where(r.block > 0, moe_lf, part_f + r.pointwise * k.ew_f + r.pointwise * (k.perm if is_moe else 0.0)
                      + r.norm * (1.0 + mla) * k.norm_f + r.act * k.act_f + r.shared * k.sh_f
                      + r.moe * (k.moe_f + both(k.sh_f, k.a2a_f)))
    rc_den = np.where(r.block > 0, den_lf, part_f + r.pointwise * k.ew_f + r.norm * float(mla) * k.norm_f
                      + r.mlp * k.dense_f)
    a2a_x = (both(k.sh_f, k.a2a_f) - k.sh_f) * (1 + r.block + r.moe) + both(k.sh_b, k.a2a_b) - k.sh_b
    moe = moe_lf + moe_lb + rc_moe + fw if is_moe else np.zeros(np.shape(den_lf))
    return LayerTotals(common_f, common_b, den_lf, den_lb, moe, den_lf + den_lb + rc_den + fw,
                       a2a_x if is_moe else np.zeros(np.shape(den_lf)), fw,
                       common_f + k.moe_f + k.sh_f if is_moe else np.zeros(np.shape(den_lf)), fw / r.units)


def stage_gpu(lt: LayerTotals, st: StageCounts, is_moe: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(its layers' GPU seconds with the exposed all-to-all, that all-to-all, their forward pass's part of the
    first) of stage ``st``."""
    fw_f = st.n_layers * lt.fw_f
    if not is_moe:
        return st.n_layers * lt.dense, np.zeros(np.shape(lt.dense)), st.n_layers * lt.dense_f + fw_f
    return (st.n_dense * lt.dense + st.n_moe * lt.moe, st.n_moe * lt.a2a_x,
            st.n_dense * lt.dense_f + st.n_moe * lt.moe_f + fw_f)


@dataclass(frozen=True)
class PipelineWork:
    """Each stage's work per micro-batch (:class:`~scaleplan.estimator.pipeline.StageWork`) and the stage
    with the most layer work: its blocks and MoE blocks and their GPU seconds (``t_cmp``)."""

    first: StageWork
    middle: Middle
    last: StageWork
    slowest_layers: np.ndarray  # blocks on the stage with the most layer work
    slowest_moe: np.ndarray     # its MoE blocks
    t_cmp: np.ndarray


def stage_dispatch(ctx: EvalContext, law: DispatchLaw, st: StageCounts) -> np.ndarray:
    """The host's seconds to launch one micro-batch of stage ``st`` by the kernel-count law
    (:func:`~scaleplan.estimator.dispatch.dispatch_time`), with what the plans' training stack launches
    beyond the stack the law was counted on (:func:`~scaleplan.estimator.kernel_counts.stack_extra_kernels`):
    the EP host term once per MoE block the stage holds (a dense block launches no token permute or
    all-to-all). Zero where the stack replays the whole step as one CUDA graph (Stack.captures_step): the host
    reads each micro-batch's inputs into the graph's buffers and launches it once (not costed)."""
    g, lay = ctx.g, ctx.lay
    if ctx.stack.captures_step():  # one graph replays the step: nothing is launched or waited for one by one
        return np.zeros(ctx.P)
    n_moe = st.n_moe if g.is_moe else 0.0
    E_loc = ctx.shapes.E_loc if g.is_moe else 0.0
    extra = 0.0
    law_stack = stack_from_key(law.kappa_stack)
    if ctx.stack.key(g.precision) != law.kappa_stack:
        per_moe, per_dense = stack_extra_kernels(ctx.stack, law_stack, np.asarray(E_loc),
                                                 lay.ep, g.precision, law.kappa0, g.glu, g.has_shared)
        extra = n_moe * per_moe + (st.n_layers - n_moe) * per_dense
    if g.is_moe and g.bias == "all":  # a model feature, not a stack's: the law's traced models have no biases
        extra = extra + n_moe * expert_bias_kernels(E_loc, bias_product_bytes(ctx) > ctx.shapes.b_el)
    r = recompute(lay.ckpt, ctx.stack.recompute_modules)
    units = r.units / FULL_UNITS
    drop_pad = bool(np.all(np.asarray(g.capacity_factor) != 1.0))
    ep_host = ep_host_time(law, law_stack.dispatcher, ctx.stack.dispatcher, units, 1.0 + r.block + r.moe, drop_pad,
                           counted_as_stock(ctx.stack, law_stack))
    return dispatch_time(law, st.n_layers, E_loc, lay.ckpt, n_moe, lay.ep, extra, units, ep_host)


def forward_share(ctx: EvalContext) -> np.ndarray:
    """The forward pass's share of a stage's host launch time per plan: its kernel unit (1) over the checkpoint
    mode's units with the stack's recompute modules (estimator/ckpt.py, estimator/recompute.py)."""
    return 1.0 / recompute(ctx.lay.ckpt, ctx.stack.recompute_modules).units


def dp_windows(ctx: EvalContext, k: LayerKernels, lt: LayerTotals, stages: list[StageCounts],
               disp: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) overlap windows of each stage's DP traffic, seconds, shape (stages, P): the wall
    time of one of the stage's forward / backward passes, its layers on the GPU without the exposed EP
    all-to-all (the traffic shares its links) or, when the pass is dispatch-bound, the host's share of the
    stage's launch time ``disp`` (in the checkpoint mode's kernel units: forward 1, backward with its
    recompute the rest), whichever is longer: the NCCL stream runs meanwhile."""
    share_f = forward_share(ctx)
    moe_b = lt.common_b + k.moe_b + k.sh_b
    fwd, bwd = [], []
    for st, t_disp in zip(stages, disp):
        if ctx.g.is_moe:
            f, b = st.n_dense * lt.dense_f + st.n_moe * lt.moe_f, st.n_dense * lt.dense_b + st.n_moe * moe_b
        else:
            f, b = st.n_layers * lt.dense_f, st.n_layers * lt.dense_b
        fwd.append(np.maximum(f, share_f * t_disp))
        bwd.append(np.maximum(b, (1 - share_f) * t_disp))
    return np.stack(fwd), np.stack(bwd)


def pipeline_work(ctx: EvalContext, lt: LayerTotals, disp: dict[str, np.ndarray]) -> PipelineWork:
    """Every stage's :class:`StageWork` from the shapes' stage counts, ``disp`` their host seconds per
    micro-batch by stage name (first, middle_lo, middle_hi, middle, last), and the slowest stage."""
    sh, moe, seen = ctx.shapes, ctx.g.is_moe, {}
    share_f = forward_share(ctx)
    # the host waits for the device between a micro-batch's passes (estimator/pipeline.stage_periods)
    split = np.logical_or(moe, (np.asarray(ctx.lay.vpp) == 1) & (np.asarray(ctx.lay.pp) > 1))
    # under --overlap-moe-expert-parallel-comm the dispatcher's host sync comes while the other pass's exchange is
    # in flight, so what stays exposed of the exchanges joins the GPU side of the max instead of adding after it
    merged = bool(moe and ctx.stack.a2a_overlap)

    def work(name: str) -> tuple[StageWork, np.ndarray]:
        st = getattr(sh, name)  # once per distinct blocks (StageCounts.blocks) and host time
        key = (*st.blocks, id(disp[name]))
        if key not in seen:
            t, a2a, t_f = stage_gpu(lt, st, moe)
            after = 0.0 if merged else a2a  # merged: the exposed exchanges share the GPU timeline the host races
            seen[key] = StageWork(t - after, disp[name], after, t_f + (a2a - after) / 2.0, share_f, split), t
        return seen[key]

    (first, t0), (last, tl), (lo, tlo), (hi, thi), (mean, _) = (
        work(n) for n in ("first", "last", "middle_lo", "middle_hi", "middle"))
    pp, has_mid = ctx.lay.pp, sh.n_middle > 0
    # the pacing stage by layer work, the first of equals in this order
    cands = [(t0, sh.first), (np.where(pp > 1, tl, 0.0), sh.last), (np.where(has_mid, thi, 0.0), sh.middle_hi),
             (np.where(has_mid, tlo, 0.0), sh.middle_lo)]
    t_cmp, n_layers, n_moe = cands[0][0], sh.first.n_layers, sh.first.n_moe
    for t, c in cands[1:]:
        later = t > t_cmp  # strictly: the first of equals keeps it
        t_cmp, n_layers, n_moe = (np.where(later, t, t_cmp), np.where(later, c.n_layers, n_layers),
                                  np.where(later, c.n_moe, n_moe))
    shape = np.shape(t_cmp)
    return PipelineWork(first, Middle(sh.n_middle, lo, hi, mean), last, np.broadcast_to(n_layers, shape),
                        np.broadcast_to(n_moe, shape), t_cmp)
