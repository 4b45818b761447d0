"""The search draws its MFU error from the calibration in force whichever way the database is named:
the default database (no $SCALEPLAN_DB: the user data directory), $SCALEPLAN_DB, or --db."""
from __future__ import annotations

import math

import numpy as np
import pytest
from .conftest import SMALL_SEARCH

RESIDUALS = [0.10, -0.05, 0.20, -0.10]
# RMS of log(1 + e), computed here by hand from the stored residuals
WANT = math.sqrt(np.mean([math.log1p(e) ** 2 for e in RESIDUALS]))


def _store(url: str) -> None:
    from scaleplan.db import models as m
    from scaleplan.db import session as dbs

    dbs.upgrade(url)
    with dbs.session_scope(url) as s:
        s.add(m.Calibration(profile="p6-b200.48xlarge", kind="dispatch", version=1, coefficients={},
                            residuals=RESIDUALS, n_obs=len(RESIDUALS)))


@pytest.mark.parametrize("how", ["default", "env", "--db"])
def test_search_sigma_from_the_calibration_whatever_names_the_database(how, tmp_path, monkeypatch, run_json):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SCALEPLAN_DB", raising=False)
    path = tmp_path / "x.db"
    argv = [*SMALL_SEARCH[:-4], "--samples", "20", "--workers", "1"]
    if how == "default":
        from scaleplan.db.session import default_url

        url = default_url()
        assert str(tmp_path / "xdg") in url
    else:
        url = f"sqlite:///{path}"
        if how == "env":
            monkeypatch.setenv("SCALEPLAN_DB", str(path))
        else:
            argv += ["--db", str(path)]
    _store(url)
    got = run_json(*argv)["uncertainty_inputs"]["mfu_error"]
    assert got["sigma"] == pytest.approx(WANT) and got["n"] == len(RESIDUALS)
    # --calibration none: the uncalibrated estimator, so the paper's fallback error
    none = run_json(*argv, "--calibration", "none")["uncertainty_inputs"]["mfu_error"]
    assert none["source"].startswith("fallback")


def test_law_by_name_from_the_default_database(tmp_path, monkeypatch, run_json):
    """--law NAME without --db reads the fit stored in the default database (it fell back to the paper's law, as
    the MFU error did), and the loss band widens by that fit's own held-out scatter beyond its data."""
    from scaleplan.db import models as m
    from scaleplan.db import session as dbs
    from scaleplan.mosaic.law import PAPER_JOINT_LAW

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SCALEPLAN_DB", raising=False)
    url = dbs.default_url()
    dbs.upgrade(url)
    with dbs.session_scope(url) as s:
        row = m.LawFit(name="mine", dataset="d", coefficients=PAPER_JOINT_LAW.to_dict(), heldout_rmse=0.02,
                       n_runs=10, settings={})
        s.add(row)
        s.flush()
        fit_id = row.id
    doc = run_json(*SMALL_SEARCH[:-4], "--samples", "20", "--workers", "1", "--law", "mine")
    assert doc["law"] == f"db:{fit_id}" and doc["evidence_range"]["law_scatter"] == 0.02
    assert doc["uncertainty_inputs"]["law_beyond_data_scatter"] == 0.02
