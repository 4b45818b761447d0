"""estimator/jitter_ep.py: EP-coupled 1F1B pipelines against the plain schedule and the closed forms."""
import numpy as np
import pytest
from scaleplan.estimator.jitter import deterministic, simulate
from scaleplan.estimator.jitter_ep import (
    mean_excess,
    op_delays,
    simulate_coupled,
    stall_exponential,
    stall_rare,
)


def _segments(rng, k, e, p, n, kf, kb):
    # 0.1 s per segment plus an exponential delay of scale 0.02 s
    return (0.1 + rng.exponential(0.02, (k, e, p, n, kf)), 0.1 + rng.exponential(0.02, (k, e, p, n, kb)))


@pytest.mark.parametrize("p,n", [(1, 4), (2, 5), (4, 8)])
def test_one_ep_rank_is_the_plain_1f1b_schedule_of_its_summed_segments(p, n):
    f, b = _segments(np.random.default_rng(p), 50, 1, p, n, 3, 5)
    assert simulate_coupled(f, b) == pytest.approx(simulate(f[:, 0].sum(-1), b[:, 0].sum(-1)), rel=1e-12)


@pytest.mark.parametrize("e,p,n", [(2, 2, 4), (4, 4, 6), (8, 3, 3)])
def test_ep_ranks_move_together_so_the_block_is_one_pipeline_of_per_segment_maxima(e, p, n):
    f, b = _segments(np.random.default_rng(e + p), 50, e, p, n, 2, 4)
    reduced = simulate(f.max(axis=1).sum(-1), b.max(axis=1).sum(-1))
    assert simulate_coupled(f, b) == pytest.approx(reduced, rel=1e-12)
    # and the coupling costs: slower than any single pipeline run alone
    alone = np.max([simulate(f[:, i].sum(-1), b[:, i].sum(-1)) for i in range(e)], axis=0)
    assert np.all(simulate_coupled(f, b) > alone)


def test_without_delays_the_coupled_block_takes_n_plus_p_minus_1_slots():
    f, b = np.full((1, 4, 4, 6, 2), 0.5), np.full((1, 4, 4, 6, 4), 0.5)
    assert simulate_coupled(f, b)[0] == pytest.approx(deterministic(4, 6, 1.0, 2.0))


def test_shapes_must_agree():
    with pytest.raises(ValueError, match="must agree"):
        simulate_coupled(np.zeros((1, 2, 2, 3, 1)), np.zeros((1, 2, 2, 4, 1)))


def test_slowest_of_ep_exponentials_has_mean_k_sigma_h_ep():
    d = op_delays(np.random.default_rng(0), 8, 6, (200_000,), 0.5)
    h8 = sum(1 / i for i in range(1, 9))
    assert d.mean() == pytest.approx(6 * 0.5 * h8, rel=0.01)
    assert d.var() == pytest.approx(6 * 0.25 * sum(1 / i ** 2 for i in range(1, 9)), rel=0.03)


@pytest.mark.parametrize("ep", [1, 2, 8])
def test_one_stage_costs_exactly_the_slowest_of_ep_beyond_its_own_delay(ep):
    # P = 1: the ops run back to back, the step adds every op's mean delay
    # Monte Carlo (seeded): 4000 steps of 8 ops x 24 segments, sd ~17 segments each: a standard error of ~0.3
    assert stall_exponential(ep, 1, 8, 4, samples=4000) == pytest.approx(mean_excess(ep, 1, 8, 4), abs=1.0)
    assert stall_rare(ep, 1, 8, 4) == pytest.approx((ep - 1) * 8 * 24, rel=1e-6, abs=1e-3)


def test_exponential_delays_couple_pipelines_mostly_as_an_ep_level():
    # beyond the PP-independent slowest-of-EP mean, 1F1B adds a term that grows with P but hardly with EP
    extra = {ep: stall_exponential(ep, 4, 32, 4) - mean_excess(ep, 4, 32, 4) for ep in (1, 8)}
    assert 0 < extra[1] < extra[8] < 1.5 * extra[1]
    assert mean_excess(8, 4, 32, 4) > 5 * extra[8]


def test_rare_stalls_grow_as_ep_times_pp():
    # per MoE layer and global batch fixed (n_mb L / PP constant): about EP x PP - 1 units of the one-stage count
    unit = 8 * 16 * (2 + 4)
    for ep, p, n, m in ((4, 4, 32, 4), (8, 4, 32, 4), (4, 8, 64, 2)):
        assert stall_rare(ep, p, n, m) == pytest.approx((ep * p - 1) * unit, rel=0.15)
    assert stall_rare(1, 4, 32, 4) < stall_rare(4, 4, 32, 4) / 4
