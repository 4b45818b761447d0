"""`scaleplan law`: evaluate, fit and optimise the joint MoE scaling law (eq:joint-law).

Never imports torch (planner command).
"""
from __future__ import annotations

from pathlib import Path

import typer

from scaleplan.cli._common import DbOpt, JsonOpt, LawOpt, db_url, print_json, stderr, stdout, want_json
from scaleplan.errors import SpecError

app = typer.Typer(no_args_is_help=True, add_completion=False)


def _positive(name: str, v: float) -> float:
    if not v > 0:
        raise SpecError(name, v, "a positive number")
    return v


@app.command("eval")
def eval_(
    n_tot: float = typer.Option(..., "--n-tot", help="Total non-embedding parameters N_tot (raw count, e.g. 3.27e11)."),
    s: float = typer.Option(..., "--s", help="Sparsity S = 1 - N_act/N_tot in [0, 1)."),
    d: float = typer.Option(..., "--d", help="Training tokens D (raw count, e.g. 1.42e12)."),
    g: float = typer.Option(1.0, "--g", help="Expert split factor G = d_ff/d_expert."),
    law_name: str = LawOpt,
    db: str = DbOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Predicted loss L(N_tot, S, D, G) of the joint scaling law (paper Sec. 4.2) with its five terms."""
    from scaleplan.mosaic.law import load_law

    _positive("--n-tot", n_tot), _positive("--d", d), _positive("--g", g)
    if not 0 <= s < 1:
        raise SpecError("--s", s, "a sparsity in [0, 1)")
    law, source = load_law(db_url(db) if law_name else None, law_name)
    loss = law(n_tot, s, d, g)
    out = {"loss": loss, "n_tot": n_tot, "s": s, "d": d, "g": g, "terms": law.terms(n_tot, s, d, g),
           "law": source, "coefficients": law.to_dict()}
    if want_json(json_out):
        print_json(out)
        return
    stdout.print(f"L(N_tot={n_tot:.4g}, S={s:.4f}, D={d:.4g}, G={g:g}) = [bold]{loss:.4f}[/bold] nats  (law: {source})")
    for k, v in out["terms"].items():
        stdout.print(f"  {k:<12} {v:.5f}")


@app.command("optimum")
def optimum(
    budget: str = typer.Option(..., "--budget", help="Model-FLOPs budget C_model = 6 N_act D in FLOP; a list "
                               "(3e19,6e19,1e20,3e20,6e20) for several."),
    g: float = typer.Option(4.0, "--g", help="Expert split factor G."),
    s_max: float = typer.Option(0.985, "--s-max", help="Upper end of the sparsity range (data support)."),
    s_min: float = typer.Option(0.5, "--s-min", help="Lower end of the sparsity range."),
    points: int = typer.Option(24, "--points", help="Sparsity grid points."),
    plot: Path = typer.Option(None, "--plot", help="Write N_tot*, N_act*, L* vs S to this PNG."),
    law_name: str = LawOpt,
    db: str = DbOpt,
    json_out: bool = JsonOpt,
) -> None:
    """The model-FLOPs optimum per sparsity (paper Sec. 6.1): boundary-seeking in S."""
    from scaleplan.mosaic.law import load_law
    from scaleplan.mosaic.optimum import boundary_optimum, sparsity_sweep

    try:
        budgets = [float(x) for x in budget.split(",") if x.strip()]
    except ValueError:
        raise SpecError("--budget", budget, "a positive number of FLOP, or a comma-separated list") from None
    if not budgets:
        raise SpecError("--budget", budget, "a positive number of FLOP, or a comma-separated list")
    if points < 2:
        raise SpecError("--points", points, "at least 2")
    _positive("--g", g)
    law, source = load_law(db_url(db) if law_name else None, law_name)
    sweeps = {c: sparsity_sweep(c, g, s_max=s_max, s_min=s_min, n=points, law=law) for c in budgets}
    if plot:
        from scaleplan.mosaic.plots import plot_sparsity_sweep

        plot_sparsity_sweep(sweeps, plot, g)
    results = []
    for c, sweep in sweeps.items():
        best = boundary_optimum(sweep)
        results.append({"budget": c, "g": g, "law": source, "best": best.to_dict(),
                        "at_boundary": best.s == sweep[-1].s, "sweep": [o.to_dict() for o in sweep]})
    if want_json(json_out):
        print_json(results[0] if len(results) == 1 else {"results": results})
        return
    from rich.table import Table

    for r in results:
        t = Table(title=f"C_model = {r['budget']:.3g} FLOP, G = {g:g} (law: {source})")
        for col in ("S", "N_tot* (B)", "N_act* (B)", "D* (B)", "L*"):
            t.add_column(col, justify="right")
        for o in r["sweep"]:
            t.add_row(f"{o['s']:.4f}", f"{o['n_tot'] / 1e9:.3f}", f"{o['n_act'] / 1e9:.4f}",
                      f"{o['d_tokens'] / 1e9:.2f}", f"{o['loss']:.4f}")
        stdout.print(t)
        where = "the upper boundary s_max" if r["at_boundary"] else "an interior sparsity"
        stdout.print(f"optimum at S = {r['best']['s']:.4f} ({where}): L* = {r['best']['loss']:.4f}")
    if plot:
        stderr.print(f"wrote {plot}")


@app.command("fit")
def fit(
    runs_csv: Path = typer.Argument(..., help="CSV with columns n_tot, n_act, s, g, d, loss [, e, k, layers]."),
    bootstrap: int = typer.Option(500, "--bootstrap", help="Wild-bootstrap refits for the 95% BCa intervals."),
    starts: int = typer.Option(64, "--starts", help="Grid starts for the multi-start fit (at least 64)."),
    restarts: int = typer.Option(32, "--restarts", help="Fresh random restarts for the identifiability check."),
    name: str = typer.Option("joint", "--name", help="Name to store the fit under."),
    seed: int = typer.Option(0, "--seed", help="Random seed (bootstrap signs, restarts)."),
    db: str = DbOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Fit the joint scaling law (paper Sec. 4.2; Huber on log L, L-BFGS-B, multi-start, hold-out, BCa bootstrap); store runs and fit."""
    from scaleplan.mosaic.law_fit import fit_joint_law, read_runs_csv, store_fit

    if starts < 64:
        raise SpecError("--starts", starts, "at least 64 grid starts")
    if bootstrap < 0 or restarts < 0:
        raise SpecError("--bootstrap", bootstrap, "a non-negative number of refits")
    runs = read_runs_csv(runs_csv)
    result = fit_joint_law(runs, n_bootstrap=bootstrap, n_starts=starts, n_restarts=restarts, seed=seed,
                           progress=not want_json(json_out))
    fit_id = store_fit(db_url(db), runs, result, name=name, dataset=str(runs_csv))
    from scaleplan.db.models import LawFit
    from scaleplan.db.session import read_back

    read_back(db_url(db), LawFit, [fit_id])
    out = result.to_json()
    if want_json(json_out):
        print_json(out)
        return
    from rich.table import Table

    t = Table(title=f"joint law fit '{name}' (id {fit_id}) on {out['n_runs']} runs")
    for c in ("coeff", "value", "95% BCa", "identifiability"):
        t.add_column(c)
    for k, v in out["coefficients"].items():
        lo, hi = out["ci95"][k]
        t.add_row(k, f"{v:.5g}", f"[{lo:.4g}, {hi:.4g}]", "identified" if k in out["identified"] else "ridge")
    stdout.print(t)
    stdout.print(f"held-out RMSE (top 10% by N_act per G): {out['heldout_rmse']:.5f} nats")
    stdout.print(f"stored {out['n_ridge_samples']} ridge samples (restarts within the objective's noise) and the "
                 f"data support {out['support']}: `scaleplan search --law {name} --samples N` draws from them")
