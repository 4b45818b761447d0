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


def test_megatron_attention_saves_contiguous_q_k_v_and_frees_the_qkv_buffer():
    # GPT-OSS: 64 query heads, 8 KV heads of 64. The reference model's SDPA keeps V as a view of the QKV GEMM
    # output (the whole buffer) beside the rotated q and k; Megatron-Core's TE attention copies v (TE's
    # get_qkv_layout finds no layout for it), so q, k, v are three contiguous tensors and the buffer is freed
    g = _gpt_oss_like()
    s, b, a = 4096, 4, 2.0
    T, hd = s * b, 64
    for rope in (True, False):
        mc = block_activation_terms(s, b, g, 1.0, 1.0, True, a, rope=rope, mcore=True)
        assert mc["qkv_out"][0] + mc["qk_rope"][0] == pytest.approx(a * T * (64 + 8 + 8) * hd)
    ref = block_activation_terms(s, b, g, 1.0, 1.0, True, a, rope=True, mcore=False)
    assert ref["qkv_out"][0] + ref["qk_rope"][0] == pytest.approx(a * T * ((64 + 2 * 8) + (64 + 8)) * hd)


def _memory(stack, tp=1, ep=8, mbs=4, profile_domain=8):
    from scaleplan.estimator.layout import ParallelLayout
    from scaleplan.estimator.memory import memory_breakdown
    from scaleplan.specs import Layout

    g = _gpt_oss_like()
    pl = ParallelLayout.from_specs([Layout(tp=tp, ep=ep, mbs=mbs, ckpt="none")], 64)
    return memory_breakdown(g, pl, 1280, 4096, "adamw", stack=stack, scaleup_domain=profile_domain)


def test_the_losses_keep_what_their_code_keeps_per_logit():
    # Megatron-Core's loss (fused or not): an fp32 softmax saved (4 bytes per logit) and, at the peak, the bf16
    # logits or their bf16 gradient (2); TE's writes the gradient into the bf16 logits it saves (2, nothing more)
    from scaleplan.estimator.model_dims import padded_vocab
    from scaleplan.stack import Stack

    TV = 4096 * 4 * float(padded_vocab(201088, 1))
    native, te, unfused = (_memory(Stack(cross_entropy=c)) for c in ("native", "te", "unfused"))
    assert native["logits"][0] == pytest.approx(2 * TV) and te["logits"][0] == 0.0
    assert native["activations"][0] - te["activations"][0] == pytest.approx((4 - 2) * TV)
    assert unfused["logits"][0] == native["logits"][0] and unfused["activations"][0] == native["activations"][0]


def test_deepep_and_hybridep_buffers_by_hand():
    # DeepEP (csrc/config.hpp) at EP 8: 10 channels (20 SMs / 2) x 8 NVLink peers x 256 received tokens, each the
    # bf16 hidden state, its 8-byte source meta, 128 top-k indices (int64) and weights (fp32) and 128 fp32 scales
    h = 2880
    want = 10 * 8 * (2 * 1 + 3) * 4 + 10 * 8 * 256 * (2 * h + 8 + 128 * 8 + 128 * 4 + 128 * 4)
    assert sm.deepep_buffer_bytes(h, 8) == pytest.approx(-(-want // 128) * 128)
    # HybridEP (csrc/hybrid_ep/buffer/intranode.cu) at EP 8 in one NVLink domain: room for every token of the
    # 8 ranks (16384 each) routed here: bf16 tokens, fp32 probabilities over 16 x 8 experts, fp32 scales per 128
    worst = 16384 * 8
    want = worst * 2 * h + worst * 16 * 8 * 4 + worst * (h // 128) * 4
    assert sm.hybridep_buffer_bytes(16384, h, 16, 8, 8) == pytest.approx(want)
    # the all-gather dispatcher gathers every rank's tokens (bf16) at each MoE layer's forward
    buf, tr = sm.dispatcher_bytes("allgather", 16384, h, 16, 8, 8, 2.0)
    assert buf == 0.0 and tr == pytest.approx(2.0 * 16384 * 8 * h)


def test_communication_buffers_sit_outside_the_allocator():
    from scaleplan.estimator.memory import allocated_reserved
    from scaleplan.stack import Stack

    hy, a2a = _memory(Stack(dispatcher="hybridep")), _memory(Stack())
    assert hy["ep_buffers"][0] == pytest.approx(sm.hybridep_buffer_bytes(16384, 2880, 16, 8, 8))
    assert a2a["ep_buffers"][0] == 0.0
    alloc_h, _, total_h = allocated_reserved(hy)
    alloc_a, _, total_a = allocated_reserved(a2a)
    assert alloc_h[0] == pytest.approx(alloc_a[0]) and total_h[0] - total_a[0] == pytest.approx(hy["ep_buffers"][0])


@pytest.mark.parametrize("router_dtype, rb", [("fp32", 4.0), ("model", 2.0), ("fp64", 8.0)])
def test_the_routers_saved_tensors_in_the_router_dtype_by_hand(router_dtype, rb):
    """--moe-router-dtype sets the dtype of the router's logits, its scores and the routing probabilities it keeps
    (Megatron-Core's TopKRouter.gating runs its GEMM in that dtype, or the input's when unset): per token E logits
    and E scores, and K gates; the int64 top-K indices and fp32 per-token statistics do not change. Through the
    whole memory model: one MoE block in flight per layer at PP 1, T = 4 x 4096 tokens on the rank."""
    from scaleplan.estimator.layout import ParallelLayout
    from scaleplan.estimator.memory import memory_breakdown
    from scaleplan.specs import Layout
    from scaleplan.stack import Stack

    g = _gpt_oss_like()
    s, b = 4096, 4
    terms = block_activation_terms(s, b, g, 1.0, 1.0, True, 2.0, mcore=True, router_bytes=rb)
    T = s * b
    assert terms["router_logits_scores"][0] == pytest.approx(2 * rb * T * 128)
    assert terms["router_topk"][0] == pytest.approx(8.0 * T * 4 + rb * T * 4 + 3 * 4.0 * T + 4.0 * b * 128)
    pl = ParallelLayout.from_specs([Layout(ep=8, mbs=b, ckpt="none")], 8)
    act = {d: memory_breakdown(g, pl, 32, s, "adam", stack=Stack(router_dtype=d))["activations"][0]
           for d in ("fp32", router_dtype)}
    assert act[router_dtype] - act["fp32"] == pytest.approx(36 * (rb - 4.0) * T * (2 * 128 + 4))
