"""Per-device memory of a plan (vectorised over plans), reported per category for the worst stage.

Model state, per :class:`ModelState`. :data:`MEGATRON` (the estimator's default): Megatron mixed
precision with the distributed optimizer: weights in the model dtype (2 bytes/param in bf16), fp32
main grads (4), fp32 master weights + optimizer moments sharded over the data-parallel group (dense
params over DP x CP, expert params over EDP): for Adam 12 bytes/param, so the unsharded total is
Megatron's 18 bytes/param (theoretical_memory_usage: 6 + 12/DP); SGD, which that optimizer refuses,
keeps its state whole (:mod:`~scaleplan.estimator.optimizer`). :data:`REFERENCE_DDP`: what
``scaleplan validate``'s runner keeps (DDP + AdamW on fp32 masters): grads in the model dtype, plus
DDP's bucket copy at DP > 1, fp32 master weights and master grads, unsharded moments, fp32 router
weights. Both are checked exactly against the reference model's tensors (tests/validate/test_memory.py).

Activations: :func:`block_activation_terms` lists, term by term, what a block saves for its backward
(the reference model's structure, which is Megatron's: fused QKV buffer kept alive by V's view,
RoPE'd Q/K copies, flash SDPA output + fp32 log-sum-exp, gate sigmoid, GEMM inputs, SwiGLU outputs,
fp32 router tensors, permuted expert rows, int64 indices, fp32 norm statistics), checked per layer and
checkpoint mode against the bytes torch saves (saved_tensors_hooks, tests/validate/test_memory.py). Under :data:`MEGATRON`
an MoE block saves what Megatron-Core (0.13 on) saves instead (``mcore``): the router's GEMM keeps its
model-dtype input, no fp32 copy, and the gate probabilities multiply the expert activation before fc2,
so the combine keeps no expert-output rows. Checkpoint modes:
none (all), selective (drops SDPA output, LSE and gate sigmoid), super-selective (also norm statistics
and SwiGLU activation outputs), full (the block input only, plus one layer's activations while it is
recomputed). :func:`dense_layer_activation_bytes` keeps Korthikanti et al. 2022's GPT formula
(s b h (34 + 5 a s / h) / t) as a reference.

1F1B keeps min(PP, n_mb) micro-batches in flight on the first stage (times 1 + (PP-1)/(PP VPP)
with interleaving); the last stage holds one, plus the LM head and its transient fp32 logits.

Beyond the allocated bytes: either the legacy fixed ``reserve`` (``reserve_bytes``)
or, with ``allocator_fraction``, an ``allocator`` term (reserved minus allocated: fragmentation and
cached blocks, measured by bench suite 'allocator', default 10%) and ``context`` (outside the
allocator: CUDA context, NCCL; default 1 GB); :func:`allocated_reserved` splits the totals.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
from numpy.typing import ArrayLike
from scaleplan.estimator.ckpt import CkptMode
from scaleplan.estimator.model_dims import Geometry, vocab_shard
from scaleplan.estimator.optimizer import optimizer as opt_spec
from scaleplan.estimator.layout import ParallelLayout, degree_groups
from scaleplan.estimator.params import StageParams, stage_params
from scaleplan.estimator.shapes import PlanShapes, plan_shapes, stage_counts
from scaleplan.estimator.recompute import Selective, frees
from scaleplan.estimator.sources import distinct
from scaleplan.estimator.stack_memory import (adjust_saved, grad_bytes, linear_weight_bytes,
                                              loss_and_dispatcher_bytes)
from scaleplan.units import ACT_DTYPE, BYTES_PER_ELEMENT

from scaleplan.stack import PAPER_STACK, Stack

WEIGHT_BYTES, GRAD_BYTES = 2.0, 4.0
RESERVE_BYTES = 5e9  # legacy fixed reserve (the estimator now uses the allocator and context terms)


def dense_layer_activation_bytes(s: ArrayLike, b: ArrayLike, h: ArrayLike, a: ArrayLike, ffn: ArrayLike, *,
                                 kv_heads: int | None = None, head_dim: int | None = None, glu: bool = False,
                                 dropout: bool = True, flash: bool = False, tp: ArrayLike = 1,
                                 gate: bool = False) -> np.ndarray:
    """Korthikanti activation bytes of one dense transformer block (no recomputation), per device.

    With kv_heads = a, ffn = 4h, no GLU, dropout, no flash: s b h (34 + 5 a s / h) / tp.
    """
    kv = a if kv_heads is None else kv_heads
    hd = h / a if head_dim is None else head_dim
    sbh = s * b * h
    attn = 2 * sbh + 2 * s * b * (a + 2 * kv) * hd + 2 * sbh + (sbh if dropout else 0)  # QKV in, Q/K/V, out-proj in, mask
    if not flash:
        attn = attn + 5.0 * a * s * s * b
    if gate:
        attn = attn + 2 * 2 * s * b * a  # gate logits and sigmoid
    mlp = 2 * sbh + 2 * s * b * ffn * (2 if glu else 1) + 2 * s * b * ffn + (sbh if dropout else 0)
    norms = 4 * sbh
    return (attn + mlp + norms) / tp


def act_bytes(precision: str) -> float:
    """Bytes per stored activation element for a model precision (fp8/fp4 GEMMs keep bf16 activations)."""
    return float(BYTES_PER_ELEMENT[ACT_DTYPE.get(precision, "bf16")])


def sdpa_cast(g: Geometry) -> bool:
    """Whether attention runs in another dtype than the model stores activations in: then Q, K, V are
    cast copies, and SDPA's output is cast back (spec model.sdpa_precision)."""
    return ACT_DTYPE.get(g.sdpa_precision, "bf16") != ACT_DTYPE.get(g.precision, "bf16")


def block_activation_terms(s: ArrayLike, b: ArrayLike, g: Geometry, tp: ArrayLike, etp: ArrayLike,
                           is_moe: bool, a: float, rope: bool = True, mcore: bool = False,
                           router_bytes: float = 4.0) -> dict:
    """Bytes one block saves for its backward, per device and micro-batch, term by term, with no
    recomputation: ``{name: (bytes, freed_by)}``; ``freed_by`` is 'core' for tensors selective
    recompute drops (SDPA output and log-sum-exp, head-gate sigmoid), 'fine' for those
    super-selective also drops (norm statistics, SwiGLU activation outputs), '' for the rest.

    What the reference model (scaleplan.reference.model; Megatron's structure) saves, checked per
    layer against torch's saved tensors (tests/validate/test_memory.py). s: sequence length per
    device, b: micro-batch, a: bytes per activation element, T = s b tokens. Attention: the norm
    input, the QKV GEMM input, the fused QKV output (V is a view of it, so the whole buffer stays),
    RoPE-rotated Q and K, the SDPA output (fp32 log-sum-exp beside it), the gate sigmoid, the output
    projection input; FFN: the norm input, the FFN input, fc1 output, SwiGLU's silu output and fc2
    input. MoE: the fp32 router input (a copy unless the model is fp32), router weights after
    RowNorm, fp32 logits and scores, the top-K indices and gates, and per routed row (T K, times the
    capacity factor) the permuted input, fc1 output, activations, fc2 output and its gated copy, plus
    int64 permutation indices. Norm statistics: fp32 mean and rstd per token. TP with sequence
    parallelism divides every per-token term by tp (the routed rows by tp / etp). ``mcore``: the block
    as Megatron-Core with Transformer Engine saves it: its attention keeps contiguous q, k, v (rotated or
    not) and no QKV buffer, the MoE block as in :func:`_moe_terms` (``router_bytes``: its router's dtype)."""
    T = s * b
    h, hd, nq = g.d, g.hd, g.nq
    kv = np.maximum(g.nkv / tp, 1.0) * tp
    w = 2 if g.glu else 1
    # attention in another dtype (sdpa_cast): SDPA saves the cast Q, K, V (a_sd bytes) instead of the
    # QKV buffer and the RoPE'd copies, its own output in a_sd, and the output cast back is a new
    # tensor that the output projection (or the head gate) saves
    cast, a_sd = sdpa_cast(g), act_bytes(g.sdpa_precision)
    own = 0.0 if cast else 1.0  # the model-dtype Q/K/V tensors SDPA saves without a cast
    back = cast or g.has_gate   # the output projection's input is a tensor of its own
    t = {
        "norm1_in": (a * T * h, ""), "norm_stats": (2 * 8.0 * T, "fine"), "qkv_in": (a * T * h, ""),
        # ``mcore``: TE's get_qkv_layout copies v (a strided view of the QKV buffer), so the buffer is freed
        "qkv_out": (own * a * T * (kv if mcore else nq + 2 * kv) * hd, ""),
        "qk_rope": (own * a * T * (nq + kv) * hd if (rope or mcore) else 0.0, ""),
        "sdpa_in": ((1.0 - own) * a_sd * T * (nq + 2 * kv) * hd, ""),
        # without the head gate or a cast the output projection's input is a view of the SDPA output
        # (flash kernels return it in [b, s, heads, hd] layout), so that one buffer stays in every mode
        "sdpa_out": ((a_sd if cast else a) * T * nq * hd, "core" if back else ""), "sdpa_lse": (4.0 * T * nq, "core"),
        "sdpa_out_cast": (a * T * nq * hd if (cast and g.has_gate) else 0.0, "core"),  # the gate's input
        "gate_sigmoid": (a * T * g.gate, "core"),  # one sigmoid per gate column (head or channel)
        "out_proj_in": (a * T * nq * hd if back else 0.0, ""),
        "norm2_in": (a * T * h, ""),
        # the FFN input is saved by a GEMM that reads it: the dense fc1, the shared expert or an fp32
        # router; a low-precision MoE block without a shared expert keeps only the router's fp32 copy
        # (Megatron-Core's router keeps this input itself)
        "ffn_in": (a * T * h if (not is_moe or g.has_shared or a == 4 or mcore) else 0.0, ""),
        # hidden dropout after the attention and the FFN (Megatron's bias-dropout-add) keeps a 1-byte
        # mask each; attention dropout inside the flash kernel keeps only its RNG state
        "dropout_masks": (2.0 * T * h if g.dropout else 0.0, ""),
    }
    if g.is_mla:
        t.update(_mla_terms(T, g, a))
    if not is_moe:
        t.update(fc1_out=(a * T * w * g.dff, ""), act_out=(a * T * g.dff if g.glu else 0.0, "fine"),
                 fc2_in=(a * T * g.dff, ""))
        return {k: (v / tp, f) for k, (v, f) in t.items()}
    t.update(_moe_terms(T, b, g, tp, etp, a, mcore, router_bytes))
    return {k: (v / tp, f_) for k, (v, f_) in t.items()}


def _mla_terms(T, g: Geometry, a: float) -> dict:
    """Multi-latent attention's saved tensors in place of GQA's (bytes before the / tp; Megatron-Core's
    MLASelfAttention with its fused MLA RoPE kernels, transformer/multi_latent_attention.py): the duplicated
    down-projections save their input, the first norm's output (``qkv_in``, as GQA's); each latent norm saves
    its input and each up-projection its normed input (the sequence shards it all-gathers: q_lora_rank and
    kv_lora_rank wide; without a query latent the query projection reads ``qkv_in``); the fused RoPE kernels
    write new contiguous query and key ([T, heads, head_dim]) and value ([T, heads, v_dim]) tensors, which the
    fused attention saves with its output ([T, heads, v_dim], the output projection's input is a view of it)
    and fp32 softmax statistics. No fused QKV buffer, no separate RoPE'd copies."""
    hv, nq = g.v_dim, g.nq
    latents = 2 * (g.q_rank + g.kv_rank)
    return {"qkv_out": (0.0, ""), "qk_rope": (0.0, ""), "sdpa_in": (0.0, ""),
            "mla_latents": (a * T * latents, ""),
            "mla_latent_norm_stats": ((2.0 if g.q_rank else 1.0) * 8.0 * T, "fine"),
            "mla_qkv": (a * T * nq * (2 * g.hd + hv), ""),
            "sdpa_out": (a * T * nq * hv, ""), "sdpa_lse": (4.0 * T * nq, "core"), "out_proj_in": (0.0, "")}


def _moe_terms(T, b, g: Geometry, tp, etp, a: float, mcore: bool = False, rb: float = 4.0) -> dict:
    """The MoE block's saved tensors of :func:`block_activation_terms` (bytes before the / tp):
    router, routed rows and the shared expert.

    ``mcore``: as Megatron-Core saves them from 0.13 on (megatron/core/transformer/moe): the router's
    gating GEMM (RouterGatingLinearFunction) saves its model-dtype input, the FFN input already
    counted, and computes the fp32 logits without keeping an fp32 copy (no ``router_in_fp32``); the
    grouped MLP multiplies the activation output by the permuted probabilities before fc2 and the
    dispatcher's unpermute takes no probabilities, so no expert-output rows are saved (no
    ``expert_out``) but the product keeps its input, the activation output (``expert_probs_in``, R f,
    dropped with the activation under super-selective recompute). ``rb``: bytes of a router logit, score and
    gate (fp32 as the reference model and --moe-router-dtype fp32 keep them; Stack.router_bytes)."""
    h, w = g.d, 2 if g.glu else 1
    R = T * g.K * g.capacity_factor * etp  # routed rows on this device, before the / tp
    E, f, fs = g.E, g.dexp / etp, g.dsh
    t = {}
    t.update({
        "router_in_fp32": (4.0 * T * h if (a != 4 and not mcore) else 0.0, ""),
        "router_weight": (4.0 * E * (h + 2) * tp, ""),  # RowNorm'd W_r and its norms (not sharded)
        "router_logits_scores": (2 * rb * T * E, ""),
        "router_topk": (8.0 * T * g.K + rb * T * g.K + 3 * 4.0 * T + 4.0 * b * E * tp, ""),
        "expert_in": (a * R * h, ""), "expert_fc1_out": (a * R * w * f, ""),
        "expert_act_out": (a * R * f if g.glu else 0.0, "fine"), "expert_fc2_in": (a * R * f, ""),
        # fc2 output and its gated copy (combine source); Megatron-Core gates before fc2 instead
        "expert_out": (0.0 if mcore else 2 * a * R * h, ""),
        "expert_probs_in": (a * R * f if mcore else 0.0, "fine"),
        # a clamped GLU (GPT-OSS) feeds its fused kernel a clamped copy of fc1's output, which the clamps keep
        # (their saved inputs); the copy is rebuilt where the activation is recomputed (estimator/kernels.py)
        "expert_clamp_out": (a * R * w * f if (g.glu_clamp and mcore) else 0.0, "fine"),
        "permute_idx": (2 * 8.0 * R + a * R + 8.0 * E * tp, ""),  # row->token, row order, gate per row, counts
    })
    if g.has_shared:
        t.update(shared_fc1_out=(a * T * w * fs, ""), shared_act_out=(a * T * fs if g.glu else 0.0, "fine"),
                 shared_fc2_in=(a * T * fs, ""))
    return t


def block_activation_bytes(s: ArrayLike, b: ArrayLike, g: Geometry, tp: ArrayLike, etp: ArrayLike,
                           is_moe: bool, mode_code: ArrayLike, a: float = 2.0, rope: bool = True,
                           mcore: bool = False, recipe: str | None = None, sel: Selective | None = None,
                           router_bytes: float = 4.0) -> np.ndarray:
    """One block's stored activations (bytes per device, one micro-batch) under checkpoint mode
    ``mode_code`` (array over plans): none keeps every term of :func:`block_activation_terms`,
    selective drops the 'core' terms, super-selective also the 'fine' ones, full keeps the block
    input only. ``mcore``: the block as Megatron-Core saves it, with its fused SwiGLU and, under an FP8
    ``recipe``, FP8 copies of the GEMM inputs (:func:`~scaleplan.estimator.stack_memory.adjust_saved`).
    ``sel``: a stack's selective recompute modules, which selective then frees instead (estimator/recompute.py)."""
    terms = block_activation_terms(s, b, g, tp, etp, is_moe, a, rope, mcore, router_bytes)
    if mcore:
        terms = adjust_saved(terms, recipe, a, dense_block=not is_moe)
    keep = {CkptMode.NONE: ("", "core", "fine"), CkptMode.SELECTIVE: ("", "fine"), CkptMode.SUPER_SELECTIVE: ("",)}
    by_mode = {m: sum(v for v, f in terms.values() if f in kinds) for m, kinds in keep.items()}
    if sel is not None:
        freed = frees(sel.modules, is_moe, recipe, g.is_mla, sel.graphs_keep_norm)
        core = "core_attn" in sel.modules
        by_mode[CkptMode.SELECTIVE] = sum(v * (1.0 - freed.get(k, 0.0)) for k, (v, f) in terms.items()
                                          if not (core and f == "core"))
    by_mode[CkptMode.FULL] = a * s * b * g.d / tp  # the block input only
    mode = np.asarray(mode_code)
    return np.select([mode == m for m in CkptMode], [by_mode[m] for m in CkptMode])


def moe_layer_activation_bytes(s: ArrayLike, b: ArrayLike, g: Geometry, tp: ArrayLike, etp: ArrayLike,
                               mode_code: ArrayLike, a: float = 2.0, rope: bool = True,
                               mcore: bool = False, recipe: str | None = None,
                               sel: Selective | None = None, router_bytes: float = 4.0) -> np.ndarray:
    """One MoE block's stored activations per device (see :func:`block_activation_terms`)."""
    return block_activation_bytes(s, b, g, tp, etp, True, mode_code, a, rope, mcore, recipe, sel, router_bytes)


def dense_block_bytes(s: ArrayLike, b: ArrayLike, g: Geometry, tp: ArrayLike, mode_code: ArrayLike,
                      a: float = 2.0, rope: bool = True, mcore: bool = False,
                      recipe: str | None = None, sel: Selective | None = None) -> np.ndarray:
    """One dense block's stored activations per device (see :func:`block_activation_terms`)."""
    return block_activation_bytes(s, b, g, tp, 1, False, mode_code, a, rope, mcore, recipe, sel)


def outside_blocks_saved_bytes(s: ArrayLike, b: ArrayLike, g: Geometry, tp: ArrayLike, a: float, first: bool,
                               last: bool, ce_saved: float = 4.0) -> np.ndarray:
    """Saved tensors outside the blocks, per device and micro-batch: int64 token ids (embedding
    backward) and RoPE tables on the first stage; the final norm's input and statistics, the LM
    head input, what the loss keeps per logit (``ce_saved`` bytes: the fp32 log-softmax or softmax, or
    TE's bf16 logits holding their gradient, stack_memory.cross_entropy_bytes) and int64 labels on the
    last stage."""
    T = s * b
    V_loc = vocab_shard(g.vocab, tp)
    head = a * T * g.d * 2 / tp + 8.0 * T / tp + ce_saved * T * V_loc + 8.0 * T
    # each MTP layer (last stage) runs the final norm, LM head and loss again, and saves the inputs of its two
    # input norms (the embedding of the shifted tokens, the hidden states) and of its 2d -> d projection
    mtp = g.mtp * (head + a * T * 4 * g.d / tp + 2 * 8.0 * T / tp)
    emb = 8.0 * T + a * s * g.hd  # cos and sin tables, S x hd/2 each
    return np.where(first, emb, 0.0) + np.where(last, head + mtp, 0.0)


@dataclass(frozen=True)
class ModelState:
    """How a training stack keeps the model state, in bytes per parameter.

    grad_bytes: gradient bytes (None: the model dtype's); master_grad: the optimizer steps an fp32
    copy of each low-precision gradient (kept until the next zero_grad); shard_optimizer: master
    weights and moments sharded over the data-parallel group (distributed optimizer: dense params
    over DP x CP, expert params over EDP); ddp_buckets: torch DDP's reducer keeps its own copy of
    every gradient in buckets when DP > 1 (gradient_as_bucket_view off); mcore_moe: MoE blocks save
    for backward what Megatron-Core's MoE layer saves (:func:`_moe_terms`), not the reference model.
    """

    name: str
    grad_bytes: float | None
    master_grad: bool
    shard_optimizer: bool
    ddp_buckets: bool
    router_fp32: bool = False  # router weights stored in fp32 (the fp32 router island): no master copy
    mcore_moe: bool = False


MEGATRON = ModelState("megatron", grad_bytes=4.0, master_grad=False, shard_optimizer=True, ddp_buckets=False,
                      mcore_moe=True)
REFERENCE_DDP = ModelState("reference-ddp", grad_bytes=None, master_grad=True, shard_optimizer=False,
                           ddp_buckets=True, router_fp32=True)  # scaleplan.validate.runner: DDP + reference.optim.MasterAdamW
# Allocator overhead when no bench measurement exists (bench suite 'allocator' measures both):
DEFAULT_ALLOCATOR_FRACTION = 0.10  # reserved / max allocated - 1 of the caching allocator in MoE training
DEFAULT_CONTEXT_BYTES = 1.0e9  # per GPU process outside torch's allocator: CUDA context, NCCL, cuBLAS handles


def state_bytes_per_param(state: ModelState, precision: str, optimizer: str, stack: Stack = PAPER_STACK,
                          non_tn: bool = True) -> dict[str, float]:
    """(weights, grads, master, moments, master_grads) bytes per parameter, before any sharding, and
    ``linear_weights``: a linear layer's weight with the training stack's FP8 copies (:data:`MEGATRON` only;
    estimator/stack_memory.py). fp32/tf32 models keep no separate master copy (the parameter is the master).
    Megatron-Core's gradient buffer is fp32 unless the stack reduces gradients in bf16."""
    wb = act_bytes(precision)
    low = wb < 4.0
    mcore = state.mcore_moe
    grads = wb if state.grad_bytes is None else (grad_bytes(stack.grads_fp32, wb) if mcore else state.grad_bytes)
    linear = linear_weight_bytes(stack.recipe(precision), stack.fp8_param, non_tn, wb) if mcore else wb
    return {"weights": wb, "grads": grads, "master": 4.0 if low else 0.0, "moments": opt_spec(optimizer).moment_bytes,
            "master_grads": 4.0 if (low and state.master_grad) else 0.0, "linear_weights": linear}


def _layer_activations(g: Geometry, pl, s, a: float, rope: bool, stack: Stack | None = None):
    """(one dense block's, one MoE block's saved bytes, the extra peak of a full recompute) per device
    and micro-batch, arrays over plans: full recompute still materialises one layer's full
    activations during its backward. Computed once per distinct (geometry, TP, CP, ETP, B_micro, ckpt),
    all they depend on (``s`` = seqlen / CP), and handed to the plans sharing it. ``stack``: the training
    stack whose blocks are saved as Megatron-Core saves them (its FP8 recipe's copies, its selective recompute
    modules, its router's dtype); None: the reference model's (no recipe copies, an fp32 router)."""
    on = stack is not None  # Megatron-Core's saved tensors
    recipe, sel, rb = (stack.recipe(g.precision), Selective.of(stack), stack.router_bytes(a)) if on else (None, None, 4.0)
    first, inv = distinct(*g.batch_keys, pl.tp, pl.cp, pl.etp, pl.mbs, pl.ckpt)
    g, pl, s = g.take(first), pl.take(first), s[first]
    tp, etp, mbs, ck = pl.tp.astype(float), pl.etp.astype(float), pl.mbs.astype(float), pl.ckpt
    act_moe = moe_layer_activation_bytes(s, mbs, g, tp, etp, ck, a, rope, on, recipe, sel, rb) if g.is_moe else 0.0
    act_den = dense_block_bytes(s, mbs, g, tp, ck, a, rope, on, recipe, sel)
    zero = np.zeros_like(ck)
    whole = np.maximum(moe_layer_activation_bytes(s, mbs, g, tp, etp, zero, a, rope, on, recipe, router_bytes=rb)
                       if g.is_moe else 0.0, dense_block_bytes(s, mbs, g, tp, zero, a, rope, on, recipe))
    out = (act_den, act_moe, np.where(ck == CkptMode.FULL, whole, 0.0))
    return tuple(np.broadcast_to(np.asarray(x, dtype=float), (len(first),))[inv] for x in out)


def memory_breakdown(g: Geometry, pl: ParallelLayout, gbs: int, seqlen: int, optimizer: str,
                     reserve_bytes: float = RESERVE_BYTES, *, state: ModelState = MEGATRON,
                     allocator_fraction: float | None = None, context_bytes: float = DEFAULT_CONTEXT_BYTES,
                     rope: bool = True, shapes: PlanShapes | None = None, stack: Stack = PAPER_STACK,
                     non_tn: bool = True, scaleup_domain: int = 8) -> StageMemory:
    """Bytes per device for the worst stage (:func:`worst_stage`; its index into :data:`STAGES`: ``.stage``), by
    category, each an array over plans. Allocated (torch.cuda.max_memory_allocated): weights, grads, optimizer
    (master weights, moments, master gradients), activations (saved for backward: :func:`block_activation_bytes`
    per block plus the tensors outside the blocks), logits (the loss's transient copy of the logits or their
    gradient, one micro-batch), dispatcher (what the token dispatcher's transients at a MoE forward add beyond
    that). Outside the allocator: ep_buffers (DeepEP / HybridEP buffers; ``scaleup_domain`` GPUs per NVLink
    domain). With ``allocator_fraction`` None (legacy) one fixed ``reserve`` = ``reserve_bytes``; with a fraction
    (the estimator's) ``allocator`` = fraction x allocated (fragmentation and cached blocks) and ``context`` =
    ``context_bytes``. :func:`allocated_reserved` splits the result. ``state``: how the stack stores the model
    state (:data:`MEGATRON`, :data:`REFERENCE_DDP`). ``rope``: RoPE keeps rotated Q and K copies. ``shapes``:
    the plans' :func:`~scaleplan.estimator.shapes.plan_shapes`. ``stack``: the training stack
    (estimator/stack_memory.py) under :data:`MEGATRON`; ``non_tn``: the GPU runs FP8 GEMMs in any layout."""
    tp, pp, dp, vpp, mbs = (getattr(pl, f).astype(float) for f in ("tp", "pp", "dp", "vpp", "mbs"))
    sh = shapes if shapes is not None else plan_shapes(g, pl, seqlen, gbs)
    a = act_bytes(g.precision)
    n_mb, s = sh.n_mb, sh.seq_shard
    pb = state_bytes_per_param(state, g.precision, optimizer, stack, non_tn)
    # Megatron's distributed optimizer shards the state except for optimizers it refuses (plain DDP)
    sharded = state.shard_optimizer and opt_spec(optimizer).sharded

    act_den, act_moe, peak_layer = _layer_activations(g, pl, s, a, rope, stack if state.mcore_moe else None)
    inflight = _in_flight(pp, vpp, n_mb)
    ce_saved, logits, buffers, transient = loss_and_dispatcher_bytes(
        stack if state.mcore_moe else None, g.is_moe, s * mbs, sh.V_loc * (1 + g.mtp), tp, g.d, sh.E_loc,
        pl.ep * pl.etp, scaleup_domain, a)
    out = {}
    for name, (st, terms) in _stages(g, pl, pb, state, sharded).items():
        act = inflight[name] * (st.n_dense * act_den + st.n_moe * act_moe) + peak_layer
        n_p = st.total
        out[name] = terms
        grads = out[name]["grads"]
        n_r = st.router * float(state.router_fp32 and g.is_moe)
        # the dispatcher's transient and the loss's come at different times: the peak has the larger
        disp_t = np.where(st.n_moe > 0, transient, 0.0)
        if name == "middle":  # no embedding, no LM head (where PP <= 2 it is never the worst: worst_stage)
            out[name].update(activations=act, logits=np.zeros_like(act), dispatcher=disp_t)
        else:
            outside = outside_blocks_saved_bytes(s, mbs, g, tp, a, st.has_embedding, st.has_head, ce_saved)
            head_logits = np.where(st.has_head, logits, 0.0)
            out[name].update(activations=act + outside * np.where(st.has_head, 1.0, inflight[name]),
                             logits=head_logits, dispatcher=np.maximum(disp_t - head_logits, 0.0))
        if state.ddp_buckets:
            out[name]["ddp_buckets"] = np.where(dp > 1, grads, 0.0)
        if state.master_grad:
            out[name]["master_grads"] = pb["master_grads"] * (n_p - n_r)
        alloc = sum(out[name].values())  # the allocator term scales with everything allocated
        out[name].update({"reserve": np.full_like(tp, float(reserve_bytes))} if allocator_fraction is None else
                         {"allocator": allocator_fraction * alloc, "context": np.full_like(tp, float(context_bytes))})
        out[name]["ep_buffers"] = np.where(st.n_moe > 0, buffers, 0.0)
    worst = worst_stage(out, pp)
    first, middle, last = (out[n] for n in STAGES)
    return StageMemory({k: np.where(worst == 0, first[k], np.where(worst == 1, middle[k], last[k])) for k in first},
                       worst)


def _in_flight(pp: np.ndarray, vpp: np.ndarray, n_mb: np.ndarray) -> dict[str, np.ndarray]:
    """Micro-batches whose activations each of :data:`STAGES` keeps (1F1B's warm-up + 1): min(PP - s, n_mb) on
    stage s; with VPP chunks (PP VPP + PP - 1 - 2 s) / VPP stage-equivalents (Megatron-Core's interleaved
    warm-up); the last stage holds one."""
    return {"first": np.minimum(pp, n_mb) * np.where(vpp > 1, 1 + (pp - 1) / (pp * vpp), 1.0),
            "middle": np.minimum(pp - 1, n_mb) * np.where(vpp > 1, (pp + (pp - 3) / vpp) / np.maximum(pp - 1, 1), 1.0),
            "last": np.ones_like(pp)}


#: the stages memory_breakdown weighs, in the order a tie goes to
STAGES = ("first", "middle", "last")


class StageMemory(dict):
    """{category: bytes per device} (arrays over plans) of each plan's worst pipeline stage, whose index
    into :data:`STAGES` is ``stage`` (int array over plans)."""

    def __init__(self, by_category: dict[str, np.ndarray], stage: np.ndarray):
        super().__init__(by_category)
        self.stage = stage

    def take(self, idx: ArrayLike) -> StageMemory:
        """The plans at ``idx``."""
        return StageMemory({k: v[idx] for k, v in self.items()}, self.stage[idx])


def worst_stage(by_stage: dict[str, dict[str, np.ndarray]], pp: np.ndarray) -> np.ndarray:
    """Per plan, the index into :data:`STAGES` of the stage with the most bytes (categories summed): the
    first, the first middle stage (s = 1, only where PP > 2: it keeps PP - 1 micro-batches of the middle
    stages' blocks in flight, more than the first where that one holds fewer or lighter blocks) or the last;
    a tie goes to the earlier."""
    tot = np.stack([np.broadcast_to(sum(by_stage[n].values()), np.shape(pp)) for n in STAGES]).astype(float)
    tot[1] = np.where(np.asarray(pp) > 2, tot[1], -np.inf)
    return np.argmax(tot, axis=0)


def _stages(g: Geometry, pl: ParallelLayout, pb: dict, state: ModelState, sharded: bool) -> dict[str, tuple]:
    """{first | middle | last: (the stage's :class:`StageParams`, its :func:`_state_terms`)}, arrays over plans
    (the middle one: stage 1, the last stage where PP <= 2), evaluated once per distinct
    :func:`~scaleplan.estimator.layout.degree_groups` tuple, all they depend on, and gathered back."""
    first, inv = degree_groups(g, pl)
    gu, pu = g.take(first), pl.take(first)
    out = {}
    for name, s in (("first", np.zeros(len(pu))), ("middle", np.where(pu.pp > 2, 1.0, pu.pp - 1.0)),
                    ("last", pu.pp - 1.0)):
        st = stage_params(gu, pu, stage_counts(gu, pu, s))
        terms = _state_terms(gu, pu, st, pb, state, sharded)
        out[name] = (StageParams(*(getattr(st, f.name)[inv] for f in fields(StageParams))),
                     {k: v[inv] for k, v in terms.items()})
    return out


def _state_terms(g: Geometry, pl: ParallelLayout, st: StageParams, pb: dict, state: ModelState,
                 sharded: bool) -> dict[str, np.ndarray]:
    """Weights, gradients and optimizer state of one stage's parameters ``st`` (bytes per device, arrays
    over plans): the first categories of :func:`memory_breakdown`, which sums them first."""
    n_p = st.total
    shard = (st.dense / (pl.dp.astype(float) * pl.cp.astype(float)) + st.experts / pl.edp) if sharded else n_p
    # fp32 router weights in a low-precision model: 4-byte weights and grads, no master copy
    n_r = st.router * float(state.router_fp32 and g.is_moe)
    lift = 4.0 - pb["weights"]
    # linear layers (every parameter but the vocabulary matrices and the routers) carry an FP8 stack's copies
    linear = n_p - st.n_vocab * vocab_shard(g.vocab, pl.tp) * g.d - st.router
    fp8 = (pb.get("linear_weights", pb["weights"]) - pb["weights"]) * linear
    return {"weights": pb["weights"] * n_p + lift * n_r + fp8, "grads": pb["grads"] * n_p + lift * n_r,
            "optimizer": (pb["master"] + pb["moments"]) * shard - pb["master"] * n_r}


def state_bytes(g: Geometry, pl: ParallelLayout, optimizer: str, state: ModelState = MEGATRON,
                stack: Stack = PAPER_STACK, non_tn: bool = True) -> np.ndarray:
    """Weights + gradients + optimizer state of the heavier of the first and last pipeline stage (bytes
    per device, arrays over plans), summed as :func:`memory_breakdown` sums its total, whose other
    categories (activations, logits, allocator, context) are not negative: a total of at least this. It
    depends on (geometry, TP, CP, PP, DP, EP, ETP) alone, so a search can drop the plans whose model
    state alone exceeds the memory cap before costing their activations."""
    pb = state_bytes_per_param(state, g.precision, optimizer, stack, non_tn)
    sharded = state.shard_optimizer and opt_spec(optimizer).sharded
    out = []
    for s in (np.zeros(len(pl)), pl.pp - 1.0):
        t = _state_terms(g, pl, stage_params(g, pl, stage_counts(g, pl, s)), pb, state, sharded)
        out.append(sum(t.values()))
    return np.maximum(*out)


ALLOCATED = ("weights", "grads", "optimizer", "activations", "logits", "dispatcher", "ddp_buckets", "master_grads")


def allocated_reserved(mem: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(allocated, reserved, device total) bytes from :func:`memory_breakdown`'s categories:
    allocated = model state + activations + logits, all at once (a stack that keeps its gradient
    buffers for the whole step, as Megatron does; see :func:`reference_peak_allocated` for one
    that does not), reserved = allocated + allocator (torch.cuda.memory_reserved; the legacy fixed
    reserve counts here), device total = reserved + context + ep_buffers (what nvidia-smi shows)."""
    allocated = sum(mem[k] for k in ALLOCATED if k in mem)
    reserved = allocated + mem.get("allocator", 0.0) + mem.get("reserve", 0.0)
    return allocated, reserved, reserved + mem.get("context", 0.0) + mem.get("ep_buffers", 0.0)


def reference_peak_allocated(mem: dict[str, np.ndarray], n_mb: ArrayLike) -> np.ndarray:
    """Peak allocated bytes of the reference runner (:data:`REFERENCE_DDP`), whose gradients exist
    only from the first backward to the optimizer step (zero_grad sets them to None) and whose fp32
    master gradients only during the step: weights, master weights, moments and DDP buckets always;
    then the larger of the forward/backward peak (activations and logits, plus the gradients of the
    earlier micro-batches when n_mb > 1) and the optimizer step (gradients and master gradients)."""
    always = mem["weights"] + mem["optimizer"] + mem.get("ddp_buckets", 0.0)
    fwd_bwd = mem["activations"] + mem["logits"] + np.where(np.asarray(n_mb) > 1, mem["grads"], 0.0)
    step = mem["grads"] + mem.get("master_grads", 0.0)
    return always + np.maximum(fwd_bwd, step)
