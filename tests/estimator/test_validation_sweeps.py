"""The measured validation sweeps (../shared/validation) end to end on the recorded B200 tables.

Asserted: every layout evaluates (no out-of-range lookup, fits in memory) and each sweep's best
measured layout is in our predicted top 3 of that sweep's layouts.

Uncalibrated (chi_sys = 1) the model cannot see the inter-node all-to-all straggler that the paper
assigns to its one fitted term (eq:desync, c_A2A): the 5.4B sweep's EP=16 layouts (EP spanning two
nodes) are then over-predicted, so only the 700M sweep (every EP group inside a node) is checked
without calibration. Both sweeps are checked under the paper's own published calibration
(c_A2A = 1.2, c_PP = 0.5, c_ovl = -0.18: dmlc/ScalePlan dlcalc/utils/desync.py), stored as a
Calibration row the way `scaleplan calibrate fit` stores ours. The absolute MFU error and the rank
correlation are reported by benchmarks/estimator_accuracy.py, not asserted.
"""
import numpy as np
import pytest
from scaleplan.estimator import Estimator

PAPER_CHI = {"c_a2a": 1.2, "c_pp": 0.5, "c_ovl": -0.18}


def _top3_check(est, sweeps, names):
    for name, spec, n, layouts, t_meas, _ref in sweeps:
        if name not in names:
            continue
        res = est.estimate(spec, n, layouts)
        assert all(r.feasible for r in res), name
        assert all(r.sources[c] in ("measured", "interpolated") for r in res
                   for c in ("attn_proj", "sdpa", "experts", "vocab")), name
        pred = np.array([r.mfu for r in res])
        assert np.all((pred > 0) & (pred < 1))
        top3 = set(np.argsort(-pred)[:3].tolist())
        assert int(np.argmin(t_meas)) in top3, (name, pred, t_meas)


def test_uncalibrated_700m_best_measured_is_in_predicted_top3(recorded_db, sweeps):
    assert {s[0] for s in sweeps} >= {"700m-32dev", "5p4b-256dev"}
    est = Estimator("p6-b200.48xlarge", db_url=recorded_db, use_calibration=False)
    _top3_check(est, sweeps, {"700m-32dev"})


def test_runtime_calibrated_both_sweeps_best_measured_in_top3(runtime_fitted_db, sweeps):
    url, fit = runtime_fitted_db
    est = Estimator("p6-b200.48xlarge", db_url=url)
    assert "host_scale" in fit["free"] and est.host_scale == pytest.approx(fit["params"]["host_scale"])
    assert est.chi.c_level == pytest.approx(fit["params"]["c_level"])  # the stored calibration is in force
    _top3_check(est, sweeps, {"700m-32dev", "5p4b-256dev"})
