"""1F1B bubble (eq:bubble) and vocabulary-stage terms against hand-computed cases."""
import numpy as np
import pytest
from scaleplan.estimator import Estimator
from scaleplan.estimator.model import (
    DispatchLaw,
    bubble_fraction,
    pipeline_time,
    stage_periods,
    vocab_stage_time,
)

from scaleplan.specs import Layout, parse_spec

from .conftest import moe_spec


def test_bubble_fraction_hand_cases():
    # (PP-1)/(VPP n_mb): PP=4, n_mb=32 -> 3/32; interleaving by 2 halves it; PP=1 -> 0
    assert bubble_fraction(4, 1, 32) == pytest.approx(3 / 32)
    assert bubble_fraction(4, 2, 32) == pytest.approx(3 / 64)
    assert bubble_fraction(1, 1, 8) == 0.0
    assert np.allclose(bubble_fraction(np.array([2, 8]), 1, np.array([16, 4])), [1 / 16, 7 / 4])


def test_vocab_term_hand_cases():
    # PP=4, n_mb=8, t_first=1 ms, t_last=10 ms:
    # (8-1)*10 + 1 + 10 = 81 ms, plus the ramp t_last*n_mb*f = 10*8*(3/8) = 30 ms -> 111 ms
    assert vocab_stage_time(8, 4, 1, 1e-3, 10e-3) == pytest.approx(111e-3)
    # PP=1: both on one GPU every micro-batch: 8 * (1 + 10) = 88 ms
    assert vocab_stage_time(8, 1, 1, 1e-3, 10e-3) == pytest.approx(88e-3)
    # VPP=2 halves only the ramp: 81 + 10*8*(3/16) = 96 ms
    assert vocab_stage_time(8, 4, 2, 1e-3, 10e-3) == pytest.approx(96e-3)


def test_stage_model_reduces_to_paper_when_compute_bound():
    # compute-bound (no dispatch floor), last stage slowest: pipelined wall = n_mb t_L (1 + f) + t_vocab
    n_mb, pp, t_layers, tf, tl = 16, 4, 50e-3, 1e-3, 20e-3
    # the LM head's forward (1/3 of it) and backward (2/3) split: compute-bound, the split cannot matter
    st = stage_periods(np.array(pp), np.array(t_layers), np.array(t_layers), np.array(tf), np.array(tl / 3),
                       np.array(2 * tl / 3), np.array(0.0))
    wall = pipeline_time(n_mb, pp, 1, st.period, tf, tl)
    f = 3 / 16
    expect = n_mb * t_layers * (1 + f) + vocab_stage_time(n_mb, pp, 1, tf, tl)
    assert wall == pytest.approx(expect)


def test_dispatch_floor_is_a_max_not_a_sum():
    # CPU 30 ms vs GPU 20 ms per micro-batch: the period is 30 ms, not 50 ms
    z = np.array(0.0)
    st = stage_periods(np.array(1), np.array(20e-3), z, z, z, z, np.array(30e-3))
    assert st.period == pytest.approx(30e-3)
    st = stage_periods(np.array(1), np.array(40e-3), z, z, z, z, np.array(30e-3))
    assert st.period == pytest.approx(40e-3)


def test_loss_sync_exposes_the_lm_head_forward_only():
    # dispatch-bound last stage: host 30 ms, layers 10 ms on the GPU, LM head + CE 4 ms forward and
    # 8 ms backward. The loss's NaN check syncs the host after the forward: 30 + 4 ms. The backward
    # runs while the host launches the layers' backward: 10 + 8 = 18 ms of GPU work < 30 ms, hidden.
    z, pp = np.array(0.0), np.array(2)
    st = stage_periods(pp, np.array(10e-3), np.array(10e-3), z, np.array(4e-3), np.array(8e-3), np.array(30e-3))
    assert st.period == pytest.approx(34e-3)
    assert st.period_disp == pytest.approx(30e-3)
    # compute-bound instead (GPU layers 40 ms): both parts add, 40 + 8 (GPU side) + 4 (after the sync)
    st = stage_periods(pp, np.array(40e-3), np.array(40e-3), z, np.array(4e-3), np.array(8e-3), np.array(30e-3))
    assert st.period == pytest.approx(52e-3)


def test_model_breakdown_uses_the_paper_terms(sqlite_url):
    # an empty DB (analytic everywhere) and no dispatch floor: the model's bubble and vocab components
    # must equal eq:bubble and the paper's t_vocab computed from the same per-stage times
    est = Estimator("p6-b200.48xlarge", db_url=sqlite_url)
    est.model.disp = DispatchLaw(t_gap_s=0.0, t_host_s=0.0)
    spec = parse_spec(moe_spec())
    r = est.estimate(spec, 32, [Layout(pp=4, ep=8, mbs=1, ckpt="full")])[0]
    n_mb = 256 / 8
    f = 3 / n_mb
    b = r.breakdown_s
    block = sum(v for k, v in b.items() if k not in ("bubble", "vocab", "pp_p2p", "dp_comm", "bias_sync",
                                                    "optimizer", "dispatch_floor"))
    assert b["dispatch_floor"] == pytest.approx(0.0, abs=1e-12)
    assert b["bubble"] == pytest.approx(f * block, rel=1e-9)
    assert sum(b.values()) == pytest.approx(r.t_analytic_s, rel=1e-12)
    assert r.t_iter_s == pytest.approx(r.chi_sys * r.t_analytic_s)
