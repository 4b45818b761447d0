"""Figures of the law and the search (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

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


def plot_pareto(frontier, best, path: Path, title: str) -> None:
    """Loss vs C_model of every feasible candidate coloured by G, the optimum starred (fig:pareto-B)."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for g, grp in frontier.groupby("g"):
        ax.scatter(grp["c_model"], grp["loss"], s=10, alpha=0.7, color=_colour(g), label=f"G={int(g)}")
    if best is not None:
        ax.scatter([best["c_model"]], [best["loss"]], marker="*", s=260, color="gold", edgecolor="black",
                   zorder=5, label="optimum")
    ax.set_xscale("log")
    ax.set_xlabel("C_model = 6 N_act D (FLOP)")
    ax.set_ylabel("predicted loss (nats)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_sweep(rows: list[dict], path: Path, axis: str) -> None:
    """Optimal loss vs budget (fig:gpuhours): solid overall optimum, dashed best per G, markers by G*."""
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
            ax.annotate(f"S={b['s']:.3f}\nN_tot={b['n_tot'] / 1e9:.0f}B", (xi, b["loss"]), fontsize=7,
                        textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel(axis)
    ax.set_ylabel("optimal predicted loss (nats)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
