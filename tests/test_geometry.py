"""Parameter counts against the paper's printed tables (values typed from the paper, not the code)."""
from __future__ import annotations

import numpy as np
import pytest

from scaleplan.geometry import ladder_model, ladder_param_counts, spec_param_counts

# tab:scale-ladder: q -> (N_tot B, N_act B, S) at E=128, K=3, G=4 (non-embedding)
LADDER = {4: (15.5, 0.7, 0.954), 6: (53.2, 2.3, 0.957), 8: (127.3, 5.4, 0.958), 10: (250.0, 10.4, 0.958),
          12: (433.7, 17.9, 0.959), 14: (690.5, 28.2, 0.959), 16: (1032.8, 41.9, 0.959), 18: (1472.8, 59.5, 0.960)}


@pytest.mark.parametrize("q", sorted(LADDER))
def test_ladder_table(q):
    n_tot, n_act, s = LADDER[q]
    pc = spec_param_counts(ladder_model(q, 128, 3, 4))
    # within 0.5% (issue 4), or the printed rounding (0.05B) where that is looser, as for q=4's 0.7B
    assert pc.n_tot / 1e9 == pytest.approx(n_tot, rel=5e-3)
    assert pc.n_act / 1e9 == pytest.approx(n_act, rel=5e-3, abs=0.05)
    assert pc.s == pytest.approx(s, abs=1e-3)


@pytest.mark.parametrize("q,E,K,G,n_act,n_tot,s", [
    (12, 96, 2, 4, 14.5, None, 0.956),       # tab:pareto-B
    (10, 128, 2, 4, 8.5, 250.0, 0.966),      # tab:staged-top4 ID 1
    (10, 128, 2, 8, 5.6, 126.4, 0.956),      # ID 2
    (10, 32, 2, 4, 8.5, 66.0, 0.872),        # ID 3
    (8, 32, 2, 2, 7.3, 65.8, 0.889),         # ID 4
])
def test_result_tables(q, E, K, G, n_act, n_tot, s):
    pc = spec_param_counts(ladder_model(q, E, K, G))
    assert pc.n_act / 1e9 == pytest.approx(n_act, abs=0.05)
    if n_tot is not None:
        assert pc.n_tot / 1e9 == pytest.approx(n_tot, rel=5e-3)
    assert pc.s == pytest.approx(s, abs=1e-3)


def test_vectorised_counts_match_scalar_path():
    q, E, K, G = np.meshgrid([4, 8, 12], [16, 128], [1, 4], [1, 2, 4, 8], indexing="ij")
    n_tot, n_act, emb = ladder_param_counts(q, E, K, G)
    for idx in [(0, 0, 0, 0), (1, 1, 1, 2), (2, 1, 0, 3)]:
        pc = spec_param_counts(ladder_model(int(q[idx]), int(E[idx]), int(K[idx]), int(G[idx])))
        assert n_tot[idx] == pytest.approx(pc.n_tot)
        assert n_act[idx] == pytest.approx(pc.n_act)
        assert emb[idx] == pytest.approx(pc.embedding)


def test_embedding_counts_tied_and_untied():
    m = ladder_model(4, 8, 2, 1)
    assert spec_param_counts(m).embedding == 2 * m.vocab_sz * m.hidden_sz
    tied = m.model_copy(update={"tie_embeddings": True})
    assert spec_param_counts(tied).embedding == m.vocab_sz * m.hidden_sz
