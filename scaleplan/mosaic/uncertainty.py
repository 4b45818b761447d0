"""How sure the search's answer is: the scaling law's ridge and the estimator's MFU error, through eq:hw-minlp.

Each draw k has
* a law coefficient vector theta_k: for a stored fit, one of its ridge samples (``law fit``'s near-optimal
  restarts, drawn with replacement); for the paper's law, :func:`scaleplan.mosaic.ridge.ridge_samples`;
* an MFU factor f_k,family = exp(sigma z), z ~ N(0, 1), one per layout family (the best plan's
  (tp, cp, pp, ep) degrees): candidates whose plans share the degrees share the error of the collective
  and pipeline terms that dominate it, other families err independently. The factor has median 1.
The best plan per candidate is searched once; per draw only D* (x f), the TPP limits and the loss change,
so all draws are evaluated at once as [draws, candidates] arrays.

Each candidate's sigma widens with the evidence of its own plan: sqrt(sigma^2 + sigma_evidence^2), where
sigma_evidence is the share-weighted measured error of the components its plan composed, extrapolated to
more ranks or costed analytically (:mod:`scaleplan.mosaic.evidence`): a search on no measured tables draws
wider than one on the recorded tables.

Per candidate: p_optimal (share of draws where it is the feasible argmin), loss_mean / loss_p05 / loss_p95
(the loss at the tokens it delivers in each draw, TPP cap applied, whether or not the draw leaves it above
the TPP floor), regret (mean over draws of its loss minus that draw's optimal loss), p_feasible (share of
draws in which it delivers at least the TPP floor) and mfu_p05 / mfu_p95 (its MFU's 90% band).
Source of sigma: the leave-one-out relative step-time errors e = t_pred/t_meas - 1 stored in the
``residuals`` of the newest kind='dispatch' calibration of the profile; the MFU error factor is
t_pred/t_meas = 1 + e, so sigma = RMS of log(1 + e) (bias included: a calibration that is off on average is
off for the search too). Without such a row: FALLBACK_SIGMA (see there).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from scaleplan.estimator.layout import MODEL_PARALLEL
from scaleplan.mosaic.law import NAMES
from scaleplan.mosaic.ridge import law_matrix, ridge_samples

#: sec:mfu-pred: the paper's per-sweep MFU MAPE is at most 13.2% (18B); for a log-normal error
#: E|f - 1| ~ sigma sqrt(2/pi), so sigma = 0.132 sqrt(pi/2) = 0.165.
FALLBACK_SIGMA = 0.132 * math.sqrt(math.pi / 2)
NEAR_TIE_P = 0.05
UNCERTAINTY_COLUMNS = ("p_optimal", "loss_mean", "loss_p05", "loss_p95", "regret", "p_feasible", "mfu_p05",
                       "mfu_p95")
#: a candidate delivering the TPP floor in fewer draws than this is "infeasible in most draws", never a tie
MOSTLY_FEASIBLE = 0.5
# candidates sharing the model-parallel degrees and EP run the same collectives: they share one draw of its error
FAMILY_KEYS = (*MODEL_PARALLEL, "ep")
_RESIDUAL_KEYS = ("rel_err", "loo_rel_err", "loo", "error", "value")


@dataclass(frozen=True)
class MfuError:
    """The estimator's MFU error: log-normal sigma and where it came from."""

    sigma: float
    source: str
    n: int = 0

    def to_dict(self) -> dict:
        return {"sigma": self.sigma, "source": self.source, "n": self.n}


def sigma_from_residuals(residuals) -> float | None:
    """RMS of log(1 + e) over relative errors e = pred/meas - 1 (numbers, or dicts with one of
    _RESIDUAL_KEYS). None when no usable value (e <= -1 and non-finite values are skipped)."""
    vals = []
    for r in residuals or []:
        if isinstance(r, dict):
            r = next((r[k] for k in _RESIDUAL_KEYS if k in r), None)
        try:
            e = float(r)
        except (TypeError, ValueError):
            continue
        if math.isfinite(e) and e > -1:
            vals.append(math.log1p(e))
    return float(np.sqrt(np.mean(np.square(vals)))) if vals else None


def mfu_error(db_url: str | None, profile: str, calibration_id: int | None = None,
              use_calibration: bool = True) -> MfuError:
    """sigma from the dispatch calibration in force for ``profile`` (the newest kind='dispatch' row, or the row
    ``calibration_id`` names when it is a dispatch calibration; see module docstring), else the fallback.

    ``db_url``: a URL or path; None is the default database (``$SCALEPLAN_DB``, else the user data dir), the
    same one the estimator reads, so a search prints one sigma whichever way the database was named.
    ``use_calibration`` False (``--calibration none``): the uncalibrated estimator's error, the fallback."""
    fallback = MfuError(FALLBACK_SIGMA, "fallback: paper sec:mfu-pred MAPE 13.2% as a log-normal sigma")
    if not use_calibration:
        return fallback
    from scaleplan.db.calibrations import calibrations_in_force

    row = calibrations_in_force(db_url, profile, calibration_id).get("dispatch")
    sigma = None if row is None else sigma_from_residuals(row.residuals)
    if sigma is None:
        return fallback
    cv = "" if row.cv_error is None else f", cv MAPE {row.cv_error:.1%} as `calibrate fit` and `list` print it"
    return MfuError(sigma, f"calibration {row.id} (dispatch v{row.version}): its {len(row.residuals)} held-out "
                           f"step-time errors{cv}", len(row.residuals))


@dataclass
class Draws:
    """The random inputs of the draws: law coefficients [N, 11], per-family MFU log-factors [N, F] and, for the
    law beyond its data, one standard normal per draw ``z_law`` [N] scaled by ``law_scatter`` (loss units) and each
    candidate's law_doublings (:mod:`scaleplan.mosaic.evidence`; None or scatter 0: no such term)."""

    coefs: np.ndarray
    z: np.ndarray
    sigma: float
    z_law: np.ndarray | None = None
    law_scatter: float = 0.0

    @property
    def n(self) -> int:
        return len(self.coefs)


def make_draws(n: int, law_ridge: np.ndarray | None, sigma: float, n_families: int, seed: int = 0,
               law=None, law_scatter: float = 0.0) -> Draws:
    """n draws: coefficient vectors (from ``law_ridge`` rows with replacement, else the paper law's ridge
    sampler around ``law``), standard-normal MFU log-factors for ``n_families`` families
    (:func:`family_index` over every budget, so one set of draws serves a whole sweep) and the law's
    beyond-its-data factor (``law_scatter``: its held-out RMSE, loss units)."""
    rng = np.random.default_rng(seed + 1)
    if law_ridge is not None and len(law_ridge):
        coefs = law_ridge[rng.integers(0, len(law_ridge), size=n)]
    else:
        from scaleplan.mosaic.law import PAPER_JOINT_LAW

        coefs = ridge_samples(n, seed=seed, law=law or PAPER_JOINT_LAW)
    z = rng.standard_normal((n, max(n_families, 1)))
    return Draws(coefs=np.asarray(coefs, dtype=float), z=z, sigma=float(sigma), z_law=rng.standard_normal(n),
                 law_scatter=float(law_scatter))


def _family_keys(table: pd.DataFrame) -> list:
    ok = table["plan_ok"].to_numpy(bool)
    cols = [table[k].to_numpy() for k in FAMILY_KEYS]
    return [tuple(int(c[i]) for c in cols) if ok[i] else None for i in range(len(table))]


def family_index(tables) -> dict[tuple, int]:
    """One index per layout family (FAMILY_KEYS degrees of the best plan) over all ``tables`` (sorted,
    so deterministic): a sweep's budgets share the index and hence each family's MFU draw."""
    keys = {k for t in tables for k in _family_keys(t) if k is not None}
    return {k: i for i, k in enumerate(sorted(keys))}


def families(table: pd.DataFrame, index: dict[tuple, int]) -> np.ndarray:
    """Layout-family index per row of ``table`` (-1 without a plan). Raises KeyError for a family not indexed."""
    return np.array([index[k] if k is not None else -1 for k in _family_keys(table)], dtype=int)


def _column(table: pd.DataFrame, name: str) -> np.ndarray:
    return np.nan_to_num(table[name].to_numpy(float)) if name in table else np.zeros(len(table))


def candidate_sigma(table: pd.DataFrame, sigma: float) -> np.ndarray:
    """Per row, the log-normal sigma of its MFU: the estimator's (``sigma``), one more of it per doubling its plan
    lies beyond the observed runs (column perf_doublings) and the evidence of its own plan's tables (column
    evidence_sigma), in quadrature: sqrt(sigma^2 (1 + D_perf) + sigma_evidence^2) (:mod:`scaleplan.mosaic.evidence`).
    [rows]"""
    return np.sqrt(sigma ** 2 * (1.0 + _column(table, "perf_doublings")) + _column(table, "evidence_sigma") ** 2)


def mfu_factors(sub: pd.DataFrame, draws: Draws, fam: np.ndarray) -> np.ndarray:
    """MFU factors [N, rows of ``sub``]: exp(sigma_c z_family), the family's draw scaled by each row's sigma."""
    return np.exp(candidate_sigma(sub, draws.sigma)[None, :] * draws.z[:, fam])


def evaluate(table: pd.DataFrame, draws: Draws, tpp_min: float, tpp_max: float, fam: np.ndarray):
    """Losses and feasibility of every candidate with a plan in every draw.

    table: a scored search table (n_tot, n_act, s, g, d_star, plan_ok); fam: :func:`families` of it.
    Returns (idx [C] rows of ``table`` with a plan, loss [N, C] at the delivered tokens, feasible [N, C]).
    """
    idx = np.flatnonzero(table["plan_ok"].to_numpy(bool))
    sub = table.iloc[idx]
    n_act = sub["n_act"].to_numpy(float)
    f = mfu_factors(sub, draws, fam[idx])
    d_star = sub["d_star"].to_numpy(float)[None, :] * f
    feas = d_star >= tpp_min * n_act[None, :]
    d = np.minimum(d_star, tpp_max * n_act[None, :])
    with np.errstate(over="ignore", invalid="ignore"):
        loss = law_matrix(draws.coefs, sub["n_tot"].to_numpy(float), sub["s"].to_numpy(float), d,
                          sub["g"].to_numpy(float))
    if draws.z_law is not None and draws.law_scatter > 0:  # the law beyond its data (mosaic.evidence)
        loss = loss + draws.z_law[:, None] * draws.law_scatter * _column(sub, "law_doublings")[None, :]
    return idx, loss, feas


def summarise(table: pd.DataFrame, draws: Draws, tpp_min: float, tpp_max: float, index: dict[tuple, int]) -> dict:
    """Per-candidate statistics (new columns of a copy of ``table``) and the draws' optima.

    Returns {"table": table + UNCERTAINTY_COLUMNS (NaN without a plan), "opt": row index of ``table`` per draw
    (-1 when a draw has no feasible candidate)}.
    """
    out = table.copy()
    for k in UNCERTAINTY_COLUMNS:
        out[k] = np.nan
    idx, loss, feas = evaluate(table, draws, tpp_min, tpp_max, families(table, index))
    if len(idx) == 0:
        return {"table": out, "opt": np.full(draws.n, -1)}
    masked = np.where(feas, loss, np.inf)
    arg = np.argmin(masked, axis=1)
    best = masked[np.arange(draws.n), arg]
    has = np.isfinite(best)
    mfu = table.iloc[idx]["mfu_plan"].to_numpy(float)
    band = mfu[None, :] * mfu_factors(table.iloc[idx], draws, families(table, index)[idx])
    cols = {"p_optimal": np.bincount(arg[has], minlength=len(idx)) / draws.n, "loss_mean": loss.mean(axis=0),
            "loss_p05": np.percentile(loss, 5, axis=0), "loss_p95": np.percentile(loss, 95, axis=0),
            "regret": (loss[has] - best[has, None]).mean(axis=0) if has.any() else np.full(len(idx), np.nan),
            "p_feasible": feas.mean(axis=0), "mfu_p05": np.percentile(band, 5, axis=0),
            "mfu_p95": np.percentile(band, 95, axis=0)}
    for k, v in cols.items():
        out.iloc[idx, out.columns.get_loc(k)] = v
    return {"table": out, "opt": np.where(has, idx[arg], -1), "idx": idx, "loss": loss, "feasible": feas}


def verdicts(table: pd.DataFrame, opt: np.ndarray, n: int) -> dict:
    """Robust statements over the draws' optima: P(G*), the 90% band of S* and N_act*, P(same geometry)."""
    ok = opt >= 0
    if not ok.any():
        return {"p_no_feasible": 1.0, "statements": ["no feasible candidate in any draw"]}
    sel = table.iloc[opt[ok]]
    g_counts = sel["g"].astype(int).value_counts()
    p_g = {str(int(g)): float(c / n) for g, c in g_counts.sort_index().items()}
    g_mode = int(g_counts.idxmax())
    s_band = [float(x) for x in np.percentile(sel["s"], [5, 95])]
    a_band = [float(x) for x in np.percentile(sel["n_act"], [5, 95])]
    counts = np.bincount(opt[ok])
    mode = int(counts.argmax())  # a row is one geometry (q, E, K, G): its index names the optimum
    m = table.iloc[mode]
    pf = float(m.get("p_feasible", 1.0))
    where = "" if pf >= MOSTLY_FEASIBLE else (f"; it delivers the TPP floor in only {pf:.0%} of draws, so it is "
                                              "infeasible in most and not a recommendation")
    statements = [f"G={g_mode} in {100 * p_g[str(g_mode)]:.0f}% of draws",
                  f"S* in [{s_band[0]:.3f}, {s_band[1]:.3f}] in 90% of draws",
                  f"N_act* in [{a_band[0] / 1e9:.1f}, {a_band[1] / 1e9:.1f}] B in 90% of draws",
                  (f"the single most frequent optimum (L{int(m['n_layers'])} E{int(m['n_experts'])} "
                   f"K{int(m['topk'])} G{int(m['g'])}) in {100 * counts[mode] / n:.0f}% of draws{where}")]
    return {"p_g": p_g, "g_mode": g_mode, "p_g_mode": p_g[str(g_mode)], "s_band90": s_band,
            "n_act_band90": a_band, "p_no_feasible": float(1 - ok.mean()), "statements": statements,
            "mode_row": mode}


def uncertainty_json(summary: dict, draws: Draws, mfu: MfuError, law_source: str, row_json) -> dict:
    """Top-level JSON of --samples: samples, near_ties (P(optimal) >= 5%, feasible at the point estimates and in
    most draws, by P), infeasible_in_most_draws (P(optimal) >= 5% but under the TPP floor in most draws: they
    win only the draws whose MFU came out high), most_frequent_optimum, verdicts and the inputs."""
    t = summary["table"]
    frequent = (t["p_optimal"] >= NEAR_TIE_P).to_numpy()
    ok = t["feasible"].to_numpy(bool) & (t["p_feasible"].fillna(0).to_numpy(float) >= MOSTLY_FEASIBLE)
    near = t[frequent & ok].sort_values("p_optimal", ascending=False, kind="stable")
    shots = t[frequent & ~ok].sort_values("p_optimal", ascending=False, kind="stable")
    v = verdicts(t, summary["opt"], draws.n)
    mode = v.pop("mode_row", None)
    return {"samples": draws.n, "near_ties": [row_json(r) for _, r in near.iterrows()],
            "infeasible_in_most_draws": [row_json(r) for _, r in shots.iterrows()],
            "most_frequent_optimum": None if mode is None else row_json(t.iloc[mode]),
            "verdicts": v,
            "uncertainty_inputs": {"law": law_source, "law_coefficients": list(NAMES), "mfu_error": mfu.to_dict(),
                                   "layout_family": list(FAMILY_KEYS)}}


def candidate_fields(r) -> dict:
    """The per-candidate uncertainty fields of a row (None where the candidate has no plan)."""
    out = {}
    for k in UNCERTAINTY_COLUMNS:
        v = r.get(k, None) if hasattr(r, "get") else None
        out[k] = None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)
    return out
