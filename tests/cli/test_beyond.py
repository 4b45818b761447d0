"""The recommended plan's distance from what was measured is in the main table, the
recommendation line, the JSON and the HTML report, and --robust says whether it changes the answer."""
from __future__ import annotations

import shutil

import pytest

from scaleplan.mosaic.evidence import FLAG_TAGS

from .test_answers import SAMPLED


@pytest.fixture(scope="module")
def with_runs(recorded_db, validation_dir, tmp_path_factory):
    """The recorded tables and the published validation runs (observed runs of the B200 profile)."""
    from scaleplan.calibrate.observations import add_runs

    db = tmp_path_factory.mktemp("beyond") / "runs.db"
    shutil.copy(recorded_db.removeprefix("sqlite:///"), db)
    add_runs(str(db), validation_dir / "mfu_sweeps.csv", validation_dir / "models.yaml")
    return str(db)


def _name(r: dict) -> str:
    return f"L{r['n_layers']} E{r['n_experts']} K{r['topk']} G{r['g']}"


def test_the_recommended_plan_says_where_it_extrapolates(with_runs, run, run_json, tmp_path):
    doc = run_json(*SAMPLED, "--db", with_runs)
    rec = doc["recommendation"]["recommended"]
    assert rec["beyond"], rec  # this small grid's optimum lies beyond the runs (its MFU or layout)
    assert doc["evidence_range"]["observed_runs"]["n"] == 24
    # the statement names every flag with its value
    assert all(f in doc["recommendation"]["statement"] for f in rec["beyond"])
    html = tmp_path / "r.html"
    code, out, err = run(*SAMPLED, "--db", with_runs, "--html", html)
    assert code == 0, err
    row = next(x for x in out.splitlines() if x.strip().startswith(_name(rec) + " "))
    tags = [FLAG_TAGS[f.rsplit(" ", 3)[0]] for f in rec["beyond"]]
    assert tags[0] in row  # the first flag's tag on the row itself (the cell wraps)
    text = html.read_text()
    assert all(f.replace(">", "&gt;") in text for f in rec["beyond"])


def test_robust_says_whether_it_changes_the_answer(with_runs, run_json):
    mean = run_json(*SAMPLED, "--db", with_runs)["recommendation"]
    rob = run_json(*SAMPLED, "--db", with_runs, "--robust")["recommendation"]
    assert rob["criterion"] == "p90" and "--robust" in rob["statement"]
    differs = _name(rob["recommended"]) != _name(mean["recommended"])
    assert rob["differs_from_mean"] is differs
    assert (f"without --robust the recommendation is {_name(mean['recommended'])}" in rob["statement"]) is differs


def test_robust_quantile_out_of_range_is_one_line(run):
    code, _, err = run(*SAMPLED, "--robust", "--robust-quantile", "1.5")
    assert code == 2 and "--robust-quantile" in err and len(err.strip().splitlines()) == 1
