"""What a training stack's tensors add to or take from the memory of a rank (estimator/memory.py), counted from
Megatron-Core core_v0.19.0 and Transformer Engine 2.x. Bytes.

* Gradient buffer: Megatron-Core's DDP keeps one gradient per parameter in fp32 with
  --accumulate-allreduce-grads-in-fp32 (the paper's NeMo stack: grad_reduce_in_fp32), else in the parameter
  dtype (Megatron-LM's default; Megatron-Bridge's MoE performance recipes set grad_reduce_in_fp32 False).
* FP8 weights: TE quantizes each linear layer's weight on a step's first micro-batch and keeps the FP8 copy for
  the others (Linear / GroupedLinear ``_fp8_workspaces``, is_first_microbatch): a row-wise copy for the forward
  and a column-wise one for the data gradient, which per-tensor scaling on Hopper makes a transposed copy (its
  GEMMs take FP8 operands in TN layout only) and Blackwell does not need (is_non_tn_fp8_gemm_supported);
  MXFP8 and blockwise scale along other axes for the column-wise copy, so it always exists, with one E8M0 scale
  byte per 32 elements (MXFP8) each way. With FP8 primary weights (--fp8-param-gather) the parameter itself is
  the FP8 row-wise copy (1 byte instead of bf16's 2) and no cache is kept.
* Saved GEMM inputs: an FP8 Linear saves its quantized input for the weight gradient and drops the row-wise
  half (linear.py: update_usage(rowwise_usage=False, columnwise_usage=True)): 1 byte per element (plus MXFP8's
  scales) instead of the activations' 2.
* Fused activation: Megatron-Core's fused (weighted) SwiGLU (bias_swiglu_fusion, on by default;
  WeightedSwiGLUFunction) saves its input and the routing probabilities only: no activation output and no
  probability product are kept for the backward.
* Cross-entropy (per logit element of one micro-batch): Megatron-Core's vocab-parallel loss, unfused or fused
  (tensor_parallel/cross_entropy.py, fusions/fused_cross_entropy.py), casts the bf16 logits to an fp32 copy,
  turns it into the softmax in place and saves it (4 bytes); the bf16 logits live until the loss returns and
  the bf16 gradient is cast from the fp32 one in the backward (2 bytes, transient, at the activation peak).
  Transformer Engine's (triton/cross_entropy.py) writes the gradient into the bf16 logits in the forward and
  saves them: 2 bytes, nothing transient. The reference model keeps an fp32 log-softmax and its fp32 logits.
* Recomputed modules: layernorm and moe_act (TEGroupedMLP activation_recompute, the pre-MLP TENorm) run under
  CheckpointWithoutOutput, whose output storage is freed once its consumers have run and rebuilt in the
  backward; the attention's norm is fused into TE's LayerNormLinear and has no output of its own to drop.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

if TYPE_CHECKING:
    from scaleplan.stack import Stack

E8M0_PER_ELEMENT = 1.0 / 32.0  # MXFP8: one scale byte per 32 elements
# saved inputs of FP8 GEMMs (estimator.memory.block_activation_terms' names): attention QKV and output
# projection, the dense MLP's fc1 and fc2, the routed experts' fc1 and fc2, the shared expert's fc2. The MoE
# block's FFN input stays: the fp32 router's gating GEMM saves it in the activations' dtype.
FP8_GEMM_INPUTS = ("qkv_in", "out_proj_in", "fc2_in", "expert_in", "expert_fc2_in", "shared_fc2_in")
DENSE_FFN_INPUT = "ffn_in"  # the dense MLP's fc1 input (an FP8 GEMM input in a dense block only)
# tensors a fused (weighted) SwiGLU does not keep
FUSED_ACTIVATION_DROPS = ("act_out", "expert_act_out", "expert_probs_in", "shared_act_out")


def cross_entropy_bytes(impl: str | None) -> tuple[float, float]:
    """(saved, transient) bytes per logit element of the loss (module docstring): ``impl`` a stack's
    cross_entropy ("native", "unfused", "te"), None for the reference model."""
    if impl is None:
        return 4.0, 4.0
    return (2.0, 0.0) if impl == "te" else (4.0, 2.0)


def grad_bytes(grads_fp32: bool, param_bytes: float) -> float:
    """Bytes per parameter of Megatron-Core's gradient buffer: 4 in fp32, else the parameter's."""
    return 4.0 if grads_fp32 else param_bytes


def needs_columnwise_copy(recipe: str, non_tn: bool) -> bool:
    """Whether TE keeps a second (column-wise) FP8 copy of a tensor for the other GEMM direction: always for
    MXFP8 and blockwise scaling, for per-tensor scaling only where the GEMMs need TN layout (Hopper)."""
    return recipe in ("mxfp8", "blockwise") or not non_tn


def fp8_copy_bytes(recipe: str, non_tn: bool) -> float:
    """Bytes per element of a tensor's FP8 copies TE keeps for both GEMM directions (row-wise and, where
    needed, column-wise), MXFP8 scales included."""
    per = 1.0 + (E8M0_PER_ELEMENT if recipe == "mxfp8" else 0.0)
    return per * (2.0 if needs_columnwise_copy(recipe, non_tn) else 1.0)


def linear_weight_bytes(recipe: str | None, fp8_param: bool, non_tn: bool, param_bytes: float = 2.0) -> float:
    """Bytes per parameter of a linear layer's weight on a rank: the stored parameter plus TE's FP8 cache.
    bf16: 2. FP8: the bf16 parameter + its cached FP8 copies; with FP8 primary weights the parameter is the
    row-wise FP8 copy (plus a column-wise one where needed) and nothing else."""
    if recipe is None:
        return param_bytes
    copies = fp8_copy_bytes(recipe, non_tn)
    return copies if fp8_param else param_bytes + copies


def saved_input_bytes(recipe: str | None, act_bytes: float) -> float:
    """Bytes per element of a saved GEMM input: the activations' dtype, or FP8's column-wise copy (with
    MXFP8's scales) under an FP8 recipe."""
    if recipe is None:
        return act_bytes
    return 1.0 + (E8M0_PER_ELEMENT if recipe == "mxfp8" else 0.0)


def adjust_saved(terms: dict, recipe: str | None, act_bytes: float, dense_block: bool,
                 fused_activation: bool = True) -> dict:
    """A block's saved tensors (``{name: (bytes, freed_by)}``, estimator.memory.block_activation_terms) as
    Megatron-Core keeps them on this stack: FP8 GEMM inputs at :func:`saved_input_bytes` per element (the
    output projection's own FP8 copy beside the attention output it reads), and without the activation outputs
    a fused SwiGLU does not keep. ``dense_block``: the FFN input is the dense fc1's (an FP8 GEMM input), not the
    router's."""
    scale = saved_input_bytes(recipe, act_bytes) / act_bytes
    fp8_inputs = FP8_GEMM_INPUTS + ((DENSE_FFN_INPUT,) if dense_block else ())
    out = {}
    for name, (b, freed) in terms.items():
        if fused_activation and name in FUSED_ACTIVATION_DROPS:
            b = 0.0 * b
        elif name in fp8_inputs:
            b = b * scale
        out[name] = (b, freed)
    if recipe is not None and "out_proj_in" in out and "sdpa_out" in out:
        # a bf16 output projection reads a view of the attention output, which attention saves anyway; an FP8
        # one saves its own quantized copy beside it
        b, freed = out["out_proj_in"]
        view = (b == 0) & (terms["sdpa_out"][0] > 0)
        out["out_proj_in"] = (b + view * terms["sdpa_out"][0] * scale, freed)
    if not dense_block:
        for name in recomputed_outputs(recipe):
            if name in out:
                out[name] = (out[name][0], "fine")
    return out


def recomputed_outputs(recipe: str | None) -> tuple[str, ...]:
    """The MoE block's saved tensors Megatron-Core's --recompute-modules layernorm moe_act (our super-selective)
    discards after use and recomputes in the backward (CheckpointWithoutOutput): the pre-MLP norm's output (the
    router's and the dispatcher's input) and the experts' activation output, fc2's input. Under an FP8 recipe fc2
    saves its own FP8 copy of that input, which stays."""
    return ("ffn_in",) + (("expert_fc2_in",) if recipe is None else ())


# GPU model tokens whose FP8 GEMMs take any operand layout (TE's is_non_tn_fp8_gemm_supported: compute
# capability 10 and up)
NON_TN_GPUS = ("B200", "B300", "GB200", "GB300")


def non_tn_fp8(gpu_name: str | None) -> bool:
    """Whether the GPU runs FP8 GEMMs in any layout (Blackwell), so per-tensor FP8 needs no transposed copy."""
    from scaleplan.profiles import gpu_model

    return (gpu_model(gpu_name) or "") in NON_TN_GPUS


# DeepEP's normal-mode buffer (deep_ep v1.2.1, csrc/config.hpp get_nvl_buffer_size_hint and
# get_rdma_buffer_size_hint, the configs of deep_ep/buffer.py get_dispatch_config / get_combine_config, which
# Megatron-Core's fused_a2a.get_buffer takes the larger of): received-token chunks per channel and peer
_DEEPEP_NVL_RECV = ((8, 256), (64, 288), (128, 560), (160, 720))  # (up to this many ranks, NVLink recv tokens)
DEEPEP_RDMA_RECV = 128
DEEPEP_NUM_SMS = 20      # deep_ep Buffer.num_sms, Megatron-Core's historical default: channels = SMs / 2
NVL_PEERS = 8            # deep_ep NUM_MAX_NVL_PEERS
_TOPK, _SCALES, _META = 128, 128, 8  # kNumMaxTopK, kNumMaxScales, sizeof(SourceMeta)


def deepep_buffer_bytes(hidden: float, ranks: int) -> float:
    """Bytes of DeepEP's NVLink and RDMA buffers on each rank of an EP group of ``ranks`` (normal mode, bf16
    hidden states: hidden_bytes = 2 hidden, what fused_a2a.get_hidden_bytes gives). They do not depend on the
    tokens: chunks of received tokens per channel and peer, with their top-k indices and weights and scales."""
    ch, nvl, rdma = DEEPEP_NUM_SMS // 2, min(ranks, NVL_PEERS), max(ranks // NVL_PEERS, 1)
    recv = next((n for up_to, n in _DEEPEP_NVL_RECV if ranks <= up_to), _DEEPEP_NVL_RECV[-1][1])
    hb = 2.0 * hidden
    per_token = hb + _META + _TOPK * 8 + _TOPK * 4 + _SCALES * 4
    nvl_bytes = ch * nvl * (2 * rdma + 3) * 4 + ch * nvl * recv * per_token
    rdma_bytes = 0.0
    if ranks > NVL_PEERS:  # NVSHMEM buffers for the peers in other NVLink domains (16: an int4 per token)
        rdma_bytes = ch * rdma * (NVL_PEERS * 2 + 2) * 2 * 4 + ch * rdma * DEEPEP_RDMA_RECV * 2 * (per_token + 16)
    return float(sum(-(-int(x) // 128) * 128 for x in (nvl_bytes, rdma_bytes)))


def hybridep_buffer_bytes(tokens: ArrayLike, hidden: float, e_loc: ArrayLike, ranks: ArrayLike,
                          domain: int) -> np.ndarray:
    """Bytes of HybridEP's buffers on each rank (DeepEP hybrid-ep branch, csrc/hybrid_ep/buffer: NVLCoordinator
    and, across NVLink domains, RDMACoordinator; bf16 tokens, shared dispatch/combine buffer), sized on the first
    dispatch for the worst case, every token of the group routed to this rank: ``tokens`` per rank (what the
    dispatcher receives: the sequence shard / TP), ``e_loc`` local experts, ``ranks`` in the group, of which
    ``domain`` share an NVLink domain. Arrays over plans."""
    t, e_loc, ranks = (np.asarray(x, dtype=float) for x in (tokens, e_loc, ranks))
    r = np.minimum(ranks, float(domain))
    nodes = np.ceil(ranks / r)
    worst = t * r * nodes
    nvl = worst * (2.0 * hidden + 4.0 * e_loc * r + 4.0 * np.floor(hidden / 128))
    far = nodes - 1.0
    per_tok = 2.0 * hidden + 4.0 * e_loc * r
    rdma = np.where(far > 0, t * (2.0 * hidden + 4.0 * e_loc * r * nodes + 4.0 * np.floor(hidden / 128))
                    + t * far * (per_tok + 4.0 * np.floor(hidden / 128)) + 2.0 * t * far * per_tok, 0.0)
    return nvl + rdma


def dispatcher_bytes(dispatcher: str, tokens: ArrayLike, hidden: float, e_loc: ArrayLike, ranks: ArrayLike,
                     domain: int, act_bytes: float) -> tuple[np.ndarray, np.ndarray]:
    """(communication buffers outside the caching allocator, transient allocated bytes at a MoE layer's
    forward) of the token dispatcher on each rank, arrays over plans; ``ranks`` the EP group (ETP x EP ranks),
    ``tokens`` per rank. The all-gather dispatcher gathers every rank's tokens (token_dispatcher.py
    MoEAllGatherTokenDispatcher: ``ranks`` x ``tokens`` rows, and the combine's rows before the
    reduce-scatter); the all-to-all exchanges only the routed rows the experts keep anyway."""
    t, ranks = np.asarray(tokens, dtype=float), np.asarray(ranks, dtype=float)
    zero = np.zeros(np.broadcast(t, ranks).shape)
    multi = ranks > 1
    if dispatcher == "hybridep":
        return np.where(multi, hybridep_buffer_bytes(t, hidden, e_loc, ranks, domain), 0.0), zero
    if dispatcher == "deepep":
        return np.where(multi, np.vectorize(lambda r: deepep_buffer_bytes(hidden, int(r)))(ranks + zero), 0.0), zero
    if dispatcher == "allgather":
        return zero, np.where(multi, act_bytes * t * ranks * hidden, 0.0)
    return zero, zero


def loss_and_dispatcher_bytes(stack: Stack | None, is_moe: bool, tokens: ArrayLike, logits: ArrayLike,
                              tp: ArrayLike, hidden: float, e_loc: ArrayLike, ep_group: ArrayLike, domain: int,
                              act_bytes: float) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """What the loss and the token dispatcher hold per rank, one micro-batch of ``tokens`` (s b / CP) whose
    ``logits`` per token (the vocabulary shard, times the heads with MTP), arrays over plans: (bytes per logit
    the loss saves, its transient bytes at the peak, the dispatcher's communication buffers, its transient;
    :func:`cross_entropy_bytes`, :func:`dispatcher_bytes` over the sequence-parallel shard tokens / ``tp``).
    ``stack`` None: the reference model (fp32 log-softmax and logits, no dispatcher buffers)."""
    saved, transient = cross_entropy_bytes(stack.cross_entropy if stack is not None else None)
    loss = transient * np.asarray(tokens, dtype=float) * logits
    if stack is None or not is_moe:
        return saved, loss, np.zeros_like(loss), np.zeros_like(loss)
    bufs, disp = dispatcher_bytes(stack.dispatcher, np.asarray(tokens) / tp, hidden, e_loc, ep_group, domain,
                                  act_bytes)
    return saved, loss, bufs, disp
