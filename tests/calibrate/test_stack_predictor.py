"""calibrate fit --kind dispatch --from-runs predicts each run with its software stack: validate runs
(scaleplan's reference model) with stack 'reference', every other run with 'megatron'."""
from __future__ import annotations

from scaleplan.calibrate import runner
from scaleplan.calibrate.evaluate import Observed


def test_validate_runs_are_predicted_with_the_reference_stack(monkeypatch):
    calls = []

    def fake(profile, url, extrapolate, host_scale, use_calibration, kernel_scale=None, stack="megatron"):
        def predict(obs):
            calls.append((stack, [o.id for o in obs], host_scale, kernel_scale))
            return [(stack, o.id) for o in obs]
        return predict

    monkeypatch.setattr(runner, "estimator_predictor", fake)
    sources = ["validate", "csv", "validate", "recorded"]
    obs = [Observed(id=i, sweep="s", profile="p", spec={}, n_devices=1, layout={}, source=s)
           for i, s in enumerate(sources)]
    out = runner.stack_predictor("p", None, "clamp", 1.5, False, 0.8)(obs)
    assert out == [("reference", 0), ("megatron", 1), ("reference", 2), ("megatron", 3)]
    assert sorted(calls) == [("megatron", [1, 3], 1.5, 0.8), ("reference", [0, 2], 1.5, 0.8)]
