"""estimator/shapes.py: per-rank shapes by hand on the 700M model (d 2048, 16 heads of 128 with a head
gate, 16 KV heads, 128 experts of 1280, top-3, vocabulary 257540)."""
import pytest
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.shapes import rank_shapes

from scaleplan.specs import parse_spec

from .conftest import moe_spec


def test_rank_shapes_by_hand():
    g = geometry(parse_spec(moe_spec()).model)
    sh = rank_shapes(g, ParallelLayout.of(tp=2, cp=2, ep=8, etp=1, mbs=2, dp=8), 8192)
    T = 8192 * 2 / 2                     # seqlen x B_micro / CP
    assert float(sh.T[0]) == T and float(sh.Tsp[0]) == T / 2
    assert float(sh.kv_loc[0]) == 8      # 16 KV heads over TP 2
    assert float(sh.n_qkv[0]) == (16 * 128 + 16) / 2 + 2 * 8 * 128  # Q + head gate, then K and V
    assert float(sh.E_loc[0]) == 16
    R = T * 3 * 1 / 2                    # T K ETP / TP routed rows
    assert float(sh.R[0]) == R and float(sh.tile[0]) == R * 8 / 128  # the EP tile correction
    assert float(sh.ffn_loc[0]) == 1280
    assert float(sh.V_loc[0]) == 257792 / 2
    assert float(sh.a2a_bytes[0]) == pytest.approx(R * 2048 * 2)  # bf16 rows of d
