"""Kernels one MoE layer launches per micro-batch on a given training stack, counted from Megatron-Core
(core_v0.19.0) and Transformer Engine (2.x) code, and what that does to the dispatch law
(sec:iteration-time-model, "Compute versus dispatch").

The law's kappa(E_loc) = kappa0 + kappa1 E_loc was counted on profiler traces of the paper's stack
(estimator/dispatch.py): grouped experts whose GEMMs TE issues one per local expert, unfused permutation
and router, the all-to-all dispatcher, bf16, no CUDA graphs. kappa0 (642 per layer and micro-batch in
full-recompute units) holds many small framework kernels this module does not list one by one (autograd's
casts and copies, memsets, sorting passes); what it lists are the parts a stack choice changes, so that
another stack's count is the law's plus the difference of the two lists (:func:`kappa_delta`):

* ``router_scores``: the top-k with its score function (unfused in moe_utils.topk_routing_with_score_function:
  topk, softmax, zeros + scatter of the probabilities, zeros + scatter + bool cast of the routing map: 7
  forward; softmax, gather and index-scatter backward: 4) or TE's fused_topk_with_score_function (1, 1);
  the aux-loss scores (compute_routing_scores_for_aux_loss: softmax, topk, zeros + scatter: 4 forward, 3
  backward; fused: 1, 1).
* ``permute`` (dispatch_preprocess, moe_utils.permute): unfused, the routing map's transpose copy, a stable
  argsort of T E flags (a segmented radix sort: 4 kernels), the modulo, the probabilities' transpose and
  gather, the token index_select (9 forward; index_add into zeros for the tokens and the probabilities,
  the transpose's: 5 backward); fused (TE moe_permute_with_probs: the row-id map in 3 kernels and the
  permute: 4 forward, 1 backward).
* ``a2a``: all-to-all of tokens and probabilities (dispatch) and of the expert output (combine): 3 NCCL
  kernels forward, 3 backward, EP > 1; the chunk sort by local expert after the dispatch and its inverse
  before the combine (sort_chunks_by_idxs: one torch.cat each for tokens, probabilities and output, or TE's
  fused sort: 3 forward, 3 backward either way, E_loc > 1 and EP > 1); DeepEP / HybridEP replace all of it
  with their fused dispatch (layout, notify, dispatch: 3) and combine (1) kernels, forward and backward.
* ``unpermute`` (combine_postprocess, moe_utils.unpermute without probabilities: the alltoall dispatcher
  applies them before fc2): zeros + scatter_add forward, a gather backward (2, 1); fused 1, 1.
* ``expert_gemms``: fc1 and fc2 (TE GroupedLinear or, per expert, TE Linear): forward 2 G, backward 4 G
  (data and weight gradients), G = E_loc GEMMs per call on the per-expert paths (TE's
  nvte_multi_stream_cublas_gemm loops cuBLAS over the groups), 1 on the grouped-kernel path.
* ``expert_act``: the SwiGLU weighted by the routing probabilities (weighted_bias_swiglu: 1 forward,
  1 backward per call; SequentialMLP calls it per expert and concatenates the outputs: + 1 each way).
* ``fp8_quantize``: the casts of each GEMM input (forward: the activations of fc1 and fc2; backward: their
  output gradients), per call of TE's split_quantize / quantize (:data:`QUANTIZE_KERNELS`): delayed
  scaling one fused multi-tensor cast-transpose for all groups (nvte_multi_cast_transpose), current
  scaling an amax, a scale and a cast per tensor, blockwise and MXFP8 one kernel per tensor (TE 2.14 to main:
  cast.cpp split_quantize allocates MXFP8 and blockwise splits in bulk, then multi_tensor_quantize_impl fuses
  only delayed scaling's splits and loops nvte_quantize_v2 over the others, one row- and column-wise kernel per
  non-empty split); the grouped-tensor path quantizes all groups at once (group_quantize). Weights are quantized on the first
  micro-batch of a step only (TE caches them: is_first_microbatch) and are left out.
* ``fp8_swizzle``: under MXFP8, the weights' scale swizzle before each GEMM that reads them (:func:`_swizzles`):
  one multi-tensor kernel per GroupedLinear call on either expert path, one per Linear; activations and
  output gradients are quantized in the GEMM's scale layout.
* ``fp8_padding``: TE's Fp8Padding of the tokens and the probabilities to the recipe's alignment
  (fused_multi_row_padding, 1 each) and the unpadding of the output (1), forward and backward, when the
  groups' rows are not aligned (the routed counts are not, in general); SequentialMLP pads each expert's
  tokens and probabilities with zeros + cat (4 per expert forward, none backward).
* ``attn_quantize``, ``shared_quantize``: FP8 casts of the layer's other GEMM inputs (QKV and output
  projection; the shared expert's fc1 and fc2), one quantize per input forward and per output gradient
  backward; delayed scaling also reduces and updates the amax history when each layer's fp8_autocast ends
  (3 forward, 3 backward, counted with the attention).

The law's kappa0 (642 traced kernels per layer and micro-batch) is 4.9 times the 130 framework kernels named
here for its stack: the traces count launches a reading of the code does not name one by one (autograd's
casts, copies and memsets, sorting passes). A change to those parts moves the launches by that factor
(:func:`framework_scale`); GEMMs and TE's quantize kernels are single C++ launches, counted one each.

On stock Megatron-Core (any stack the spec describes, beside the law counted on the paper's stack:
:func:`counted_as_stock`) the host issues fewer launches per named kernel than the paper's traces counted:
Megatron-Bridge's rank-0 Nsight profile of one step of its H100 BF16 V1 Qwen3-30B-A3B workload holds 463,348
kernels, 151 per layer and micro-batch, where the law's 4.9 per named kernel gives that stack 252. The host's count
there is the stack's named kernels at that profile's :func:`stock_framework_scale` (2.7), GEMMs and quantize kernels
one each (:func:`host_framework_scale`).
The device-side framework term (estimator/model.py) keeps the law's count: it is not a launch count but the
device time of the work no table costs at the shortest kernel's time each, and the GB200 steps captured whole,
which read the device side alone, land within 1% with it (docs/accuracy.md).

CUDA graphs (``stack.cuda_graphs``): the captured parts launch as one graph per pass
(:func:`graph_savings`); their kernels still run on the device, only the host stops issuing them.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from scaleplan.stack import Stack

# kernels per quantized tensor (or per grouped call, "grouped") of each recipe (module docstring)
QUANTIZE_KERNELS = {"delayed": 1, "tensorwise": 3, "blockwise": 1, "mxfp8": 1}
# the fused multi-tensor cast of delayed scaling takes every group in one kernel; so does the grouped path
_ONE_CALL_FOR_ALL_GROUPS = ("delayed",)
DELAYED_AMAX_UPDATE = 3  # per layer and pass: amax history roll, scale update, amax all-reduce

# (forward, backward) kernels of the parts the stack does not change but CUDA graphs capture
# attention block: norm, QKV GEMM, RoPE q and k, cuDNN attention (2), output GEMM, bias-dropout-add;
# backward: two data-gradient and two weight-gradient GEMMs, attention (3), RoPE (2), norm (2), residual
ATTENTION_KERNELS = (8, 12)
# the router's gating GEMM in fp32 (router_gating_linear: two casts and the GEMM; backward two GEMMs and
# two casts back) and the token counts before the dispatch (preprocess: sum, cast, split sums, the
# all-gather of the counts, slice, two sums)
GATING_KERNELS = (3, 4)
PREPROCESS_KERNELS = (7, 0)
DENSE_MLP_KERNELS = (4, 8)  # norm, fc1, SwiGLU, fc2; backward the GEMMs' gradients, SwiGLU, norm


@dataclass(frozen=True)
class LayerCounts:
    """Kernels one MoE layer launches per micro-batch, by part (module docstring), forward and backward;
    each value a float array over plans."""

    fwd: dict[str, np.ndarray]
    bwd: dict[str, np.ndarray]

    def total(self, parts: Iterable[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(forward, backward) kernels summed over ``parts`` (default: all)."""
        keys = self.fwd.keys() if parts is None else parts
        return sum(self.fwd[k] for k in keys), sum(self.bwd[k] for k in keys)

    def full_recompute_units(self, parts: Iterable[str] | None = None) -> np.ndarray:
        """Kernels per layer and micro-batch under full recompute (the law's unit): 2 forward + backward."""
        f, b = self.total(parts)
        return 2.0 * f + b


def _quantize(recipe: str | None, groups, grouped_kernel: bool):
    """Quantize kernels of one GroupedLinear input of ``groups`` tensors (arrays)."""
    if recipe is None:
        return np.zeros_like(groups)
    per = QUANTIZE_KERNELS[recipe]
    return np.full_like(groups, per) if (grouped_kernel or recipe in _ONE_CALL_FOR_ALL_GROUPS) else per * groups


def moe_layer_counts(stack: Stack, E_loc: ArrayLike, ep: ArrayLike, precision: str, glu: bool = True,
                     shared_expert: bool = False) -> LayerCounts:
    """:class:`LayerCounts` of one MoE layer (arrays over plans of ``E_loc`` local experts and ``ep``) on
    ``stack`` for a model in ``precision`` (its FP8 recipe: :meth:`Stack.recipe`). Raises nothing."""
    E_loc = np.asarray(E_loc, dtype=float)
    multi = (np.asarray(ep) > 1).astype(float)
    one = np.ones_like(E_loc)
    recipe = stack.recipe(precision)
    f, b = {}, {}
    fused_r = stack.router_fusion
    f["router_scores"], b["router_scores"] = one * (2 if fused_r else 11), one * (2 if fused_r else 7)
    f["permute"], b["permute"] = one * (4 if stack.permute_fusion else 9), one * (1 if stack.permute_fusion else 5)
    f["a2a"], b["a2a"] = _dispatch_counts(stack, E_loc, multi)
    f["unpermute"], b["unpermute"] = one * (1 if stack.permute_fusion else 2), one
    grouped_kernel = stack.experts == "grouped" and stack.grouped_gemm == "grouped"
    G = one if grouped_kernel else E_loc
    f["expert_gemms"], b["expert_gemms"] = 2 * G, 4 * G
    seq = stack.experts == "sequential"
    f["expert_act"] = b["expert_act"] = (E_loc + 1) if seq else one
    if seq:  # one TE Linear per expert and projection: a quantize per tensor, no multi-tensor fusion
        q = QUANTIZE_KERNELS[recipe] * E_loc if recipe else 0 * E_loc
        f["fp8_quantize"] = b["fp8_quantize"] = 2 * q
        f["fp8_padding"], b["fp8_padding"] = (4 * E_loc if recipe else 0 * E_loc), 0 * E_loc
    else:
        f["fp8_quantize"] = b["fp8_quantize"] = 2 * _quantize(recipe, E_loc, grouped_kernel)
        f["fp8_padding"] = b["fp8_padding"] = one * (3 if recipe else 0)
    f["fp8_swizzle"] = b["fp8_swizzle"] = _swizzles(recipe, E_loc, seq, shared_expert)
    q1 = QUANTIZE_KERNELS[recipe] if recipe else 0
    # QKV and output projection (with delayed scaling's amax update at the layer's autocast exit)
    f["attn_quantize"] = b["attn_quantize"] = one * (2 * q1 + (DELAYED_AMAX_UPDATE if recipe == "delayed" else 0))
    f["shared_quantize"] = b["shared_quantize"] = one * (2 * q1 if shared_expert else 0)
    if not glu:
        f["expert_act"], b["expert_act"] = f["expert_act"] + 1, b["expert_act"] + 1  # activation, then x probs
    return LayerCounts(f, b)


# MXFP8 scales are swizzled into cuBLAS's layout before a GEMM (TE 2.14 gemm.cpp swizzle_scales_for_gemm, and
# multi_tensor_swizzle_scales_for_gemm for a grouped call: one kernel per 64 tensors, swizzle.cu
# kMaxTensorsPerKernel). The modules quantize activations and output gradients straight into that layout
# (optimize_for_gemm in Linear, LayerNormLinear, GroupedLinear _get_quantizers); the cached weights are not,
# so every GEMM that reads weights (forward, data gradient) swizzles theirs again.
SWIZZLE_TENSORS_PER_KERNEL = 64


def _swizzles(recipe: str | None, E_loc, sequential: bool, shared_expert: bool) -> np.ndarray:
    """Scale-swizzle kernels per pass of one MoE layer under MXFP8 (zero otherwise): fc1 and fc2 (one multi-tensor
    kernel per GroupedLinear call, or one per expert's Linear in SequentialMLP), QKV and the output projection,
    the shared expert's fc1 and fc2."""
    if recipe != "mxfp8":
        return np.zeros_like(E_loc)
    experts = 2 * (E_loc if sequential else np.ceil(E_loc / SWIZZLE_TENSORS_PER_KERNEL))
    return experts + 2 + (2 if shared_expert else 0)


def _dispatch_counts(stack: Stack, E_loc, multi) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) kernels of the token exchange: all-to-alls and chunk sorts, or the fused
    dispatch / combine of DeepEP and HybridEP, or the all-gather dispatcher's gather and reduce-scatter."""
    sort = 3.0 * ((E_loc > 1) * multi)
    if stack.dispatcher == "alltoall":
        return 3.0 * multi + sort, 3.0 * multi + sort
    if stack.dispatcher == "allgather":  # all-gather tokens, probabilities and the routing map; reduce-scatter
        return 3.0 * multi, 1.0 * multi
    return 4.0 * multi, 4.0 * multi  # deepep / hybridep: layout + notify + dispatch, combine; the same back


PAPER_STACK = Stack()
# Parts whose named kernels come with launches the traces count and a reading of the code does not name
# (autograd's casts, copies and memsets, sorting passes, the framework's bookkeeping around each op): the law's
# kappa0 of 642 per layer and micro-batch is 4.9 times the 130 kernels named here for the paper's stack (EP > 1),
# so a change to these parts moves the launches by that factor (:func:`framework_scale`). GEMMs and TE's
# quantize kernels are single C++ launches and count one each (the law's kappa1, 7.29 per local expert, is
# the 8 per-expert GEMMs named here).
FRAMEWORK_PARTS = ("router_scores", "permute", "a2a", "unpermute", "expert_act", "fp8_padding")
# the framework kernels of an MoE layer no stack choice changes, in full-recompute units: the attention block, the
# router's gating GEMM and the token counts
NAMED_FIXED = sum(2.0 * f + b for f, b in (ATTENTION_KERNELS, GATING_KERNELS, PREPROCESS_KERNELS))


def named_framework_kernels(stack: Stack, E_loc: ArrayLike, ep: ArrayLike,
                            precision: str = 'bf16') -> np.ndarray:
    """Framework kernels named per MoE layer and micro-batch in full-recompute units: the attention block, the
    router's gating GEMM, the token counts and :data:`FRAMEWORK_PARTS` (arrays over plans)."""
    return NAMED_FIXED + moe_layer_counts(stack, E_loc, ep, precision).full_recompute_units(FRAMEWORK_PARTS)


def framework_scale(kappa0: float) -> float:
    """Launches per named framework kernel: the law's kappa0 over the kernels named for the stack it was
    counted on (the paper's, at EP 8 with 16 local experts, one of its two traced points)."""
    return float(kappa0 / named_framework_kernels(PAPER_STACK, np.array([16.0]), np.array([8]))[0])


# Megatron-Bridge's rank-0 Nsight profile of one step of its H100 BF16 V1 Qwen3-30B-A3B workload (NVIDIA-NeMo/
# Megatron-Bridge v0.6.0 skills/nemo-mbridge-perf-moe-comm-overlap, the overlap-off case: 16 H100, EP 16, micro-batch
# 1, global batch 1024, 48 MoE layers, 128 experts top-8): its kernels, its layers x micro-batches (1024 sequences
# over 16 data-parallel ranks), its local experts and EP, and its stack (qwen3_workload_base_configs H100_BF16_V1)
STOCK_TRACE_KERNELS = 463_348
STOCK_TRACE_LAYER_MICROBATCHES = 48 * (1024 // 16)
STOCK_TRACE_E_LOC, STOCK_TRACE_EP = 128 / 16, 16
STOCK_TRACE_STACK = Stack(dispatcher="hybridep", permute_fusion=True, router_fusion=True, grads_fp32=False,
                          cuda_graphs=("moe_router", "moe_preprocess"), cross_entropy="te", nan_check=False,
                          router_dtype="model")


@functools.cache
def stock_framework_scale() -> float:
    """Launches per named framework kernel on stock Megatron-Core: the kernels of one layer and micro-batch of the
    :data:`STOCK_TRACE_KERNELS` profile (the step's embedding, loss and optimizer kernels, a few thousand, left in),
    less its named GEMMs and graph launches, over the framework kernels named for its stack that the host issues
    there (no recompute: forward + backward; the captured router and token counts are not issued)."""
    E, ep = np.array([STOCK_TRACE_E_LOC]), np.array([STOCK_TRACE_EP])
    c = moe_layer_counts(STOCK_TRACE_STACK, E, ep, "bf16")
    launched = sum(sum(fb) for fb in (ATTENTION_KERNELS, GATING_KERNELS, PREPROCESS_KERNELS))
    launched = launched + float(sum(c.total(FRAMEWORK_PARTS))[0])
    captured = sum(GATING_KERNELS) + sum(PREPROCESS_KERNELS) + float(sum(c.total(("router_scores",)))[0])
    other = float(sum(c.total([k for k in c.fwd if k not in FRAMEWORK_PARTS]))[0])
    graphs = 2.0 * len(STOCK_TRACE_STACK.cuda_graphs)  # one launch per captured module and pass
    per_layer = STOCK_TRACE_KERNELS / STOCK_TRACE_LAYER_MICROBATCHES
    return (per_layer - other - graphs) / (launched - captured)


def counted_as_stock(stack: Stack, law_stack: Stack) -> bool:
    """Whether the host's launches on ``stack`` are stock Megatron-Core's: a stack other than ``law_stack`` when
    the law was counted on the paper's stack (a law traced on the user's own stack speaks for their framework)."""
    return stack != law_stack and law_stack == PAPER_STACK


def host_framework_scale(stack: Stack, law_stack: Stack, kappa0: float) -> float:
    """Launches per named framework kernel the host issues on ``stack``: stock Megatron-Core's
    (:func:`stock_framework_scale`) where :func:`counted_as_stock`, else the law's (:func:`framework_scale`)."""
    return stock_framework_scale() if counted_as_stock(stack, law_stack) else framework_scale(kappa0)


def kappa_delta(stack: Stack, E_loc: ArrayLike, ep: ArrayLike, precision: str, kappa0: float,
                glu: bool = True, shared_expert: bool = False, law_stack: Stack = PAPER_STACK,
                law_precision: str = 'bf16', scale: float | None = None) -> np.ndarray:
    """Kernels per MoE layer and micro-batch (full-recompute units, the law's) that ``stack`` launches more
    than ``law_stack``, the stack the law in force was counted on (arrays over plans): framework kernels at
    ``scale`` launches each on ``stack`` (default the law's :func:`framework_scale`) and the law's on
    ``law_stack``, GEMMs and quantize kernels one."""
    mine = moe_layer_counts(stack, E_loc, ep, precision, glu, shared_expert)
    theirs = moe_layer_counts(law_stack, E_loc, ep, law_precision, glu, shared_expert)
    other = [k for k in mine.fwd if k not in FRAMEWORK_PARTS]
    s_law = framework_scale(kappa0)
    s = s_law if scale is None else scale
    d_fw = s * (NAMED_FIXED + mine.full_recompute_units(FRAMEWORK_PARTS)) \
        - s_law * (NAMED_FIXED + theirs.full_recompute_units(FRAMEWORK_PARTS))
    d_other = mine.full_recompute_units(other) - theirs.full_recompute_units(other)
    return d_fw + d_other


def _captured(stack: Stack, counts: LayerCounts) -> dict[str, tuple]:
    """Per captured module: (framework kernels, other kernels), each in full-recompute units."""
    q_attn = 2.0 * counts.fwd["attn_quantize"] + counts.bwd["attn_quantize"]
    out = {}
    for module in stack.cuda_graphs:
        if module == "attn":
            out[module] = (2.0 * ATTENTION_KERNELS[0] + ATTENTION_KERNELS[1], q_attn)
        elif module == "moe_router":
            out[module] = (2.0 * GATING_KERNELS[0] + GATING_KERNELS[1]
                           + counts.full_recompute_units(("router_scores",)), 0.0)
        elif module == "moe_preprocess":
            out[module] = (2.0 * PREPROCESS_KERNELS[0] + PREPROCESS_KERNELS[1], 0.0)
        elif module == "mlp":
            out[module] = (2.0 * DENSE_MLP_KERNELS[0] + DENSE_MLP_KERNELS[1], 0.0)
        elif module == "moe":  # a whole drop-and-pad MoE layer
            other = [k for k in counts.fwd if k not in FRAMEWORK_PARTS and k != "attn_quantize"]
            out[module] = (counts.full_recompute_units(FRAMEWORK_PARTS) + 2.0 * (GATING_KERNELS[0]
                           + PREPROCESS_KERNELS[0]) + GATING_KERNELS[1], counts.full_recompute_units(other))
    return out


def graph_savings(stack: Stack, counts: LayerCounts, kappa0: float, moe_layer: bool = True,
                  scale: float | None = None) -> np.ndarray:
    """Launches per layer and micro-batch (full-recompute units) the host no longer issues one by one because
    ``stack`` captures them in CUDA graphs (framework kernels at ``scale`` launches each, default the law's
    :func:`framework_scale`), less the graph launches that replace them (one per captured module and pass; the
    forward graph replays again under full recompute). ``moe_layer``: the layer is an MoE layer (else only
    ``attn`` and ``mlp`` apply)."""
    scale, saved = framework_scale(kappa0) if scale is None else scale, 0.0
    for module, (fw, other) in _captured(stack, counts).items():
        if (module == "mlp" and moe_layer) or (module.startswith("moe") and not moe_layer):
            continue
        saved = saved + scale * fw + other - 3.0
    return np.asarray(saved, dtype=float)


def dense_layer_delta(stack: Stack, precision: str, law_stack: Stack, law_precision: str) -> float:
    """Kernels per dense layer and micro-batch (full-recompute units) ``stack`` launches more than
    ``law_stack``: an FP8 recipe's quantize kernels of the attention's and the dense MLP's four GEMM inputs
    (forward) and output gradients (backward), and delayed scaling's amax update."""
    def n(st: Stack, prec: str) -> float:
        r = st.recipe(prec)
        if r is None:
            return 0.0
        per_pass = 4 * QUANTIZE_KERNELS[r] + (DELAYED_AMAX_UPDATE if r == "delayed" else 0) \
            + (4 if r == "mxfp8" else 0)  # the four weights' scale swizzles (_swizzles)
        return 3.0 * per_pass  # forward twice under full recompute, backward once
    return n(stack, precision) - n(law_stack, law_precision)


def stack_extra_kernels(stack: Stack, law_stack: Stack, E_loc: ArrayLike, ep: ArrayLike, precision: str,
                        kappa0: float, glu: bool = True, shared_expert: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(per MoE layer, per dense layer) kernels per micro-batch in full-recompute units that the host issues for
    ``stack`` beyond what the law counts on ``law_stack`` (arrays over plans): :func:`kappa_delta` and
    :func:`dense_layer_delta`, less what CUDA graphs take off the host (:func:`graph_savings`), framework kernels
    at :func:`host_framework_scale` launches each."""
    law_precision = "fp8" if law_stack.fp8_recipe else "bf16"
    counts = moe_layer_counts(stack, E_loc, ep, precision, glu, shared_expert)
    s = host_framework_scale(stack, law_stack, kappa0)
    moe = kappa_delta(stack, E_loc, ep, precision, kappa0, glu, shared_expert, law_stack, law_precision, s) \
        - graph_savings(stack, counts, kappa0, moe_layer=True, scale=s)
    dense = dense_layer_delta(stack, precision, law_stack, law_precision) \
        - graph_savings(stack, counts, kappa0, moe_layer=False, scale=s)
    return moe, dense + 0.0 * moe


def framework_delta(stack: Stack, law_stack: Stack, E_loc: ArrayLike, ep: ArrayLike, precision: str,
                    kappa0: float) -> np.ndarray:
    """The framework launches per MoE layer and micro-batch (full-recompute units) ``stack`` runs on the device
    beyond ``law_stack`` (fusions remove kernels; CUDA graphs do not: a replayed kernel still runs)."""
    law_precision = "fp8" if law_stack.fp8_recipe else "bf16"
    mine = moe_layer_counts(stack, E_loc, ep, precision).full_recompute_units(FRAMEWORK_PARTS)
    theirs = moe_layer_counts(law_stack, E_loc, ep, law_precision).full_recompute_units(FRAMEWORK_PARTS)
    return framework_scale(kappa0) * (mine - theirs)


def moe_forward_share() -> float:
    """A MoE block's share of one MoE layer's named forward kernels (router, token counts, permutation,
    exchange, experts) on the paper's stack at the law's traced point (EP 8, 16 local experts): what
    recomputing the whole MoE block (--recompute-modules moe) re-launches, in forward-pass units."""
    c = moe_layer_counts(PAPER_STACK, np.array([16.0]), np.array([8]), "bf16")
    moe = float(c.total()[0][0]) + GATING_KERNELS[0] + PREPROCESS_KERNELS[0]
    return moe / (moe + ATTENTION_KERNELS[0])


def expert_bias_kernels(E_loc: ArrayLike, widened: bool = False) -> np.ndarray:
    """Kernels per MoE layer and micro-batch (full-recompute units) of the experts' biases where the model has them
    (estimator/kernels._expert_bias_times: Megatron-Core's ``_apply_bias`` of fc2): forward a product and a sum
    per local expert and one cat (2 E_loc + 1); backward the product's two gradients, each a product and a
    reduction, per expert, and the cats of the two splits' gradients (4 E_loc + 2), then the distributed data
    parallel's accumulation of each of the 2 E_loc bias gradients (fc1's and fc2's) into its main_grad (one add
    each: the GEMM weights accumulate inside their wgrad GEMM, the biases do not). ``widened``: the probabilities
    are wider than the activations (stack.router_dtype fp32 or fp64 on a bf16 model), so the product is too: the
    result is cast back (1 forward; its gradient 1) and each expert's t and bias gradients are cast back (2 E_loc).
    Single ATen ops, one launch each; beyond the law, whose traced models have no biases (arrays over plans)."""
    E_loc = np.asarray(E_loc, dtype=float)
    w = 1.0 if widened else 0.0
    return 2.0 * (2 * E_loc + 1 + w) + (4 * E_loc + 2 + w * (2 * E_loc + 1)) + 2 * E_loc


def dense_mlp_forward_share() -> float:
    """A dense MLP's share of a dense layer's named forward kernels (--recompute-modules mlp)."""
    return DENSE_MLP_KERNELS[0] / (DENSE_MLP_KERNELS[0] + ATTENTION_KERNELS[0])
