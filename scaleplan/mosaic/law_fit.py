"""Fitting the joint law (eq:joint-law) to training runs, the way sec:joint-NtSDG-law and
sec:sl_joint_uncertainty describe, with the pitfalls of the Chinchilla replication (Besiroglu et al., 2024)
handled explicitly:

* objective: Huber (delta 0.1) on r = log L_pred - log L_obs, summed over runs;
* parameters: theta = (log a', log b', log c, log j', log e, alpha, beta, lambda, delta, gamma, eta), prefactors
  as exp(.) so they stay positive; N_tot and D are centred on their geometric means inside the fit
  (a = a' N0^alpha, b = b' D0^beta, j = j' N0^gamma) so prefactor and exponent are not collinear;
* optimiser: L-BFGS-B with an analytic gradient and explicit tolerances (ftol 1e-13, gtol 1e-9; the objective
  is scaled to O(1) so ``ftol``'s max(|f|, 1) floor does not stop it early), re-run from its end point until
  the projected gradient is small, a converged flag per fit;
* multi-start from a grid (2^6 exponent corners, prefactors by non-negative least squares at each corner);
* hold-out: the top 10% of runs by N_act within each G stratum, reported as held-out RMSE in loss units;
* uncertainty: warm-started wild bootstrap (Rademacher signs on the log residuals), 95% BCa intervals with
  the acceleration from a warm-started grouped jackknife (at most 50 leave-a-group-out refits);
* identifiability: fresh random restarts; among the solutions whose objective lies within the 95% profile
  threshold of the best, a coefficient is "identified" when their values agree within 5% AND the local
  near-flat region (Hessian ellipsoid at that threshold) stretches it by at most 10%; otherwise "ridge".
  The near-optimal solutions themselves are stored with the fit as its ridge samples (settings
  "ridge_samples"), with the runs' data support (settings "support"); ``scaleplan search --samples``
  draws the law from them (app:scaling-law-coeffs, sec:sl_joint_uncertainty: perturb jointly along the ridge).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import minimize, nnls
from scipy.stats import norm

from scaleplan.errors import SpecError
from scaleplan.mosaic.law import NAMES, JointLaw, LawSupport

HUBER_DELTA = 0.1
OBJ_SCALE = 1e4           # objective = OBJ_SCALE * mean Huber: O(0.1) at 0.3% scatter
LBFGS = {"ftol": 1e-13, "gtol": 1e-9, "maxiter": 20000, "maxfun": 40000, "maxcor": 20}
JACK_GROUPS = 50
PG_TOL = 1e-6             # convergence check on the projected gradient of the scaled objective
IDENT_REL_TOL = 0.05     # restarts in the near-optimal set must agree this well
IDENT_EXTENT_TOL = 0.10  # and the local near-flat region must not stretch further (relative)
REQUIRED = ("n_tot", "n_act", "s", "g", "d", "loss")
OPTIONAL = ("e", "k", "layers")
_BOUNDS = [(-30.0, 30.0)] * 5 + [(1e-3, 3.0)] * 5 + [(-3.0, 3.0)]


@dataclass
class Runs:
    """Training runs as arrays (raw counts; loss in nats)."""

    df: pd.DataFrame

    @property
    def n(self) -> int:
        return len(self.df)


def read_runs_csv(path: Path) -> Runs:
    """Read and validate a runs CSV. Raises SpecError (one line naming the column/row) on any bad input."""
    path = Path(path)
    if not path.is_file():
        raise SpecError("RUNS.csv", str(path), "an existing CSV file")
    try:
        df = pd.read_csv(path)
    except Exception as e:  # noqa: BLE001 - pandas raises many kinds
        raise SpecError("RUNS.csv", str(path), f"a readable CSV ({str(e).splitlines()[0]})") from None
    df.columns = [str(c).strip().lower() for c in df.columns]
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise SpecError(f"{path.name}: column {missing[0]}", "missing", f"columns {list(REQUIRED)} (+ optional {list(OPTIONAL)})")
    for c in REQUIRED + tuple(c for c in OPTIONAL if c in df.columns):
        num = pd.to_numeric(df[c], errors="coerce")
        bad = np.flatnonzero(~np.isfinite(num.to_numpy(dtype=float)))
        if bad.size:
            i = int(bad[0])
            raise SpecError(f"{path.name}: row {i + 2}, column {c}", df[c].iloc[i], "a finite number")
        df[c] = num.astype(float)
    rules = [("n_tot", df.n_tot > 0, "> 0"), ("n_act", (df.n_act > 0) & (df.n_act <= df.n_tot), "in (0, n_tot]"),
             ("s", (df.s >= 0) & (df.s < 1), "in [0, 1)"), ("g", df.g > 0, "> 0"), ("d", df.d > 0, "> 0"),
             ("loss", df.loss > 0, "> 0"),
             ("s", (df.s - (1 - df.n_act / df.n_tot)).abs() <= 0.01, "= 1 - n_act/n_tot (within 0.01)")]
    for col, ok, allowed in rules:
        bad = np.flatnonzero(~ok.to_numpy())
        if bad.size:
            i = int(bad[0])
            raise SpecError(f"{path.name}: row {i + 2}, column {col}", df[col].iloc[i], allowed)
    if len(df) <= len(NAMES):
        raise SpecError(f"{path.name}", f"{len(df)} runs", f"more than {len(NAMES)} runs (11 coefficients)")
    for c in OPTIONAL:
        df[c] = df[c].astype(int) if c in df.columns else 0
    return Runs(df.reset_index(drop=True))


def heldout_mask(df: pd.DataFrame, frac: float = 0.1) -> np.ndarray:
    """True for the top ``frac`` of runs by N_act within each G stratum (at least one where a stratum has 2+)."""
    mask = np.zeros(len(df), dtype=bool)
    for idx in df.groupby("g").groups.values():
        idx = np.asarray(list(idx))
        k = round(frac * len(idx))
        k = max(k, 1) if len(idx) >= 2 else 0
        if k:
            order = idx[np.argsort(-df.n_act.to_numpy()[idx], kind="stable")]
            mask[order[:k]] = True
    return mask


class _Problem:
    """Objective and gradient in the centred log-coefficient space for one data set."""

    def __init__(self, n_tot, s, d, g, loss):
        self.n0 = float(np.exp(np.mean(np.log(n_tot))))
        self.d0 = float(np.exp(np.mean(np.log(d))))
        self.x1 = np.log(n_tot / self.n0)
        self.x2 = np.log(d / self.d0)
        self.x3 = np.log1p(-s)
        self.x4 = np.log(g)
        self.y = np.log(loss)

    def parts(self, th):
        la, lb, lc, lj, le, al, be, lam, de, ga, et = th
        t1 = np.exp(la - al * self.x1)
        t2 = np.exp(lb - be * self.x2)
        t3 = np.exp(lc - lam * self.x3)
        t4 = np.exp(lj - de * self.x3 - ga * self.x1 - et * self.x4)
        t5 = np.full_like(t1, np.exp(le))
        return t1, t2, t3, t4, t5

    def predict_log(self, th):
        return np.log(sum(self.parts(th)))

    def fg(self, th, y=None):
        y = self.y if y is None else y
        t1, t2, t3, t4, t5 = self.parts(th)
        pred = t1 + t2 + t3 + t4 + t5
        r = np.log(pred) - y
        a = np.abs(r)
        h = np.where(a <= HUBER_DELTA, 0.5 * r * r, HUBER_DELTA * (a - 0.5 * HUBER_DELTA))
        w = np.clip(r, -HUBER_DELTA, HUBER_DELTA) / pred * (OBJ_SCALE / len(r))
        g = np.array([w @ t1, w @ t2, w @ t3, w @ t4, w @ t5, -(w * self.x1) @ t1, -(w * self.x2) @ t2,
                      -(w * self.x3) @ t3, -(w * self.x3) @ t4, -(w * self.x1) @ t4, -(w * self.x4) @ t4])
        return OBJ_SCALE * h.mean(), g

    def start(self, exps) -> np.ndarray:
        """A start at exponents ``exps`` with the five prefactors from non-negative least squares on L."""
        al, be, lam, de, ga, et = exps
        cols = np.column_stack([np.exp(-al * self.x1), np.exp(-be * self.x2), np.exp(-lam * self.x3),
                                np.exp(-de * self.x3 - ga * self.x1 - et * self.x4), np.ones_like(self.x1)])
        coef, _ = nnls(cols, np.exp(self.y))
        coef = np.maximum(coef, 1e-4 * max(coef.max(), 1e-3))
        return np.concatenate([np.log(coef), exps])

    def to_law(self, th) -> JointLaw:
        la, lb, lc, lj, le, al, be, lam, de, ga, et = th
        return JointLaw(a=math.exp(la) * self.n0 ** al, b=math.exp(lb) * self.d0 ** be, c=math.exp(lc),
                        j=math.exp(lj) * self.n0 ** ga, e=math.exp(le), alpha=al, beta=be, lam=lam, delta=de,
                        gamma=ga, eta=et)


def _projected_grad(th, g) -> float:
    lo = np.array([b[0] for b in _BOUNDS])
    hi = np.array([b[1] for b in _BOUNDS])
    pg = np.where((th <= lo + 1e-12) & (g > 0), 0.0, g)
    pg = np.where((th >= hi - 1e-12) & (pg < 0), 0.0, pg)
    return float(np.abs(pg).max())


def _minimise(prob: _Problem, th0, y=None, rounds: int = 4) -> tuple[np.ndarray, float, bool]:
    """L-BFGS-B from th0, re-run from its end point until the projected gradient is below PG_TOL."""
    th = np.clip(np.asarray(th0, dtype=float), [b[0] for b in _BOUNDS], [b[1] for b in _BOUNDS])
    f = math.inf
    for _ in range(rounds):
        res = minimize(prob.fg, th, args=(y,), jac=True, method="L-BFGS-B", bounds=_BOUNDS, options=LBFGS)
        th, f = res.x, float(res.fun)
        if _projected_grad(th, res.jac) < PG_TOL:
            return th, f, True
    return th, f, False


def _grid_exponents(n: int, rng) -> list[np.ndarray]:
    """2^6 corners of an exponent box (alpha, beta, lambda, delta, gamma, eta), then random draws up to n."""
    lows, highs = (0.1, 0.1, 0.1, 0.2, 0.1, 0.25), (0.4, 0.4, 0.6, 0.8, 0.4, 1.2)
    pts = [np.array(c) for c in itertools.product(*zip(lows, highs))]
    while len(pts) < n:
        pts.append(rng.uniform(0.5 * np.array(lows), 1.5 * np.array(highs)))
    return pts[:n] if n >= 64 else pts


@dataclass
class FitResult:
    law: JointLaw
    ci95: dict[str, tuple[float, float] | None]
    heldout_rmse: float | None
    identified: list[str]
    n_runs: int
    n_train: int
    converged: bool
    objective: float
    n_near_optimal: int
    n_bootstrap: int
    boot: np.ndarray | None = field(default=None, repr=False)
    #: ridge samples: the multi-start and fresh-restart solutions whose objective lies within the
    #: profile threshold of the best (rows in NAMES order), the law's uncertainty for the search
    ridge: np.ndarray | None = field(default=None, repr=False)
    ridge_threshold: float | None = None
    support: LawSupport | None = None

    def to_json(self) -> dict:
        return {"coefficients": self.law.to_dict(),
                "ci95": {k: (list(v) if v is not None else None) for k, v in self.ci95.items()},
                "heldout_rmse": self.heldout_rmse, "identified": list(self.identified), "n_runs": self.n_runs,
                "n_ridge_samples": 0 if self.ridge is None else len(self.ridge),
                "support": None if self.support is None else self.support.to_dict()}


def _bca(theta_hat: float, boot: np.ndarray, jack: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """BCa interval from bootstrap replicates and jackknife values (Efron 1987)."""
    boot = boot[np.isfinite(boot)]
    if boot.size < 2:
        return (float("nan"), float("nan"))
    p = (np.sum(boot < theta_hat) + 0.5 * np.sum(boot == theta_hat)) / boot.size
    z0 = norm.ppf(np.clip(p, 1.0 / (2 * boot.size), 1 - 1.0 / (2 * boot.size)))
    dj = jack.mean() - jack
    den = 6.0 * (np.sum(dj**2) ** 1.5)
    acc = float(np.sum(dj**3) / den) if den > 0 else 0.0
    z = norm.ppf([(1 - level) / 2, (1 + level) / 2])
    adj = norm.cdf(z0 + (z0 + z) / (1 - acc * (z0 + z)))
    lo, hi = np.quantile(boot, adj)
    return float(lo), float(hi)


def fit_joint_law(runs: Runs, n_bootstrap: int = 500, n_starts: int = 64, n_restarts: int = 32, seed: int = 0,
                  holdout_frac: float = 0.1, progress: bool = False) -> FitResult:
    """Fit eq:joint-law to ``runs`` (see the module docstring for the procedure). Returns a FitResult."""
    from threadpoolctl import threadpool_limits

    # L-BFGS-B's 11x11 linear algebra is far slower with a multi-threaded BLAS (thread wake-ups per call)
    with threadpool_limits(limits=1, user_api="blas"):
        return _fit(runs, n_bootstrap, n_starts, n_restarts, seed, holdout_frac)


def _fit(runs: Runs, n_bootstrap: int, n_starts: int, n_restarts: int, seed: int, holdout_frac: float) -> FitResult:
    df = runs.df
    rng = np.random.default_rng(seed)
    hold = heldout_mask(df, holdout_frac)
    tr = df[~hold]
    prob = _Problem(tr.n_tot.to_numpy(), tr.s.to_numpy(), tr.d.to_numpy(), tr.g.to_numpy(), tr.loss.to_numpy())
    # multi-start from the grid; best kept
    sols = [_minimise(prob, prob.start(ex)) for ex in _grid_exponents(n_starts, rng)]
    th, f_best, conv = min(sols, key=lambda t: t[1])
    law = prob.to_law(th)
    rmse = None
    if hold.any():
        ho = df[hold]
        rmse = float(np.sqrt(np.mean((law(ho.n_tot.to_numpy(), ho.s.to_numpy(), ho.d.to_numpy(), ho.g.to_numpy())
                                      - ho.loss.to_numpy()) ** 2)))
    # identifiability: fresh random restarts plus the grid solutions, near-optimal set by the profile threshold
    for _ in range(n_restarts):
        ex = rng.uniform([0.02, 0.02, 0.02, 0.05, 0.02, -0.5], [0.8, 0.8, 1.5, 1.5, 0.8, 2.0])
        sols.append(_minimise(prob, prob.start(ex)))
    n_tr = len(tr)
    sigma2 = 2.0 * f_best / OBJ_SCALE * n_tr / max(n_tr - len(NAMES), 1)  # residual variance of log L
    thresh = 0.5 * 3.841 * sigma2 * OBJ_SCALE / n_tr
    near = [prob.to_law(s[0]).vector() for s in sols if s[1] - f_best <= thresh]
    support = LawSupport.of_runs(df.s.to_numpy(), df.d.to_numpy() / df.n_act.to_numpy())
    v_hat = law.vector()
    spread = np.max(np.abs(np.array(near) - v_hat), axis=0) / np.maximum(np.abs(v_hat), 1e-12)
    extent = _local_extent(prob, th, thresh, v_hat)
    identified = [k for k, sp, ex in zip(NAMES, spread, extent) if sp <= IDENT_REL_TOL and ex <= IDENT_EXTENT_TOL]
    # warm-started wild bootstrap (Rademacher) and jackknife for BCa
    ci: dict[str, tuple[float, float] | None] = {k: None for k in NAMES}
    boot = None
    if n_bootstrap > 0:
        yhat = prob.predict_log(th)
        res = prob.y - yhat
        boot = np.array([prob.to_law(_minimise(prob, th, yhat + rng.choice([-1.0, 1.0], size=n_tr) * res,
                                               rounds=2)[0]).vector() for _ in range(n_bootstrap)])
        jack = []
        groups = np.arange(n_tr) % min(n_tr, JACK_GROUPS)  # grouped jackknife: same acceleration estimate
        for gi in range(groups.max() + 1):
            keep = groups != gi
            sub = _Problem(tr.n_tot.to_numpy()[keep], tr.s.to_numpy()[keep], tr.d.to_numpy()[keep],
                           tr.g.to_numpy()[keep], tr.loss.to_numpy()[keep])
            # same coefficients expressed in the sub-problem's centring, then refit
            th_sub = _recentre(th, prob, sub)
            jack.append(sub.to_law(_minimise(sub, th_sub, rounds=2)[0]).vector())
        jack = np.array(jack)
        ci = {k: _bca(v_hat[i], boot[:, i], jack[:, i]) for i, k in enumerate(NAMES)}
    return FitResult(law=law, ci95=ci, heldout_rmse=rmse, identified=identified, n_runs=len(df), n_train=n_tr,
                     converged=conv, objective=f_best, n_near_optimal=len(near), n_bootstrap=n_bootstrap, boot=boot,
                     ridge=np.array(near), ridge_threshold=float(thresh), support=support)


def _local_extent(prob: _Problem, th, thresh: float, v_hat) -> np.ndarray:
    """Relative half-width of each coefficient over the local near-flat region {f - f_best <= thresh}.

    The region is the quadratic ellipsoid of the Hessian at the optimum (finite differences of the analytic
    gradient); widths are mapped to the natural coefficients (log prefactors uncentred), relative to the value
    for exponents. A coefficient that other coefficients can absorb has a long extent (a ridge).
    """
    eps = 1e-6
    H = np.array([(prob.fg(th + eps * u)[1] - prob.fg(th - eps * u)[1]) / (2 * eps) for u in np.eye(len(th))])
    H = 0.5 * (H + H.T)
    try:
        cov = np.linalg.pinv(H, hermitian=True)
    except np.linalg.LinAlgError:
        return np.full(len(th), np.inf)
    J = np.eye(len(th))
    J[0, 5], J[1, 6], J[3, 9] = math.log(prob.n0), math.log(prob.d0), math.log(prob.n0)
    ext = np.sqrt(np.maximum(2.0 * thresh * np.diag(J @ cov @ J.T), 0.0))
    return np.where(np.arange(len(th)) < 5, ext, ext / np.maximum(np.abs(v_hat), 1e-12))


def _recentre(th, src: _Problem, dst: _Problem) -> np.ndarray:
    """theta of ``src``'s centring re-expressed in ``dst``'s (same law)."""
    out = np.array(th, dtype=float)
    al, be, ga = th[5], th[6], th[9]
    out[0] += al * math.log(dst.n0 / src.n0)
    out[1] += be * math.log(dst.d0 / src.d0)
    out[3] += ga * math.log(dst.n0 / src.n0)
    return out


def _uncertainty_settings(result: FitResult) -> dict:
    """What the search's --samples reads back (scaleplan.mosaic.law.load_law_full): support and ridge samples."""
    out = {}
    if result.support is not None:
        out["support"] = result.support.to_dict()
    if result.ridge is not None and len(result.ridge):
        out["ridge_samples"] = [{k: float(v) for k, v in zip(NAMES, row)} for row in result.ridge]
        out["ridge_threshold"] = result.ridge_threshold
    return out


def store_fit(url: str | None, runs: Runs, result: FitResult, name: str, dataset: str) -> int:
    """Store the runs (LawRun, idempotent) and the fit (LawFit); return the fit id."""
    from scaleplan.db.importers import insert_points
    from scaleplan.db.models import LawFit, LawRun
    from scaleplan.db.session import ensure_schema, session_scope

    ensure_schema(url)
    rows = [{"dataset": dataset, "n_tot": r.n_tot, "n_act": r.n_act, "s": r.s, "g": r.g, "d": r.d, "loss": r.loss,
             "e": int(r.e), "k": int(r.k), "layers": int(r.layers)} for r in runs.df.itertuples()]
    with session_scope(url) as s:
        insert_points(s, LawRun, rows)
        j = result.to_json()
        row = LawFit(name=name, dataset=dataset, coefficients=j["coefficients"], ci95=j["ci95"],
                     heldout_rmse=j["heldout_rmse"], identified=j["identified"], n_runs=j["n_runs"],
                     settings={"huber_delta": HUBER_DELTA, "optimizer": "L-BFGS-B", **LBFGS, "pg_tol": PG_TOL,
                               "n_bootstrap": result.n_bootstrap, "n_train": result.n_train,
                               "converged": result.converged, "n_near_optimal": result.n_near_optimal,
                               "holdout": "top 10% by n_act per g", **_uncertainty_settings(result)})
        s.add(row)
        s.flush()
        return int(row.id)
