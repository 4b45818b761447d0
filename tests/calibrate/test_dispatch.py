"""Dispatch-floor fit on synthetic benchmark rows with a known gap (sec:iteration-time-model)."""
import pytest
from scaleplan.calibrate.dispatch import PRIOR, fit_dispatch, launches_per_unit

from scaleplan.errors import ScaleplanError
from scaleplan.profiles import load_profile

GAP, LAT = 12e-6, 1e-6


def _rows(source="measured", host=None, gap=GAP):
    """wall = max(active + t_lat, launches * t_gap): GPU time grows with M, the launch cost does not."""
    out = []
    for mode in ("gemm", "gemm_relu"):
        for m in (8, 64, 512, 4096, 16384):
            active = 2e-6 + m * 6e-9  # s per row unit
            n = launches_per_unit(mode, source)
            wall = max(active + LAT, n * gap)
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
    """With a block-level gap in force (the profile's, from profiler traces of a real block), the chain rows
    move only the chain gap: fitted on rows made with two different true gaps, the chain gap follows the rows
    and the block's gap does not move; the note names both."""
    block = load_profile("p6-b200.48xlarge").dispatch
    prior = {"t_gap_s": block.t_gap_s, "t_host_s": block.t_host_s}
    fits = {gap: fit_dispatch(_rows(gap=gap), prior=prior, prior_source="the profile") for gap in (GAP, 2 * GAP)}
    for gap, fit in fits.items():
        assert fit.coefficients["t_gap_chain_s"] == pytest.approx(gap, rel=0.02)
        assert "t_gap_s" not in fit.identified and "lower bound" in fit.unidentified["t_gap_s"]
        assert f"chain gap {fit.coefficients['t_gap_chain_s'] * 1e6:.1f} us" in fit.unidentified["t_gap_s"]
    kept = {(f.coefficients["t_gap_s"], f.coefficients["t_host_s"]) for f in fits.values()}
    assert kept == {(block.t_gap_s, block.t_host_s)}


def test_prior_from_previous_calibration_is_kept():
    """Kernel counts are not identifiable from chained kernels: a previous calibration's kappa0 stays in force
    whatever the chain rows say, and kappa1 (not in that calibration) falls back to the module default."""
    previous = {"kappa0": PRIOR["kappa0"] / 2}
    fits = [fit_dispatch(_rows(gap=gap), prior=previous) for gap in (GAP, 2 * GAP)]
    assert {(f.coefficients["kappa0"], f.coefficients["kappa1"]) for f in fits} == {(previous["kappa0"],
                                                                                      PRIOR["kappa1"])}
    assert all("kappa0" not in f.identified for f in fits)


def test_refusals():
    with pytest.raises(ScaleplanError, match="1 usable dispatch row"):
        fit_dispatch(_rows()[:1])
    big = [r for r in _rows() if r["m"] >= 4096]  # every row GPU-bound: the gap is hidden
    with pytest.raises(ScaleplanError, match="not identifiable"):
        fit_dispatch(big)
