"""Memory model against Megatron's theoretical memory formula (Korthikanti et al. 2022)."""
import numpy as np
import pytest
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.memory import (MEGATRON, dense_block_bytes, dense_layer_activation_bytes, memory_breakdown,
                                        outside_blocks_saved_bytes)
from scaleplan.estimator.layout import ParallelLayout

from scaleplan.specs import Layout, ModelBlock

H, A, L, F, V = 4096, 32, 32, 11008, 32000


def _dense_block() -> ModelBlock:
    return ModelBlock(n_layers=L, hidden_sz=H, inter_sz=F, n_q_heads=A, n_kv_heads=A, head_dim=H // A,
                      vocab_sz=V, glu=True, attn_gate=False, tie_embeddings=False)


def _params_by_hand() -> float:
    # per layer: Q, K, V, O (4 h^2) + 2 norms (2 h) + SwiGLU (3 h f); final norm h; embedding + LM head 2 V h
    return L * (4 * H * H + 2 * H + 3 * H * F) + H + 2 * V * H


@pytest.mark.parametrize("dp", [1, 8, 64])
def test_model_state_is_megatron_18_bytes_sharded(dp):
    # Megatron theoretical_memory_usage, distributed optimizer: 6 + 12/DP bytes per parameter
    g = geometry(_dense_block())
    pl = ParallelLayout.from_specs([Layout(tp=1, pp=1, dp=dp, mbs=1, ckpt="full")], dp)
    m = memory_breakdown(g, pl, gbs=dp * 4, seqlen=2048, optimizer="adam")
    state = float(m["weights"][0] + m["grads"][0] + m["optimizer"][0])
    expect = _params_by_hand() * (6 + 12 / dp)
    assert state == pytest.approx(expect, rel=1e-5)


@pytest.mark.parametrize("s,b,h,a,t", [(2048, 1, 4096, 32, 1), (4096, 2, 8192, 64, 8), (1024, 4, 2048, 16, 2)])
def test_activation_formula_of_korthikanti(s, b, h, a, t):
    # per layer, no recompute, TP + sequence parallel: s b h (34 + 5 a s / h) / t bytes
    got = dense_layer_activation_bytes(s, b, h, a, 4 * h, dropout=True, flash=False, tp=t)
    assert got == pytest.approx(s * b * h * (34 + 5 * a * s / h) / t)


def test_flash_drops_the_score_term_and_full_recompute_keeps_layer_inputs():
    s, b, h, a = 2048, 1, 4096, 32
    assert dense_layer_activation_bytes(s, b, h, a, 4 * h, flash=True) == pytest.approx(s * b * h * 34)
    g = geometry(_dense_block())
    lays = [Layout(pp=1, dp=8, mbs=1, ckpt=c) for c in ("none", "full")]
    m = memory_breakdown(g, ParallelLayout.from_specs(lays, 8), gbs=64, seqlen=s, optimizer="adam")
    none, full = m["activations"]
    one_layer = float(dense_block_bytes(s, b, g, 1, 0, mcore=True))  # Megatron-Core's: its fused SwiGLU
    outside = none - L * one_layer  # token ids, RoPE tables, final norm, LM head input, the loss's softmax
    assert outside == pytest.approx(float(outside_blocks_saved_bytes(s, b, g, 1, 2.0, True, True)))
    # full: one stored [s, b, h] bf16 input per layer + one layer's activations while it is recomputed
    assert full == pytest.approx(L * 2 * s * b * h + one_layer + outside)
    assert none > full


def test_expert_optimizer_state_shards_over_edp():
    from scaleplan.geometry import ladder_model

    g = geometry(ladder_model(4, 128, 3, 4))
    lays = [Layout(pp=2, dp=16, ep=e, mbs=1) for e in (1, 8)]
    m = memory_breakdown(g, ParallelLayout.from_specs(lays, 32), gbs=256, seqlen=8192, optimizer="adamw")
    # experts are sharded over EP for weights/grads; their optimizer state over EDP = DP/EP, so
    # per-device expert optimizer bytes are the same for EP=1 and EP=8 (12 B x experts / DP)
    w1, w8 = m["weights"]
    n_exp_stage = (g.L / 2) * g.expert_params
    assert w1 - w8 == pytest.approx(2 * n_exp_stage * (1 - 1 / 8), rel=1e-9)
    o1, o8 = m["optimizer"]
    assert o1 == pytest.approx(o8, rel=1e-9)
    assert np.all(m["reserve"] > 0)


def test_sgd_state_is_not_sharded_megatron_runs_it_under_plain_ddp():
    # Megatron-Core's distributed optimizer takes the Adam family only: SGD's fp32 master + momentum
    # (8 bytes/param) stay whole on every DP rank, while Adam's 12 bytes shard over DP
    g = geometry(_dense_block())
    pl = ParallelLayout.from_specs([Layout(tp=1, pp=1, dp=8, mbs=1, ckpt="full")], 8)
    sgd = memory_breakdown(g, pl, gbs=32, seqlen=2048, optimizer="sgd")
    adam = memory_breakdown(g, pl, gbs=32, seqlen=2048, optimizer="adam")
    assert float(sgd["optimizer"][0]) == pytest.approx(8.0 * _params_by_hand(), rel=1e-5)
    assert float(adam["optimizer"][0]) == pytest.approx(12.0 * _params_by_hand() / 8, rel=1e-5)


@pytest.mark.parametrize("optimizer,expect", [("adam", {"reduce_scatter", "all_gather"}),
                                              ("muon", {"all_reduce", "all_gather"}), ("sgd", {"all_reduce"})])
def test_dp_collectives_follow_the_optimizer_megatron_runs(optimizer, expect):
    # ZeRO-1 for Adam; layer-wise (dist_muon) for Muon: all-reduce, then the owners' parameters gathered;
    # plain DDP for SGD: the all-reduce alone. The bench plan's lookups are the collectives the model costs.
    from scaleplan.estimator import Estimator
    from scaleplan.estimator.lookup_listing import recorded_lookups

    est = Estimator.from_frames("p6-b200.48xlarge", {})
    g = geometry(_dense_block())
    pl = ParallelLayout.from_specs([Layout(tp=1, pp=1, dp=16, mbs=1, ckpt="full")], 16)
    pts = recorded_lookups(est.model, est.tables, g, pl, gbs=64, seqlen=2048, optimizer=optimizer)
    dp_colls = {p["collective"] for p in pts["collectives"] if p["group_size"] == 16}
    assert dp_colls == expect


@pytest.mark.parametrize("ckpt", ["none", "selective", "super-selective", "full"])
def test_moe_blocks_save_what_megatron_core_saves(ckpt):
    """Megatron-Core's MoE layer (0.13 on), against the reference model's (REFERENCE_DDP): its router
    GEMM saves the bf16 input the shared expert saves too, not an fp32 copy (4 T h bytes less); the
    probabilities multiply the SwiGLU output before fc2 and the unpermute takes none, so neither the
    fc2 output nor its gated copy is kept (2 x 2 R h less); and its SwiGLUs are fused
    (WeightedSwiGLUFunction, bias_swiglu_fusion on by default), saving their input and the probabilities
    only: no activation output of the routed experts (2 R f), the shared expert (2 T f_s) or the dense
    block (2 T d_ff), which the reference model keeps unless super-selective recompute drops them; under
    super-selective (--recompute-modules layernorm moe_act) Megatron-Core also frees the pre-MLP norm's output
    (2 T h) and the experts' activation output, fc2's input (2 R f); R = T K routed rows. In every block its
    Transformer Engine attention saves contiguous q, k, v and no QKV GEMM output, which the reference model's
    SDPA keeps alive through V's view beside the rotated q and k (2 T (n_q + n_kv) d_head less)."""
    from scaleplan.estimator.memory import REFERENCE_DDP
    from scaleplan.geometry import ladder_model

    m = ladder_model(10, 128, 2, 4)
    h, f, K, L = m.hidden_sz, m.moe.expert_inter_sz, m.moe.experts_per_token, m.n_layers
    s, b = 2048, 2
    T = s * b
    R = T * K
    pl = ParallelLayout.from_specs([Layout(tp=1, pp=1, ep=8, dp=8, mbs=b, ckpt=ckpt)], 8)
    g = geometry(m)
    mcore, ref = (memory_breakdown(g, pl, gbs=64, seqlen=s, optimizer="adamw", state=st)["activations"][0]
                  for st in (MEGATRON, REFERENCE_DDP))
    fs, dff = m.moe.shared_expert_inter_sz, m.inter_sz
    act = ckpt != "super-selective"  # the activation outputs the reference model keeps
    per_block = 4 * T * h + 2 * 2 * R * h + (2 * R * f + 2 * T * fs if act else 2 * T * h + 2 * R * f)
    # one stage holds the dense block and all L - 1 MoE blocks; full recompute keeps only the block inputs
    # (same in both) plus one MoE block's whole activations while it is recomputed
    attn = 2 * T * (m.n_q_heads + m.n_kv_heads) * m.head_dim
    expect = per_block + attn if ckpt == "full" else (L - 1) * per_block + L * attn + (2 * T * dff if act else 0)
    assert ref - mcore == pytest.approx(expect, rel=1e-9)


def test_a_deep_pipeline_is_worst_on_its_second_stage():
    """The 700M model (16 blocks, block 0 dense) over PP 16, one block a stage: the first stage keeps 16
    micro-batches of its dense block in flight, stage 1 keeps 15 of its MoE block (1F1B's warm-up: PP - s),
    which weigh more whenever an MoE block saves more than 16/15 of a dense one (a 32k vocabulary: the last
    stage's one micro-batch and logits weigh less)."""
    from scaleplan.estimator.memory import STAGES, act_bytes, moe_layer_activation_bytes
    from scaleplan.specs import parse_spec

    from .conftest import moe_spec

    spec = parse_spec(moe_spec(model={**moe_spec()["model"], "vocab_sz": 32000}))
    g = geometry(spec.model)
    pl = ParallelLayout.from_specs([Layout(pp=16, dp=2, ep=2, mbs=1, ckpt="none")], 32)
    mem = memory_breakdown(g, pl, gbs=256, seqlen=8192, optimizer="adamw")
    a, none = act_bytes(g.precision), np.array([0])
    moe = float(moe_layer_activation_bytes(8192, 1, g, 1, 1, none, a, mcore=True)[0])
    dense = float(dense_block_bytes(8192, 1, g, 1, none, a, mcore=True)[0])
    assert moe > 16 / 15 * dense and STAGES[int(mem.stage[0])] == "middle"
    assert float(mem["activations"][0]) == pytest.approx(15 * moe, rel=1e-12)  # no recompute peak, no logits
    assert float(mem["logits"][0]) == 0.0
