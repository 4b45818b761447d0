"""Figures of the law and the search (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

G_COLOURS = {1: "tab:blue", 2: "tab:orange", 4: "tab:green", 6: "tab:purple", 8: "tab:red"}


def _colour(g) -> str:
    return G_COLOURS.get(int(g), "tab:gray")


def plot_sparsity_sweep(sweeps: dict, path: Path, g: float) -> None:
    """N_tot*, N_act* and L* vs S per budget (the fig:figure3-abnar-repro view). sweeps: budget -> list."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for budget, sw in sweeps.items():
        s = [o.s for o in sw]
        axes[0].plot(s, [o.n_tot for o in sw], label=f"C={budget:.0e}")
        axes[1].plot(s, [o.n_act for o in sw])
        axes[2].plot(s, [o.loss for o in sw])
    for ax, lab in zip(axes, ("N_tot* (params)", "N_act* (params)", "L* (nats)")):
        ax.set_xlabel("sparsity S")
        ax.set_ylabel(lab)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"model-FLOPs optimum per sparsity (eq:compute-only-program), G={g:g}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_pareto(frontier, best, path: Path, title: str, ax=None) -> None:
    """Loss vs C_model of every feasible candidate coloured by G, the optimum starred (fig:pareto-B).

    Candidates beyond the law's data support (extrap_s / extrap_tpp) are hollow; with --samples columns
    (p_optimal) the near-ties (P >= 5%) are ringed and labelled with their P(optimal). ``ax``: draw into it
    (no file written) instead of a new figure at ``path``.
    """
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
    extrap = pd.Series(False, index=frontier.index)
    for c in ("extrap_s", "extrap_tpp"):
        if c in frontier:
            extrap |= frontier[c].astype(bool)
    for g, grp in frontier.groupby("g"):
        ex = extrap[grp.index]
        inside, outside = grp[~ex], grp[ex]
        ax.scatter(inside["c_model"], inside["loss"], s=10, alpha=0.7, color=_colour(g), label=f"G={int(g)}")
        ax.scatter(outside["c_model"], outside["loss"], s=10, alpha=0.7, facecolors="none", edgecolors=_colour(g))
    if "p_optimal" in frontier:
        near = frontier[frontier["p_optimal"] >= 0.05]
        ax.scatter(near["c_model"], near["loss"], s=90, facecolors="none", edgecolors="black", linewidths=0.8,
                   label="P(optimal) >= 5%")
        for _, r in near.iterrows():
            ax.annotate(f"{r['p_optimal']:.0%}", (r["c_model"], r["loss"]), fontsize=7, textcoords="offset points",
                        xytext=(5, -9))
    if best is not None:
        ax.scatter([best["c_model"]], [best["loss"]], marker="*", s=260, color="gold", edgecolor="black",
                   zorder=5, label="optimum")
    ax.set_xscale("log")
    ax.set_xlabel("C_model = 6 N_act D (FLOP)")
    ax.set_ylabel("predicted loss (nats)")
    ax.set_title(title + ("\nhollow: beyond the law's data support (S or TPP)" if bool(extrap.any()) else ""),
                 fontsize=9)
    ax.legend(fontsize=7)
    if own:
        _save(fig, path)


def plot_by_sparsity(bs: dict, path: Path, title: str, axes=None) -> None:
    """Two panels (fig:mosaic-motivation right, fig:mosaic-solution): the best candidate's deliverable
    model FLOPs per sparsity against the prescription (red where it falls short), and L*_hw(S) with
    S*_cluster and s_max marked. ``axes``: two axes to draw into (no file written)."""
    own = axes is None
    if own:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    rows = bs["by_sparsity"]
    s = [r["s"] for r in rows]
    ax = axes[0]
    ax.plot(s, [r["c_deliverable"] for r in rows], "k.-", label="C_deliverable (best plan per S)")
    ax.axhline(bs["prescription_c_model"], color="tab:blue", ls="--",
               label=f"prescription C_model = {bs['prescription_c_model']:.2g}")
    lo = bs["s_feas_max"] if bs["s_feas_max"] is not None else (min(s) if s else None)
    if lo is not None and any(not r["prescription_feasible"] and r["s"] > lo for r in rows):
        ax.axvspan(lo, max(s), color="red", alpha=0.15, label="beyond S_feas^max: prescription not deliverable")
    if bs["s_feas_max"] is not None:
        ax.axvline(bs["s_feas_max"], color="red", lw=0.8)
        ax.annotate(f"S_feas^max={bs['s_feas_max']:.3f}", (bs["s_feas_max"], bs["prescription_c_model"]),
                    fontsize=7, textcoords="offset points", xytext=(3, 6))
    ax.set_yscale("log")
    ax.set_xlabel("sparsity S")
    ax.set_ylabel("model FLOPs")
    ax.legend(fontsize=7)
    ax = axes[1]
    for g in sorted({r["g"] for r in rows}):
        pts = [r for r in rows if r["g"] == g]
        ax.scatter([r["s"] for r in pts], [r["loss"] for r in pts], s=14, color=_colour(g), label=f"G={g}")
    ax.plot(s, [r["loss"] for r in rows], color="gray", lw=0.6)
    if bs["s_star_cluster"] is not None:
        ax.axvline(bs["s_star_cluster"], color="green", ls="--", label=f"S*_cluster={bs['s_star_cluster']:.3f}")
    ax.axvline(bs["s_max"], color="red", ls=":", label=f"s_max={bs['s_max']:.3f}")
    if bs["gain_nats"] is not None:
        ax.set_title(f"gain over the highest S <= s_max: {bs['gain_nats']:.3f} nats", fontsize=9)
    ax.set_xlabel("sparsity S")
    ax.set_ylabel("L*_hw(S) (nats)")
    ax.legend(fontsize=7)
    if own:
        fig.suptitle(title, fontsize=10)
        _save(fig, path)


def _save(fig, path) -> None:
    """Write the figure to ``path`` (or to each of a list of paths: PNG and SVG) and close it."""
    fig.tight_layout()
    for pth in [path] if not isinstance(path, (list, tuple)) else path:
        fig.savefig(pth, dpi=120)
    plt.close(fig)


def plot_sweep(rows: list[dict], path: Path, axis: str) -> None:
    """Optimal loss vs budget (fig:gpuhours): solid overall optimum, dashed best per G, markers by G*,
    annotated with S*, N_tot* and (with --samples) P(G*) and the 90% band of S* over the draws."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    x = [r[axis] for r in rows]
    ax.plot(x, [r["best"]["loss"] if r["best"] else float("nan") for r in rows], "k-", label="optimum")
    gs = sorted({g for r in rows for g in r.get("best_per_g", {})})
    for g in gs:
        ax.plot(x, [r["best_per_g"].get(g, {}).get("loss", float("nan")) for r in rows], "--", color=_colour(g),
                label=f"best G={g}")
    for xi, r in zip(x, rows):
        if r["best"]:
            b = r["best"]
            ax.scatter([xi], [b["loss"]], color=_colour(b["g"]), s=60, zorder=5, edgecolor="black")
            note = f"S={b['s']:.3f}\nN_tot={b['n_tot'] / 1e9:.0f}B"
            if r.get("p_g_star") is not None:
                band = r["s_band90"]
                note += f"\nP(G={b['g']})={r['p_g_star']:.0%}\nS* 90%: {band[0]:.3f}-{band[1]:.3f}"
            ax.annotate(note, (xi, b["loss"]), fontsize=7, textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel(axis)
    ax.set_ylabel("optimal predicted loss (nats)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    for pth in [path] if not isinstance(path, (list, tuple)) else path:
        fig.savefig(pth, dpi=120)
    plt.close(fig)


def plot_motivation(sweep: list, budget: float, bs: dict, path, title: str) -> None:
    """fig:mosaic-motivation, two panels. Left: the model-FLOPs optimum L*(S) at ``budget`` (``sweep``:
    SparsityOptimum list, eq:compute-only-program) with N_tot* and N_act* on a second axis; right: the
    cluster's view (:func:`plot_by_sparsity`'s first panel with L*_hw(S) on a second axis)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6))
    s = [o.s for o in sweep]
    left.plot(s, [o.loss for o in sweep], "k-", label=f"L*(S), C_model={budget:.2g}")
    left.scatter([s[-1]], [sweep[-1].loss], marker="*", s=200, color="red", zorder=5, label=f"S*=S_max={s[-1]:.3f}")
    left.set_xlabel("sparsity S")
    left.set_ylabel("L* (nats)")
    twin = left.twinx()
    twin.plot(s, [o.n_tot for o in sweep], color="tab:blue", ls="--", label="N_tot*")
    twin.plot(s, [o.n_act for o in sweep], color="tab:orange", ls="--", label="N_act*")
    twin.set_yscale("log")
    twin.set_ylabel("parameters")
    left.legend(fontsize=7, loc="upper center")
    twin.legend(fontsize=7, loc="center left")
    left.set_title("model FLOPs select the boundary (eq:compute-only-program)", fontsize=9)
    rtwin = right.twinx()
    plot_by_sparsity(bs, path, title, axes=(right, rtwin))
    gain = "" if bs["gain_nats"] is None else f"; gain {bs['gain_nats']:.3f} nats"
    rtwin.set_title("")
    right.set_title(f"{title}: C_deliverable per S, L*_hw(S) (right axis){gain}", fontsize=9)
    right.legend(fontsize=7, loc="upper center", framealpha=0.9)
    rtwin.legend(fontsize=7, loc="lower left", framealpha=0.9)
    _save(fig, path)
