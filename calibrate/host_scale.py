"""The host-time scale of the dispatch law, fitted from observed step times (opt-in).

The dispatch law (paper sec:iteration-time-model, "Compute versus dispatch") costs the host side
of a micro-batch as t_disp = L_stage kappa(E_loc) t_gap + t_ep_host + t_host. Its host terms come
from small probes (a kernel chain; on a serial-dispatch CPU the ``ops:*`` rows: op counts x the
per-op host seconds of a tiny model), which understate the per-op cost inside a real model
(autograd, allocator and framework code around each op). One multiplicative factor ``host_scale``
on every host term (t_gap, t_ep_host, t_host and the ``ops:*`` host seconds) is fitted on the
absolute step times of observed runs:

    min over s in [0.2, 5] of sum_i rho( log t_an_i(s) - log t_meas_i ),   rho = soft-L1

with t_an_i(s) the estimator's chi = 1 step time (eq:cal-iter) at host scale s and t_meas_i the
measured step time (``measured_t_iter_s``, else from ``measured_mfu``: MFU x t is fixed for a run).
Runs with only MFU ratios (mfu_norm) carry no absolute scale and are not used. chi_sys (eq:desync)
is fitted afterwards on the rescaled analytic times.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from scaleplan.errors import ScaleplanError

BOUNDS = (0.2, 5.0)
N_PARAMS = 1


@dataclass
class HostScaleFit:
    """host_scale and the per-run log residuals log(t_pred / t_meas) before (s = 1) and after."""

    host_scale: float
    n_obs: int
    residuals: list[float]
    residuals_before: list[float]
    at_bound: bool
    notes: list[str] = field(default_factory=list)


def fit_host_scale(t_of_scale: Callable[[float], np.ndarray], t_meas: Sequence[float],
                   bounds: tuple[float, float] = BOUNDS) -> HostScaleFit:
    """Fit one host-time factor s so that t_of_scale(s) (seconds, one per run) matches t_meas.

    Args:
        t_of_scale: s -> predicted chi = 1 step times (seconds, array of len(t_meas)).
        t_meas: measured step times (seconds, > 0).
        bounds: (lo, hi) for s.
    Raises:
        ScaleplanError: fewer observations than parameters (1), or the predictions do not depend
            on s over the bounds (no run has host time in its critical path: s is not identifiable).
    """
    y = np.log(np.asarray(t_meas, dtype=float))
    if len(y) < N_PARAMS:
        raise ScaleplanError(f"host-scale fit refused: {len(y)} observed run(s) with an absolute step time "
                             f"for {N_PARAMS} parameter (host_scale); add runs with measured_t_iter_s or MFU")
    lo, hi = np.log(bounds)
    if np.allclose(np.log(t_of_scale(bounds[0])), np.log(t_of_scale(bounds[1])), rtol=0, atol=1e-9):
        raise ScaleplanError("host-scale fit refused: the predicted step times do not depend on the host time "
                             "(dispatch hidden behind compute in every run); host_scale is not identifiable")

    def fun(x):
        return np.log(np.asarray(t_of_scale(float(np.exp(x[0]))), dtype=float)) - y

    sol = least_squares(fun, [0.0], bounds=([lo], [hi]), loss="soft_l1", f_scale=0.1, diff_step=1e-3)
    s = float(np.exp(sol.x[0]))
    at_bound = bool(np.isclose(sol.x[0], lo, atol=1e-3) or np.isclose(sol.x[0], hi, atol=1e-3))
    notes = [f"host_scale at its bound {bounds}: the host terms alone do not explain the gap"] if at_bound else []
    return HostScaleFit(s, len(y), fun(sol.x).tolist(), fun([0.0]).tolist(), at_bound, notes)


def absolute_times(obs, preds) -> tuple[list[int], np.ndarray]:
    """(indices, measured seconds) of the runs with an absolute measurement: t_iter, else MFU
    converted with the prediction's MFU x t (the FLOPs per step do not depend on the plan's timing)."""
    idx, t = [], []
    for i, (o, p) in enumerate(zip(obs, preds)):
        if o.t_iter_s:
            idx.append(i)
            t.append(float(o.t_iter_s))
        elif o.mfu:
            idx.append(i)
            t.append(p.mfu_analytic * p.t_analytic_s / float(o.mfu))
    return idx, np.array(t, dtype=float)
