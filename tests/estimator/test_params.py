"""estimator/params.py: the parameters one rank of a pipeline stage holds, placed where Megatron-Core puts
them (embedding on the first stage, LM head and final norm on the last, the padded vocabulary over TP,
the routed experts over EP x ETP), checked by hand on the 700M model (16 blocks, the first dense)."""
import numpy as np
import pytest
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.params import dp_stages, stage_params

from scaleplan.specs import parse_spec

from .conftest import moe_spec

D, V = 2048, 257540
V_LOC_TP2 = 257792 / 2  # padded to a multiple of 128 x 2, over TP 2


def _g(tie=False):
    return geometry(parse_spec(moe_spec(model={**moe_spec()["model"], "tie_embeddings": tie})).model)


def test_first_middle_and_last_stage_by_hand():
    g = _g()
    lay = ParallelLayout.of(tp=2, pp=4, dp=4, ep=4, etp=1)  # 4 blocks per stage
    first, middle, last = (stage_params(g, lay, s) for s in (0, 1, 3))
    # stage 0: blocks 0-3, block 0 dense; the input embedding
    assert (first.n_layers[0], first.n_dense[0], first.n_moe[0], first.n_vocab[0]) == (4, 1, 3, 1)
    assert first.has_embedding[0] and not first.has_head[0]
    want = (4 * g.attn_params + g.dense_mlp_params + 3 * g.moe_dense_params) / 2 + V_LOC_TP2 * D
    assert first.dense[0] == pytest.approx(want)
    assert first.experts[0] == pytest.approx(3 * g.expert_params / 4)
    assert first.router[0] == pytest.approx(3 * 128 * D)
    # a middle stage: 4 MoE blocks, no vocabulary
    assert (middle.n_moe[0], middle.n_vocab[0]) == (4, 0)
    assert middle.dense[0] == pytest.approx((4 * g.attn_params + 4 * g.moe_dense_params) / 2)
    # the last: the (untied) LM head and the final norm (d, replicated over TP)
    assert last.has_head[0] and last.n_vocab[0] == 1
    assert last.dense[0] == pytest.approx(middle.dense[0] + V_LOC_TP2 * D + D)
    assert last.total[0] == pytest.approx(last.dense[0] + last.experts[0])


def test_vocabulary_matrices_with_and_without_tied_embeddings():
    one, two = ParallelLayout.of(pp=1, dp=8), ParallelLayout.of(pp=2, dp=4)
    assert stage_params(_g(tie=False), one, 0).n_vocab[0] == 2  # embedding and LM head on one stage
    assert stage_params(_g(tie=True), one, 0).n_vocab[0] == 1   # one shared matrix
    assert stage_params(_g(tie=True), two, 1).n_vocab[0] == 1   # the last stage's copy for the LM head
    assert stage_params(_g(tie=True), two, 0).n_vocab[0] == 1


def test_dp_stages_first_first_middle_and_last():
    lay = ParallelLayout.of(pp=np.array([1, 2, 4]), dp=np.array([32, 16, 8]))
    (p0, s0), (p1, s1), (p2, s2) = dp_stages(_g(), lay)
    assert list(p0) == [True, True, True] and list(s0.index) == [0, 0, 0]
    assert list(p1) == [False, False, True] and s1.index[2] == 1  # a middle stage needs PP > 2
    assert list(p2) == [False, True, True] and list(s2.index) == [0, 1, 3]
    # the blocks each holds (16 blocks, the first dense): the middle stage of PP 4 holds 4 MoE blocks
    assert list(s0.n_dense) == [1, 1, 1] and list(s0.n_moe) == [15, 7, 3]
    assert (s1.n_dense[2], s1.n_moe[2]) == (0, 4) and list(s2.n_moe[1:]) == [8, 4]
