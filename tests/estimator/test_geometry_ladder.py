"""Parameter counts of the geometry ladder (paper tab:scale-ladder, E=128, K=3, G=4)."""
import pytest
from paper_tables import SCALE_LADDER
from scaleplan.estimator.geom import geometry

from scaleplan.geometry import ladder_model

LADDER = {q: (L, nh, d, dff, ntot, nact) for q, L, nh, d, dff, ntot, nact, _s in SCALE_LADDER}


def _close(ours_b: float, printed_b: float) -> bool:
    # within 0.5%, or within the table's printing precision (half a unit of its last digit, 0.05B)
    return abs(ours_b - printed_b) <= max(0.005 * printed_b, 0.05)


@pytest.mark.parametrize("q", sorted(LADDER))
def test_ladder_counts_match_paper(q):
    L, nh, d, dff, n_tot, n_act = LADDER[q]
    g = geometry(ladder_model(q, 128, 3, 4))
    assert (g.L, g.nq, g.d, g.dff) == (L, nh, d, dff)
    assert g.dexp == dff // 4 and g.E == 128 and g.K == 3
    assert _close(g.n_tot / 1e9, n_tot), (g.n_tot, n_tot)
    assert _close(g.n_act / 1e9, n_act), (g.n_act, n_act)


def test_mfu_counts_embedding_and_untied_head():
    g = geometry(ladder_model(4, 128, 3, 4, tie_embeddings=False))
    gt = geometry(ladder_model(4, 128, 3, 4, tie_embeddings=True))
    assert g.n_mfu - g.n_act == pytest.approx(2 * g.vocab * g.d)
    assert gt.n_mfu - gt.n_act == pytest.approx(gt.vocab * gt.d)
