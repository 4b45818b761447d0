"""The measured validation sweeps (../shared/validation) end to end on the recorded B200 tables.

Asserted: every layout evaluates (no out-of-range lookup, fits in memory) and each sweep's best
measured layout is in our predicted top 3 of that sweep's layouts. The absolute MFU error and the
rank correlation are reported by benchmarks/estimator_accuracy.py (not asserted: nothing is fitted).
"""
import numpy as np
from scaleplan.estimator import Estimator


def test_sweeps_run_and_best_measured_is_in_predicted_top3(recorded_db, sweeps):
    est = Estimator("p6-b200.48xlarge", db_url=recorded_db, use_calibration=False)
    assert {s[0] for s in sweeps} >= {"700m-32dev", "5p4b-256dev"}
    for name, spec, n, layouts, real, _ref in sweeps:
        res = est.estimate(spec, n, layouts)
        assert all(r.feasible for r in res), name
        assert all(r.sources[c] in ("measured", "interpolated") for r in res
                   for c in ("attn_proj", "sdpa", "experts", "vocab")), name
        pred = np.array([r.mfu for r in res])
        assert np.all((pred > 0) & (pred < 1))
        top3 = set(np.argsort(-pred)[:3].tolist())
        assert int(np.argmax(real)) in top3, (name, pred, real)
