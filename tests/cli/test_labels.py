"""Labels that agree with what they label (each test fails on the code before the fix)."""
from __future__ import annotations

import yaml

from .test_suggest import PLAN


def test_a_suite_error_means_the_run_is_not_complete(run, sqlite_url, tmp_path, monkeypatch):
    """A point that ends ERROR (dispatch's 'non-positive host intercept' in the issue) makes its run 'failed',
    with the count in its note, and bench run exits 1: 'complete' is kept for runs that measured every point."""
    from scaleplan.bench.suites import gemm
    from scaleplan.db import models as m
    from scaleplan.db.session import session_scope
    from tests.bench.conftest import tiny_preset

    real = gemm.measure

    def flaky(p, ctx):
        if p["m"] == 16:
            raise RuntimeError("non-positive host intercept; stand-in")
        return real(p, ctx)

    monkeypatch.setattr(gemm, "measure", flaky)
    preset = tmp_path / "p.yaml"
    preset.write_text(yaml.safe_dump(tiny_preset({"gemm": {"dtypes": ["fp32"], "m": [8, 16], "n": [8], "k": [8]}})))
    code, out, err = run("bench", "run", "--preset", preset, "--device", "cpu", "--db", sqlite_url)
    assert code == 1, (out, err)
    assert "failed" in out and "complete" not in out
    assert "1 point(s) ended ERROR" in err
    with session_scope(sqlite_url) as s:
        [r] = s.query(m.BenchRun).all()
        assert r.status == "failed" and "1 point(s) ended ERROR" in (r.notes or "")


def test_a_layout_degree_is_echoed_as_given(run, tmp_path, sqlite_url):
    """--layout tp=3 on 8 devices names tp and the 3 the user typed, not an internal product."""
    spec = tmp_path / "plan.yaml"
    spec.write_text(yaml.safe_dump(PLAN))
    code, _, err = run("estimate", spec, "--devices", 8, "--layout", "tp=3", "--db", sqlite_url)
    assert code == 2 and err.startswith("error: --layout tp: got 3; "), err
    assert "tp*cp*pp (here 3) divides --devices 8" in err
    code, _, err = run("estimate", spec, "--devices", 8, "--layout", "tp=2,pp=3", "--db", sqlite_url)
    assert err.startswith("error: --layout tp, --layout pp: got 'tp=2, pp=3'; "), err


def test_the_guess_and_the_footer_give_the_same_two_shares(run, run_json, sqlite_url):
    """'a guess: 100% ... no measured table' and 'analytic parts (57% of its step time)' measured different things
    without saying so: both now give the share of the step time and of the kernel and communication time."""
    from .test_answers import SAMPLED

    rec = run_json(*SAMPLED, "--db", sqlite_url)["recommendation"]["recommended"]
    step = rec["analytic_share"] + rec["extrapolated_share"]
    kern = rec["unmeasured_kernel_share"]
    code, out, err = run(*SAMPLED, "--db", sqlite_url)
    assert code == 0, err
    assert f"a guess: {kern:.0%} of this plan's kernel and communication time ({step:.0%} of its step time" in out
    assert f"analytic parts ({100 * step:.0f}% of its step time, {100 * kern:.0f}% of its kernel and " \
           "communication time)" in " ".join(err.split())


def test_calibrate_report_heads_with_what_the_fit_fitted(run, runtime_fitted_db):
    """The runtime fit stores a dispatch row (host scales) and a chi_sys row (c_level...): the report's first line
    named only the chi_sys row, whose unfitted terms are 0, so a row of zeros stood for the fit."""
    url, fit = runtime_fitted_db
    code, out, err = run("calibrate", "report", "--db", url)
    assert code == 0, err
    head = out.splitlines()[0]
    d, c = fit["calibration_ids"]
    assert head.startswith(f"calibration {c} (chi_sys) with dispatch calibration {d}, ")
    for k in fit["free"]:
        assert f"{k}={fit['params'][k]:.4g}" in head.split("; not fitted")[0], head
    assert all(k not in head.split("; not fitted")[0] for k in fit["unidentified"])


def test_the_cache_folder_is_settable_and_said(run, run_json, sqlite_url, tmp_path, monkeypatch):
    """The search's on-disk caches go to $SCALEPLAN_CACHE (nothing under the home folder), and `db status` says
    where they are."""
    from .test_answers import SAMPLED

    home, cache = tmp_path / "home", tmp_path / "cache"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SCALEPLAN_CACHE", str(cache))
    run_json(*SAMPLED, "--db", sqlite_url)
    assert any(cache.iterdir()) and not (home / ".cache").exists()
    assert run_json("db", "status", "--db", sqlite_url)["cache"] == str(cache)
    code, out, _ = run("db", "status", "--db", sqlite_url)
    assert f"cache     {cache} " in out and "$SCALEPLAN_CACHE" in out
