"""What a training stack's tensors take on a rank (estimator/stack_memory.py), against hand counts of what
Megatron-Core and Transformer Engine keep: the gradient buffer, FP8 weights and their copies, FP8 saved inputs,
and the fused SwiGLU's saved tensors."""
from __future__ import annotations

import numpy as np
import pytest
from scaleplan.estimator import stack_memory as sm
from scaleplan.estimator.memory import block_activation_terms
from scaleplan.estimator.model_dims import geometry

from scaleplan.specs import parse_spec


def test_gradient_buffer_bytes():
    assert sm.grad_bytes(True, 2.0) == 4.0 and sm.grad_bytes(False, 2.0) == 2.0


@pytest.mark.parametrize("recipe, non_tn, fp8_param, want", [
    (None, True, False, 2.0),                  # bf16 weights only
    ("tensorwise", True, False, 2.0 + 1.0),    # B200: bf16 + one FP8 copy (no TN transpose needed)
    ("tensorwise", False, False, 2.0 + 2.0),   # H100: bf16 + FP8 copy + its transpose
    ("delayed", False, True, 1.0 + 1.0),       # H100 FP8 primary weights: the FP8 parameter and its transpose
    ("tensorwise", True, True, 1.0),           # B200 FP8 primary weights: the FP8 parameter alone
    ("mxfp8", True, False, 2.0 + 2 * (1 + 1 / 32)),  # row- and column-wise blocks, one E8M0 byte per 32 each
    ("blockwise", False, False, 2.0 + 2.0),
])
def test_linear_weight_bytes_per_parameter(recipe, non_tn, fp8_param, want):
    assert sm.linear_weight_bytes(recipe, fp8_param, non_tn) == pytest.approx(want)


def _gpt_oss_like():
    """GPT-OSS-120B's widths: d 2880, 64 x 64 query heads, 8 KV heads, 128 experts top-4 of width 2880."""
    return geometry(parse_spec({"model": {
        "n_layers": 36, "hidden_sz": 2880, "inter_sz": 2880, "n_q_heads": 64, "n_kv_heads": 8, "head_dim": 64,
        "vocab_sz": 201088, "attn_gate": False,
        "moe": {"n_experts": 128, "experts_per_token": 4, "expert_inter_sz": 2880, "first_dense_layers": 0}}}).model)


@pytest.mark.parametrize("recipe, per_elem", [(None, 2.0), ("tensorwise", 1.0), ("mxfp8", 1 + 1 / 32)])
def test_an_moe_blocks_fp8_inputs_and_fused_swiglu_by_hand(recipe, per_elem):
    g = _gpt_oss_like()
    s, b, a = 4096, 4, 2.0
    terms = block_activation_terms(s, b, g, 1.0, 1.0, True, a, mcore=True)
    got = sm.adjust_saved(terms, recipe, a, dense_block=False)
    T, R, h, f = s * b, s * b * 4, 2880, 2880
    # the routed experts' fc1 input (R x h) and fc2 input (R x f): FP8 column-wise copies under a recipe
    assert got["expert_in"][0] == pytest.approx(per_elem * R * h)
    assert got["expert_fc2_in"][0] == pytest.approx(per_elem * R * f)
    # the fused weighted SwiGLU keeps its input (fc1's output, 2f wide, bf16) and no activation product
    assert got["expert_fc1_out"][0] == pytest.approx(a * R * 2 * f)
    assert got["expert_act_out"][0] == 0.0 and got["expert_probs_in"][0] == 0.0
    # attention: the QKV input (T x h) as FP8; the output projection reads a view of the attention output
    # (saved by attention in bf16): no tensor of its own in bf16, its FP8 copy (T x 64*64) under a recipe
    assert got["qkv_in"][0] == pytest.approx(per_elem * T * h)
    assert got["out_proj_in"][0] == pytest.approx(0.0 if recipe is None else per_elem * T * 64 * 64)
    assert got["ffn_in"][0] == pytest.approx(a * T * h)
    # what the stack does not touch stays as it was
    assert got["sdpa_out"] == terms["sdpa_out"] and got["norm1_in"] == terms["norm1_in"]


def test_without_the_fused_activation_every_term_is_kept_as_counted():
    g = _gpt_oss_like()
    terms = block_activation_terms(1024, 1, g, 1.0, 1.0, True, 2.0, mcore=True)
    got = sm.adjust_saved(terms, None, 2.0, dense_block=False, fused_activation=False)
    assert {k: v[0] for k, v in got.items()} == {k: v[0] for k, v in terms.items()}


@pytest.mark.parametrize("name, any_layout", [
    ("NVIDIA B200", True), ("NVIDIA GB200", True), ("NVIDIA H100 80GB HBM3", False),
    ("NVIDIA H200", False), ("NVIDIA A100-SXM4-80GB", False), (None, False)])
def test_only_blackwell_runs_fp8_gemms_in_any_layout(name, any_layout):
    # TE keeps a transposed FP8 copy of per-tensor weights only where FP8 GEMMs need the TN layout
    # (compute capability below 10: Hopper, Ada)
    assert sm.non_tn_fp8(name) is any_layout


@pytest.mark.parametrize("recipe, dropped", [(None, ("ffn_in", "expert_fc2_in")), ("mxfp8", ("ffn_in",))])
def test_layernorm_and_moe_act_recompute_drop_the_outputs_megatron_core_discards(recipe, dropped):
    """super-selective is --recompute-modules layernorm moe_act (core_attn under flash attention saves nothing
    more): the pre-MLP norm's output and the experts' activation output are freed and recomputed; an FP8 fc2
    keeps its own quantized copy of its input."""
    from scaleplan.estimator.ckpt import CkptMode
    from scaleplan.estimator.memory import block_activation_bytes

    g = _gpt_oss_like()
    s, b, a = 4096, 4, 2.0
    terms = sm.adjust_saved(block_activation_terms(s, b, g, 1.0, 1.0, True, a, mcore=True), recipe, a, False)
    kept = {m: float(block_activation_bytes(s, b, g, 1.0, 1.0, True, np.array([m]), a, mcore=True,
                                            recipe=recipe)[0]) for m in (CkptMode.SELECTIVE, CkptMode.SUPER_SELECTIVE)}
    T, R, f = s * b, s * b * 4, 2880
    want = {"ffn_in": a * T * 2880, "expert_fc2_in": a * R * f}
    assert kept[CkptMode.SELECTIVE] - kept[CkptMode.SUPER_SELECTIVE] == pytest.approx(
        sum(want[n] for n in dropped) + float(terms["norm_stats"][0]))
