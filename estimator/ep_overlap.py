"""The EP all-to-all under --overlap-moe-expert-parallel-comm (``Stack.a2a_overlap``): what stays exposed.

Megatron-Core (core_v0.19.0 pipeline_parallel/combined_1f1b.py, models/common/model_chunk_schedule_plan.py
``TransformerLayerSchedulePlan.run``) runs one micro-batch's forward merged with another's backward, forward layer
i with backward layer L - 1 - i, on a compute and a communication stream:

    comm stream: combine_bwd       | dispatch_fwd -> dispatch_bwd     | combine_fwd
    comp stream: pre_dispatch_fwd  | mlp_bwd -> mlp_bwd_dw -> mlp_fwd  | pre_dispatch_bwd

The host issues the nine parts of a layer pair in that order (combine_bwd, pre_dispatch_fwd, mlp_bwd, dispatch_fwd,
mlp_bwd_dw, dispatch_bwd, mlp_fwd, combine_fwd, pre_dispatch_bwd); each stream runs its parts in order, and a part
waits for its input: mlp_bwd for combine_bwd, dispatch_fwd for pre_dispatch_fwd, dispatch_bwd for mlp_bwd, mlp_fwd
for dispatch_fwd, combine_fwd for mlp_fwd, pre_dispatch_bwd for dispatch_bwd. The pair ends with the last part
(:func:`layer_pair_time`, about max(c_b, P_f) + max(d_f, M_b) + max(d_b, W + M_f) + max(c_f, P_b)); what it adds to
the computation alone is the exposed wire time of its four exchanges, a each.
P is the pre-dispatch part (attention, norms, element-wise, TP and CP exchanges, router, top-k, permutation), M
the experts and the shared expert (which --moe-shared-expert-overlap, refused with this flag, would otherwise run
under the exchange): M_b their data gradients and W their weight gradients, delayed by --delay-wgrad-compute, each
half of their backward (a GEMM's two gradients cost alike). The windows leave recompute out (it runs inside the
backward nodes), so they are never longer than the schedule's.

Only the merged passes overlap. At PP = 1 the first micro-batch's forward and the last one's backward run alone; in
an interleaved pipeline the warm-up forwards and cool-down backwards do, (PP - 1) 2 + (VPP - 1) PP + 1 model chunks
each at rank 0 (core_v0.19.0 schedules.get_pp_rank_microbatches: num_warmup_microbatches and the one more this
overlap schedules, the most of any rank): u = that over VPP micro-batches, whose exchanges stay exposed. Per
micro-batch: x + (4 a - x) min(u, n_mb) / n_mb. Seconds, arrays over plans.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from numpy.typing import ArrayLike

from scaleplan.estimator.kernels import LayerKernels


def unmerged_microbatches(pp: ArrayLike, vpp: ArrayLike, n_mb: ArrayLike) -> np.ndarray:
    """Micro-batches whose forward (and, as many, whose backward) runs unmerged on the rank with the longest warm-up
    (module docstring): 1 at PP = 1, ((PP - 1) 2 + (VPP - 1) PP + 1) / VPP otherwise, at most n_mb."""
    pp, vpp = np.asarray(pp, dtype=float), np.asarray(vpp, dtype=float)
    u = np.where(pp > 1, (2.0 * (pp - 1.0) + (vpp - 1.0) * pp + 1.0) / vpp, 1.0)
    return np.minimum(u, np.asarray(n_mb, dtype=float))


def layer_pair_time(a: ArrayLike, pre_f: ArrayLike, pre_b: ArrayLike, mlp_f: ArrayLike, mlp_b: ArrayLike,
                    wgrad: ArrayLike) -> np.ndarray:
    """Seconds of one merged MoE layer pair on the compute and communication streams (module docstring): ``a`` one
    exchange's wire time, ``pre_f`` / ``pre_b`` the pre-dispatch forward / backward, ``mlp_f`` the experts' forward,
    ``mlp_b`` their data gradients, ``wgrad`` their weight gradients. Arrays over plans."""
    comb_b = np.asarray(a, dtype=float)                # comm: combine_bwd, from 0
    t1 = np.maximum(comb_b, pre_f)                     # comp: pre_dispatch_fwd from 0; mlp_bwd waits for combine_bwd
    mlp_b_end = t1 + mlp_b
    disp_f_end = t1 + a                                # comm: dispatch_fwd after combine_bwd and pre_dispatch_fwd
    disp_b_end = np.maximum(disp_f_end, mlp_b_end) + a  # comm: dispatch_bwd after mlp_bwd
    mlp_f_end = np.maximum(mlp_b_end + wgrad, disp_f_end) + mlp_f  # comp: after mlp_bwd_dw, waits for dispatch_fwd
    comb_f_end = np.maximum(disp_b_end, mlp_f_end) + a  # comm: combine_fwd after mlp_fwd
    pre_b_end = np.maximum(mlp_f_end, disp_b_end) + pre_b  # comp: pre_dispatch_bwd waits for dispatch_bwd
    return np.maximum(comb_f_end, pre_b_end)


def exposed_a2a(k: LayerKernels, pp: ArrayLike, vpp: ArrayLike, n_mb: ArrayLike) -> np.ndarray:
    """Exposed EP all-to-all seconds per MoE layer and micro-batch, forward and backward together (module
    docstring); ``k.a2a_f`` holds a dispatch and a combine, so one exchange is half of it."""
    a = k.a2a_f / 2.0
    common_f, common_b = k.common()
    pre_f, pre_b = common_f + k.rg_f + k.tk_f + k.perm, common_b + k.rg_b + k.tk_b + k.perm_b
    mlp_f, grad = k.ex_f + k.sh_f, (k.ex_b + k.sh_b) / 2.0
    merged = layer_pair_time(a, pre_f, pre_b, mlp_f, grad, grad) - (pre_f + pre_b + mlp_f + 2.0 * grad)
    share = unmerged_microbatches(pp, vpp, n_mb) / np.asarray(n_mb, dtype=float)
    return merged + (4.0 * a - merged) * share


def with_overlapped_a2a(k: LayerKernels, pp: ArrayLike, vpp: ArrayLike, n_mb: ArrayLike) -> LayerKernels:
    """``k`` with its all-to-all terms the exposed part (:func:`exposed_a2a`), half in each pass: what every later
    term (the layer totals, the breakdown's ep_a2a, eq:desync's wire time) then reads."""
    x = exposed_a2a(k, pp, vpp, n_mb) / 2.0
    return replace(k, a2a_f=x, a2a_b=x)
