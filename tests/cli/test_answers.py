"""The recommendation, and an analytic-only answer drawn wider."""
from __future__ import annotations

from .conftest import SMALL_SEARCH

SAMPLED = [a if a != "0" or SMALL_SEARCH[i - 1] != "--samples" else "100" for i, a in enumerate(SMALL_SEARCH)]


def _band(doc: dict, r: dict) -> float:
    """The log-normal sigma of the candidate's MFU draw (uncertainty.candidate_sigma: the calibration's sigma, one
    more per doubling beyond the observed runs, and its plan's evidence, in quadrature). Not the bands themselves:
    two plans of different layout families draw their own 100 normals, whose sample quantiles differ more than the
    sigmas do."""
    import math

    s = doc["uncertainty_inputs"]["mfu_error"]["sigma"]
    return math.sqrt(s ** 2 * (1 + r["perf_doublings"]) + r["evidence_sigma"] ** 2)


def test_analytic_only_search_is_wider_and_says_it_is_a_guess(recorded_db, sqlite_url, run_json):
    measured = run_json(*SAMPLED, "--db", recorded_db)
    guess = run_json(*SAMPLED, "--db", sqlite_url)  # a migrated, empty database: every component analytic
    rm, rg = measured["recommendation"], guess["recommendation"]
    assert rg["guess"] and not rm["guess"]
    assert rg["statement"].startswith("a guess:") and "scaleplan bench" in rg["statement"]
    assert rg["recommended"]["unmeasured_kernel_share"] > 0.5 > rm["recommended"]["unmeasured_kernel_share"]
    assert _band(guess, rg["recommended"]) > _band(measured, rm["recommended"])
    assert guess["best"]["evidence_sigma"] > measured["best"]["evidence_sigma"]


def test_recommended_row_shows_why(recorded_db, run, run_json):
    doc = run_json(*SAMPLED, "--db", recorded_db)
    code, out, err = run(*SAMPLED, "--db", recorded_db)
    assert code == 0, err
    lines = out.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("candidates ("))
    end = next(i for i, x in enumerate(lines) if x.startswith("recommendation: train L"))
    table = lines[start:end]
    assert max(len(x.rstrip()) for x in table) <= 120  # fits a 120-column terminal, piped or not
    head = next(x for x in table if "model" in x)
    assert all(c in head for c in ("TPP", "P(TPP)", "MFU % (90%)", "loss 90%", "P(opt)", "status"))
    name = lambda r: f"L{r['n_layers']} E{r['n_experts']} K{r['topk']} G{r['g']}"  # noqa: E731
    rec = doc["recommendation"]["recommended"]
    row = next(x for x in table if x.strip().startswith(name(rec) + " "))
    assert "recommended" in row and f"{rec['tpp']:.0f}" in row and f"{rec['p_feasible']:.0%}" in row
    mf = doc["most_frequent_optimum"]
    assert any(x.strip().startswith(name(mf) + " ") for x in table)  # the summary's optimum is a row
    for r in doc["near_ties"]:
        assert r["p_feasible"] >= 0.5 and any(x.strip().startswith(name(r) + " ") for x in table)
    code, wide, _ = run(*SAMPLED, "--db", recorded_db, "--wide")
    assert code == 0 and "N_tot (B)" in wide and "composed" in wide


def test_edge_optimum_is_reported_and_extended(recorded_db, run_json, run):
    """On 4 nodes the small grid's optimum uses mbs 4, the top of the default 1,2,4."""
    out = run_json(*SMALL_SEARCH, "--db", recorded_db)
    e = out["edges"]
    before = e["before"]
    assert before["layout"]["mbs"] == 4 and {"axis": "mbs", "extend_with": 8}.items() <= next(
        x for x in e["found"] if x["axis"] == "mbs").items()
    assert "mbs" in e["extended"] and out["best"]["loss"] <= before["loss"]
    off = run_json(*SMALL_SEARCH, "--no-extend-edges", "--db", recorded_db)
    assert off["edges"]["extended"] == [] and off["best"]["layout"] == before["layout"]
    assert off["best"]["loss"] == before["loss"]
    code, text, _ = run(*SMALL_SEARCH, "--db", recorded_db)
    assert code == 0 and "edge: the optimum's mbs = 4 is the largest searched; one more step: --mbs with 8" in text
    assert "edge: extended" in text


def test_html_report_carries_the_recommendation_verdicts_and_edges(recorded_db, run_json, tmp_path):
    import html as h

    page = tmp_path / "plan.html"
    out = run_json(*SAMPLED, "--db", recorded_db, "--html", page)
    text = h.unescape(page.read_text())
    assert "Recommendation" in text and out["recommendation"]["statement"] in text
    assert "Verdicts over 100 draws" in text and all(s in text for s in out["verdicts"]["statements"])
    assert "Edges of the searched grid" in text and out["edges"]["found"][0]["text"] in text
    for col in ("P(TPP &gt;= floor)", "MFU 90% (%)", "loss 90%", "status"):
        assert h.unescape(col) in text
