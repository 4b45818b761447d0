"""eq:desync's placement features (estimator/desync.py): which groups leave the node, in Megatron-Core's
rank order (tp fastest, then cp, dp, pp)."""
import numpy as np
import pytest
from scaleplan.estimator.desync import ChiCoefficients, chi_sys, desync_features
from scaleplan.estimator.layout import ParallelLayout


def test_desync_features_follow_megatron_rank_order():
    # 8 GPUs per node. pp neighbours are tp*cp*dp ranks apart:
    ep_nodes, hops, deep = desync_features(ParallelLayout.of(tp=1, cp=1, pp=4, dp=64, ep=8), 8)  # 256 GPUs: every stage on its own nodes
    assert (ep_nodes, hops, deep) == (1, 3, False)
    ep_nodes, hops, deep = desync_features(ParallelLayout.of(tp=2, cp=1, pp=4, dp=2, ep=2), 8)  # stride 4: two stages per node
    assert (ep_nodes, hops, deep) == (1, 1, False)
    ep_nodes, hops, deep = desync_features(ParallelLayout.of(tp=1, cp=1, pp=8, dp=1, ep=1), 8)  # 8 stages on one node
    assert (ep_nodes, hops, deep) == (1, 0, True)
    ep_nodes, hops, deep = desync_features(ParallelLayout.of(tp=1, cp=1, pp=1, dp=256, ep=16), 8)  # EP 16 spans two nodes
    assert (ep_nodes, hops, deep) == (2, 0, False)


def test_chi_sys_is_eq_desync_by_hand():
    """chi = 1 + c_level + c_a2a (t_A2A / t) [EP spans nodes] + c_pp hops + c_ovl [deep], per plan."""
    c = ChiCoefficients(c_a2a=0.5, c_pp=0.02, c_ovl=0.1, c_level=0.03)
    t_a2a, t = np.array([0.2, 0.2, 0.0]), np.array([1.0, 1.0, 2.0])
    got = chi_sys(c, t_a2a, t, np.array([2.0, 1.0, 1.0]), np.array([3.0, 0.0, 0.0]), np.array([False, False, True]))
    # EP over two nodes with 3 inter-node hops; EP inside one node (no a2a term); a deep pipeline in one node
    assert got == pytest.approx([1 + 0.03 + 0.5 * 0.2 + 0.02 * 3, 1 + 0.03, 1 + 0.03 + 0.1])
    assert chi_sys(ChiCoefficients(), t_a2a, t, np.array([2.0, 2.0, 2.0]), np.zeros(3), np.ones(3, bool)) \
        == pytest.approx([1.0, 1.0, 1.0])  # no calibration: chi = 1
