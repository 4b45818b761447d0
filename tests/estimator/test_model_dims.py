"""estimator/model_dims.py: the scalar geometry the time and memory models read, and Megatron's padded
vocabulary (--make-vocab-size-divisible-by 128, times TP)."""
import numpy as np
import pytest
from scaleplan.estimator.model_dims import geometry, padded_vocab, vocab_shard

from scaleplan.specs import parse_spec

from .conftest import moe_spec


def test_padded_vocabulary_by_hand():
    # 50257 = 392.6 x 128 -> 393 x 128 = 50304; over TP 4 the multiple is 512: 99 x 512 = 50688
    assert padded_vocab(50257) == 50304 and padded_vocab(50257, 4) == 50688
    assert padded_vocab(50304) == 50304  # already a multiple
    assert list(padded_vocab(257540, np.array([1, 2, 8]))) == [257664, 257792, 258048]


def test_vocab_shard_is_the_padded_vocabulary_over_tp():
    assert vocab_shard(50257, 4) == pytest.approx(50688 / 4)
    assert list(vocab_shard(257540, np.array([1, 2]))) == pytest.approx([257664.0, 128896.0])


def test_geometry_of_the_700m_model_by_hand():
    """The 700M validation model: d 2048, 16 heads of 128, SwiGLU 5120, 128 experts of 1280 and a shared
    expert of 1280, 16 blocks of which the first is dense (moe.first_dense_layers defaults to 1)."""
    g = geometry(parse_spec(moe_spec()).model)
    d = 2048
    assert (g.L, g.d, g.E, g.K, g.dexp, g.dsh, g.n_dense, g.n_moe) == (16, d, 128, 3, 1280, 1280, 1, 15)
    # Q, K, V, O of 16 x 128 = d columns each, and the head-wise output gate (one column per head)
    assert g.gate == 16 and 4 * d * d + d * 16 <= g.attn_params <= 4 * d * d + d * 16 + 2 * d  # (+ norms)
    assert g.dense_mlp_params == 3 * d * 5120              # gate, up, down
    assert g.expert_params == 128 * 3 * d * 1280           # every routed expert of one block
    assert g.moe_dense_params == 128 * d + 3 * d * 1280    # router + shared expert
    assert g.is_moe


def test_a_batch_reads_each_plans_geometry_however_selected():
    """GeometryBatch: every per-plan field of plan p is its geometry's (gathered when first read), after
    any chain of selections; the batch-wide flags and unknown names behave as on one geometry."""
    from scaleplan.estimator.model_dims import PER_PLAN_FIELDS, GeometryBatch
    from scaleplan.geometry import ladder_model

    geoms = [geometry(ladder_model(*z)) for z in ((8, 16, 1, 1), (12, 32, 2, 2), (10, 8, 2, 1))]
    index = np.array([2, 0, 0, 1, 2, 1, 1])
    batch = GeometryBatch.stack(geoms, index)
    sub = batch.take(np.array([6, 4, 0])).take(np.array([True, False, True]))
    for b, idx in ((batch, index), (sub, index[[6, 0]])):
        assert list(b.index) == list(idx) and b.is_moe and b.batch_keys[0] is b.index
        for f in PER_PLAN_FIELDS:
            assert getattr(b, f).tolist() == [getattr(geoms[i], f) for i in idx], f
    assert sub.dense_index.tolist() == batch.dense_index[[6, 0]].tolist()
    with pytest.raises(AttributeError):
        batch.no_such_field  # noqa: B018
