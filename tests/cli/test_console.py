"""The console script (scaleplan/console.py): the collector tuned for a short-lived process before the CLI
runs; the `python -m scaleplan` form starts the same way."""
from __future__ import annotations

import gc
import subprocess
import sys


def test_the_collector_is_tuned_before_the_cli_runs(monkeypatch):
    from scaleplan import cli, console

    seen = []
    monkeypatch.setattr(cli, "main", lambda: seen.append(gc.get_threshold()))
    before = gc.get_threshold()
    try:
        console.main()
    finally:
        gc.set_threshold(*before)
    assert seen == [console.GC_THRESHOLDS] and console.GC_THRESHOLDS[0] > before[0]


def test_python_dash_m_runs_the_cli():
    out = subprocess.run([sys.executable, "-m", "scaleplan", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "layouts" in out.stdout
