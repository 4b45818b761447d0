"""Runtime scales of the time model, fitted from observed step times (opt-in): host_scale and kernel_scale.

The paper's model (sec:iteration-time-model) takes every term from a microbenchmark; its only
fitted term is chi_sys (eq:desync). Two quantities are measured in conditions a real training
step does not share, and ``calibrate fit --kind dispatch --from-runs`` fits one factor for each:

* ``host_scale`` multiplies the host side of the dispatch law t_disp = L_stage kappa(E_loc) t_gap
  + t_ep_host + t_host ("Compute versus dispatch"; on a serial-dispatch CPU the ``ops:*`` rows, op
  counts x per-op host seconds of a tiny probe). The probe understates the per-op cost inside a
  real model (autograd, allocator and framework code around each op) or, on a CPU, also holds the
  tiny ops' own compute and so can overstate it.
* ``kernel_scale`` multiplies every device-kernel time read from the tables (GEMM, grouped GEMM,
  SDPA, router, element-wise, vocabulary, optimizer): a microbenchmark repeats one kernel on warm
  caches, a step runs hundreds of different ones on cold caches and shared clocks.

kernel_scale is fitted on serial-dispatch profiles only (a CPU: host work and kernels share the
cores and their caches, which an isolated kernel benchmark cannot see). On a GPU the kernel tables
are device-timed and the host runs on other silicon; the paper keeps them unscaled, and a free
kernel factor there would trade compute against dispatch across the sweep (on the published B200
sweeps it runs to its lower bound), so only host_scale is fitted. Collectives are never scaled
(their curves already come from concurrent ranks). The fit:

    min over (s_h, s_k) in [0.2, 5]^2 of sum_i rho( log t_an_i(s_h, s_k) - log t_meas_i ),   rho = soft-L1

with t_an_i the estimator's chi = 1 step time (eq:cal-iter) and t_meas_i the measured step time
(``measured_t_iter_s``, else from ``measured_mfu``: MFU x t is fixed for a run). A scale is fitted
only where it is identifiable: some run's time must depend on it (sensitivity d log t / d log s
above 1e-3), and the two are fitted together only when their sensitivities are not proportional
across the runs (condition number of the sensitivity matrix at most COND_MAX; every run with the
same host share cannot tell host from kernel time). An unidentifiable scale stays 1, with a note;
when only one can be fitted it is host_scale if that is identifiable (the GPU case: the host terms
set the time of dispatch-bound runs only). chi_sys is fitted afterwards on the rescaled times.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from scaleplan.errors import ScaleplanError

PARAMS = ("host_scale", "kernel_scale")
BOUNDS = (0.2, 5.0)
COND_MAX = 30.0
SENS_MIN = 1e-3
_STEP = 0.05  # log step of the sensitivity difference quotient


@dataclass
class ScalesFit:
    """The fitted scales (1 where not fitted) and per-run log residuals log(t_pred / t_meas)."""

    host_scale: float
    kernel_scale: float
    fitted: list[str]
    n_obs: int
    residuals: list[float]
    residuals_before: list[float]
    at_bound: list[str]
    notes: list[str] = field(default_factory=list)

    def coefficients(self) -> dict[str, float]:
        return {"host_scale": self.host_scale, "kernel_scale": self.kernel_scale}


def sensitivities(t_of_scales: Callable[[float, float], np.ndarray], n: int) -> np.ndarray:
    """d log t_i / d log s at s = (1, 1), central differences: shape (n runs, 2) in PARAMS order."""
    cols = []
    for j in range(len(PARAMS)):
        up, dn = [1.0, 1.0], [1.0, 1.0]
        up[j], dn[j] = np.exp(_STEP), np.exp(-_STEP)
        d = np.log(np.asarray(t_of_scales(*up), float)) - np.log(np.asarray(t_of_scales(*dn), float))
        cols.append(d.reshape(n) / (2 * _STEP))
    return np.column_stack(cols)


def _identifiable(J: np.ndarray, allowed: Sequence[str]) -> tuple[list[int], list[str]]:
    """Indices of PARAMS to fit (of ``allowed``), and the notes for the allowed ones left at 1."""
    notes = []
    cand = [j for j in range(J.shape[1]) if PARAMS[j] in allowed]
    live = [j for j in cand if np.max(np.abs(J[:, j])) > SENS_MIN]
    for j in sorted(set(cand) - set(live)):
        notes.append(f"{PARAMS[j]} not identifiable: no run's step time depends on it; kept at 1")
    if len(live) == 2:
        sv = np.linalg.svd(J / np.linalg.norm(J, axis=0), compute_uv=False)
        if J.shape[0] < 2:
            notes.append("kernel_scale not identifiable apart from host_scale from one run; kept at 1")
            live = [0]
        elif sv[-1] <= 0 or sv[0] / sv[-1] > COND_MAX:
            notes.append("kernel_scale not identifiable apart from host_scale: the runs have (nearly) "
                         "the same host share of their step time; kept at 1")
            live = [0]
    return live, notes


def fit_run_scales(t_of_scales: Callable[[float, float], np.ndarray], t_meas: Sequence[float],
                   bounds: tuple[float, float] = BOUNDS, params: Sequence[str] = PARAMS) -> ScalesFit:
    """Fit host_scale and kernel_scale so that t_of_scales(s_h, s_k) (seconds) matches t_meas.

    Args:
        t_of_scales: (host_scale, kernel_scale) -> predicted chi = 1 step times (seconds, one per run).
        t_meas: measured step times (seconds, > 0), same order.
        bounds: (lo, hi) for each scale.
        params: the scales that may be fitted (the rest stay 1): PARAMS on a serial-dispatch
            profile, ("host_scale",) on a GPU one.
    Raises:
        ScaleplanError: no observations, or no allowed scale changes any predicted step time
            (nothing to fit). One run, or runs that share one host share, fit host_scale alone.
    """
    y = np.log(np.asarray(t_meas, dtype=float))
    n = len(y)
    if n < 1:
        raise ScaleplanError("runtime-scale fit refused: 0 observed run(s) with an absolute step time; "
                             "add runs with measured_t_iter_s or MFU")
    J = sensitivities(t_of_scales, n)
    live, notes = _identifiable(J, params)
    if not live:
        raise ScaleplanError(f"runtime-scale fit refused: the predicted step times do not depend on "
                             f"{' or '.join(params)} (dispatch hidden behind compute in every run?); not identifiable")
    lo, hi = np.log(bounds)

    def full(x) -> list[float]:
        s = [1.0, 1.0]
        for j, v in zip(live, x):
            s[j] = float(np.exp(v))
        return s

    def fun(x):
        return np.log(np.asarray(t_of_scales(*full(x)), dtype=float)) - y

    x0 = np.zeros(len(live))
    sol = least_squares(fun, x0, bounds=([lo] * len(live), [hi] * len(live)), loss="soft_l1", f_scale=0.1,
                        diff_step=1e-3)
    s = full(sol.x)
    at_bound = [PARAMS[j] for j, v in zip(live, sol.x) if np.isclose(v, lo, atol=1e-3) or np.isclose(v, hi, atol=1e-3)]
    notes += [f"{p} at its bound {bounds}: the scaled terms alone do not explain the gap" for p in at_bound]
    return ScalesFit(s[0], s[1], [PARAMS[j] for j in live], n, fun(sol.x).tolist(), fun(x0).tolist(),
                     at_bound, notes)


def absolute_times(obs, preds) -> tuple[list[int], np.ndarray]:
    """(indices, measured seconds) of the runs with a measured step time (an MFU import in a declared
    FLOP count stores one; an MFU of unknown count is no absolute measurement). ``preds`` aligns."""
    idx = [i for i, o in enumerate(obs) if o.t_iter_s]
    return idx, np.array([float(obs[i].t_iter_s) for i in idx], dtype=float)
