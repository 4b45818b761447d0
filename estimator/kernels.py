"""Per-layer kernel times of one micro-batch (paper sec:iteration-time-model), vectorised over plans:
the attention block, the dense MLP, the MoE block, the TP and CP collectives and the vocabulary work,
each forward and backward, as a typed record (:class:`LayerKernels`). They depend on (TP, CP, EP, ETP,
B_micro) only: :func:`layer_kernels` evaluates each distinct tuple once and hands the times to every plan
sharing it. Everything it reads comes in one :class:`~scaleplan.estimator.context.EvalContext` (the
tables: the spec precision's view, or a recording view; the profile; the plans and their shapes); seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
from numpy.typing import ArrayLike
from scaleplan.estimator import analytic as an
from scaleplan.estimator.comm import collective_time
from scaleplan.estimator.context import EvalContext
from scaleplan.estimator.compute import (
    elementwise_times,
    norm_time,
    expert_times,
    gemm_times,
    permute_times,
    sdpa_times,
    vocab_times,
)
from scaleplan.estimator.sources import Recorder, distinct
from scaleplan.estimator.tables import ANALYTIC


@dataclass(frozen=True)
class LayerKernels:
    """Seconds per layer and micro-batch (arrays over plans; _f forward, _b backward). The MoE block's
    terms are zero for a dense model."""

    attn_f: np.ndarray    # attention projections: QKV (+ head gate) and output GEMMs
    attn_b: np.ndarray
    sd_f: np.ndarray      # SDPA on the local heads, 1/CP of the causal work
    sd_b: np.ndarray
    ew_f: np.ndarray      # element-wise: 2 norms, 2 residual adds, RoPE, head gate
    ew_b: np.ndarray
    dense_f: np.ndarray   # one dense block's MLP
    dense_b: np.ndarray
    moe_f: np.ndarray     # the MoE block on the GPU: router + top-k + permute + routed experts
    moe_b: np.ndarray
    a2a_f: np.ndarray     # EP all-to-all, dispatch + combine
    a2a_b: np.ndarray
    sh_f: np.ndarray      # shared expert (overlaps the all-to-all)
    sh_b: np.ndarray
    E_loc: np.ndarray     # local experts E / EP (1 for a dense model)
    rg_f: np.ndarray      # router GEMM
    rg_b: np.ndarray
    tk_f: np.ndarray      # top-k
    tk_b: np.ndarray
    perm: np.ndarray      # permute + unpermute, forward
    perm_b: np.ndarray    # their backward
    ex_f: np.ndarray      # routed experts (grouped GEMMs and their SwiGLU)
    ex_b: np.ndarray
    tp_f: np.ndarray      # TP all-gathers + reduce-scatters (sequence parallel)
    tp_b: np.ndarray
    cp_f: np.ndarray      # CP key/value exchange the attention does not cover
    cp_b: np.ndarray
    t_first: np.ndarray   # embedding gather / scatter-add (first stage)
    t_last_f: np.ndarray  # LM head + cross-entropy forward (last stage)
    t_last_b: np.ndarray  # their backward
    T: np.ndarray         # tokens of a rank's sequence shard
    Tsp: np.ndarray       # its sequence-parallel shard, T / TP
    norm_f: np.ndarray    # one RMSNorm forward (what a recomputed norm re-runs, estimator/recompute.py)
    act_f: np.ndarray     # the routed experts' SwiGLU forward (part of ex_f; moe_act re-runs it)
    mla_up_f: np.ndarray  # MLA's up-projection GEMMs forward (part of attn_f; mla_up_proj re-runs them)

    def take(self, idx: ArrayLike) -> LayerKernels:
        return LayerKernels(**{f: getattr(self, f)[idx] for f in _NAMES})

    def common(self) -> tuple[np.ndarray, np.ndarray]:
        """(forward, backward) seconds of what every block runs besides its FFN: attention projections, SDPA,
        element-wise, the TP and CP exchanges."""
        return (self.attn_f + self.sd_f + self.ew_f + self.tp_f + self.cp_f,
                self.attn_b + self.sd_b + self.ew_b + self.tp_b + self.cp_b)


_NAMES = tuple(f.name for f in fields(LayerKernels))
# the MoE block's terms (zero for a dense model), and the device-kernel times kernel_scale multiplies
# (never collectives or shapes)
_MOE_KERNELS = ("moe_f", "moe_b", "a2a_f", "a2a_b", "sh_f", "sh_b", "rg_f", "rg_b", "tk_f", "tk_b", "perm", "perm_b",
                "ex_f", "ex_b", "act_f")
_DEVICE_KERNELS = ("attn_f", "attn_b", "sd_f", "sd_b", "ew_f", "ew_b", "dense_f", "dense_b", "moe_f", "moe_b", "sh_f",
                   "sh_b", "rg_f", "rg_b", "tk_f", "tk_b", "perm", "perm_b", "ex_f", "ex_b", "t_first", "t_last_f",
                   "t_last_b", "norm_f", "act_f", "mla_up_f")


def layer_kernels(ctx: EvalContext) -> LayerKernels:
    """:class:`LayerKernels` of every plan of ``ctx`` (arrays of length P), each distinct (TP, CP, EP, ETP,
    B_micro) evaluated once (per geometry of a :class:`~scaleplan.estimator.model_dims.GeometryBatch`);
    lookups recorded in ``ctx.rec``."""
    lay = ctx.lay
    first, inv = distinct(*ctx.g.batch_keys, lay.tp, lay.cp, lay.ep, lay.etp, lay.mbs)
    sub = ctx.take(first, stages=False)
    k = LayerKernels(**_kernels(sub)).take(inv)
    ctx.rec.fold(sub.rec, inv)
    return k


def _scaled(ks: float, times: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The device-kernel times of ``times`` multiplied by ``ks`` (fitted for serial-dispatch (CPU) profiles
    only, calibrate/run_scales.py); collectives and shapes unchanged."""
    return times if ks == 1.0 else {name: ks * v if name in _DEVICE_KERNELS else v for name, v in times.items()}


def _kernels(ctx: EvalContext) -> dict[str, np.ndarray]:
    """Per-layer, per-micro-batch forward/backward times that depend only on (TP, CP, EP, ETP, B_micro):
    evaluated once per distinct tuple and broadcast to the plans sharing it. The kernels outside the MoE
    block depend on fewer: :func:`_dense_kernels` runs once per distinct (dense fields of the geometry, TP,
    CP, B_micro); their lookups are recorded in the order they occur (attention and dense MLP, the MoE
    block, TP, vocabulary and CP)."""
    P, g, lay = ctx.P, ctx.g, ctx.lay
    first, inv = distinct(*g.dense_keys, lay.tp, lay.cp, lay.mbs)
    pre = ctx.take(first, stages=False)
    post = Recorder(len(first), ctx.rec.mode)
    k = {name: v[inv] for name, v in _dense_kernels(pre, post).items()}
    ctx.rec.fold(pre.rec, inv)
    if g.is_moe:
        k.update(_scaled(ctx.kernel_scale, _moe_kernels(ctx)))
    else:
        k.update(dict.fromkeys(_MOE_KERNELS, np.zeros(P)), E_loc=np.ones(P))
    ctx.rec.fold(post, inv)
    k.update(T=ctx.shapes.T, Tsp=ctx.shapes.Tsp)
    return {name: np.broadcast_to(np.asarray(k[name], dtype=float), (P,)) for name in _NAMES}


def _dense_kernels(ctx: EvalContext, post: Recorder) -> dict[str, np.ndarray]:
    """The kernels outside the MoE block (seconds per layer and micro-batch): attention and the dense
    MLP (lookups in ``ctx.rec``), TP collectives, vocabulary and the exposed CP exchange (in ``post``)."""
    g, lay, sh = ctx.g, ctx.lay, ctx.shapes
    tp, cp = lay.tp.astype(float), lay.cp.astype(float)
    b_el, T = sh.b_el, sh.T
    k = _attention_kernels(ctx)

    # dense MLP (first block(s))
    w1 = 2 if g.glu else 1
    dm_f1, dm_b1 = gemm_times(ctx, "dense_mlp", T, w1 * g.dff / tp, g.d, active=g.n_dense > 0)
    dm_f2, dm_b2 = gemm_times(ctx, "dense_mlp", T, g.d, g.dff / tp, active=g.n_dense > 0)
    act_dense = an.memory_time(b_el * T * g.dff / tp * 3, ctx.hbm)
    k["dense_f"], k["dense_b"] = dm_f1 + dm_f2 + act_dense, dm_b1 + dm_b2 + 2 * act_dense

    # TP (sequence parallel): 2 all-gathers + 2 reduce-scatters of the full [T, d] per pass; MLA gathers its
    # latents (q_lora_rank, kv_lora_rank and the rotary key; d without a query latent) instead of [T, d]
    late = replace(ctx, rec=post)
    tp_inter = lay.spans_nodes("tp", ctx.gpn)
    gathered = g.d
    if g.is_mla:
        gathered = np.where(np.asarray(g.q_rank) > 0, g.q_rank, g.d) + g.kv_rank + g.rope_dim
    tp_one = collective_time(late, "tp_comm", "all_gather", tp, T * g.d * b_el, tp_inter) + \
        collective_time(late, "tp_comm", "reduce_scatter", tp, T * g.d * b_el, tp_inter)
    tp_attn = collective_time(late, "tp_comm", "all_gather", tp, T * gathered * b_el, tp_inter) + \
        collective_time(late, "tp_comm", "reduce_scatter", tp, T * g.d * b_el, tp_inter)
    k["tp_f"] = k["tp_b"] = tp_one + tp_attn
    k["t_first"], k["t_last_f"], k["t_last_b"] = vocab_times(late)
    if np.any(np.asarray(g.mtp) > 0):  # each MTP layer: its 2d -> d projection, then the LM head and loss again
        eh_f, eh_b = gemm_times(late, "vocab", T, g.d, 2 * g.d)
        k["t_last_f"] = k["t_last_f"] + g.mtp * (k["t_last_f"] + eh_f)
        k["t_last_b"] = k["t_last_b"] + g.mtp * (k["t_last_b"] + eh_b)
    k = _scaled(ctx.kernel_scale, k)

    # CP: all-gather K,V forward; all-gather + reduce-scatter of dK,dV backward
    kv_bytes = ctx.seqlen * lay.mbs.astype(float) * 2 * sh.kv_loc * g.hd * b_el
    cp_inter = lay.spans_nodes("cp", ctx.gpn)
    # TE's ring attention exchanges K/V blocks peer to peer while it computes on the previous
    # block: only the part of the exchange longer than the attention itself is exposed
    sd_f, sd_b = k["sd_f"], k["sd_b"]
    cp_f = np.maximum(collective_time(late, "cp_comm", "all_gather", cp, kv_bytes, cp_inter) - sd_f, 0.0)
    cp_b = np.maximum(cp_f + collective_time(late, "cp_comm", "reduce_scatter", cp, kv_bytes, cp_inter) - sd_b, 0.0)
    k.update(cp_f=cp_f, cp_b=cp_b)
    return {name: np.broadcast_to(np.asarray(v, dtype=float), (len(tp),)) for name, v in k.items()}


def _attention_kernels(ctx: EvalContext) -> dict[str, np.ndarray]:
    """The attention block's projections, SDPA and element-wise work, forward and backward
    (attn_f, attn_b, sd_f, sd_b, ew_f, ew_b; seconds per layer and micro-batch)."""
    g, sh = ctx.g, ctx.shapes
    up = np.zeros(ctx.P)
    if g.is_mla:
        f_qkv, b_qkv, up = _mla_projections(ctx)
    else:  # attention projections (gate folded into the QKV GEMM: same input, n_q extra columns)
        f_qkv, b_qkv = gemm_times(ctx, "attn_proj", sh.T, sh.n_qkv, g.d)
    f_o, b_o = gemm_times(ctx, "attn_proj", sh.T, g.d, sh.n_attn_out)
    attn_f, attn_b = f_qkv + f_o, b_qkv + b_o

    # SDPA on TP-sharded heads; CP: each rank computes 1/CP of the (load-balanced) causal work
    cp = ctx.lay.cp.astype(float)
    sd_f, sd_b = sdpa_times(ctx)
    sd_f, sd_b = sd_f / cp, sd_b / cp

    # element-wise: 2 norms, 2 residual adds, RoPE on q/k, gate sigmoid*mul; q/k norms, bias gradients
    ew_f, ew_b = elementwise_times(ctx)
    if g.has_gate:  # the head gate has no table: bytes through HBM
        gate = an.memory_time(sh.b_el * sh.T * g.nq * g.hd / ctx.lay.tp.astype(float) * 3, ctx.hbm)
        ew_f, ew_b = ew_f + gate, ew_b + 2 * gate
    sf, sb = _small_kernels(ctx)
    return {"attn_f": attn_f, "attn_b": attn_b, "sd_f": sd_f, "sd_b": sd_b, "ew_f": ew_f + sf, "ew_b": ew_b + sb,
            "norm_f": norm_time(ctx), "mla_up_f": up}


def _mla_projections(ctx: EvalContext) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Multi-latent attention's input projections per layer and micro-batch, as Megatron-Core's MLASelfAttention
    runs them under TP with sequence parallelism: the down-projections d -> q_lora_rank and d -> kv_lora_rank +
    rope are duplicated on every TP rank (TELinear parallel_mode 'duplicated') over the rank's sequence shard
    T/TP; the up-projections are column-parallel over the all-gathered T tokens, q_lora_rank -> n_q/TP head_dim
    and kv_lora_rank -> n_q/TP (head_dim - rope + v_dim); without a query latent, d -> n_q/TP head_dim directly.
    (forward, backward, the up-projections' forward) seconds; the output projection is the caller's."""
    g, sh = ctx.g, ctx.shapes
    q_lat = np.asarray(g.q_rank) > 0
    f1, b1 = gemm_times(ctx, "attn_proj", sh.Tsp, g.q_rank, g.d, active=q_lat)
    f2, b2 = gemm_times(ctx, "attn_proj", sh.T, sh.mla_q_out, g.q_rank, active=q_lat)
    f3, b3 = gemm_times(ctx, "attn_proj", sh.T, sh.mla_q_out, g.d, active=~q_lat)
    f4, b4 = gemm_times(ctx, "attn_proj", sh.Tsp, g.kv_rank + g.rope_dim, g.d)
    f5, b5 = gemm_times(ctx, "attn_proj", sh.T, sh.mla_kv_out, g.kv_rank)
    return f1 + f2 + f3 + f4 + f5, b1 + b2 + b3 + b4 + b5, f2 + f3 + f5


def _small_kernels(ctx: EvalContext) -> tuple[np.ndarray, np.ndarray]:
    """The model features' small kernels per layer and micro-batch (bytes through HBM, read and write; backward
    twice the forward; labelled analytic): the q/k RMSNorms (``g.qk_norm`` elements per token: per-head norms over
    the rank's heads, or MLA's two latent norms on the sequence shard) and, with linear biases, their gradient
    reductions (one read of each biased output's gradient; the forward adds are fused into the GEMM epilogue and
    the bias-dropout-add, as Megatron-Core and Transformer Engine run them). Attention sinks add one column to the
    softmax: no time. Zero for the paper's architecture."""
    g, sh, P = ctx.g, ctx.shapes, ctx.P
    f, b = np.zeros(P), np.zeros(P)
    tp = ctx.lay.tp.astype(float)
    if np.any(np.asarray(g.qk_norm) > 0):
        ctx.rec.mark("elementwise", ANALYTIC)
        rows_width = sh.Tsp * g.qk_norm if g.is_mla else sh.T * g.qk_norm / tp
        norm = an.memory_time(2.0 * sh.b_el * rows_width, ctx.hbm)
        f, b = f + norm, b + 2 * norm
    if g.bias != "none":
        ctx.rec.mark("elementwise", ANALYTIC)
        cols = sh.n_qkv + (g.d + 2 * g.dff / tp + g.d if g.bias == "all" else 0.0)  # QKV; O, the dense MLP
        b = b + an.memory_time(sh.b_el * sh.T * cols, ctx.hbm)
    return f, b


def _moe_kernels(ctx: EvalContext) -> dict[str, np.ndarray]:
    """The MoE block per layer and micro-batch, forward and backward (seconds; _MOE_KERNELS and
    E_loc): router + top-k, permute, routed experts, shared expert, EP all-to-all."""
    g, sh, lay = ctx.g, ctx.shapes, ctx.lay
    ep = lay.ep.astype(float)
    sh_f = sh_b = np.zeros(ctx.P)
    # the router, top-k and shared expert read no EP or ETP: once per distinct (geometry, TP, CP, B_micro),
    # each recorded where it runs in the block
    first, inv = distinct(*g.batch_keys, lay.tp, lay.cp, lay.mbs)
    coarse = ctx.take(first, stages=False)
    rg_f, rg_b, tk_f, tk_b = (x[inv] for x in _router_kernels(coarse))
    ctx.rec.fold(coarse.rec, inv)
    perm_f, perm_b = permute_times(ctx)
    ex_f, ex_b = expert_times(ctx)
    ex_act = an.memory_time(sh.b_el * sh.R * sh.ffn_loc * 3, ctx.hbm)        # SwiGLU on routed rows
    ex_f, ex_b = ex_f + ex_act, ex_b + 2 * ex_act
    if g.glu_clamp:  # moe_act's recompute re-runs the clamps with the activation
        clamp_f, clamp_b = _glu_clamp_times(ctx)
        ex_act, ex_f, ex_b = ex_act + clamp_f, ex_f + clamp_f, ex_b + clamp_b
    if g.bias == "all":  # each expert's fc2 bias, weighted by the routing probability outside the GEMM
        bias_f, bias_b = _expert_bias_times(ctx)
        ex_f, ex_b = ex_f + bias_f, ex_b + bias_b
    if g.has_shared:  # the same plans, a record of their own folded where the shared expert runs
        coarse = replace(coarse, rec=Recorder(len(first), ctx.rec.mode))
        sh_f, sh_b = (x[inv] for x in _shared_expert_kernels(coarse))
        ctx.rec.fold(coarse.rec, inv)
    # EP all-to-all: dispatch + combine per pass; per-rank buffer R*d*bytes (the fused dispatchers' own,
    # exchange_bytes); the EP ranks on one node exchange over NVLink (ParallelLayout.ranks_per_node)
    inter, per_node = lay.spans_nodes("ep", ctx.gpn), lay.ranks_per_node("ep", ctx.gpn)
    a2a_one = _token_exchange(ctx) if ctx.stack.dispatcher == "allgather" else collective_time(
        ctx, "ep_a2a", "all_to_all", ep, exchange_bytes(ctx, inter, per_node), inter, active=ep > 1,
        per_node=per_node)
    return {"moe_f": rg_f + tk_f + perm_f + ex_f, "moe_b": rg_b + tk_b + perm_b + ex_b,
            "a2a_f": 2 * a2a_one, "a2a_b": 2 * a2a_one, "sh_f": sh_f, "sh_b": sh_b, "E_loc": sh.E_loc,
            "rg_f": rg_f, "rg_b": rg_b, "tk_f": tk_f, "tk_b": tk_b, "perm": perm_f, "perm_b": perm_b, "ex_f": ex_f,
            "ex_b": ex_b, "act_f": ex_act}


def _glu_clamp_times(ctx: EvalContext) -> tuple[np.ndarray, np.ndarray]:
    """(fwd, bwd) seconds per MoE layer and micro-batch of the clamped GLU's unfused pass (GPT-OSS,
    ``g.glu_clamp``): Megatron-Core's weighted_bias_quick_geglu_impl (fusions/fused_bias_geglu.py, core_v0.15 to
    0.19) clamps the gate half (max) and the linear half (min and max) of the routed rows' fc1 output and cats them
    into a new [R, 2f] tensor before its fused kernel: per element of one half, 2 + 2 + 4 of the activations' bytes
    b forward (each clamp reads and writes its half, the cat reads and writes both). Backward (PyTorch's
    clamp_backward: where(mask, grad, 0) on 1-byte masks; the chunk's gradient cat back into one tensor): the gate
    half a compare and a where (3 b + 2 bytes), the linear half two compares, their and and a where (4 b + 6),
    the cat 4 b: 11 b + 8 bytes. Through HBM, as the activation itself."""
    sh = ctx.shapes
    rows = sh.R * sh.ffn_loc  # elements of one half
    return an.memory_time(8 * sh.b_el * rows, ctx.hbm), an.memory_time((11 * sh.b_el + 8) * rows, ctx.hbm)


def bias_product_bytes(ctx: EvalContext) -> float:
    """Bytes per element of the experts' bias product ``b * p`` (:func:`_expert_bias_times`): the routing
    probabilities' (:meth:`Stack.router_bytes`) where wider than the activations', else the activations'."""
    return max(ctx.shapes.b_el, ctx.stack.router_bytes(ctx.shapes.b_el))


def _expert_bias_times(ctx: EvalContext) -> tuple[np.ndarray, np.ndarray]:
    """(fwd, bwd) seconds per MoE layer and micro-batch of the experts' fc2 bias (``model.linear_bias: all``,
    GPT-OSS). TEGroupedMLP builds fc2 with skip_bias_add and adds each expert's bias times its tokens' routing
    probabilities in Python (experts.py ``_apply_bias``, core_v0.16 to 0.19, and Megatron-Bridge 0.4.2's pinned
    core, whose performance overrides keep the TE op fuser that fuses it off): per expert ``b * p`` and ``t + .``,
    then one cat of the [R, d] rows and a cast back to the activations' dtype. Per element of the fc2 output, with
    a the activations' bytes and c those of the product (the probabilities' dtype when wider:
    ``stack.router_dtype``): forward the product written (c), the sum reading t and it and writing (a + 2c), the
    cat (2c), the cast where c != a (c + a); backward the cast's gradient (a + c where c != a), the sum's gradient
    to t cast back (c + a, likewise), the split's gradient cat (2a), the bias and probability gradients, each a
    product read and written then reduced (3c + 3c). With c = a: 6a forward, 8a backward. Through HBM (kernel
    counts: estimator/kernel_counts.expert_bias_kernels)."""
    a, c = ctx.shapes.b_el, bias_product_bytes(ctx)
    cast = a + c if c != a else 0.0
    fwd, bwd = c + (a + 2 * c) + 2 * c + cast, 2 * cast + 2 * a + 6 * c
    el = ctx.shapes.R * ctx.g.d
    return an.memory_time(fwd * el, ctx.hbm), an.memory_time(bwd * el, ctx.hbm)


def _router_kernels(ctx: EvalContext) -> tuple[np.ndarray, ...]:
    """(router GEMM fwd, bwd, top-k fwd, bwd) seconds per MoE layer and micro-batch: the fp32 router island
    costed as a bf16 GEMM (d x E is tiny), the top-k from its table or the memory roofline."""
    tb, rec, g, Tsp = ctx.tables, ctx.rec, ctx.g, ctx.shapes.Tsp
    rg_f, rg_b = gemm_times(ctx, "router", Tsp, g.E, g.d)
    if tb.topk:
        tk_f = rec.use("router", tb.topk["fwd"].lookup(Tsp, g.E, g.K))
        tk_b = rec.use("router", tb.topk["bwd"].lookup(Tsp, g.E, g.K)) if "bwd" in tb.topk else tk_f
    else:
        rec.mark("router", ANALYTIC)
        tk_f = tk_b = an.memory_time(4.0 * Tsp * g.E * 3, ctx.hbm)
    return tuple(np.broadcast_to(np.asarray(x, dtype=float), (ctx.P,)) for x in (rg_f, rg_b, tk_f, tk_b))


def _shared_expert_kernels(ctx: EvalContext) -> tuple[np.ndarray, np.ndarray]:
    """(fwd, bwd) seconds of the shared expert's MLP per MoE layer and micro-batch (its activation from the
    memory roofline)."""
    g, T, tp = ctx.g, ctx.shapes.T, ctx.lay.tp.astype(float)
    w1 = 2 if g.glu else 1
    s1f, s1b = gemm_times(ctx, "shared_expert", T, w1 * g.dsh / tp, g.d)
    s2f, s2b = gemm_times(ctx, "shared_expert", T, g.d, g.dsh / tp)
    s_act = an.memory_time(ctx.shapes.b_el * T * g.dsh / tp * 3, ctx.hbm)
    f, b = s1f + s2f + s_act, s1b + s2b + 2 * s_act
    return tuple(np.broadcast_to(np.asarray(x, dtype=float), (ctx.P,)) for x in (f, b))


def _token_exchange(ctx: EvalContext) -> np.ndarray:
    """Half of one pass's token exchange under the all-gather dispatcher (MoEAllGatherTokenDispatcher): every
    EP rank gathers all the group's tokens before its local experts (all-gather, nccl-tests size: EP x the
    rank's R / (K cf) rows x d) and the combine reduce-scatters the same buffer; the backward runs the two the
    other way round. Where K < EP it moves EP / K times the all-to-all's bytes."""
    g, sh, lay = ctx.g, ctx.shapes, ctx.lay
    ep = lay.ep.astype(float)
    size = ep * sh.R / (g.K * g.capacity_factor) * g.d * sh.b_el
    inter = lay.spans_nodes("ep", ctx.gpn)
    ag = collective_time(ctx, "ep_a2a", "all_gather", ep, size, inter, active=ep > 1)
    rs = collective_time(ctx, "ep_a2a", "reduce_scatter", ep, size, inter, active=ep > 1)
    return 0.5 * (ag + rs)



FUSED_DISPATCHERS = ("deepep", "hybridep")


def hit_probability(E: ArrayLike, K: ArrayLike, e: ArrayLike) -> np.ndarray:
    """Probability that a token's K distinct experts, drawn uniformly from E, include at least one of ``e``
    given experts: 1 - C(E - e, K) / C(E, K) (arrays broadcast over plans)."""
    E, K, e = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (E, K, e)))
    miss = np.ones(E.shape)
    for i in range(int(np.max(K, initial=0))):
        step = np.clip((E - e - i) / np.maximum(E - i, 1.0), 0.0, 1.0)
        miss = np.where(i < K, miss * step, miss)
    return 1.0 - miss


def exchange_bytes(ctx: EvalContext, inter: ArrayLike, per_node: ArrayLike) -> np.ndarray:
    """Bytes per rank and pass of the EP token exchange in the all-to-all convention (what the rank's rows
    amount to when spread evenly over the group, itself included; arrays over plans). The all-to-all dispatcher
    sends a token once per routed expert: R rows (``PlanShapes.a2a_bytes``). DeepEP and HybridEP send it once per
    destination rank (deep_ep get_dispatch_layout: is_token_in_rank) and, across NVLink domains, once per
    destination domain, forwarded there over NVLink (num_tokens_per_rdma_rank; HybridEP's hierarchical
    dispatch). Under uniform routing a rank of E_loc experts receives a token with probability
    :func:`hit_probability` (E, K, E_loc), a domain of ``per_node`` ranks with (E, K, E_loc per_node): within a
    domain the rank's T tokens x EP x p_rank rows; across domains the bytes that leave it, T x (domains - 1) x
    p_domain rows, stated as the all-to-all size whose share (EP - m) / EP crosses the NICs (comm.collective_time)."""
    sh, g = ctx.shapes, ctx.g
    if ctx.stack.dispatcher not in FUSED_DISPATCHERS:
        return sh.a2a_bytes
    ep, m = ctx.lay.ep.astype(float), np.asarray(per_node, dtype=float)
    token = sh.a2a_bytes / (g.K * g.capacity_factor)  # one row of every token the rank dispatches
    within = token * ep * hit_probability(g.E, g.K, sh.E_loc)
    across = token * ep / np.maximum(m, 1.0) * hit_probability(g.E, g.K, sh.E_loc * m)
    return np.where(np.asarray(inter, dtype=bool), across, within)
