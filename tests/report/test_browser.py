"""The HTML report in a real browser: headless Chromium loads the file with the network off
(every request goes to a dead proxy, every host name fails to resolve), the rendered DOM holds the plots
with every frontier point drawn, the console stays empty, no request leaves the page, and a screenshot is
saved. Only the page's own requests count: the browser's background services are switched off as far as
flags allow, and what they still send (update, time or account checks) is told apart in the net log by
its network isolation key, which names the page's site (file://) only for the page's own fetches.
Skipped only where no Chromium is installed (CI installs the Debian package `chromium`: .ci/run)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from pace import budget
from scaleplan.report.html import build_report

from .synth import calibrate_dict, search_dict, validate_dict

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")

OFFLINE = ["--headless", "--no-sandbox", "--disable-gpu", "--proxy-server=127.0.0.1:9",
           "--host-resolver-rules=MAP * ~NOTFOUND", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--no-first-run", "--disable-default-apps", "--disable-extensions",
           "--disable-domain-reliability", "--disable-client-side-phishing-detection", "--disable-breakpad",
           "--no-pings", "--no-default-browser-check", "--metrics-recording-only",
           "--disable-features=OptimizationHints,MediaRouter,Translate,AutofillServerCommunication,"
           "CertificateTransparencyComponentUpdater,SpellCheck",
           "--enable-logging=stderr", "--v=0", "--virtual-time-budget=8000"]


def page_requests(net_log: dict) -> set[str]:
    """Origins (scheme://host) of the http(s) requests a file:// page itself started: the URL requests
    whose network isolation key names the page's site; the browser's own fetches carry another key
    (the fetched site's, or none)."""
    start = net_log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    out = set()
    for e in net_log["events"]:
        p = e.get("params") or {}
        if e["type"] == start and str(p.get("network_isolation_key", "")).startswith("file://"):
            m = re.match(r"https?://[^/?#]+", str(p.get("url", "")))
            if m:
                out.add(m.group(0))
    return out


def _chromium(url: str, tmp_path, *extra: str) -> tuple[str, list[str], set[str]]:
    """(stdout, console messages, origins the page requested) of one headless load of ``url``."""
    net = tmp_path / f"net{len(list(tmp_path.iterdir()))}.json"
    p = subprocess.run([CHROMIUM, *OFFLINE, f"--user-data-dir={tmp_path / 'profile'}", f"--log-net-log={net}",
                        *extra, url], capture_output=True, text=True, timeout=budget(120), check=False)
    console = [ln for ln in p.stderr.splitlines() if ":CONSOLE" in ln]
    assert net.exists(), p.stderr[-2000:]  # no net log: nothing could be checked
    return p.stdout, console, page_requests(json.loads(net.read_text()))


def test_the_checks_can_fail(tmp_path):
    """A page with a console error and two outside requests (an image, a script's fetch) is caught by
    both checks, and only the page's requests are counted (the browser's own are not in the set)."""
    page = tmp_path / "bad.html"
    page.write_text('<html><body><script>console.error("boom-1234")</script>'
                    '<img src="https://cdn.example.org/x.png">'
                    '<script>fetch("https://api.example.com/y").catch(() => 0)</script></body></html>')
    _, console, urls = _chromium(page.as_uri(), tmp_path, "--dump-dom")
    assert any("boom-1234" in c for c in console)
    assert urls == {"https://cdn.example.org", "https://api.example.com"}, urls


def test_browser_traffic_is_not_the_pages():
    """A net log holding a browser fetch (isolation key of the fetched site) and a page fetch (key
    file://): only the page's is counted."""
    log = {"constants": {"logEventTypes": {"URL_REQUEST_START_JOB": 7, "REQUEST_ALIVE": 3}}, "events": [
        {"type": 7, "params": {"url": "https://android.clients.google.com/c2dm",
                               "network_isolation_key": "https://google.com https://google.com"}},
        {"type": 7, "params": {"url": "http://clients2.google.com/time", "initiator": "not an origin"}},
        {"type": 3, "params": {"url": "https://cdn.example.org/a.js"}},
        {"type": 7, "params": {"url": "https://cdn.example.org/a.js?v=1",
                               "network_isolation_key": "file:// [internally: file://] file://"}}]}
    assert page_requests(log) == {"https://cdn.example.org"}


@pytest.mark.parametrize("kind,data,plots", [
    ("search", search_dict(24), {"frontier": 24 + 1, "sparsity": 6, "sweep": None}),
    ("calibrate", calibrate_dict(), {"parity": 2 * 10}),
    ("validate", validate_dict(), {"components": None}),
])
def test_report_renders_offline(tmp_path, kind, data, plots):
    page = tmp_path / f"{kind}.html"
    page.write_text(build_report(kind, data))
    dom, console, urls = _chromium(page.as_uri(), tmp_path, "--dump-dom")
    assert console == [], console
    assert urls == set(), urls
    ids = list(plots)
    for i, div in enumerate(ids):
        m = re.search(rf'<div id="{div}" class="([^"]*)"', dom)
        assert m and "js-plotly-plot" in m.group(1), f"{div} was not plotted"
        end = dom.find(f'<div id="{ids[i + 1]}"') if i + 1 < len(ids) else len(dom)
        chunk = dom[m.start():end]
        assert 'class="main-svg"' in chunk
        if plots[div] is not None:  # one drawn marker per data point (a star for the optimum)
            assert chunk.count('class="point"') == plots[div], (div, chunk.count('class="point"'))
    assert "<table" in dom and 'class="sortable"' in dom
    shot = tmp_path / f"{kind}.png"
    _chromium(page.as_uri(), tmp_path, f"--screenshot={shot}", "--window-size=1400,2400")
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


# in the page after load: where each table's box, the prose cells and the candidates' deciding headers end
_MEASURE = """<script>window.addEventListener("load", function () {
  var W = window.innerWidth, out = {page: document.documentElement.scrollWidth, width: W, boxes: [], prose: [],
                                    heads: {}};
  document.querySelectorAll("div.scroll").forEach(function (b) { out.boxes.push(b.getBoundingClientRect().right); });
  document.querySelectorAll("table.prose").forEach(function (t) {
    out.prose.push([t.scrollWidth, t.parentElement.clientWidth]); });
  document.querySelectorAll("th").forEach(function (th) {
    var box = th.closest("div.scroll").getBoundingClientRect();
    out.heads[th.textContent] = th.getBoundingClientRect().right <= box.right + 1; });
  parent.postMessage(JSON.stringify(out), "*"); });</script>"""
# the page in a frame of the width under test (headless Chromium's own window is at least 500 px wide); the frame
# posts its measurements to this host page, which --dump-dom prints
_HOST = """<html><body style="margin:0"><iframe src="{src}" style="border:0;width:{w}px;height:2000px"></iframe>
<script>window.addEventListener("message", function (e) {{ var pre = document.createElement("pre");
  pre.id = "measure"; pre.textContent = e.data; document.body.appendChild(pre); }});</script></body></html>"""


@pytest.mark.parametrize("width", [1280, 390])
def test_search_report_reads_at_desktop_and_phone_width(tmp_path, width):
    """At 1280 px and at a phone's 390 px nothing runs off the page (every table scrolls inside its own
    box, which fits the page), the recommendation sentence wraps whole, and at 1280 the candidates' status and
    P(optimal) are in view without scrolling the table. A screenshot of each is saved (and was looked at)."""
    d = search_dict(24)
    words = " ".join(f"clause{i} (TPP 115 > 70; MFU 22.1% > 9.8%; EP nodes 16 > 4)" for i in range(40))
    d["recommendation"] = {"recommended": d["best"], "ties": [], "statement": "train L48 E128 K1 G2: " + words}
    d["best"]["beyond"] = ["TPP 115 > 70", "MFU 22.1% > 9.8%", "EP nodes 16 > 4", "micro-batch 8 > 4"]
    page = tmp_path / "search.html"
    page.write_text(build_report("search", d).replace("</body>", _MEASURE + "</body>"))
    host = tmp_path / "host.html"
    host.write_text(_HOST.format(src=page.name, w=width))
    dom, console, _ = _chromium(host.as_uri(), tmp_path, "--dump-dom", "--window-size=1400,2200")
    assert console == [], console
    m = json.loads(re.search(r'<pre id="measure">(.*?)</pre>', dom, re.S).group(1).replace("&quot;", '"'))
    assert m["width"] == width and m["page"] <= width, m  # no sideways scroll of the page itself
    assert m["boxes"] and max(m["boxes"]) <= width, m
    assert m["prose"] and all(sw <= cw for sw, cw in m["prose"]), m["prose"]  # the sentences wrap, none cut
    if width >= 1280:
        assert m["heads"]["status"] and m["heads"]["P(optimal)"], m["heads"]
    shot = tmp_path / f"search-{width}.png"
    _chromium(host.as_uri(), tmp_path, f"--screenshot={shot}", "--window-size=1400,2000")
    assert shot.exists() and shot.stat().st_size > 20_000
