"""Dispatch-floor fit on synthetic benchmark rows with a known gap (sec:iteration-time-model)."""
import pytest
from scaleplan.calibrate.dispatch import PRIOR, fit_dispatch, launches_per_unit

from scaleplan.errors import ScaleplanError

GAP, LAT = 12e-6, 1e-6


def _rows(source="measured", host=None):
    """wall = max(active + t_lat, launches * t_gap): GPU time grows with M, the launch cost does not."""
    out = []
    for mode in ("gemm", "gemm_relu"):
        for m in (8, 64, 512, 4096, 16384):
            active = 2e-6 + m * 6e-9  # s per row unit
            n = launches_per_unit(mode, source)
            wall = max(active + LAT, n * GAP)
            out.append(dict(mode=mode, m=m, n=2048, k=2048, chain_len=512, wall_s=wall, active_s=active,
                            source=source))
    if host is not None:
        out.append(dict(mode="host_overhead", m=64, n=64, k=64, chain_len=1, wall_s=host, active_s=None,
                        source=source))
    return out


@pytest.mark.parametrize("source", ["measured", "imported"])
def test_recovers_gap_for_both_row_conventions(source):
    fit = fit_dispatch(_rows(source))  # no block-level gap known: the chain gap is t_gap
    assert fit.coefficients["t_gap_s"] == pytest.approx(GAP, rel=0.02)
    assert fit.coefficients["t_gap_chain_s"] == fit.coefficients["t_gap_s"]
    assert fit.identified == ["t_gap_s", "t_gap_chain_s"]
    # kappa cannot come from chained kernels: priors kept, and the reason names E_loc
    assert fit.coefficients["kappa1"] == PRIOR["kappa1"] and "E_loc" in fit.unidentified["kappa1"]
    assert max(abs(r) for r in fit.residuals) < 0.05


def test_imported_gemm_relu_counts_two_kernels():
    assert launches_per_unit("gemm_relu", "imported") == 2
    assert launches_per_unit("gemm_relu", "measured") == 1
    assert launches_per_unit("gemm", "imported") == 1


def test_host_overhead_rows_identify_t_host():
    fit = fit_dispatch(_rows(host=3.5e-3))
    assert fit.coefficients["t_host_s"] == pytest.approx(3.5e-3)
    assert "t_host_s" in fit.identified and "t_host_s" not in fit.unidentified


def test_block_level_gap_is_kept_and_chain_gap_reported():
    fit = fit_dispatch(_rows(), prior={"t_gap_s": 27e-6, "t_host_s": 0.024}, prior_source="the profile")
    assert fit.coefficients["t_gap_s"] == 27e-6 and fit.coefficients["t_host_s"] == 0.024
    assert fit.coefficients["t_gap_chain_s"] == pytest.approx(GAP, rel=0.02)
    assert "t_gap_s" not in fit.identified and "lower bound" in fit.unidentified["t_gap_s"]


def test_prior_from_previous_calibration_is_kept():
    fit = fit_dispatch(_rows(), prior={"kappa0": 500.0})
    assert fit.coefficients["kappa0"] == 500.0


def test_refusals():
    with pytest.raises(ScaleplanError, match="1 usable dispatch row"):
        fit_dispatch(_rows()[:1])
    big = [r for r in _rows() if r["m"] >= 4096]  # every row GPU-bound: the gap is hidden
    with pytest.raises(ScaleplanError, match="not identifiable"):
        fit_dispatch(big)
