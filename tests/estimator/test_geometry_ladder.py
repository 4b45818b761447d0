"""Parameter counts of the geometry ladder (paper tab:scale-ladder, E=128, K=3, G=4)."""
import pytest
from paper_tables import SCALE_LADDER
from scaleplan.estimator.model_dims import geometry

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


# N of the FLOP count the training stack logged its MFU in (shared/validation/README.md's table)
LOGGED_N = {"700m-32dev": 1.8269e9, "5p4b-256dev": 6.4239e9, "18b-512dev": 20.983e9}


def test_validation_flop_count_is_the_logged_one(sweeps):
    """mfu_validation is the MFU in the count the validation runs logged (6 N tokens, N every active
    parameter that multiplies a token: calibrate/flops.py '6n'), the README's N to its 5 digits."""
    from scaleplan.calibrate.flops import logged_params

    for name, spec, *_ in sweeps:
        g = geometry(spec.model)
        assert g.n_mfu_validation == pytest.approx(LOGGED_N[name], rel=2e-4), name
        assert logged_params(g) == g.n_mfu_validation
        assert g.n_act < g.n_mfu_validation  # eq:mfu's N_act excludes the embeddings
