"""The HTML report builder (scaleplan.report.html) from plain dicts: sections, offline-ness, hover text."""
from __future__ import annotations

import re

import pytest

from scaleplan.report.html import build_report

from .synth import calibrate_dict, search_dict, validate_dict


def test_search_report_is_self_contained():
    page = build_report("search", search_dict())
    # plotly.js is inlined: no script or stylesheet is fetched from anywhere
    assert not re.search(r"<script[^>]+src=", page) and not re.search(r"<link[^>]+href=", page)
    from plotly.offline import get_plotlyjs

    # the installed plotly package's own plotly.js bundle, whole, inside one inline <script>
    assert "Plotly.newPlot" in page and f"<script>{get_plotlyjs()}</script>" in page
    for div in ("frontier", "sparsity", "sweep"):
        assert f'id="{div}"' in page


def test_search_report_has_inputs_optimum_and_provenance():
    d = search_dict()
    page = build_report("search", d)
    best = d["best"]
    for text in ("Calibration in force", "12 observations", "gemm_util.parquet", "memory fraction of HBM",
                 "Optimum (the paper&#39;s result-table columns)", "Optimum&#39;s full geometry", "pp_p2p",
                 "--num-layers 40"):
        assert text in page, text
    # the optimum row: L E K G as the candidate has them, MFU in percent with two decimals
    assert f"<td>{best['n_layers']}</td><td>{best['n_experts']}</td><td>{best['topk']}</td><td>{best['g']}</td>" \
        in page
    assert f"<td>{100 * best['mfu']:.2f}</td>" in page


def test_frontier_hover_names_geometry_layout_mfu_memory_and_p_optimal():
    from scaleplan.report.html import _hover

    r = search_dict()["frontier"][3]
    h = _hover(r)
    g = r["geometry"]
    for text in (f"L{r['n_layers']} E{r['n_experts']} K{r['topk']} G{r['g']}", f"d_ff {g['d_ff']}",
                 f"d_expert {g['d_expert']}", "pp=2", "ep=8", f"MFU {100 * r['mfu']:.2f}%",
                 f"memory {r['mem_per_device_gb']:.1f} GB", f"P(optimal) {100 * r['p_optimal']:.1f}%"):
        assert text in h, text
    assert "P(optimal)" not in _hover({k: v for k, v in r.items() if k != "p_optimal"})


def test_user_text_is_escaped():
    d = validate_dict()
    page = build_report("validate", d)
    assert "&lt;tiny&gt;.yaml" in page and "<tiny>" not in page


@pytest.mark.parametrize("kind,data,divs", [("calibrate", calibrate_dict(), ["parity"]),
                                            ("validate", validate_dict(), ["components"])])
def test_other_reports(kind, data, divs):
    page = build_report(kind, data)
    for div in divs:
        assert f'id="{div}"' in page
    assert 'class="sortable"' in page


def test_validate_without_breakdown_has_no_bars():
    d = validate_dict()
    for r in d["rows"]:
        r.pop("predicted_breakdown_s")
    assert 'id="components"' not in build_report("validate", d)


def test_unknown_kind():
    with pytest.raises(ValueError):
        build_report("bench", {})
