"""--html on search, layouts, calibrate report and validate writes the report from the command's own output."""
from __future__ import annotations

import re
from pathlib import Path

from .conftest import SMALL_SEARCH

TINY = Path(__file__).resolve().parents[1] / "data" / "validate_specs" / "tiny.yaml"


def _divs(page: str) -> set[str]:
    return set(re.findall(r'<div id="([a-z]+)" class="plotly-graph-div', page))


def test_search_html(recorded_db, run_json, tmp_path):
    path = tmp_path / "plan.html"
    out = run_json(*SMALL_SEARCH, "--db", recorded_db, "--html", path)
    page = path.read_text()
    assert out["html"] == str(path) and "frontier" in _divs(page)
    b = out["best"]
    assert f"<td>{b['n_layers']}</td><td>{b['n_experts']}</td><td>{b['topk']}</td><td>{b['g']}</td>" in page
    assert f"<td>{b['geometry']['d']}</td><td>{b['geometry']['d_ff']}</td>" in page  # full geometry row
    assert "Measured table runs read" in page and "gemm_util.parquet" in page
    # every feasible candidate is a frontier point: the hover texts name each one's L/E/K/G (the grid's
    # E 32 and 64, and E 96 where the edge extension went past the largest E of the grid)
    # (plotly writes the hover's <br> JSON-escaped into the page)
    assert len(re.findall(r"L\d+ E\d+ K\d+ G\d+\\u003cbr", page)) >= out["n_feasible"]


def test_layouts_html(recorded_db, run_json, spec_file, tmp_path):
    path = tmp_path / "layouts.html"
    out = run_json("layouts", spec_file, "--devices", "32", "--top", "4", "--db", recorded_db, "--html", path)
    page = path.read_text()
    assert "Ranked layouts" in page and page.count("<tr><td>") >= 4 + 1
    assert "components" in _divs(page)
    assert f"<td>{100 * out['best']['mfu']:.2f}</td>" in page


def test_calibrate_report_html(sqlite_url, validation_dir, run, tmp_path):
    code, _, err = run("calibrate", "add", validation_dir / "mfu_sweeps.csv", "--specs",
                       validation_dir / "models.yaml", "--db", sqlite_url)
    assert code == 0, err
    path = tmp_path / "cal.html"
    code, _, err = run("calibrate", "report", "--db", sqlite_url, "--html", path)
    assert code == 0, err
    page = path.read_text()
    assert "parity" in _divs(page) and "700m-32dev" in page


def test_validate_html(sqlite_url, run, tmp_path):
    path = tmp_path / "val.html"
    code, _, err = run("validate", TINY, "--steps", "1", "--warmup", "0", "--no-store", "--db", sqlite_url,
                       "--html", path)
    assert code == 0, err
    page = path.read_text()
    assert "components" in _divs(page) and "Measured vs predicted" in page


def test_html_into_a_missing_directory_fails_before_work(run, spec_file, sqlite_url, tmp_path):
    bad = tmp_path / "no" / "such" / "r.html"
    for argv in (("layouts", spec_file, "--devices", "32"), ("validate", TINY), tuple(SMALL_SEARCH)):
        code, _, err = run(*argv, "--db", sqlite_url, "--html", bad)
        assert code == 2 and "--html" in err, (argv, err)
