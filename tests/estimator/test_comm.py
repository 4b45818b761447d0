"""estimator/comm.py's collectives outside the DP buckets (tests/estimator/test_dp_overlap.py and
test_dp_rails.py cover those): the expert-bias all-reduce (eq:bias-update)."""
import numpy as np
from scaleplan.estimator.comm import bias_sync
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.layout import ParallelLayout

from scaleplan.specs import parse_spec

from .conftest import moe_spec


def test_bias_sync_is_one_all_reduce_of_the_stage_token_counts():
    g = geometry(parse_spec(moe_spec()).model)  # 15 MoE blocks of 128 experts
    lay = ParallelLayout.of(tp=np.array([1, 2]), cp=1, pp=np.array([1, 4]), dp=np.array([32, 4]))
    n, group, inter, nbytes = bias_sync(g, lay, 8)
    assert list(n) == [1, 1]
    assert list(group) == [32, 8]  # TP x CP x DP: the stage's ranks
    assert list(inter) == [True, False]  # 32 contiguous ranks leave an 8-GPU node; 8 do not
    # fp32 counts per expert of the MoE blocks of the stage holding the most: 15 at PP 1; at PP 4 the
    # first stage holds the dense block and 3 MoE blocks, the others 4 MoE blocks each
    assert list(nbytes) == [4 * 128 * 15, 4 * 128 * 4]
    spec = moe_spec()
    del spec["model"]["moe"]
    dense = geometry(parse_spec(spec).model)
    n, _, _, nbytes = bias_sync(dense, lay, 8)
    assert list(n) == [0, 0] and list(nbytes) == [0, 0]  # a dense model has no bias to update
