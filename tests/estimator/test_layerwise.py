"""Megatron-Core's layer-wise distributed optimizer (muon, scion) gathers the updated parameters by one
broadcast per parameter tensor (estimator/layerwise.py): the tensor inventory and the time it costs."""
from __future__ import annotations

import numpy as np
import pytest
from scaleplan.estimator import Estimator
from scaleplan.estimator.analytic import ALPHA_INTER_S
from scaleplan.estimator.comm import collective_time, dp_buckets
from scaleplan.estimator.context import Lookups
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.layerwise import stage_tensors
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.params import stage_params
from scaleplan.estimator.sources import Recorder
from scaleplan.profiles import load_profile
from scaleplan.specs import Layout, ModelBlock, parse_spec
from tests.estimator.conftest import moe_spec

# the 5.4B validation model (validation/models.yaml moe-5p4b): tied embeddings, the first block dense
Q8 = dict(n_layers=32, hidden_sz=4096, inter_sz=10240, n_q_heads=32, n_kv_heads=8, head_dim=128, vocab_sz=257536,
          tie_embeddings=True, moe=dict(n_experts=128, experts_per_token=3, expert_inter_sz=2560,
                                        shared_expert_inter_sz=2560, first_dense_layers=1))
PROFILE = "p6-b200.48xlarge"


def _f(x) -> float:
    return float(np.ravel(x)[0])


def _sum(tensors) -> float:
    return sum(_f(c) * _f(n) for c, n in tensors)


@pytest.mark.parametrize("model", [ModelBlock(**Q8), parse_spec(moe_spec()).model])
@pytest.mark.parametrize("tp,pp,ep", [(1, 1, 8), (1, 2, 1), (2, 4, 4), (1, 4, 16)])
def test_tensor_inventory_adds_up_to_the_stage_parameters(model, tp, pp, ep):
    g = geometry(model)
    lay = ParallelLayout.of(tp=tp, pp=pp, dp=64, ep=ep)
    for s in range(pp):
        dense, experts = stage_tensors(g, lay, s)
        p = stage_params(g, lay, s)
        # params.stage_params splits the norms and the router over TP too; Megatron replicates them
        replicated = (1 - 1 / tp) * (2 * g.d * _f(p.n_layers) + _f(p.n_moe) * g.E * g.d)
        assert _sum(dense) == pytest.approx(_f(p.dense) + replicated, rel=1e-12)
        assert _sum(experts) == pytest.approx(_f(p.experts), rel=1e-12)


def test_tensor_count_of_the_5p4b_pp1_ep8_by_hand():
    dense, experts = stage_tensors(geometry(ModelBlock(**Q8)), ParallelLayout.of(pp=1, dp=256, ep=8), 0)
    # 2 norms x 32 blocks + final norm, QKV and O per block, one tied vocabulary matrix, 31 MoE blocks'
    # router and shared fc1/fc2, the dense block's fc1/fc2; 31 MoE blocks x 16 local experts x fc1/fc2
    assert sum(_f(c) for c, _ in dense) == 65 + 32 + 32 + 1 + 31 + 62 + 2
    assert sum(_f(c) for c, _ in experts) == 31 * 16 * 2


def _by_hand(ep: int, pp: int, dp: int):
    """Analytic tables (no recorded rows): per stage, each group's last gradient all-reduce bucket
    and its broadcasts, one per tensor, each (n - 1) hop latencies + S / bandwidth for S bf16 bytes."""
    spec = parse_spec(moe_spec(optimizer={"optimizer_type": "muon"}))
    g, prof = geometry(spec.model), load_profile(PROFILE)
    est = Estimator.from_frames(PROFILE, {})
    lay = ParallelLayout.of(pp=pp, dp=dp, ep=ep)
    last, bcast = [], []
    for s in range(pp):
        grads, sent = 0.0, 0.0
        for (params, group, layout, inter, nb), tensors in zip(dp_buckets(g, lay, 8, s), stage_tensors(g, lay, s)):
            group, params, nb, inter = _f(group), _f(params), _f(nb), bool(_f(inter))
            if group <= 1:
                continue
            ar = collective_time(Lookups(est.tables.view("bf16"), prof, Recorder(1, "compose")), "dp_comm",
                                 "all_reduce", np.atleast_1d(group), np.atleast_1d(params / nb * 4.0),
                                 np.atleast_1d(inter), layout, active=np.atleast_1d(True))
            grads += float(ar[0])  # of nb buckets only the last one stays exposed: nb * t / nb
            bw = prof.scaleout_bandwidth if inter else prof.scaleup_bandwidth
            assert inter, "these layouts leave the node in every DP group"
            sent += sum(_f(c) * ((group - 1) * ALPHA_INTER_S + 2.0 * _f(n) / bw) for c, n in tensors)
        last.append(grads)
        bcast.append(sent)
    return spec, est, last, bcast


def test_muon_gathers_by_one_broadcast_per_tensor_after_the_step():
    spec, _, last, bcast = _by_hand(ep=8, pp=1, dp=32)
    est = Estimator.from_frames(PROFILE, {}, host_scale=1e4)  # the backward hides all but the last buckets
    got = est.estimate(spec, 32, [Layout(pp=1, ep=8, dp=32, mbs=1, ckpt="full")])[0].breakdown_s["dp_comm"]
    assert got == pytest.approx(last[0] + bcast[0], rel=1e-9)


def test_the_pipeline_drain_does_not_hide_the_broadcasts():
    # PP = 2 on 64 GPUs: the last stage's gradient tail hides behind the first stage's drain, its
    # broadcasts (the LM head and the final norm: the larger set) do not
    spec, _, last, bcast = _by_hand(ep=4, pp=2, dp=32)
    assert bcast[1] > bcast[0]
    est = Estimator.from_frames(PROFILE, {}, host_scale=1e4)
    got = est.estimate(spec, 64, [Layout(pp=2, ep=4, dp=32, mbs=1, ckpt="full")])[0].breakdown_s["dp_comm"]
    assert got == pytest.approx(last[0] + bcast[1], rel=1e-9)


def test_adamw_keeps_the_bucketed_all_gather():
    # ZeRO-1's gather is bucketed (max(40M, 1M x DP) parameters): far fewer calls than tensors
    spec = parse_spec(moe_spec(optimizer={"optimizer_type": "adamw"}))
    muon = parse_spec(moe_spec(optimizer={"optimizer_type": "muon"}))
    est = Estimator.from_frames(PROFILE, {}, host_scale=1e4)
    lay = [Layout(pp=1, ep=1, dp=32, mbs=1, ckpt="full")]
    t_adam = est.estimate(spec, 32, lay)[0].breakdown_s["dp_comm"]
    t_muon = est.estimate(muon, 32, lay)[0].breakdown_s["dp_comm"]
    n_tensors = 15 * 128 * 2  # local expert tensors alone at EP = 1
    assert t_muon - t_adam > 0.5 * n_tensors * 31 * ALPHA_INTER_S


@pytest.mark.recorded
def test_latency_bound_broadcasts_on_the_recorded_tables(recorded_db):
    # read the recorded points directly: the inter-node contiguous all-gather at its smallest message
    import sqlite3

    con = sqlite3.connect(recorded_db.removeprefix("sqlite:///"))
    rows = dict(con.execute("select group_size, t_s from collective_point where collective = 'all_gather' and "
                            "layout = 'contiguous' and inter_node = 1 and size_bytes = (select min(size_bytes) "
                            "from collective_point where collective = 'all_gather' and layout = 'contiguous' "
                            "and inter_node = 1)").fetchall())
    con.close()
    assert sorted(rows) == [16, 32]
    hop = (rows[32] - rows[16]) / 16  # the ring's latency per added rank
    assert 5e-6 < hop < 20e-6

    from scaleplan.estimator.comm import _broadcast_loop

    est = Estimator(PROFILE, db_url=recorded_db, use_calibration=False)
    tb = est.tables.view("bf16")

    def one_norm(n):  # a single 2048-element norm weight: far below the smallest measured message
        rec = Recorder(1, "compose")
        return float(_broadcast_loop(Lookups(tb, est.profile, rec), [(np.ones(1), np.full(1, 2048.0))],
                                     np.full(1, float(n)), np.ones(1, bool), "contiguous", np.ones(1, bool), None)[0])

    assert one_norm(32) == pytest.approx(rows[32], rel=0.02)  # the measured floor, not the analytic 31 hops
    assert one_norm(256) == pytest.approx(one_norm(32) + 224 * hop, rel=1e-9)
    assert one_norm(256) < 255 * ALPHA_INTER_S  # shorter than the analytic ring's hops
