"""The chi_sys fit: the estimator's one fitted runtime correction (paper eq:cal-iter, eq:desync).

    t_iter_cal = chi_sys * t_analytic                                        (eq:cal-iter)
    chi_sys    = 1 + c_a2a * (t_A2A / t_iter) * [N_node^EP > 1]
                   + c_pp  * (N_node^PP - 1)
                   + c_ovl * [P_PP >= N_gpu/node, N_node^PP = 1]               (eq:desync)

Each observation i contributes the log step-time residual r_i = log(chi_i t_an_i) - log(t_meas_i);
when only MFU is measured, t_meas / t_an = MFU_an / MFU_meas (same FLOPs), so
r_i = log chi_i - log(MFU_an_i / MFU_meas_i). In the scale-free ("normalized") mode, for sweeps
known only as ratios, each sweep's mean residual is removed (its absolute level is unknown).

The fit is scipy.optimize.least_squares with a soft-L1 loss (robust to run-to-run outliers) and
bounds that keep the physics: c_a2a >= 0, c_pp >= 0 (cross-node effects only slow a step down) and
-0.9 <= c_ovl <= 0 (an in-node deep pipeline can only be credited, and chi stays positive).
A term the data cannot identify (its feature is zero on every run, or constant within every sweep
in normalized mode, or collinear with another) is fixed and reported: at 0, or at a prior the user
names (``prior``: used only where the data cannot identify the term; e.g. :data:`REFERENCE_PRIOR`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from scaleplan.errors import ScaleplanError

TERMS = ("c_a2a", "c_pp", "c_ovl")
BOUNDS = {"c_a2a": (0.0, 20.0), "c_pp": (0.0, 5.0), "c_ovl": (-0.9, 0.0)}
SOFT_L1_SCALE = 0.1  # residuals beyond ~10% (run-to-run noise) are down-weighted
MODES = ("absolute", "normalized")
# The desync coefficients published with the paper's reference estimator (dmlc/ScalePlan,
# dlcalc/utils/desync.py), fitted there on B200 sweeps that include inter-node EP and PP: an opt-in
# prior for terms our data cannot identify (never used for a term the data do identify). Its c_pp
# multiplies ceil(pp / gpus_per_node) - 1, not our placement-based hop count
# (estimator.model.desync_features), so as a prior for c_pp it over-charges pipelines.
REFERENCE_PRIOR = {"c_a2a": 1.2, "c_pp": 0.5, "c_ovl": -0.18}
_WHY_ZERO = {
    "c_a2a": "no observation has its EP group spanning more than one node (ceil(ep*etp/gpus_per_node) > 1)",
    "c_pp": "no observation has a pipeline stage boundary between nodes (stages are tp*cp*dp ranks apart)",
    "c_ovl": "no observation has a deep pipeline inside one node (pp >= gpus_per_node, tp*cp*dp = 1)",
}


@dataclass
class ChiData:
    """Fit inputs, arrays of length n (one per observation).

    t_analytic_s: analytic (chi = 1) step time, seconds; t_a2a_s: modelled expert all-to-all wire
    time per step, seconds; ep_nodes / pp_nodes: nodes spanned by the EP / PP group;
    deep_pp_in_node: bool; y: log(t_meas / t_analytic) = log(MFU_an / MFU_meas); sweep: names.
    """

    t_analytic_s: np.ndarray
    t_a2a_s: np.ndarray
    ep_nodes: np.ndarray
    pp_nodes: np.ndarray
    deep_pp_in_node: np.ndarray
    y: np.ndarray
    sweep: np.ndarray
    scale_free: np.ndarray | None = None  # per run: only ratios within its sweep are known

    def __post_init__(self):
        for k in ("t_analytic_s", "t_a2a_s", "y"):
            setattr(self, k, np.asarray(getattr(self, k), dtype=float))
        self.ep_nodes = np.asarray(self.ep_nodes, dtype=int)
        self.pp_nodes = np.asarray(self.pp_nodes, dtype=int)
        self.deep_pp_in_node = np.asarray(self.deep_pp_in_node, dtype=bool)
        self.sweep = np.asarray(self.sweep, dtype=object)
        self.scale_free = (np.zeros(self.y.size, dtype=bool) if self.scale_free is None
                           else np.asarray(self.scale_free, dtype=bool))

    def __len__(self) -> int:
        return int(self.y.size)

    def subset(self, mask: np.ndarray) -> ChiData:
        return ChiData(**{k: getattr(self, k)[mask] for k in self.__dataclass_fields__})


def features(d: ChiData) -> np.ndarray:
    """The (n, 3) design matrix of eq:desync: [a2a fraction if EP spans nodes, PP nodes - 1, deep PP in node]."""
    a2a = np.where(d.ep_nodes > 1, d.t_a2a_s / d.t_analytic_s, 0.0)
    return np.column_stack([a2a, d.pp_nodes - 1.0, d.deep_pp_in_node.astype(float)])


def chi_from(coeffs: dict[str, float], d: ChiData) -> np.ndarray:
    """chi_sys per observation for coefficients {c_a2a, c_pp, c_ovl, c_level} (missing keys count as 0):
    the estimator's own eq:desync (estimator.desync.chi_sys), read on the observations' features."""
    from scaleplan.estimator.desync import ChiCoefficients, chi_sys

    c = ChiCoefficients(*(float(coeffs.get(t, 0.0)) for t in ("c_a2a", "c_pp", "c_ovl")),
                        c_level=float(coeffs.get("c_level", 0.0)))
    return chi_sys(c, d.t_a2a_s, d.t_analytic_s, d.ep_nodes, d.pp_nodes - 1.0, d.deep_pp_in_node.astype(float))


def _demean(x: np.ndarray, sweep: np.ndarray, scale_free: np.ndarray) -> np.ndarray:
    """Remove each scale-free sweep's own mean (its unknown absolute level); other rows unchanged."""
    out = np.array(x, dtype=float, copy=True)
    for s in np.unique(sweep[scale_free]):
        m = (sweep == s) & scale_free
        out[m] -= out[m].mean(axis=0)
    return out


def _with_mode(d: ChiData, mode: str) -> ChiData:
    """mode 'normalized' treats every sweep as scale-free; 'absolute' keeps the per-run flags."""
    if mode not in MODES:
        raise ScaleplanError(f"--mode: got {mode!r}; one of {', '.join(MODES)}")
    if mode == "normalized" and not d.scale_free.all():
        d = d.subset(np.ones(len(d), dtype=bool))
        d.scale_free = np.ones(len(d), dtype=bool)
    return d


def identifiability(d: ChiData, mode: str, fixed: dict[str, float] | None = None) -> tuple[list[str], dict[str, str]]:
    """Which terms the data can identify, and why the others cannot: (free terms, {term: reason})."""
    fixed = fixed or {}
    d = _with_mode(d, mode)
    f = features(d)
    g = _demean(f, d.sweep, d.scale_free)
    free: list[str] = []
    why: dict[str, str] = {}
    for j, t in enumerate(TERMS):
        if t in fixed:
            why[t] = f"pinned at {fixed[t]:g} by the user"
            continue
        if not np.any(np.abs(f[:, j]) > 1e-12):
            why[t] = f"not identifiable: {_WHY_ZERO[t]}"
            continue
        if not np.any(np.abs(g[:, j]) > 1e-12):
            why[t] = ("not identifiable: the term takes one value within every scale-free sweep, "
                      "so each sweep's unknown scale absorbs it")
            continue
        cols = [TERMS.index(x) for x in free] + [j]
        if np.linalg.matrix_rank(g[:, cols], tol=1e-9) < len(cols):
            why[t] = f"not identifiable: collinear with {', '.join(free)} on these observations"
            continue
        free.append(t)
    return free, why


def _residuals(d: ChiData, coeffs: dict[str, float]) -> np.ndarray:
    return _demean(np.log(chi_from(coeffs, d)) - d.y, d.sweep, d.scale_free)


def _snap(v: float, bounds: tuple[float, float]) -> float:
    """Solver round-off next to a bound onto it, so a term pushed to its bound reads exactly 0 (or -0.9)."""
    tol = 1e-6 * (bounds[1] - bounds[0])
    for b in bounds:
        if abs(v - b) <= tol:
            return float(b)
    return float(v)


@dataclass
class ChiFit:
    """A fitted chi_sys: coefficients, which were free, why others were fixed, per-point residuals."""

    coefficients: dict[str, float]
    free: list[str]
    unidentified: dict[str, str]
    mode: str
    n_obs: int
    residuals: np.ndarray  # log(t_pred / t_meas) per observation (per-sweep mean removed if normalized)
    cost: float
    notes: list[str] = field(default_factory=list)


def fit_chi(d: ChiData, mode: str = "absolute", fixed: dict[str, float] | None = None,
            allow_identity: bool = False, prior: dict[str, float] | None = None) -> ChiFit:
    """Fit (c_a2a, c_pp, c_ovl) on ``d`` (eq:desync) by soft-L1 least squares on log step-time residuals.

    Args:
        d: observations (see :class:`ChiData`).
        mode: 'absolute': each run as flagged in ``d.scale_free`` (runs of ratio-only sweeps are
            scale-free, the rest compared on their level); 'normalized': every sweep scale-free.
        fixed: terms pinned by the user, e.g. {"c_pp": 0.5}; unidentifiable terms are fixed at 0.
        allow_identity: return chi = 1 (all fixed) instead of refusing when no term is identifiable.
        prior: values for terms the data cannot identify (default 0); identified terms ignore it.

    Raises:
        ScaleplanError: unknown mode, fewer observations than parameters, or nothing identifiable.
    """
    d = _with_mode(d, mode)
    fixed = dict(fixed or {})
    n = len(d)
    n_scales = len(np.unique(d.sweep[d.scale_free]))
    free, why = identifiability(d, mode, fixed)
    n_par = max(len(TERMS), len(free) + n_scales)
    if n < n_par and not allow_identity:
        raise ScaleplanError(f"chi_sys fit refused: {n} observation(s) for {n_par} parameters "
                             f"({len(TERMS)} chi_sys terms" + (f" + {n_scales} per-sweep scales" if n_scales else "")
                             + "); add observed runs")
    if not free and not allow_identity:
        raise ScaleplanError("chi_sys fit refused: no term is identifiable on these observations: "
                             + "; ".join(f"{t} {r}" for t, r in why.items()))
    prior = prior or {}
    coeffs = {t: float(fixed.get(t, prior.get(t, 0.0))) for t in TERMS}
    if free and n >= len(free) + n_scales:
        lo = [BOUNDS[t][0] for t in free]
        hi = [BOUNDS[t][1] for t in free]
        x0 = np.array([l + 0.01 if l >= 0 else h - 0.01 for l, h in zip(lo, hi)])  # interior start

        def fun(x):
            return _residuals(d, {**coeffs, **dict(zip(free, x))})

        sol = least_squares(fun, x0, bounds=(lo, hi), loss="soft_l1", f_scale=SOFT_L1_SCALE)
        coeffs.update({t: _snap(v, BOUNDS[t]) for t, v in zip(free, sol.x)})
    else:
        free = []
    res = _residuals(d, coeffs)
    notes = [f"{t} fixed at {coeffs[t]:g}" + (" (prior)" if t in prior and t not in fixed else "") + f": {r}"
             for t, r in why.items()]
    at_bound = [t for t in free if np.isclose(coeffs[t], BOUNDS[t][0]) or np.isclose(coeffs[t], BOUNDS[t][1])]
    notes += [f"{t} sits at its physical bound {coeffs[t]:g}" for t in at_bound]
    return ChiFit(coefficients=coeffs, free=free, unidentified=why, mode=mode, n_obs=n, residuals=res,
                  cost=float(0.5 * np.sum(res ** 2)), notes=notes)
