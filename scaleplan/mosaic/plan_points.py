"""The points of ``scaleplan plan``: one (platform, nodes, days) each, with its MOSAIC optimum, its cost, how
sure it is, and which of them a budget meeting wants (cheapest, fastest, the time-versus-cost frontier).

How sure a point is: the search's draws (:mod:`scaleplan.mosaic.uncertainty`): law coefficients on the
ridge, and an MFU factor exp(sigma_c z) whose sigma_c is the calibration's error widened by the evidence of
the point's own plan (``candidate_sigma``: unmeasured or analytic components widen it, so a platform without
measured tables draws wider). Per draw k the committed geometry and plan need

    days_k = max(D_need,k, tpp_min N_act) / (tokens/s x f_k x eta_good)   (inf where draw k's law cannot
                                                                          reach the target within tpp_max)

so P(reaches target) = P(days_k <= the point's days), and the 90% band of days_k says how long to book.
A fixed model (spec and --tokens) has no law in it: days_k = days / f_k. Units: days, GPU-hours, USD.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from scaleplan.mosaic.law import NAMES
from scaleplan.mosaic.ridge import law_matrix
from scaleplan.mosaic.search import SECONDS_PER_DAY
from scaleplan.mosaic.uncertainty import candidate_sigma

_B, _BETA = NAMES.index("b"), NAMES.index("beta")


def draw_days(row: pd.Series, coefs: np.ndarray, z: np.ndarray, sigma: float, target: float | None,
              eta: float, tpp_min: float, tpp_max: float, days: float) -> np.ndarray:
    """days_k of the module docstring for one scored row (n_tot, s, g, n_act, tokens_per_s, evidence_sigma)
    over the draws: law coefficients ``coefs`` [N, 11] (unused without ``target``: a fixed token budget of
    ``days`` at the point estimate) and standard normals ``z`` [N]. Returns [N] days (inf: never)."""
    sig = float(candidate_sigma(row.to_frame().T, sigma)[0])
    f = np.exp(sig * np.asarray(z, dtype=float))
    if target is None:
        return days / f
    n_tot, s, g, n_act = (np.array([float(row[k])]) for k in ("n_tot", "s", "g", "n_act"))
    rest = law_matrix(coefs, n_tot, s, np.full((len(coefs), 1), np.inf), g)[:, 0]
    gap = target - rest
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = np.where(gap > 0, (coefs[:, _B] / np.where(gap > 0, gap, 1.0)) ** (1.0 / coefs[:, _BETA]), np.inf)
        d = np.where(d <= tpp_max * n_act[0], np.maximum(d, tpp_min * n_act[0]), np.inf)
        return d / (float(row["tokens_per_s"]) * f * eta) / SECONDS_PER_DAY


def draw_loss(row: pd.Series, coefs: np.ndarray, z: np.ndarray, sigma: float, tpp_min: float,
              tpp_max: float) -> dict:
    """A forward point's loss over the draws: the tokens its plan delivers in draw k (D* f_k, TPP cap applied)
    under draw k's law; its 90% band and median, and P(it clears the TPP floor)."""
    sig = float(candidate_sigma(row.to_frame().T, sigma)[0])
    d_star = float(row["d_star"]) * np.exp(sig * np.asarray(z, dtype=float))
    n_act = float(row["n_act"])
    d = np.minimum(d_star, tpp_max * n_act)[:, None]
    loss = law_matrix(coefs, *(np.array([float(row[k])]) for k in ("n_tot", "s")), d, np.array([float(row["g"])]))
    band = np.percentile(loss[:, 0], [5, 50, 95])
    return {"loss_p05": float(band[0]), "loss_p50": float(band[1]), "loss_p95": float(band[2]),
            "p_feasible": float(np.mean(d_star >= tpp_min * n_act))}


def reach_fields(days_k: np.ndarray, days: float, deadline: float | None) -> dict:
    """P(reaches the target in the point's days), the days' 90% band and median, P(within the deadline)."""
    fin = np.where(np.isfinite(days_k), days_k, np.inf)
    band = np.percentile(fin, [5, 50, 95], method="inverted_cdf")  # no interpolation between infinities
    out = {"p_reach": float(np.mean(fin <= days * (1 + 1e-9))), "days_p05": _f(band[0]), "days_p50": _f(band[1]),
           "days_p95": _f(band[2])}
    out["p_within_deadline"] = None if deadline is None else float(np.mean(fin <= deadline * (1 + 1e-9)))
    return out


def _f(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def money(n_dev: int, days: float, price: float | None) -> dict:
    """GPU-hours and cost (USD; None without a price) of ``n_dev`` GPUs for ``days``."""
    hours = n_dev * days * 24.0
    return {"gpu_hours": hours, "cost_usd": None if price is None else hours * price}


def violations(p: dict, max_days: float | None, max_gpu_hours: float | None, max_cost: float | None) -> list[str]:
    """The constraints a point breaks: 'deadline', 'gpu-hours', 'cost' (tolerance 1e-9 relative)."""
    out = []
    tol = 1 + 1e-9
    if max_days is not None and p["days"] > max_days * tol:
        out.append("deadline")
    if max_gpu_hours is not None and p["gpu_hours"] > max_gpu_hours * tol:
        out.append("gpu-hours")
    if max_cost is not None and p["cost_usd"] is not None and p["cost_usd"] > max_cost * tol:
        out.append("cost")
    return out


def cost_key(p: dict) -> float:
    """What 'cheaper' means for a point: its cost where priced, else its GPU-hours."""
    return p["cost_usd"] if p.get("cost_usd") is not None else p["gpu_hours"]


def cheapest(points: list[dict]) -> dict | None:
    """The point of least cost (ties: fewer days)."""
    return min(points, key=lambda p: (cost_key(p), p["days"]), default=None)


def fastest(points: list[dict]) -> dict | None:
    """The point of fewest days (ties: less cost)."""
    return min(points, key=lambda p: (p["days"], cost_key(p)), default=None)


def frontier(points: list[dict]) -> list[dict]:
    """The time-versus-cost frontier: the points no other point beats on both days and cost, by days
    (fastest first, cheapest last)."""
    out: list[dict] = []
    for p in sorted(points, key=lambda p: (p["days"], cost_key(p))):
        if not out or cost_key(p) < cost_key(out[-1]) * (1 - 1e-12):
            out.append(p)
    return out


def label(p: dict) -> str:
    """'32 x p6-b200.48xlarge (256 GPUs), 14.2 days'."""
    return f"{p['nodes']} x {p['profile']} ({p['n_devices']} GPUs), {p['days']:.3g} days"
