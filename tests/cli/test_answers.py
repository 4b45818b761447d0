"""Issue 26.1 and 26.3 through the CLI: the recommendation, and an analytic-only answer drawn wider."""
from __future__ import annotations

from .conftest import SMALL_SEARCH

SAMPLED = [a if a != "0" or SMALL_SEARCH[i - 1] != "--samples" else "100" for i, a in enumerate(SMALL_SEARCH)]


def _band(r: dict) -> float:
    return r["loss_p95"] - r["loss_p05"]


def test_analytic_only_search_is_wider_and_says_it_is_a_guess(recorded_db, sqlite_url, run_json):
    measured = run_json(*SAMPLED, "--db", recorded_db)
    guess = run_json(*SAMPLED, "--db", sqlite_url)  # a migrated, empty database: every component analytic
    rm, rg = measured["recommendation"], guess["recommendation"]
    assert rg["guess"] and not rm["guess"]
    assert rg["statement"].startswith("a guess:") and "scaleplan bench" in rg["statement"]
    assert rg["recommended"]["unmeasured_kernel_share"] > 0.5 > rm["recommended"]["unmeasured_kernel_share"]
    assert _band(rg["recommended"]) > _band(rm["recommended"])
    assert guess["best"]["evidence_sigma"] > measured["best"]["evidence_sigma"]


def test_recommended_row_shows_why(recorded_db, run):
    code, out, err = run(*SAMPLED, "--db", recorded_db)
    assert code == 0, err
    assert "recommendation: train L" in out
