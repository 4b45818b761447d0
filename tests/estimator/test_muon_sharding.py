"""Why Muon is modelled (and emitted) as Megatron-Core's layer-wise distributed optimizer.

The paper's 5.4B validation sweep ran pp=1 ep=8 on B200 (../shared/validation/mfu_sweeps.csv). With
the optimizer state replicated on every DP rank (plain ``--optimizer muon``), that layout's state alone
overflows the device: the run could only have sharded it, as Megatron-LM's layer-wise distributed optimizer
(``--optimizer muon --use-distributed-optimizer``; formerly ``dist_muon``) does. The model is the
paper's q=8 rung (validation/models.yaml): 32 layers, d 4096, 128 experts of width 2560, top-3, one
shared expert, the first block dense, tied embeddings.
"""
from dataclasses import replace

import pytest

from scaleplan.emit import megatron_args
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.memory import MEGATRON, allocated_reserved, memory_breakdown
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.profiles import load_profile
from scaleplan.specs import Layout, ModelBlock, parse_spec

Q8 = dict(n_layers=32, hidden_sz=4096, inter_sz=10240, n_q_heads=32, n_kv_heads=8, head_dim=128, vocab_sz=257536,
          tie_embeddings=True, moe=dict(n_experts=128, experts_per_token=3, expert_inter_sz=2560,
                                        shared_expert_inter_sz=2560, first_dense_layers=1))


def _local_params_by_hand(ep: int) -> float:
    d, kv = 4096, 8 * 128
    attn = d * (d + 2 * kv) + d * d + 2 * d              # Q, K, V, O, two norms
    expert, shared = 3 * d * 2560, 3 * d * 2560
    moe = attn + 128 * expert / ep + shared + d * 128    # + router
    return attn + 3 * d * 10240 + 31 * moe + 257536 * d + d  # dense first block, tied embedding, final norm


def test_replicated_muon_state_cannot_fit_the_measured_5p4b_layout():
    hbm = load_profile("p6-b200.48xlarge").hbm_bytes
    g = geometry(ModelBlock(**Q8))
    pl = ParallelLayout.from_specs([Layout(tp=1, cp=1, pp=1, dp=256, ep=8, mbs=1, ckpt="full")], 256)
    sharded = memory_breakdown(g, pl, 2048, 8192, "muon", state=MEGATRON)
    replicated = memory_breakdown(g, pl, 2048, 8192, "muon", state=replace(MEGATRON, shard_optimizer=False))
    n = _local_params_by_hand(8)
    # fp32 master + momentum (8 bytes) on every local parameter: the replicated state by hand
    assert float(replicated["optimizer"][0]) == pytest.approx(8.0 * n, rel=0.01)
    assert float(replicated["weights"][0] + replicated["grads"][0] + replicated["optimizer"][0]) > hbm
    assert float(allocated_reserved(sharded)[1][0]) < hbm  # what the measured run needed: a sharded state


def test_muon_is_emitted_as_the_layer_wise_distributed_optimizer():
    spec = parse_spec({"model": Q8, "optimizer": {"optimizer_type": "muon"}, "data": {"gbs": 2048, "seqlen": 8192}})
    args = {a[0]: a[1:] for a in megatron_args(spec, {**spec.default_layout().model_dump(), "dp": 256, "ep": 8})}
    # Megatron-LM >= core_v0.18: muon with --use-distributed-optimizer is the LayerWiseDistributedOptimizer
    # (validate_args sets use_layer_wise_distributed_optimizer); dist_muon is the deprecated spelling
    assert args["--optimizer"] == ["muon"]
    assert "--use-distributed-optimizer" in args
