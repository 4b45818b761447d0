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
* Recomputed modules: layernorm and moe_act (TEGroupedMLP activation_recompute, the pre-MLP TENorm) run under
  CheckpointWithoutOutput, whose output storage is freed once its consumers have run and rebuilt in the
  backward; the attention's norm is fused into TE's LayerNormLinear and has no output of its own to drop.
"""
from __future__ import annotations

E8M0_PER_ELEMENT = 1.0 / 32.0  # MXFP8: one scale byte per 32 elements
# saved inputs of FP8 GEMMs (estimator.memory.block_activation_terms' names): attention QKV and output
# projection, the dense MLP's fc1 and fc2, the routed experts' fc1 and fc2, the shared expert's fc2. The MoE
# block's FFN input stays: the fp32 router's gating GEMM saves it in the activations' dtype.
FP8_GEMM_INPUTS = ("qkv_in", "out_proj_in", "fc2_in", "expert_in", "expert_fc2_in", "shared_fc2_in")
DENSE_FFN_INPUT = "ffn_in"  # the dense MLP's fc1 input (an FP8 GEMM input in a dense block only)
# tensors a fused (weighted) SwiGLU does not keep
FUSED_ACTIVATION_DROPS = ("act_out", "expert_act_out", "expert_probs_in", "shared_act_out")


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
