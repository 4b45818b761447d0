"""Expert-DP groups on several ranks per node use that many NIC rails (estimator/comm.py)."""
import numpy as np
import pytest
from scaleplan.estimator import Estimator
from scaleplan.estimator.context import Lookups
from scaleplan.estimator.comm import collective_time
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.sources import Recorder


def test_ranks_per_node_follow_the_stride():
    # 8 GPUs per node; expert-DP ranks are TP*CP*EP apart
    def rails(ep, dp):
        return float(ParallelLayout.of(ep=ep, dp=dp).ranks_per_node("edp", 8)[0])

    assert rails(8, 32) == 1   # stride 8: one rank per node
    assert rails(4, 32) == 2   # stride 4: two per node
    assert rails(1, 32) == 8   # stride 1: whole nodes
    assert rails(1, 4) == 4    # a 4-rank group holds at most 4 per node


@pytest.mark.recorded
def test_strided_group_time_between_one_rail_and_whole_nodes(recorded_db):
    est = Estimator("p6-b200.48xlarge", db_url=recorded_db, use_calibration=False)
    tb, size = est.tables.view("bf16"), 2e9

    def t(layout, rails=None):
        rec = Recorder(1, "compose")
        return float(collective_time(Lookups(tb, est.profile, rec), "dp_comm", "all_reduce", 32, size, True, layout,
                                     rails=rails)[0])

    one, contiguous = t("strided"), t("contiguous")
    assert contiguous < one / 4  # whole-node rings run on 8 rails: the tables differ ~8x in busbw
    assert t("strided", 1) == pytest.approx(one)
    assert t("strided", 2) == pytest.approx(max(one / 2, contiguous))
    assert t("strided", 8) == pytest.approx(max(one / 8, contiguous))
    assert np.isfinite([one, contiguous]).all()
