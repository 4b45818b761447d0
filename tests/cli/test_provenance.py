"""Say what was used: every planner output names the calibration in force (id, when
fitted, on what) and the table runs read; --calibration ID|none on estimate, layouts and search;
search --mem-fraction."""
from __future__ import annotations

import pytest

from .conftest import SMALL_SEARCH

PROFILE = "p6-b200.48xlarge"
HBM_GB = 179.0  # cluster_profiles/p6-b200.48xlarge.yaml: hbm_bytes 179e9 (the paper's M_dev)


@pytest.fixture()
def calibrated(sqlite_url):
    """A fresh database with one chi_sys calibration that adds a level term c_level = 0.5 (chi = 1.5 for
    every plan, eq:desync plus the level term), fitted on 7 observed runs."""
    from scaleplan.db.models import Calibration
    from scaleplan.db.session import session_scope

    with session_scope(sqlite_url) as s:
        row = Calibration(profile=PROFILE, kind="chi_sys", version=1, n_obs=7, notes="test fit",
                          coefficients={"c_a2a": 0.0, "c_pp": 0.0, "c_ovl": 0.0, "c_level": 0.5},
                          inputs={"observation_ids": [11, 12, 13, 14, 15, 16, 17]}, residuals=[], cv_error=0.05)
        s.add(row)
        s.flush()
        cal_id = row.id
    return sqlite_url, cal_id


def test_estimate_names_the_calibration_and_none_switches_it_off(calibrated, run_json, spec_file):
    url, cal_id = calibrated
    args = ("estimate", spec_file, "--devices", "32", "--layout", "ep=8", "--db", url)
    cal = run_json(*args)[0]
    off = run_json(*args, "--calibration", "none")[0]
    by_id = run_json(*args, "--calibration", str(cal_id))[0]
    (c,) = cal["provenance"]["calibration"]
    assert (c["id"], c["kind"], c["n_obs"]) == (cal_id, "chi_sys", 7)
    assert c["fitted_at"] and "7 observations" in c["fitted_on"] and "11..17" in c["fitted_on"]
    assert off["provenance"]["calibration"] == [] and not off["provenance"]["calibration_used"]
    assert by_id["provenance"]["calibration"][0]["id"] == cal_id
    # the level term multiplies t_iter by 1 + c_level: MFU without it is 1.5 x MFU with it
    assert cal["chi_sys"] == pytest.approx(1.5) and off["chi_sys"] == pytest.approx(1.0)
    assert off["mfu"] / cal["mfu"] == pytest.approx(1.5, rel=1e-9)
    assert by_id["mfu"] == pytest.approx(cal["mfu"], rel=1e-12)


def test_layouts_and_search_take_calibration(calibrated, run_json, spec_file):
    url, cal_id = calibrated
    lay = run_json("layouts", spec_file, "--devices", "32", "--top", "2", "--db", url, "--calibration", "none")
    assert lay["provenance"]["calibration"] == []
    lay = run_json("layouts", spec_file, "--devices", "32", "--top", "2", "--db", url)
    assert [c["id"] for c in lay["provenance"]["calibration"]] == [cal_id]
    on = run_json(*SMALL_SEARCH, "--db", url)
    off = run_json(*SMALL_SEARCH, "--db", url, "--calibration", "none")
    assert [c["id"] for c in on["provenance"]["calibration"]] == [cal_id]
    assert off["provenance"]["calibration"] == []
    # the same optimum's predicted MFU moves by the documented factor when the calibration is off
    if on["best"] and off["best"] and on["best"]["geometry"] == off["best"]["geometry"] \
            and on["best"]["layout"] == off["best"]["layout"]:
        assert off["best"]["mfu"] / on["best"]["mfu"] == pytest.approx(1.5, rel=1e-9)


@pytest.mark.parametrize("value", ["abc", "0", "-3", "1.5", "99999999999999999999"])
def test_bad_calibration_values_exit_2(run, spec_file, sqlite_url, value):
    code, _, err = run("estimate", spec_file, "--devices", "32", "--db", sqlite_url, "--calibration", value)
    assert code == 2 and "--calibration" in err.strip().splitlines()[-1]


def test_unknown_calibration_id_exits_2(calibrated, run, spec_file):
    url, cal_id = calibrated
    code, _, err = run("estimate", spec_file, "--devices", "32", "--db", url, "--calibration", str(cal_id + 5))
    assert code == 2 and "--calibration" in err


def test_table_runs_are_named(recorded_db, run_json, spec_file):
    """The runs listed are exactly the recorded runs of the profile that hold OK points (read back with SQL
    here), each with its suite and GPU."""
    from sqlalchemy import create_engine, text

    out = run_json("estimate", spec_file, "--devices", "32", "--db", recorded_db)
    runs = out[0]["provenance"]["table_runs"]
    eng = create_engine(recorded_db)
    with eng.connect() as c:
        want = {r[0] for r in c.execute(text("SELECT DISTINCT r.id FROM bench_run r JOIN gemm_point p ON "
                                             "p.run_id = r.id WHERE r.profile = :p AND p.status = 'OK'"),
                                        {"p": PROFILE})}
    got_gemm = {r["id"] for r in runs if r["suite"] == "gemm"}
    assert want and got_gemm == want
    assert all(r["n_points"] > 0 for r in runs)


def test_human_output_names_calibration_and_runs(calibrated, run, spec_file):
    url, cal_id = calibrated
    code, out, err = run("estimate", spec_file, "--devices", "32", "--layout", "ep=8", "--db", url)
    assert code == 0, err
    assert f"chi_sys #{cal_id}" in out and "table runs:" in out


def test_search_mem_fraction_caps_memory(recorded_db, run_json):
    dflt = run_json(*SMALL_SEARCH, "--db", recorded_db)
    assert dflt["mem_fraction"] == 0.95
    assert all(r["mem_per_device_gb"] <= 0.95 * HBM_GB for r in dflt["top"])
    low = run_json(*SMALL_SEARCH, "--db", recorded_db, "--mem-fraction", "0.6")
    assert low["mem_fraction"] == 0.6
    assert all(r["mem_per_device_gb"] <= 0.6 * HBM_GB for r in low["top"])
    full = run_json(*SMALL_SEARCH, "--db", recorded_db, "--mem-fraction", "1")
    assert max(r["mem_per_device_gb"] for r in full["top"]) > 0.6 * HBM_GB  # the cap binds at 0.6


def test_a_profile_reading_another_parts_rows_names_it(recorded_db, run_json, run, spec_file):
    """GB200 has no run of its own; its tables are p6-b200's rows scaled to it: the provenance names that profile,
    how its rows are read and its runs, and the human line no longer says all analytic."""
    out = run_json("estimate", spec_file, "--devices", "32", "--db", recorded_db, "--profile", "p6e-gb200.36xlarge")
    p = out[0]["provenance"]
    assert p["table_runs"] == [] and [b["profile"] for b in p["borrowed"]] == [PROFILE]
    assert p["borrowed"][0]["how"] == "scaled to this part"
    assert {r["id"] for r in p["borrowed"][0]["table_runs"]} == {r["id"] for r in run_json(
        "estimate", spec_file, "--devices", "32", "--db", recorded_db)[0]["provenance"]["table_runs"]}
    code, text_out, err = run("estimate", spec_file, "--devices", "32", "--db", recorded_db, "--profile",
                              "p6e-gb200.36xlarge")
    assert code == 0, err
    assert f"table runs: none; rows of {PROFILE} (scaled to this part)" in " ".join(text_out.split())
