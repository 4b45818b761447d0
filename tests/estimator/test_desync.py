"""eq:desync's placement features (estimator/desync.py): which groups leave the node, in Megatron-Core's
rank order (tp fastest, then cp, dp, pp)."""
from scaleplan.estimator.desync import desync_features
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
