"""One writer per calibration kind (calibrate/writers.py): the fits hand their parts to it, and the
composition of a 'dispatch' row follows one precedence."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from scaleplan.calibrate.writers import dispatch_coefficients, keys_in, keys_not_in, law_coefficients
from scaleplan.db.calibrations import KINDS
from scaleplan.estimator.dispatch import DispatchLaw

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ("scaleplan", "bench", "estimator", "calibrate", "db_migrations")


def _callers(name: str) -> set[str]:
    """The package files (and functions) that call ``name``."""
    out = set()
    for folder in PACKAGE:
        for path in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for fn in ast.walk(tree):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == name:
                        out.add(f"{path.relative_to(ROOT)}:{fn.name}")
    return out


def test_each_kind_has_exactly_one_writer():
    assert _callers("store_calibration") == {"calibrate/writers.py:write_dispatch", "calibrate/writers.py:write_chi_sys"}
    assert set(KINDS) == {"dispatch", "chi_sys"}  # a new kind needs its writer here


def test_the_fits_write_through_the_owners():
    assert _callers("write_dispatch") == {"calibrate/runner.py:fit_dispatch_floor",
                                          "calibrate/runner.py:fit_scales_from_runs", "calibrate/runner.py:fit_runtime",
                                          "calibrate/trace.py:store_law"}
    assert _callers("write_chi_sys") == {"calibrate/runner.py:fit_chi_sys", "calibrate/runner.py:fit_runtime"}


def test_dispatch_row_precedence_base_then_kept_then_fitted():
    base = {"t_gap_s": 2e-5, "kappa0": 600.0, "host_scale": 9.0}
    prev = {"t_gap_s": 3e-5, "host_scale": 1.5, "kernel_scale": 0.8, "t_gap_chain_s": 1e-5}
    # a floor refit: its law, the previous runtime scales kept
    assert dispatch_coefficients({"t_gap_s": 4e-5, "kappa0": 640.0}, prev, keep=keys_in(("host_scale", "kernel_scale"))) \
        == {"t_gap_s": 4e-5, "kappa0": 640.0, "host_scale": 1.5, "kernel_scale": 0.8}
    # a runs fit on the calibrated law: the law written out, the previous law keys over it, new scales on top
    assert dispatch_coefficients({"host_scale": 1.2}, prev, base, keys_not_in(("host_scale", "kernel_scale"))) \
        == {"t_gap_s": 3e-5, "kappa0": 600.0, "host_scale": 1.2, "t_gap_chain_s": 1e-5}
    # a fit on the uncalibrated law keeps nothing of the previous row
    assert dispatch_coefficients({"host_scale": 1.2}, prev, base) == {**base, "host_scale": 1.2}
    assert dispatch_coefficients({"host_scale": 1.2}, None, None, keys_not_in(())) == {"host_scale": 1.2}


def test_law_coefficients_write_out_every_term_of_the_law():
    law = DispatchLaw(kappa0=650.0, kappa1=7.0, t_gap_s=2.7e-5, t_host_s=1e-3, t_ep_host_s=4e-4)
    assert law_coefficients(law) == pytest.approx(
        {"t_gap_s": 2.7e-5, "kappa0": 650.0, "kappa1": 7.0, "t_host_s": 1e-3, "t_ep_host_s": 4e-4})
