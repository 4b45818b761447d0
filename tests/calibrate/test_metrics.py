"""Metric functions against hand-computed values (paper sec:mfu-pred definitions)."""
import math

import numpy as np
import pytest
from scaleplan.calibrate import metrics as M


def test_mape_hand_computed():
    # |1.1-1|/1 = 0.1, |1.8-2|/2 = 0.1, |4.4-4|/4 = 0.1, |3-6|/6 = 0.5 -> mean 0.2
    assert M.mape([1.1, 1.8, 4.4, 3.0], [1.0, 2.0, 4.0, 6.0]) == pytest.approx(0.2)


def test_mape_is_relative_to_measured_not_predicted():
    assert M.mape([2.0], [1.0]) == pytest.approx(1.0)
    assert M.mape([1.0], [2.0]) == pytest.approx(0.5)


def test_spearman_hand_computed():
    # ranks pred (1,2,3,4), meas (1,3,2,4): d^2 = 0+1+1+0 = 2; rho = 1 - 6*2/(4*15) = 0.8
    assert M.spearman([1, 2, 3, 4], [10, 30, 20, 40]) == pytest.approx(0.8)
    assert M.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(M.spearman([1, 1, 1], [1, 2, 3]))


def test_topk_overlap_hand_computed():
    pred = [0.9, 0.8, 0.7, 0.1, 0.2, 0.3]
    meas = [0.9, 0.1, 0.8, 0.7, 0.2, 0.3]
    # top-1: {0} vs {0} -> 1; top-2: {0,1} vs {0,2} -> 1/2; top-3: {0,1,2} vs {0,2,3} -> 2/3
    assert M.topk_overlap(pred, meas, 1) == 1.0
    assert M.topk_overlap(pred, meas, 2) == pytest.approx(0.5)
    assert M.topk_overlap(pred, meas, 3) == pytest.approx(2 / 3)
    # k beyond n is capped at n: everything overlaps
    assert M.topk_overlap(pred, meas, 10) == 1.0


def test_top1_in_top2():
    meas = [0.5, 1.0, 0.7]  # best measured is index 1
    assert M.top1_in_topk([0.9, 0.8, 0.1], meas, 2)  # predicted top-2 = {0, 1}
    assert not M.top1_in_topk([0.9, 0.1, 0.8], meas, 2)  # predicted top-2 = {0, 2}
    assert not M.top1_in_topk([0.9, 0.8, 0.1], meas, 1)


def test_geomean_scale_and_normalized_mape():
    meas = np.array([1.0, 2.0, 4.0])
    pred = meas / 3.0  # right ratios, wrong level
    assert M.geomean_scale(pred, meas) == pytest.approx(3.0)
    out = M.sweep_metrics(pred, meas, normalized=True)
    assert out["mape"] == pytest.approx(0.0, abs=1e-12)
    # the report's MAPE is the step time's: a third of the MFU is three times the step time, 200% off
    assert M.sweep_metrics(pred, meas)["mape"] == pytest.approx(2.0)
    assert M.step_time_mape([2.0, 1.0], [1.0, 1.0]) == pytest.approx(0.25)  # (0.5 + 0) / 2


def test_shape_mismatch_raises():
    with pytest.raises(ValueError):
        M.mape([1.0, 2.0], [1.0])
