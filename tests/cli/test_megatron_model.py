"""The model Megatron-LM builds has the parameters scaleplan costs. megatron-core (the ``megatron`` test
extra) builds a small GPTModel on the CPU (gloo, one rank, its local non-Transformer-Engine layer spec) from the same
config the emitted arguments give, and its parameter count must equal scaleplan.geometry's N_tot + embeddings:
Megatron-LM's element-wise output gate (extra QKV columns), attention wider or narrower than d (--kv-channels),
GQA, shared experts, a dense first block, tied and untied embeddings.

Stubbed, and only that: the all-to-all token dispatcher opens a CUDA stream at construction, so the model is built
with the allgather dispatcher; dispatchers hold no parameters, so the count is the same.
"""
from __future__ import annotations

import pytest

from scaleplan.geometry import spec_param_counts
from scaleplan.specs import ModelBlock

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


def _built_params(m: ModelBlock) -> int:
    import torch.nn.functional as F
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from scaleplan.megatron.args import moe_layer_pattern

    moe = m.moe
    kw = {}
    if moe is not None:
        kw = dict(num_moe_experts=moe.n_experts, moe_router_topk=moe.experts_per_token,
                  moe_ffn_hidden_size=moe.expert_inter_sz,
                  moe_shared_expert_intermediate_size=moe.shared_expert_inter_sz or None,
                  moe_layer_freq=moe_layer_pattern(m.n_layers, moe.first_dense_layers, moe.moe_frequency),
                  moe_router_pre_softmax=moe.experts_per_token == 1, moe_token_dispatcher_type="allgather")
    cfg = TransformerConfig(num_layers=m.n_layers, hidden_size=m.hidden_sz, ffn_hidden_size=m.inter_sz,
                            num_attention_heads=m.n_q_heads, kv_channels=m.head_dim, num_query_groups=m.n_kv_heads,
                            attention_output_gate=m.attn_gate == "element", gated_linear_unit=m.glu,
                            activation_func=F.silu, add_bias_linear=False, normalization="RMSNorm",
                            use_cpu_initialization=True, **kw)
    spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False) if moe else get_gpt_layer_local_spec()
    model = GPTModel(cfg, spec, vocab_size=m.vocab_sz, max_sequence_length=64, position_embedding_type="rope",
                     share_embeddings_and_output_weights=m.tie_embeddings)
    return sum(p.numel() for p in model.parameters())


MODELS = {
    "element gate, attention 128 wide on d 96, GQA, shared expert, dense first block":
        dict(n_layers=3, hidden_sz=96, inter_sz=192, n_q_heads=4, n_kv_heads=2, head_dim=32, vocab_sz=1000,
             attn_gate="element", moe=dict(n_experts=4, experts_per_token=2, expert_inter_sz=48,
                                           shared_expert_inter_sz=48, first_dense_layers=1)),
    "no gate, attention 64 wide on d 90 (GPT-OSS-like), K=1, tied, MoE every 2nd block":
        dict(n_layers=4, hidden_sz=90, inter_sz=90, n_q_heads=8, n_kv_heads=2, head_dim=8, vocab_sz=512,
             attn_gate=False, tie_embeddings=True,
             moe=dict(n_experts=8, experts_per_token=1, expert_inter_sz=90, first_dense_layers=0, moe_frequency=2)),
    "dense, element gate": dict(n_layers=2, hidden_sz=64, inter_sz=160, n_q_heads=4, n_kv_heads=4, head_dim=16,
                                vocab_sz=300, attn_gate="element"),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_megatron_builds_the_parameters_scaleplan_costs(one_rank, name):
    m = ModelBlock(**MODELS[name])
    p = spec_param_counts(m)
    assert _built_params(m) == p.n_tot + p.embedding
