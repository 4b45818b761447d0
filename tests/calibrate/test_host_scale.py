"""host_scale fit (calibrate fit --kind dispatch --from-runs) on synthetic step times from the estimator."""
from __future__ import annotations

import numpy as np
import pytest
from scaleplan.calibrate.host_scale import BOUNDS, fit_host_scale
from scaleplan.estimator import Estimator

from scaleplan.errors import ScaleplanError
from scaleplan.specs import Layout
from tests.estimator.test_cpu_serial import SERIAL, _ops_frame, _spec

CASES = [(ck, mbs) for ck in ("none", "full") for mbs in (1, 2, 4)]


def _times(s: float) -> np.ndarray:
    """Step times (seconds) of six serial-dispatch runs at host scale s (ops rows for two ckpt modes)."""
    import pandas as pd

    frames = {"dispatch": pd.concat([_ops_frame(ckpt="none"), _ops_frame(ckpt="full")], ignore_index=True)}
    est = Estimator.from_frames(SERIAL, frames, extrapolate="clamp", host_scale=s)
    return np.array([est.estimate(_spec(ckpt=ck), 1, [Layout(mbs=mbs, ckpt=ck, dp=1)])[0].t_analytic_s
                     for ck, mbs in CASES])


@pytest.mark.parametrize("s_true", [0.6, 2.3])
def test_recovers_a_known_host_scale(s_true):
    rng = np.random.default_rng(1)
    t_meas = _times(s_true) * np.exp(rng.normal(0, 0.002, len(CASES)))
    fit = fit_host_scale(_times, t_meas)
    assert fit.host_scale == pytest.approx(s_true, rel=0.02)
    assert fit.n_obs == len(CASES) and not fit.at_bound
    assert max(abs(r) for r in fit.residuals) < 0.01 < max(abs(r) for r in fit.residuals_before)


def test_scale_beyond_the_bounds_stops_at_the_bound():
    fit = fit_host_scale(_times, _times(8.0))
    assert fit.host_scale == pytest.approx(BOUNDS[1], rel=1e-3) and fit.at_bound and fit.notes


def test_refuses_without_observations():
    with pytest.raises(ScaleplanError, match="0 observed run"):
        fit_host_scale(_times, [])


def test_refuses_when_host_time_never_matters():
    with pytest.raises(ScaleplanError, match="not identifiable"):
        fit_host_scale(lambda s: np.array([1.0, 2.0]), [1.1, 2.2])
