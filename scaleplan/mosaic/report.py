"""The search's uncertainty and by-sparsity outputs, shared by ``scaleplan search`` and the findings benchmark.

JSON keys added by ``--samples N`` (N > 0):
  per candidate (best, top, near_ties, sweep rows' best): p_optimal, loss_mean, loss_p05, loss_p95, regret,
    p_feasible (see :mod:`scaleplan.mosaic.uncertainty`);
  top level: samples (N), near_ties (candidates with P(optimal) >= 5%, most probable first), verdicts
    (p_g: P(G* = g); g_mode, p_g_mode; s_band90 / n_act_band90: the 5-95% range of S* / N_act* over the draws;
    p_no_feasible; statements: the same as sentences), uncertainty_inputs (law source, MFU sigma and its source,
    the layout-family keys);
  sweep rows: p_g (P(G* = g)), p_g_star (P(G* = the point optimum's G)), s_band90.
JSON keys added by ``--by-sparsity``: see :func:`scaleplan.mosaic.sparsity.by_sparsity`.
"""
from __future__ import annotations

from scaleplan.mosaic.uncertainty import (
    MfuError,
    family_index,
    make_draws,
    summarise,
    uncertainty_json,
)


def attach_uncertainty(results: list, law, ridge, law_source: str, mfu: MfuError, n: int, seed: int = 0,
                       evidence=None, law_scatter: float = 0.0, robust: float | None = None) -> list[dict]:
    """Run the draws for every (envelope, SearchResult) of ``results``; replaces each result's table by one
    with the per-candidate columns and returns the top-level JSON per budget (same draws for all budgets).
    ``evidence``: the rule errors the plans' evidence used (mosaic.evidence.errors_for; None: the recorded);
    ``law_scatter``: the law's held-out RMSE, the unit its draws widen by beyond its data (mosaic.evidence, the
    tables' law_doublings column); ``robust``: recommend at that loss quantile (recommend.recommend)."""
    from scaleplan.mosaic.search import row_json

    from scaleplan.mosaic.evidence import describe
    from scaleplan.mosaic.law import PAPER_JOINT_LAW
    from scaleplan.mosaic.recommend import recommend

    index = family_index([r.table for _, r in results])
    draws = make_draws(n, ridge, mfu.sigma, len(index), seed=seed, law=law, law_scatter=law_scatter)
    out = []
    how = (f"{len(ridge)} stored ridge samples of the fit" if ridge is not None and len(ridge) else
           "ridge sampler on the paper's data grid and residual scatter (scaleplan.mosaic.ridge)")
    for env, res in results:
        summ = summarise(res.table, draws, env.tpp_min, env.tpp_max, index)
        res.table = summ["table"]
        u = uncertainty_json(summ, draws, mfu, law_source, row_json)
        u["uncertainty_inputs"]["law_ridge"] = how
        u["uncertainty_inputs"]["evidence"] = describe(*([evidence] if evidence is not None else []))
        u["uncertainty_inputs"]["law_beyond_data_scatter"] = law_scatter
        u["recommendation"] = recommend(summ, draws, (law or PAPER_JOINT_LAW).vector(), index,
                                        (env.tpp_min, env.tpp_max), row_json, robust)
        out.append(u)
    return out


def _key(r: dict) -> tuple:
    return (r["q"], r["n_experts"], r["topk"], r["g"])


def shown_rows(out: dict) -> list[tuple[dict, str]]:
    """The candidates a search shows, each with its status: the top by point loss, then every candidate the
    summary names that is not among them (the recommendation, its ties, the near-ties, those infeasible in most
    draws, the most frequent optimum), so every name in the summary is a row of the table.
    Status: recommended, point optimum, tie, near-tie, mostly infeasible (under the TPP floor at the point
    estimates or in most draws), most frequent (the draws' most frequent optimum); comma-joined, "" for others."""
    rec = out.get("recommendation") or {}
    tags: dict[tuple, list[str]] = {}
    named: list[dict] = []

    def tag(r, label):
        if r is None:
            return
        tags.setdefault(_key(r), []).append(label)
        named.append(r)

    tag(rec.get("recommended"), "recommended")
    if out.get("best") and rec.get("recommended") and _key(out["best"]) != _key(rec["recommended"]):
        tag(out["best"], "point optimum")
    for r in rec.get("ties") or []:
        tag(r, "tie")
    ties = {_key(r) for r in rec.get("ties") or []}
    for r in out.get("near_ties") or []:
        if _key(r) not in ties and "recommended" not in tags.get(_key(r), []):
            tag(r, "near-tie")
    for r in out.get("infeasible_in_most_draws") or []:
        tag(r, "mostly infeasible")
    tag(out.get("most_frequent_optimum"), "most frequent")
    rows, seen = [], set()
    for r in [*(out.get("top") or []), *named]:
        if _key(r) not in seen:
            seen.add(_key(r))
            rows.append((r, ", ".join(dict.fromkeys(tags.get(_key(r), [])))))
    return rows


def sweep_fields(unc: dict, best: dict | None) -> dict:
    """The sweep row's share of the uncertainty: P(G*) per G, P(G* = the point optimum's G), S* band."""
    v = unc["verdicts"]
    p_g = v.get("p_g", {})
    return {"p_g": p_g, "p_g_star": p_g.get(str(best["g"]), 0.0) if best else None, "s_band90": v.get("s_band90")}


def print_uncertainty(out: dict, console, wide: bool = False) -> None:
    """Verdicts as text (after the candidate table, whose status column marks the near-ties); with ``wide`` the
    near-ties' own table too."""
    from rich.table import Table

    v = out["verdicts"]
    mfu = out["uncertainty_inputs"]["mfu_error"]
    console.print(f"uncertainty over {out['samples']} draws (law: {out['uncertainty_inputs']['law']} ridge; MFU "
                  f"log-normal sigma {mfu['sigma']:.3f} from {mfu['source']}):")
    for s in v["statements"]:
        console.print(f"  {s}")
    if wide:
        t = Table(title="near-ties (P(optimal) >= 5%, feasible at the point estimates and in most draws)")
        for c in ("L", "E", "K", "G", "TPP", "P(TPP ok)", "MFU 90%", "loss", "loss 90%", "P(opt)", "regret"):
            t.add_column(c, justify="right")
        for r in out["near_ties"]:
            t.add_row(*_tie_cells(r))
        console.print(t)
    shots = out.get("infeasible_in_most_draws") or []
    if shots:
        console.print("not ties, under the TPP floor at the point estimates or in most draws (their P(optimal) comes "
                      "from the draws whose MFU came out high): " + "; ".join(
                          f"L{r['n_layers']} E{r['n_experts']} K{r['topk']} G{r['g']} TPP {r['tpp']:.0f}, "
                          f"P(TPP ok) {r['p_feasible']:.0%}, P(opt) {r['p_optimal']:.0%}" for r in shots),
                      highlight=False)


def _tie_cells(r: dict) -> list[str]:
    return [str(r["n_layers"]), str(r["n_experts"]), str(r["topk"]), str(r["g"]), f"{r['tpp']:.0f}",
            f"{r['p_feasible']:.0%}", f"{100 * r['mfu_p05']:.1f}-{100 * r['mfu_p95']:.1f}", f"{r['loss']:.4f}",
            f"[{r['loss_p05']:.4f}, {r['loss_p95']:.4f}]", f"{r['p_optimal']:.0%}", f"{r['regret']:.4f}"]


def print_by_sparsity(bs: dict, console) -> None:
    """The --by-sparsity table: L*_hw per sparsity bin, deliverable FLOPs against the prescription."""
    from rich.table import Table

    t = Table(title=f"by sparsity (bins of {bs['s_step']:g}; prescription C_model = "
                    f"{bs['prescription_c_model']:.3g} FLOP)")
    for c in ("S", "L*_hw", "L", "E", "K", "G", "MFU (%)", "C_model", "C_deliverable", "prescription", "extrap"):
        t.add_column(c, justify="right")
    for r in bs["by_sparsity"]:
        star = r["s"] == bs["s_star_cluster"]
        t.add_row(f"{r['s']:.4f}", f"[bold]{r['loss']:.4f}[/bold]" if star else f"{r['loss']:.4f}",
                  str(r["n_layers"]), str(r["n_experts"]), str(r["topk"]), str(r["g"]), f"{100 * r['mfu']:.2f}",
                  f"{r['c_model']:.3g}", f"{r['c_deliverable']:.3g}",
                  "feasible" if r["prescription_feasible"] else "[red]infeasible[/red]",
                  ",".join(r["extrapolated"]) or "-")
    console.print(t)
    if bs["s_star_cluster"] is None:
        console.print("no feasible candidate")
        return
    gain = "n/a (no bin at or below s_max)" if bs["gain_nats"] is None else f"{bs['gain_nats']:.4f} nats"
    feas = "none" if bs["s_feas_max"] is None else f"{bs['s_feas_max']:.4f}"
    console.print(f"S*_cluster = {bs['s_star_cluster']:.4f}; s_max (law's data support) = {bs['s_max']:.3f}; "
                  f"gain over the highest S <= s_max: {gain}; S_feas^max = {feas}")


def measured_only(mosaic, est_error, env, best: dict | None) -> dict:
    """The same search with an estimator that reads measured lookups only (``--extrapolate error``): its
    optimum and whether it differs from ``best`` (the default search's). JSON of ``--compare-measured``:
    {"best", "n_feasible", "optimum_changes"}: how much the answer rests on lookups no table measured."""
    from scaleplan.mosaic.search import Mosaic, row_json

    m = Mosaic(est_error, mosaic.grid, mosaic.law, mosaic.constraints, workers=mosaic.workers,
               support=mosaic.support)
    res = m.run(env)
    b = None if res.best is None else row_json(res.best)
    key = ("q", "n_experts", "topk", "g")
    changes = (b is None) != (best is None) or (b is not None and any(b[k] != best[k] for k in key))
    return {"best": b, "n_feasible": int(res.table.feasible.sum()), "optimum_changes": bool(changes)}


def print_measured_only(mo: dict, console) -> None:
    b = mo["best"]
    where = "no feasible candidate" if b is None else (
        f"L={b['n_layers']} E={b['n_experts']} K={b['topk']} G={b['g']} S={b['s']:.3f} loss {b['loss']:.4f}")
    console.print(f"measured lookups only (--extrapolate error): {mo['n_feasible']} feasible, optimum {where}; "
                  + ("[yellow]the optimum changes[/yellow]" if mo["optimum_changes"] else "the optimum is the same"))
