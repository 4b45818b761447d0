"""The HTML report in a real browser (issue 16.3): headless Chromium loads the file with the network off
(every request goes to a dead proxy, every host name fails to resolve), the rendered DOM holds the plots
with every frontier point drawn, the console stays empty, no request leaves the page, and a screenshot is
saved. Skipped only where no Chromium is installed (CI installs the Debian package `chromium`: .ci/run)."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from scaleplan.report.html import build_report

from .synth import calibrate_dict, search_dict, validate_dict

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")

OFFLINE = ["--headless", "--no-sandbox", "--disable-gpu", "--proxy-server=127.0.0.1:9",
           "--host-resolver-rules=MAP * ~NOTFOUND", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--no-first-run", "--disable-default-apps", "--disable-extensions",
           "--enable-logging=stderr", "--v=0", "--virtual-time-budget=8000"]


def _chromium(url: str, tmp_path, *extra: str) -> tuple[str, list[str], set[str]]:
    """(stdout, console messages, http(s) URLs in the net log) of one headless load of ``url``."""
    net = tmp_path / f"net{len(list(tmp_path.iterdir()))}.json"
    p = subprocess.run([CHROMIUM, *OFFLINE, f"--user-data-dir={tmp_path / 'profile'}", f"--log-net-log={net}",
                        *extra, url], capture_output=True, text=True, timeout=120, check=False)
    console = [ln for ln in p.stderr.splitlines() if ":CONSOLE" in ln]
    urls = set(re.findall(r"https?://[A-Za-z0-9.\-]+", net.read_text())) if net.exists() else set()
    return p.stdout, console, urls


@pytest.fixture(scope="module")
def background_urls(tmp_path_factory) -> set[str]:
    """Hosts the browser itself names in its net log on a blank page (update checks and the like)."""
    return _chromium("about:blank", tmp_path_factory.mktemp("blank"))[2]


def test_the_checks_can_fail(tmp_path, background_urls):
    """A page with a console error and an outside request is caught by both checks."""
    page = tmp_path / "bad.html"
    page.write_text('<html><body><script>console.error("boom-1234")</script>'
                    '<img src="https://cdn.example.org/x.png"></body></html>')
    _, console, urls = _chromium(page.as_uri(), tmp_path, "--dump-dom")
    assert any("boom-1234" in c for c in console)
    assert "https://cdn.example.org" in urls - background_urls


@pytest.mark.parametrize("kind,data,plots", [
    ("search", search_dict(24), {"frontier": 24 + 1, "sparsity": 6, "sweep": None}),
    ("calibrate", calibrate_dict(), {"parity": 2 * 10}),
    ("validate", validate_dict(), {"components": None}),
])
def test_report_renders_offline(tmp_path, background_urls, kind, data, plots):
    page = tmp_path / f"{kind}.html"
    page.write_text(build_report(kind, data))
    dom, console, urls = _chromium(page.as_uri(), tmp_path, "--dump-dom")
    assert console == [], console
    assert urls <= background_urls, urls - background_urls
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
