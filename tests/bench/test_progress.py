"""Progress of bench sweeps: a bar with done/total and ETA on stderr, stdout untouched."""
from __future__ import annotations

import json

import yaml
from scaleplan.bench.progress import parse_progress, progress_line

from tests.reliability.conftest import run_cli

from .conftest import tiny_preset


def test_progress_lines_round_trip():
    assert parse_progress(progress_line(3, 10)) == (3, 10)
    assert parse_progress("SCALEPLAN_RESULT {}") is None and parse_progress("SCALEPLAN_PROGRESS {oops") is None


def test_bench_run_draws_a_bar_with_eta(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text(yaml.safe_dump(tiny_preset({"gemm": {"dtypes": ["fp32"], "m": [8, 16, 32], "n": [8],
                                                           "k": [8]}})))
    code, out, err = run_cli("bench", "run", "--preset", str(preset), "--device", "cpu",
                             "--db", f"sqlite:///{tmp_path / 'b.db'}", "--json")
    assert code == 0, err
    assert json.loads(out)["runs"][0]["measured"] == 3  # stdout stays one JSON document
    assert "3/3" in err and "ETA" in err and "gemm" in err, err
