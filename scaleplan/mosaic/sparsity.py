"""The search viewed by sparsity (fig:mosaic-motivation right, fig:mosaic-solution).

For each sparsity bin: the hardware-aware loss L*_hw(S) (the lowest loss of the feasible candidates in the
bin, each at the tokens its own best plan delivers), and whether a fixed model-FLOPs prescription C_model
is deliverable there (eq:feasible-budget: C_model <= C_peak x MFU x eta_good of the bin's best plan, i.e.
the largest 6 N_act D* in the bin). From those rows: S*_cluster (the minimiser of L*_hw), s_max (the upper
edge of the law's data support), gain_nats = L*_hw at the highest sparsity <= s_max minus L*_hw(S*_cluster),
and S_feas^max (the highest sparsity whose prescription is deliverable).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from scaleplan.mosaic.law import LawSupport

DEFAULT_S_STEP = 0.005


def by_sparsity(table: pd.DataFrame, support: LawSupport, prescription: float,
                s_step: float = DEFAULT_S_STEP) -> dict:
    """The by-sparsity view of a scored search table (see the module docstring).

    table: :attr:`SearchResult.table` (feasible, loss, s, c_model, d_star, n_act, plan_ok, geometry columns);
    prescription: C_model in FLOP; s_step: bin width in S (bins [k s_step, (k+1) s_step)).
    Returns the JSON object of ``search --by-sparsity`` (keys documented in :func:`row`); ``gain_nats`` and
    ``s_star_cluster`` are None without a feasible candidate, ``s_feas_max`` None when no bin delivers it.
    Raises ValueError on a non-positive s_step or prescription.
    """
    if not s_step > 0 or not prescription > 0:
        raise ValueError("s_step and prescription must be positive")
    t = table.assign(_bin=np.floor(table["s"].to_numpy(float) / s_step).astype(int),
                     c_deliverable=6.0 * table["n_act"] * table["d_star"])
    deliverable = t[t["plan_ok"]].groupby("_bin")["c_deliverable"].max()
    feas = t[t["feasible"]].sort_values(["loss", "c_model"], ascending=[True, False], kind="stable")
    best = feas.groupby("_bin", sort=True).head(1).sort_values("s", kind="stable")
    rows = [row(r, float(deliverable.get(r["_bin"], np.nan)), prescription) for _, r in best.iterrows()]
    out = {"by_sparsity": rows, "s_max": support.s_max, "prescription_c_model": prescription, "s_step": s_step,
           "s_star_cluster": None, "gain_nats": None, "s_feas_max": None}
    if not rows:
        return out
    star = min(rows, key=lambda r: r["loss"])
    out["s_star_cluster"] = star["s"]
    inside = [r for r in rows if r["s"] <= support.s_max]
    if inside:
        edge = max(inside, key=lambda r: r["s"])
        out["gain_nats"] = edge["loss"] - star["loss"]
        out["s_edge"] = edge["s"]
    ok = [r["s"] for r in rows if r["prescription_feasible"]]
    out["s_feas_max"] = max(ok) if ok else None
    return out


def row(r, c_deliverable: float, prescription: float) -> dict:
    """One bin: s, loss (L*_hw), the geometry (q, n_layers, n_experts, topk, g, n_act, n_tot), mfu (its best
    plan's), tpp, c_model (6 N_act D it trains on), c_deliverable (the bin's largest C_peak MFU eta_good),
    prescription_feasible (c_deliverable >= prescription) and extrapolated (axes beyond the law's data)."""
    from scaleplan.mosaic.search import extrapolated

    return {"s": float(r["s"]), "loss": float(r["loss"]), "q": int(r["q"]), "n_layers": int(r["n_layers"]),
            "n_experts": int(r["n_experts"]), "topk": int(r["topk"]), "g": int(r["g"]),
            "n_act": float(r["n_act"]), "n_tot": float(r["n_tot"]), "mfu": float(r["mfu_plan"]),
            "tpp": float(r["tpp"]), "c_model": float(r["c_model"]), "c_deliverable": c_deliverable,
            "prescription_feasible": bool(c_deliverable >= prescription), "extrapolated": extrapolated(r)}
