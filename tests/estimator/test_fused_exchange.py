"""The EP token exchange by dispatcher (estimator/kernels.py exchange_bytes): the all-to-all dispatcher sends a
token once per routed expert, DeepEP and HybridEP once per destination rank and, across NVLink domains, once per
destination domain; an all-to-all across domains is bound by the bytes that leave on the NICs. On a profile with
no collective tables (the exchange analytic) the EP term is the hand count of those bytes."""
from __future__ import annotations

import math

import pytest
from scaleplan.estimator import Estimator
from scaleplan.estimator.analytic import ALPHA_INTER_S, ALPHA_INTRA_S
from scaleplan.estimator.kernels import hit_probability

from scaleplan.profiles import load_profile, profile_file
from scaleplan.specs import Layout, parse_spec

H100 = "p5.48xlarge"
T, D, K, E, L, N_MB = 2048, 1024, 8, 128, 4, 4  # tokens per rank, width, top-k, experts, layers, micro-batches


def test_hit_probability_is_one_minus_the_hypergeometric_miss():
    for e_all, k, e in ((128, 8, 16), (128, 8, 64), (32, 2, 4), (64, 1, 8)):
        assert float(hit_probability(e_all, k, e)) == pytest.approx(1 - math.comb(e_all - e, k) / math.comb(e_all, k))
    assert float(hit_probability(128, 8, 0)) == 0.0 and float(hit_probability(128, 8, 128)) == 1.0


def _ep_a2a(dispatcher: str, n_dev: int) -> float:
    spec = parse_spec({"model": {"n_layers": L, "hidden_sz": D, "inter_sz": 2048, "n_q_heads": 8, "n_kv_heads": 8,
                                 "head_dim": 128, "vocab_sz": 32768,
                                 "moe": {"n_experts": E, "experts_per_token": K, "expert_inter_sz": 512,
                                         "first_dense_layers": 0}},
                       "data": {"gbs": N_MB * n_dev, "seqlen": T, "microbatch_sz": 1},
                       "hardware": {"node_type": H100}, "stack": {"dispatcher": dispatcher}})
    est = Estimator(profile_file(H100), db_url="sqlite://", use_calibration=False)
    r = est.estimate(spec, n_dev, [Layout(dp=n_dev, ep=n_dev, mbs=1, ckpt="none")])[0]
    assert r.sources["ep_a2a"] == "analytic"
    return r.breakdown_s["ep_a2a"]


@pytest.mark.parametrize("dispatcher", ["alltoall", "deepep", "hybridep"])
def test_the_exchange_moves_what_the_dispatcher_sends(dispatcher):
    p = load_profile(H100)
    up, out = p.scaleup_bandwidth, p.scaleout_bandwidth
    row = D * 2.0  # one bf16 token row
    fused = dispatcher != "alltoall"
    # EP 8 inside one node: all-to-all size T K rows, or T rows x 8 ranks x P(a rank of 16 experts is hit)
    s8 = T * row * 8 * (1 - math.comb(E - 16, K) / math.comb(E, K)) if fused else T * K * row
    one8 = 7 * ALPHA_INTRA_S + 7 / 8 * s8 / up
    # EP 16 over two nodes: the bytes leaving the node, T K rows x 8/16, or T rows x P(the other node's 64
    # experts are hit); NVLink carries the rest at once
    leave = T * row * (1 - math.comb(E - 64, K) / math.comb(E, K)) if fused else T * K * row * 8 / 16
    s16 = leave * 16 / 8
    one16 = 15 * ALPHA_INTER_S + max(leave / out, 7 / 16 * s16 / up)
    # dispatch and combine, forward and backward: four exchanges per MoE layer and micro-batch
    assert _ep_a2a(dispatcher, 8) == pytest.approx(N_MB * L * 4 * one8, rel=1e-9)
    assert _ep_a2a(dispatcher, 16) == pytest.approx(N_MB * L * 4 * one16, rel=1e-9)
