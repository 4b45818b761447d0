"""The runtime calibration: what observed runs can identify, fitted jointly (eq:cal-iter, eq:desync).

    t_iter = chi(theta) * t_analytic(host_scale)
    chi    = 1 + c_level + c_a2a (t_A2A / t_an) [EP spans nodes] + c_pp (inter-node PP hops)

* ``ep_host_scale`` multiplies the EP token path's host term t_ep_host on top of host_scale: identified
  only where runs with and without EP separate it (the 700M sweep has EP = 1 rows; the 5.4B has none).
* ``host_scale`` multiplies the host side of the dispatch law (t_gap, t_ep_host, t_host,
  sec:iteration-time-model): on B200 the floor is 45-62% of the step, and its constants come from
  profiler traces of one stack, so it is the term most worth learning.
* ``c_level``: what every run of the stack pays beyond the microbenchmarks (paper app:training-stack:
  allocator, garbage collection, launch jitter, input pipeline).
* ``c_a2a``, ``c_pp``: eq:desync's cross-node terms, with the placement features of Megatron's rank
  order (estimator.model.desync_features).

**Every run is one draw of the model's error.** The fit is the posterior mode of: log step-time
residuals independent across runs with one scatter SIGMA, and a Gaussian prior per parameter around
its identity value (PRIOR_SD: the trace-derived dispatch law is known to ~15%, the desync terms are
small). SIGMA is not a constant: it is the RMS log residual the runs leave at identity (the
estimator's own error before calibration), floored at READ_SD, the reading error of the published
charts (shared/validation/README.md: +-0.01 on values near 1). So more runs pull harder against the
priors, and a model that already fits well is moved less by the same misfit.

**Each sweep its own scatter.** Given the sweep of each run, SIGMA is the RMS log residual of that
sweep's runs at identity (floored at READ_SD): the estimator's error differs by sweep (a sweep whose
step time depends on a cost the model lacks is explained worse than the others), and a run of a
sweep the model explains to 45% is not the same draw as one of a sweep it explains to 8%. Weighing
each run by its own sweep's scatter keeps a sweep the physics cannot explain from dragging the
coefficients the others rely on (it still pulls, by (sigma_best / sigma_s)^2 per run). When one sweep
holds most of the squared residual with fewer than half the runs, the fit says so in its notes, with
what the shared coefficients would be without it (:func:`dominance_note`). There is no between-sweep
level term: no repeat runs are published, so a level scatter between sweeps has no measurement to set it.

The estimator itself evaluates every candidate (one place for the physics). A term is fitted only
when the runs identify it: its sensitivity d log t / d theta is non-zero on some run, and adding it
keeps the condition number of the runs' sensitivity matrix <= COND_MAX (greedy, in the order of
PARAMS: the dispatch law first, cross-node terms next, the level last); fewer runs than free terms
+ 1 stops the greedy. Then a freed term is kept only when the runs support it: dropping it, the
refit's chi-square (log residuals in the scatter below) must rise by more than ln n for n runs
(Schwarz's BIC; the last freed term is tried first): a term one sweep barely supports would otherwise be
carried to sweeps it does not describe. The rest stay at their identity value, and the fit says why
(what each fit freed on the validation sweeps: docs/accuracy.md). The objective is least squares on log
step-time residuals, plus the priors (below).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from scaleplan.errors import ScaleplanError

PARAMS = ("host_scale", "ep_host_scale", "c_a2a", "c_pp", "c_level")
LOG_PARAMS = ("host_scale", "ep_host_scale")  # fitted in log space
IDENTITY = {"host_scale": 1.0, "ep_host_scale": 1.0, "c_a2a": 0.0, "c_pp": 0.0, "c_level": 0.0}
BOUNDS = {"host_scale": (0.2, 5.0), "ep_host_scale": (0.1, 5.0), "c_a2a": (0.0, 20.0), "c_pp": (0.0, 5.0),
          "c_level": (-0.5, 1.0)}
COND_MAX = 30.0
SENS_MIN = 1e-3
READ_SD = 0.01     # floor of the per-run log scatter: the published charts' reading error (+-0.01 near 1)
PRIOR_SD = {"host_scale": 0.15, "ep_host_scale": 0.3, "c_a2a": 0.5, "c_pp": 0.05, "c_level": 0.10}  # about identity (log for host_scale)
_H = 0.05  # finite-difference step (log host_scale; the chi coefficients themselves)


# what a term at its bound means, in words (the fit's note): the lower bound of an eq:desync term is "off"
_AT_LOWER = {
    "c_a2a": "the runs ask for no extra cross-node all-to-all cost: the estimator's all-to-all time alone already "
             "matches them (or over-predicts), so this eq:desync term is off",
    "c_pp": "the runs ask for no extra cost per pipeline hop across nodes: this eq:desync term is off",
    "c_level": "the runs ask for the largest step-time reduction allowed: the estimator over-predicts all of them",
}
_AT_UPPER = "the fit wanted more than its range allows: this term alone does not explain the gap (a missing cost)"


def bound_note(name: str, value: float, lower: bool, bounds: dict | None = None) -> str:
    """The fit's note for a term that ended on its bound: the value and what it means for the runs
    (``bounds``: the fit's, default BOUNDS)."""
    lo, hi = (bounds or BOUNDS)[name]
    if lower and name in _AT_LOWER:
        why = _AT_LOWER[name]
    elif lower:
        why = "the fit wanted less than its range allows: the estimator over-predicts what this term scales"
    else:
        why = _AT_UPPER
    return f"{name} sits at its {'lower' if lower else 'upper'} bound ({value:.4g}, range [{lo:g}, {hi:g}]): {why}"


@dataclass
class JointFit:
    """Fitted values (identity where not fitted), which were free, why the others were not, and the
    log residuals log(t_pred / t_meas) per run before (identity) and after."""

    params: dict[str, float]
    free: list[str]
    unidentified: dict[str, str]
    residuals: np.ndarray
    residuals_before: np.ndarray
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Terms:
    """The terms a fit may free, in the greedy order, with their identity values, bounds and prior sd
    (about the identity; in log space for LOG_PARAMS). The default is the runtime calibration's own;
    :meth:`with_term` adds one (a diagnostic term, e.g. benchmarks/coupled_delay.py) the same way."""

    names: tuple[str, ...] = PARAMS
    identity: dict = field(default_factory=lambda: dict(IDENTITY))
    bounds: dict = field(default_factory=lambda: dict(BOUNDS))
    prior_sd: dict = field(default_factory=lambda: dict(PRIOR_SD))

    def with_term(self, name: str, identity: float, bounds: tuple[float, float], prior_sd: float,
                  before: str = "c_level") -> Terms:
        """These terms plus ``name`` (linear, not log), tried by the greedy just before ``before``."""
        i = self.names.index(before)
        return Terms(self.names[:i] + (name,) + self.names[i:], {**self.identity, name: identity},
                     {**self.bounds, name: bounds}, {**self.prior_sd, name: prior_sd})


def _to_x(p: dict[str, float], names) -> np.ndarray:
    return np.array([np.log(p[n]) if n in LOG_PARAMS else p[n] for n in names])


def _from_x(x, names, identity=IDENTITY) -> dict[str, float]:
    out = dict(identity)
    out.update({n: float(np.exp(v)) if n in LOG_PARAMS else float(v) for n, v in zip(names, x)})
    return out


def fit_joint(t_pred: Callable[[dict[str, float]], np.ndarray], t_meas: np.ndarray, sweeps=None,
              terms: Terms | None = None) -> JointFit:
    """Fit the identifiable subset of ``terms`` (default :class:`Terms`: PARAMS; posterior mode of the
    model in the module docstring).

    Args:
        t_pred: parameters -> predicted step times of the runs (seconds, shape (n,)).
        t_meas: measured step times (seconds, shape (n,)).
        sweeps: the sweep of each run (shape (n,)), or None (one sweep): each run is weighed by its
            sweep's scatter at identity (:func:`sweep_scatter`), and a sweep that dominates the
            residual is named in the notes (:func:`dominance_note`).
        terms: the terms that may be freed, with identity, bounds and priors (default: the module's PARAMS).

    Raises:
        ScaleplanError: no runs, or a non-positive / non-finite measured time.
    """
    t_meas = np.asarray(t_meas, dtype=float)
    if t_meas.size == 0 or not np.all(np.isfinite(t_meas) & (t_meas > 0)):
        raise ScaleplanError("runtime calibration: needs observed runs with positive finite step times")
    tm = terms or Terms()
    ident = tm.identity
    y = np.log(t_meas)
    r0 = np.log(t_pred(ident)) - y
    sens = {}
    for n in tm.names:
        sens[n] = (np.log(t_pred(_from_x(_to_x(ident, [n]) + _H, [n], ident))) - y - r0) / _H
    free: list[str] = []
    why: dict[str, str] = {}
    for n in tm.names:
        if np.max(np.abs(sens[n])) < SENS_MIN:
            why[n] = "no run's step time depends on it"
            continue
        if len(free) + 2 > t_meas.size:
            why[n] = f"{t_meas.size} runs are too few for another free term"
            continue
        J = np.column_stack([sens[m] for m in free + [n]])
        cond = np.linalg.cond(J)
        if not np.isfinite(cond) or cond > COND_MAX:
            why[n] = f"not separable from {', '.join(free)} on these runs (condition number {cond:.3g})"
            continue
        free.append(n)
    if not free:
        return JointFit(dict(ident), [], why, r0, r0)
    # each run one draw with the scatter the estimator leaves at identity on its sweep (module docstring)
    w = 1.0 / sweep_scatter(r0, sweeps)
    fit = _solve(t_pred, y, free, tm, w)
    for n in reversed(list(free)):  # the last freed first: the level and cross-node terms before the host law
        if len(free) == 1:
            break
        rest = [m for m in free if m != n]
        alt = _solve(t_pred, y, rest, tm, w)
        gain = float(np.sum((w * alt[1]) ** 2) - np.sum((w * fit[1]) ** 2))
        if gain <= np.log(t_meas.size):
            why[n] = (f"the runs do not support it: it lowers their chi-square by {gain:.2g}, less than the "
                      f"ln {t_meas.size} = {np.log(t_meas.size):.2g} a free term must earn (BIC)")
            free, fit = rest, alt
    p, res, notes = fit
    note = dominance_note(t_pred, y, r0, sweeps, free, tm, p)
    return JointFit(p, free, why, res, r0, notes + ([note] if note else []))


def sweep_scatter(r0: np.ndarray, sweeps=None) -> np.ndarray:
    """The scatter of each run's log residual (shape (n,)): the RMS of ``r0`` over the run's sweep
    (over all runs when ``sweeps`` is None), floored at READ_SD."""
    r0 = np.asarray(r0, dtype=float)
    lab = (np.zeros(r0.size, dtype=int) if sweeps is None
           else np.unique(np.asarray(sweeps), return_inverse=True)[1])
    rms = np.array([np.sqrt(np.mean(r0[lab == k] ** 2)) for k in range(lab.max() + 1)])
    return np.maximum(rms, READ_SD)[lab]


DOMINANT_SHARE = 0.5  # a sweep holding more than this share of the squared residual with fewer runs


def dominance_note(t_pred, y: np.ndarray, r0: np.ndarray, sweeps, free: list[str], tm: Terms,
                   params: dict[str, float]) -> str | None:
    """The note naming the sweep that dominates the residual (module docstring), or None: more than
    DOMINANT_SHARE of sum(r0^2) at identity from fewer than DOMINANT_SHARE of the runs, with at least
    one other sweep. Says its share, its scatter against the others', and each free coefficient as
    fitted, refitted without that sweep, and refitted with one scatter for every run (the drag the
    sweep would have if weighed as the others)."""
    if sweeps is None or not free:
        return None
    lab = np.asarray(sweeps)
    names = list(dict.fromkeys(lab.tolist()))
    if len(names) < 2:
        return None
    total = float(np.sum(r0 ** 2))
    share = {s: float(np.sum(r0[lab == s] ** 2)) / total for s in names}
    top = max(names, key=share.get)
    frac = float(np.mean(lab == top))
    if share[top] <= DOMINANT_SHARE or frac >= DOMINANT_SHARE:
        return None
    keep = lab != top
    sub = [i for i in range(lab.size) if keep[i]]

    def t_rest(p):
        return t_pred(p)[sub]
    alt = _solve(t_rest, y[keep], free, tm, 1.0 / sweep_scatter(r0[keep], lab[keep]))[0]
    one = _solve(t_pred, y, free, tm, 1.0 / sweep_scatter(r0))[0]  # one scatter for every run
    rms = {s: float(np.sqrt(np.mean(r0[lab == s] ** 2))) for s in names}
    best = min(rms.values())
    moved = ", ".join(f"{n} {params[n]:.4g} (without it {alt[n]:.4g}; weighed as the others {one[n]:.4g})"
                      for n in free)
    return (f"sweep {top} dominates the residual: {100 * share[top]:.0f}% of the squared log step-time residual "
            f"at identity from {100 * frac:.0f}% of the runs (RMS {100 * rms[top]:.0f}% against {100 * best:.0f}% "
            f"on the best-explained sweep); its runs are weighed by their own scatter, each "
            f"{(max(best, READ_SD) / max(rms[top], READ_SD)) ** 2:.2g} of a best-explained run; {moved}")


def _solve(t_pred, y: np.ndarray, free: list[str], tm: Terms, w):
    """Posterior mode over ``free`` (the rest at identity): (parameters, log residuals, bound notes)."""
    ident = tm.identity
    lo = _to_x({n: tm.bounds[n][0] for n in free}, free)
    hi = _to_x({n: tm.bounds[n][1] for n in free}, free)
    x0 = _to_x(ident, free)
    sd = np.array([tm.prior_sd[n] for n in free])

    def resid(x):
        return np.log(t_pred(_from_x(x, free, ident))) - y

    def fun(x):
        return np.concatenate([w * resid(x), (x - x0) / sd])

    # trf's first trust radius is |start| (1 where it is 0): started at the identity, 1e-9 inside the
    # zero bound of c_a2a / c_pp and 0 for the log host scales, a first step of ~1e-9 met ftol and the
    # fit stopped there. A thousandth of each range inside its bounds gives it a radius to move.
    margin = 1e-3 * (hi - lo)
    sol = least_squares(fun, np.clip(x0, lo + margin, hi - margin), bounds=(lo, hi))
    p = _from_x(sol.x, free, ident)
    notes = [bound_note(n, p[n], v - a < b - v, tm.bounds) for n, v, a, b in zip(free, sol.x, lo, hi)
             if min(v - a, b - v) < 1e-6 * (b - a)]
    return p, resid(sol.x), notes


def estimator_t_pred(profile: str, db_url: str | None, groups, extrapolate: str = "compose"):
    """A ``t_pred`` for :func:`fit_joint`: ``groups`` = [(Spec, n_devices, [Layout])], the runs in that
    order; the estimator at each parameter vector (its stored calibrations ignored: this is the fit).
    The host scales change the estimator; eq:desync's coefficients only multiply its t_analytic
    (:meth:`~scaleplan.estimator.model.Evaluation.t_iter_with`), so the runs are evaluated once per
    pair of host scales and a step of the c's costs no evaluation."""
    from scaleplan.estimator import Estimator
    from scaleplan.estimator.model import ChiCoefficients

    cache: dict[tuple[float, float], list] = {}

    def t_pred(p: dict[str, float]) -> np.ndarray:
        hs = (round(float(p["host_scale"]), 12), round(float(p.get("ep_host_scale", 1.0)), 12))
        evs = cache.get(hs)
        if evs is None:
            est = Estimator(profile, db_url, extrapolate, use_calibration=False, host_scale=hs[0],
                            ep_host_scale=hs[1])
            evs = cache[hs] = [est.evaluate(spec, n, lays) for spec, n, lays in groups]
        c = ChiCoefficients(p["c_a2a"], p["c_pp"], 0.0, None, p["c_level"])
        return np.concatenate([ev.t_iter_with(c) for ev in evs])

    return t_pred
