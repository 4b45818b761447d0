"""One meaning per name: `mfu` is eq:mfu (N = N_act) in every output, the
glossary (docs/glossary.md) defines the names the outputs use, and --help texts cite paper sections rather
than raw LaTeX labels."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from scaleplan.cli import app

GLOSSARY = Path(__file__).resolve().parents[2] / "docs" / "glossary.md"  # the README links it
LABEL = re.compile(r"\b(?:eq|sec|tab|fig|app|lst|alg):[A-Za-z0-9_-]+")


def _command_paths():
    paths = [[]]

    def walk(cmd, path):
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                paths.append([*path, name])
                walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return paths


@pytest.mark.parametrize("path", _command_paths(), ids=lambda p: " ".join(p) or "scaleplan")
def test_help_names_sections_not_labels(path):
    out = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "250"}).output
    assert "Usage" in out
    assert not LABEL.findall(out), LABEL.findall(out)


def test_glossary_defines_the_output_names():
    gloss = GLOSSARY.read_text()
    for name in ("L", "E", "K", "G", "S", "TPP", "mb", "MFU", "HFU", "N_act", "N_tot", "C_model", "C_peak",
                 "chi_sys", "mfu_validation", "d_expert", "d_ff"):
        assert re.search(rf"^\| [^|]*\b{re.escape(name)}\b", gloss, re.M), name


def test_validate_mfu_is_the_estimators_mfu(tmp_path):
    """validate's measured MFU and the estimator's predicted MFU are one quantity: at the predicted
    t_iter both give the same number, and it is 6 N_act B T / (t_iter N_dev F_peak) by hand."""
    from scaleplan.estimator import Estimator

    from scaleplan.geometry import spec_param_counts
    from scaleplan.profiles import load_profile
    from scaleplan.specs import parse_spec
    from scaleplan.validate.compare import mfu

    from .test_fuzz import BASE

    spec = parse_spec(BASE)
    est = Estimator(spec.hardware.node_type, db_url=f"sqlite:///{tmp_path / 'e.db'}")
    r = est.estimate(spec, 8, [spec.default_layout()])[0]
    peak = load_profile(spec.hardware.node_type).peak(spec.model.precision)
    by_hand = 6 * spec_param_counts(spec.model).n_act * spec.data.gbs * spec.data.seqlen / (r.t_iter_s * 8 * peak)
    assert r.mfu == pytest.approx(by_hand, rel=1e-9)
    assert mfu(spec, r.t_iter_s, 8, peak) == pytest.approx(r.mfu, rel=1e-9)
