"""estimator/jitter.py: the discrete-event 1F1B schedule with per-op jitter against its closed forms."""
import numpy as np
import pytest
from scaleplan.estimator.jitter import deterministic, mean_field_rate, schedule, simulate


def _delays(rng, k, p, n, sigma):
    # one-sided delays (host stalls): exponential of sd sigma, mean sigma, around 1 s forward / 2 s backward
    return (1.0 + sigma * (rng.exponential(1.0, (k, p, n)) - 1.0),
            2.0 + sigma * (rng.exponential(1.0, (k, p, n)) - 1.0))


def test_schedule_is_megatrons_1f1b_order():
    order = schedule(4, 6)
    assert order[0][:4] == [("F", 0), ("F", 1), ("F", 2), ("F", 3)] and order[0][4] == ("B", 0)
    assert order[3][:3] == [("F", 0), ("B", 0), ("F", 1)]  # the last stage has no warm-up
    every = sorted([("F", m) for m in range(6)] + [("B", m) for m in range(6)])
    assert all(sorted(o) == every for o in order)


@pytest.mark.parametrize("p,n", [(1, 5), (2, 3), (4, 8), (8, 4)])
def test_without_jitter_the_step_is_n_plus_p_minus_1_slots(p, n):
    f, b = np.full((1, p, n), 1.0), np.full((1, p, n), 2.0)
    assert simulate(f, b)[0] == pytest.approx(deterministic(p, n, 1.0, 2.0))


def _rate(p, sigma, rng, k=300):
    """Lengthening per extra micro-batch (seconds), from two batch sizes (removes the ramps)."""
    ex = [simulate(*_delays(rng, k, p, n, sigma)).mean() - deterministic(p, n, 1.0, 2.0)
          for n in (4 * p, 8 * p)]
    return (ex[1] - ex[0]) / (4 * p)


def test_one_stage_adds_only_the_mean_of_its_delays():
    rng = np.random.default_rng(0)
    ex = simulate(*_delays(rng, 2000, 1, 16, 0.3)).mean() - deterministic(1, 16, 1.0, 2.0)
    assert abs(ex) < 0.05  # zero-mean delays on one stage: nothing waits for anything


def test_two_stages_lengthen_each_slot_by_the_mean_field_three_quarters_sigma():
    rate = _rate(2, 0.2, np.random.default_rng(1))
    assert rate == pytest.approx(mean_field_rate(2, 0.2), rel=0.10)


def test_deeper_pipelines_lie_between_two_stages_and_the_mean_field_bound():
    rng = np.random.default_rng(2)
    rates = {p: _rate(p, 0.2, rng) for p in (2, 4, 8)}
    assert rates[2] < rates[4] < rates[8]
    for p in (4, 8):
        assert mean_field_rate(2, 0.2) < rates[p] < mean_field_rate(p, 0.2)
    # about linear in sigma: the same draws at twice the spread cost about twice as much (not exactly:
    # the longest path can change with the spread)
    wide, narrow = _rate(4, 0.4, np.random.default_rng(3)), _rate(4, 0.2, np.random.default_rng(3))
    assert wide == pytest.approx(2 * narrow, rel=0.05)
