"""The runtime calibration (calibrate/joint.py) and eq:desync's placement features."""
import numpy as np
import pytest
from scaleplan.calibrate.joint import IDENTITY, fit_joint
from scaleplan.estimator.model import desync_features

from scaleplan.errors import ScaleplanError


def _synthetic(gpu, host, a2a_frac):
    """t = chi x max(gpu, host x host_scale): a dispatch floor, with chi = 1 + c_level + c_a2a f."""
    def t_pred(p):
        chi = 1 + p["c_level"] + p["c_a2a"] * a2a_frac
        return chi * np.maximum(gpu, host * p["host_scale"])
    return t_pred


def test_recovers_known_scale_and_a2a_term_and_says_what_it_cannot_fit():
    gpu = np.array([1.0, 2.0, 3.0, 1.0, 4.0, 2.5])
    host = np.array([2.0, 2.5, 2.0, 3.0, 1.0, 4.0])
    frac = np.array([0.0, 0.3, 0.0, 0.2, 0.0, 0.4])
    truth = {**IDENTITY, "host_scale": 0.8, "c_a2a": 0.5}
    tp = _synthetic(gpu, host, frac)
    f = fit_joint(tp, tp(truth))
    assert f.params["host_scale"] == pytest.approx(0.8, rel=1e-3)
    assert f.params["c_a2a"] == pytest.approx(0.5, abs=1e-3)
    # no run spans nodes with a pipeline: c_pp moves nothing
    assert "c_pp" not in f.free and "depends" in f.unidentified["c_pp"]
    assert np.abs(f.residuals).max() < 1e-6 < np.abs(f.residuals_before).max()


def test_level_and_host_scale_are_not_both_fitted_when_every_run_is_dispatch_bound():
    # every run host-bound: t = (1 + c_level) host_scale host -> the two are one factor
    host = np.array([2.0, 3.0, 4.0, 5.0])
    tp = _synthetic(np.zeros(4), host, np.zeros(4))
    f = fit_joint(tp, 0.9 * host)
    assert f.free == ["host_scale"] and "not separable" in f.unidentified["c_level"]
    assert f.params["host_scale"] == pytest.approx(0.9, rel=1e-3)


def test_refuses_non_positive_times():
    with pytest.raises(ScaleplanError):
        fit_joint(_synthetic(np.ones(2), np.ones(2), np.zeros(2)), np.array([1.0, 0.0]))


def test_desync_features_follow_megatron_rank_order():
    # 8 GPUs per node. pp neighbours are tp*cp*dp ranks apart:
    ep_nodes, hops, deep = desync_features(1, 1, 4, 64, 8, 8)   # 256 GPUs: every stage on its own nodes
    assert (ep_nodes, hops, deep) == (1, 3, False)
    ep_nodes, hops, deep = desync_features(2, 1, 4, 2, 2, 8)    # stride 4: two stages per node
    assert (ep_nodes, hops, deep) == (1, 1, False)
    ep_nodes, hops, deep = desync_features(1, 1, 8, 1, 1, 8)    # 8 stages on one node
    assert (ep_nodes, hops, deep) == (1, 0, True)
    ep_nodes, hops, deep = desync_features(1, 1, 1, 256, 16, 8)  # EP 16 spans two nodes
    assert (ep_nodes, hops, deep) == (2, 0, False)
