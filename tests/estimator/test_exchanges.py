"""Megatron-Core's blocking 1F1B exchanges (estimator/exchanges.py): the discrete-event schedule,
the closed-form count of exchanges on the critical path, and the model's pp_p2p term built on it."""
import pytest
from scaleplan.estimator import Estimator
from scaleplan.estimator.exchanges import critical_exchanges, simulate, stage_calls

from scaleplan.specs import Layout, parse_spec

from .conftest import moe_spec


def test_end_stages_skip_the_calls_without_a_peer():
    # PP = 3, 2 micro-batches: the first stage never receives a forward, the last never sends one
    first = [c for kind, x in stage_calls(0, 3, 2, 1.0, 2.0) if kind == "X" for c in x]
    last = [c for kind, x in stage_calls(2, 3, 2, 1.0, 2.0) if kind == "X" for c in x]
    assert ("recv", -1) not in first and all(peer == 1 for _, peer in first)
    assert all(peer == 1 for _, peer in last) and ("send", 3) not in last
    # middle stage: one exchange per neighbour and micro-batch in each direction
    mid = [c for kind, x in stage_calls(1, 3, 2, 1.0, 2.0) if kind == "X" for c in x]
    assert sorted(mid).count(("send", 2)) == 2 and sorted(mid).count(("recv", 0)) == 2


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_blocking_exchanges_cost_nothing_at_equal_fixed_stage_times(p, n):
    # the rendezvous alone does not lengthen 1F1B: (n + p - 1)(t_F + t_B), the classic wall
    assert simulate(p, n, 1.0, 3.0) == pytest.approx((n + p - 1) * 4.0)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 8, 16])
@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 37])
@pytest.mark.parametrize("f,b", [(1.0, 2.0), (1.0, 3.0), (2.0, 3.0)])
def test_exchanges_on_the_critical_path_match_the_schedule(p, n, f, b):
    t_x = 1e-3
    got = (simulate(p, n, f, b, t_x) - simulate(p, n, f, b)) / t_x
    assert got == pytest.approx(float(critical_exchanges(p, n)), abs=1e-6)


def test_two_stages_pay_one_exchange_per_slot_deeper_pipelines_two():
    # hand counts: PP = 2, 8 micro-batches: 9 slots, one exchange each; PP = 4: 2 x 11 slots less 3
    assert critical_exchanges(2, 8) == 9 and critical_exchanges(4, 8) == 19 and critical_exchanges(1, 8) == 0


def test_model_charges_the_critical_exchanges_at_the_p2p_cost(sqlite_url):
    # 700M on 32 GPUs at DP 16 (PP 2) / 8 (PP 4): TP CP DP fills a node, so every stage boundary
    # leaves it: one [T, d] bf16 tensor per exchange over one 50 GB/s NIC plus 25 us
    est = Estimator("p6-b200.48xlarge", db_url=sqlite_url)
    spec = parse_spec(moe_spec())
    t_x = 25e-6 + 8192 * 2048 * 2 / 50e9
    for pp, n_x in ((2, 16 + 1), (4, 2 * (32 + 4) - 5)):
        r = est.estimate(spec, 32, [Layout(pp=pp, ep=8, mbs=1, ckpt="full")])[0]
        assert r.breakdown_s["pp_p2p"] == pytest.approx(n_x * t_x, rel=1e-9), pp


def test_interleaved_exchanges_show_only_what_outlasts_the_chunk_they_overlap(sqlite_url):
    """VPP > 1 posts each exchange before the next chunk's compute and waits after it (Megatron-LM's default
    --overlap-p2p-communication): on the NIC they are hidden; over a link a thousand times slower part of each
    shows, less than the whole 2 (VPP n_mb + PP - 1) exchanges the blocking count would charge."""
    from scaleplan.profiles import load_profile

    spec = parse_spec(moe_spec())
    lay = Layout(pp=2, vpp=2, ep=8, mbs=1, ckpt="full")
    nic = Estimator("p6-b200.48xlarge", db_url=sqlite_url).estimate(spec, 32, [lay])[0]
    assert nic.breakdown_s["pp_p2p"] == 0.0
    prof = load_profile("p6-b200.48xlarge")
    slow = prof.model_copy(update={"scaleout_bandwidth": prof.scaleout_bandwidth / 1000})
    r = Estimator(slow, db_url=sqlite_url).estimate(spec, 32, [lay])[0]
    n_x, t_x = 2 * (2 * 16 + 1), 25e-6 + 8192 * 2048 * 2 / (prof.scaleout_bandwidth / 1000)
    assert 0.5 * n_x * t_x < r.breakdown_s["pp_p2p"] < n_x * t_x
