"""A tiny copy of each catalogue family, built on the CPU by megatron-core's own GPTModel from the
arguments ``--emit megatron`` prints for it, has the parameters scaleplan.geometry counts (N_tot + embeddings + MTP
layers): multi-latent attention with and without a q latent, MTP, the sigmoid router's expert bias (a buffer, not a
parameter), dense first blocks of their own width, q/k norms, attention sinks, biases on every linear, GPT-OSS's
clamped GeGLU and its sliding window, Qwen3's per-head q/k norms, Mixtral.

Needs the ``megatron`` test extra. Stubbed, and only these, since a CPU machine has no GPU, no Transformer Engine and
no APEX: the all-to-all dispatcher opens a CUDA stream at construction (built with the all-gather dispatcher, without
the shared-expert overlap that needs the all-to-all one; dispatchers hold no parameters); grouped GEMM experts need
TE (built as a per-expert loop: the same weights); the weight-gradient fusion needs APEX's CUDA extension (off); the
learnable softmax offset is allocated on the current CUDA device (on the CPU here); MLA's core attention is
Transformer Engine's (megatron-core's local DotProductAttention takes no separate q/k and v head widths: built
without them, it holds no parameters either way) and its TE import succeeds without TE (HAVE_TE off); the fused RoPE
and fp8 version checks (as tests/cli/test_megatron_accepts.py).
"""
from __future__ import annotations

import copy

import pytest

from scaleplan.geometry import spec_param_counts
from scaleplan.specs import parse_spec

from . import mlm

pytest.importorskip("megatron.core.models.gpt.gpt_model")


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{tmp_path_factory.mktemp('pg') / 'store'}", rank=0,
                                world_size=1)
    ps.initialize_model_parallel(1, 1)
    yield
    ps.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch):
    import megatron.core.models.common.embeddings.rope_utils as rope
    import megatron.core.transformer.transformer_config as tc
    import torch

    monkeypatch.setattr(tc, "is_te_min_version", lambda *a, **k: True)
    monkeypatch.setattr(rope, "fused_apply_rotary_pos_emb", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    import megatron.core.transformer.multi_latent_attention as mla
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    monkeypatch.setattr(mla, "HAVE_TE", False)  # its TE module imports without TE installed, its classes are None

    init = DotProductAttention.__init__

    def without_widths(self, *a, k_channels=None, v_channels=None, **kw):
        init(self, *a, **kw)

    monkeypatch.setattr(DotProductAttention, "__init__", without_widths)


def _tiny(name: str, **model) -> dict:
    """The catalogue spec of ``name`` with its model block's sizes replaced (its features kept)."""
    from scaleplan import catalogue

    doc = copy.deepcopy(catalogue.spec_data(name))
    moe = model.pop("moe", {})
    doc["model"].update(model)
    doc["model"]["moe"].update(moe)
    doc["data"] = {"gbs": 8, "seqlen": 64}
    return doc


TINY = {
    "deepseek-v3 (MLA with q latent, 1 MTP layer, 2 dense blocks, sigmoid router with expert bias)":
        _tiny("deepseek-v3", n_layers=4, hidden_sz=64, inter_sz=160, n_q_heads=4, n_kv_heads=4, head_dim=24,
              vocab_sz=256, mla={"q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "v_head_dim": 16},
              moe={"n_experts": 8, "experts_per_token": 2, "expert_inter_sz": 32, "shared_expert_inter_sz": 32,
                   "first_dense_layers": 2}),
    "kimi-k2 shape (MLA without q latent, one dense block)":
        _tiny("kimi-k2", n_layers=3, hidden_sz=64, inter_sz=128, n_q_heads=2, n_kv_heads=2, head_dim=20,
              vocab_sz=300, mla={"q_lora_rank": None, "kv_lora_rank": 24, "qk_rope_head_dim": 4, "v_head_dim": 12},
              moe={"n_experts": 12, "experts_per_token": 3, "expert_inter_sz": 16, "shared_expert_inter_sz": 16}),
    "qwen3-30b-a3b (per-head q/k norms, attention wider than d)":
        _tiny("qwen3-30b-a3b", n_layers=3, hidden_sz=48, inter_sz=96, n_q_heads=8, n_kv_heads=2, head_dim=16,
              vocab_sz=200, moe={"n_experts": 8, "experts_per_token": 2, "expert_inter_sz": 24}),
    "qwen3-235b-a22b (MoE every 2nd block)":
        _tiny("qwen3-235b-a22b", n_layers=4, hidden_sz=32, inter_sz=64, n_q_heads=4, n_kv_heads=1, head_dim=16,
              vocab_sz=128, moe={"n_experts": 4, "experts_per_token": 2, "expert_inter_sz": 16, "moe_frequency": 2}),
    "gpt-oss-120b (biases everywhere, sinks, window SF, clamped GeGLU)":
        _tiny("gpt-oss-120b", n_layers=4, hidden_sz=40, inter_sz=40, n_q_heads=4, n_kv_heads=2, head_dim=8,
              vocab_sz=256, sliding_window={"size": 8, "pattern": "SF"},
              moe={"n_experts": 8, "experts_per_token": 2, "expert_inter_sz": 40}),
    "gpt-oss-20b (window pattern SSF)":
        _tiny("gpt-oss-20b", n_layers=3, hidden_sz=32, inter_sz=24, n_q_heads=4, n_kv_heads=4, head_dim=8,
              vocab_sz=96, sliding_window={"size": 4, "pattern": "SSF"},
              moe={"n_experts": 4, "experts_per_token": 1, "expert_inter_sz": 24}),
    "mixtral-8x7b (GQA, 8 experts top-2)":
        _tiny("mixtral-8x7b", n_layers=2, hidden_sz=64, inter_sz=112, n_q_heads=8, n_kv_heads=2, head_dim=8,
              vocab_sz=320, moe={"expert_inter_sz": 112}),
    "mixtral-8x22b with a window on every block (Mistral-style)":
        _tiny("mixtral-8x22b", n_layers=2, hidden_sz=48, inter_sz=64, n_q_heads=6, n_kv_heads=2, head_dim=8,
              vocab_sz=128, sliding_window={"size": 16, "pattern": "S"}, moe={"expert_inter_sz": 64}),
    "the paper's moe-5p4b (head-wise gate: not emitted, so counted without it)":
        _tiny("moe-5p4b", n_layers=3, hidden_sz=64, inter_sz=160, n_q_heads=4, n_kv_heads=2, head_dim=16,
              vocab_sz=256, attn_gate=False, moe={"n_experts": 8, "expert_inter_sz": 40, "shared_expert_inter_sz": 40}),
}


def build_from_emitted(spec) -> int:
    """Parameters of the GPTModel megatron-core builds from ``spec``'s emitted arguments (one rank)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    from scaleplan.megatron.args import megatron_text

    lo = {**spec.default_layout().model_dump(), "dp": 1}
    ns, _ = mlm.parse(mlm.argv(megatron_text(spec, lo, 1, 8)))
    mlm.validate(ns, 1)
    ns.update(moe_token_dispatcher_type="allgather", moe_shared_expert_overlap=False, moe_grouped_gemm=False,
              gradient_accumulation_fusion=False,
              use_cpu_initialization=True)
    cfg = mlm.transformer_config(ns)
    block = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization="RMSNorm")
    mtp = get_gpt_mtp_block_spec(cfg, block.layer_specs[-1], use_transformer_engine=False) if cfg.mtp_num_layers \
        else None
    model = GPTModel(cfg, block, vocab_size=ns["vocab_size"], max_sequence_length=ns["seq_length"],
                     position_embedding_type=ns["position_embedding_type"],
                     share_embeddings_and_output_weights=not ns["untie_embeddings_and_output_weights"],
                     mtp_block_spec=mtp)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", list(TINY))
def test_megatron_builds_the_family_scaleplan_counts(one_rank, name):
    spec = parse_spec(TINY[name])
    p = spec_param_counts(spec.model)
    assert build_from_emitted(spec) == p.n_tot + p.embedding + p.mtp


def test_olmoe_qk_norm_over_the_projection(one_rank):
    """OLMoE normalises each whole q and k projection; Megatron-LM builds per-head norms (the nearest, noted when
    emitted): its count is ours less (n_q + n_kv - 2) x head_dim per block, by hand."""
    spec = parse_spec(_tiny("olmoe-1b-7b", n_layers=2, hidden_sz=48, inter_sz=32, n_q_heads=6, n_kv_heads=6,
                            head_dim=8, vocab_sz=100, moe={"n_experts": 4, "experts_per_token": 2,
                                                           "expert_inter_sz": 32}))
    p = spec_param_counts(spec.model)
    assert build_from_emitted(spec) == p.n_tot + p.embedding - 2 * (6 + 6 - 2) * 8
