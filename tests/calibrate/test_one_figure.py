"""Calibration output that agrees with itself: fit, report, list and search give one figure per quantity,
and a term at its bound is explained in words."""
import pytest
from scaleplan.calibrate.joint import BOUNDS, bound_note
from scaleplan.calibrate.runner import build_report


@pytest.fixture(scope="module")
def fitted(runtime_fitted_db):
    url, fit = runtime_fitted_db  # the validation sweeps added, fit_runtime stored (tests/conftest.py)
    return url, fit, build_report(url, extrapolate="compose")


def test_report_prints_the_figures_fit_printed(fitted, validation_counts):
    _, fit, rep = fitted
    for row in rep["sweeps"]:
        held = fit["loso"][row["sweep"]]
        assert row["loso_mape"] == pytest.approx(held["mape_loso"], abs=1e-12)   # the same held-out figure
        assert row["mape_before"] == pytest.approx(held["mape_before"], abs=2e-3)  # "before" = uncalibrated
    a = rep["all_runs"]
    assert a["n"] == fit["n_obs"] == sum(validation_counts.values())
    assert a["mape_before"] == pytest.approx(fit["step_time_mape"]["before"], abs=2e-3)
    assert a["mape_after"] == pytest.approx(fit["step_time_mape"]["after"], abs=2e-3)
    assert rep["cv_error"] == pytest.approx(sum(v["mape_loso"] for v in fit["loso"].values()) / len(fit["loso"]))


def test_search_draws_from_the_newest_calibration(fitted, validation_counts):
    from scaleplan.mosaic.uncertainty import FALLBACK_SIGMA, mfu_error

    url, fit, rep = fitted
    err = mfu_error(url, "p6-b200.48xlarge")
    assert err.sigma != FALLBACK_SIGMA and err.n == sum(validation_counts.values())
    assert f"calibration {fit['calibration_ids'][0]}" in err.source and f"cv MAPE {rep['cv_error']:.1%}" in err.source


def test_a_term_at_its_bound_is_explained():
    lo, hi = BOUNDS["c_a2a"]
    low = bound_note("c_a2a", 1.261e-18, True)
    assert low.startswith(f"c_a2a sits at its lower bound (1.261e-18, range [{lo:g}, {hi:g}]): the runs ask for no ")
    assert "term is off" in low
    assert "does not explain the gap" in bound_note("c_pp", BOUNDS["c_pp"][1], False)


def test_parity_rings_are_visible_over_the_filled_points():
    import json
    import re

    from scaleplan.report.html import parity_figure

    runs = [{"sweep": "s", "id": i, "layout": {}, "measured": 0.1 + 0.01 * i, "before": 0.1 + 0.01 * i,
             "after": 0.1 + 0.01 * i} for i in range(3)]
    html = parity_figure(runs)
    data = json.loads(re.search(r"Plotly\.newPlot\(\s*\"parity\",\s*(\[.*?\]),\s*\{", html, re.S).group(1))
    filled, rings = data[0], data[1]
    assert rings["marker"]["symbol"] == "circle-open" and rings["marker"]["size"] > filled["marker"]["size"]
    assert rings["marker"]["color"] == filled["marker"]["color"]  # drawn after (on top), same sweep colour
