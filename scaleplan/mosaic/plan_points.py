"""The points of ``scaleplan plan``: one (platform, nodes, days) each, with its MOSAIC optimum, its cost, how
sure it is, and which of them a budget meeting wants (cheapest, fastest, the time-versus-cost frontier).

How sure a point is: the days_k its committed geometry and plan need in each of the search's draws
(:mod:`scaleplan.mosaic.plan_draws`: the law's ridge and beyond-its-data term, the MFU error widened by the plan's
distance from the observed runs and its unmeasured parts), so P(reaches target) = P(days_k <= the point's days),
and the 90% band of days_k says how long to book. A fixed model (spec and --tokens) has no law in it:
days_k = days / f_k. Units: days, GPU-hours, USD.
"""
from __future__ import annotations

import numpy as np


def reach_fields(days_k: np.ndarray, days: float, deadline: float | None) -> dict:
    """P(reaches the target in the point's days), the days' 90% band and median, P(within the deadline)."""
    fin = np.where(np.isfinite(days_k), days_k, np.inf)
    band = np.percentile(fin, [5, 50, 95], method="inverted_cdf")  # no interpolation between infinities
    out = {"p_reach": float(np.mean(fin <= days * (1 + 1e-9))), "days_p05": _f(band[0]), "days_p50": _f(band[1]),
           "days_p95": _f(band[2])}
    out["p_within_deadline"] = None if deadline is None else float(np.mean(fin <= deadline * (1 + 1e-9)))
    return out


def loss_fields(loss_k: np.ndarray, feasible_k: np.ndarray) -> dict:
    """A forward point's loss over the draws (at the tokens each delivers, as the search's band): its 90% band and
    median, and P(it clears the TPP floor)."""
    band = np.percentile(loss_k, [5, 50, 95])
    return {"loss_p05": _f(band[0]), "loss_p50": _f(band[1]), "loss_p95": _f(band[2]),
            "p_feasible": float(np.mean(feasible_k))}


def fwd_loss(p: dict) -> float:
    """The loss a forward point is planned to: at the confidence (``loss_q``) where one was asked, else the
    point estimate's."""
    return p["loss_q"] if p.get("loss_q") is not None else p["plan"]["loss"]


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
