"""`scaleplan plan --html`: the frontier per platform (cost vs days, one colour per platform, every point's plan in
its hover), the cheapest plan per platform in a table, drawn offline by Chromium at 1280 px and at a phone's width."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from pace import budget

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
B200, GB200 = "p6-b200.48xlarge", "p6e-gb200.36xlarge"


@pytest.fixture(scope="module")
def plan_out(recorded_db, tmp_path_factory):
    from scaleplan.mosaic.goodput import Goodput
    from scaleplan.mosaic.plan import PlanRequest, run_plan
    from scaleplan.mosaic.run import SearchRequest

    html = tmp_path_factory.mktemp("plan") / "plan.html"
    s = SearchRequest(profile=B200, nodes=(1,), days=(1.0,), q=(8, 10), experts=(16, 32, 64), topk=(1, 2, 4),
                      g=(1, 2), samples=50, workers=1, db_url=recorded_db, progress=False)
    req = PlanRequest(search=s, target_loss=1.45, platforms=(B200, GB200), nodes={B200: (4, 8, 16), GB200: (8, 16, 32)},
                      prices={B200: 6.0, GB200: 7.5}, goodput=Goodput(), html=html)
    return run_plan(req).out, html


def _figure(text: str) -> list[dict]:
    """The traces of the plan-frontier figure, read from the page's plotly call."""
    i = text.index('"plan-frontier"')
    data = text[text.index("[", i):]
    traces, _ = json.JSONDecoder().raw_decode(data)
    return traces


@pytest.mark.recorded
def test_frontier_figure_and_cheapest_table(plan_out):
    out, path = plan_out
    text = path.read_text()
    assert out["html"] == str(path)
    traces = {t["name"]: t for t in _figure(text)}
    for pl in out["platforms"]:
        t = traces[pl["profile"]]
        pts = [p for p in pl["points"] if p.get("plan")]
        assert t["x"] == [p["days"] for p in pts] and t["y"] == pytest.approx([p["cost_usd"] for p in pts])
        for p, hover in zip(pts, t["text"]):  # the plan in the hover: cluster, model, layout
            b = p["plan"]
            assert f"{p['nodes']} x {pl['profile']}" in hover and f"E{b['n_experts']} K{b['topk']}" in hover
            assert f"ep={b['layout']['ep']}" in hover
    assert traces[B200]["marker"]["color"] != traces[GB200]["marker"]["color"]
    table = text[text.index("The cheapest plan per platform"):]
    table = table[:table.index("</table>")]
    for pl in out["platforms"]:
        c = pl["cheapest"]
        assert re.search(rf"<td>{re.escape(pl['profile'])}</td>.*?<td>{c['nodes']}</td>", table, re.S)
        assert f"{c['cost_usd']:,.0f}" in table


@pytest.mark.recorded
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
@pytest.mark.parametrize("width", [1280, 390])
def test_plan_report_draws_offline(plan_out, tmp_path, width):
    from .test_browser import OFFLINE

    _, path = plan_out
    p = subprocess.run([CHROMIUM, *OFFLINE, f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={width},2000",
                        "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=budget(120), check=False)
    dom = p.stdout
    assert [ln for ln in p.stderr.splitlines() if ":CONSOLE" in ln] == []
    m = re.search(r'<div id="plan-frontier" class="([^"]*)"', dom)
    assert m and "js-plotly-plot" in m.group(1), "the frontier was not plotted"
    assert 'class="point"' in dom[m.start():]
