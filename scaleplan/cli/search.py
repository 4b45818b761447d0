"""`scaleplan search`: MOSAIC (eq:hw-minlp) on a cluster profile and a training window.

Every grid flag defaults to the paper's envelope (tab:results-envelope, sec:minlp-implementation).
Never imports torch (planner command).
"""
from __future__ import annotations

from pathlib import Path

import typer

from scaleplan.cli._common import (
    DbOpt,
    ExtrapOpt,
    JsonOpt,
    LawOpt,
    db_url,
    print_json,
    stderr,
    stdout,
    want_json,
)
from scaleplan.cli._launch import finish as finish_launch
from scaleplan.cli._launch import print_human as print_launch
from scaleplan.cli.estimate import CalibrationOpt, EmitOpt, EmitSpecOpt, HtmlOpt, check_emit
from scaleplan.errors import SpecError
from scaleplan.report.provenance import calibration_option

CKPT_ALL = "none,selective,super-selective,full"


def _ints(flag: str, text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise SpecError(flag, text, "a comma-separated list of positive integers") from None
    if not vals or any(v <= 0 for v in vals):
        raise SpecError(flag, text, "a comma-separated list of positive integers")
    return vals


def _floats(flag: str, text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise SpecError(flag, text, "a comma-separated list of positive numbers") from None
    if not vals or any(not v > 0 for v in vals):
        raise SpecError(flag, text, "a comma-separated list of positive numbers")
    return vals


def search(
    profile: str = typer.Option(..., "--profile", help="Node type (cluster profile), e.g. p6-b200.48xlarge."),
    nodes: str = typer.Option(..., "--nodes", help="Node count, or a list (16,32,64,128) for a budget sweep."),
    days: str = typer.Option(..., "--days", help="Training window in days, or a list (10,20,30,40) for a sweep."),
    goodput: float = typer.Option(1.0, "--goodput", help="Goodput eta_good: fraction of wall-clock spent training."),
    gbs: int = typer.Option(1024, "--gbs", help="Global batch B_global (sequences)."),
    seqlen: int = typer.Option(2048, "--seqlen", help="Sequence length T_seq (tokens)."),
    q: str = typer.Option("8,10,12,14,16,18", "--q", help="Ladder seeds q (L = 4q layers, d = 512q)."),
    experts: str = typer.Option("4,6,8,16,24,32,48,96,128,192,256,384,512", "--experts", help="Expert counts E."),
    topk: str = typer.Option("1,2,4,6,8", "--topk", help="Top-K values."),
    g: str = typer.Option("1,2,4,8", "--g", help="Expert split factors G = d_ff / d_expert."),
    s_min: float = typer.Option(0.7, "--s-min", help="Geometry guard: keep S >= s_min (law's calibrated range)."),
    s_max: float = typer.Option(None, "--s-max", help="Geometry guard: keep S <= s_max (default none; the paper "
                                "law's data support ends at 0.985, candidates beyond it are flagged extrapolated)."),
    tpp_min: float = typer.Option(40.0, "--tpp-min", help="Lowest tokens per active parameter (D/N_act)."),
    tpp_max: float = typer.Option(150.0, "--tpp-max", help="Cap on tokens per active parameter."),
    mbs: str = typer.Option("1,2,4", "--mbs", help="Micro-batch sizes of the plan search."),
    ckpt: str = typer.Option(CKPT_ALL, "--ckpt", help="Activation-checkpointing modes of the plan search."),
    vocab: int = typer.Option(257_536, "--vocab", help="Vocabulary size of the ladder models."),
    kv_heads: int = typer.Option(8, "--kv-heads", help="GQA key/value heads of the ladder models."),
    top: int = typer.Option(10, "--top", help="How many of the best candidates to list."),
    samples: int = typer.Option(200, "--samples", help="Draws of the law's ridge and the MFU error for P(optimal), "
                                "loss bands, regret and near-ties (0: none)."),
    seed: int = typer.Option(0, "--seed", help="Random seed of the --samples draws."),
    by_sparsity: bool = typer.Option(False, "--by-sparsity", help="Also the best candidate per sparsity bin, "
                                     "S*_cluster, the gain over s_max and S_feas^max (the paper's Figure 1)."),
    prescription: float = typer.Option(None, "--prescription", help="--by-sparsity: the model-FLOPs prescription "
                                       "C_model (FLOP) checked per sparsity (default: the optimum's C_model)."),
    s_step: float = typer.Option(0.005, "--s-step", help="--by-sparsity: sparsity bin width."),
    compare_measured: bool = typer.Option(False, "--compare-measured", help="Also search with measured lookups "
                                          "only (--extrapolate error) and say whether the optimum changes."),
    optimizer: str = typer.Option("adamw", "--optimizer", help="Optimizer (memory of its states)."),
    extrapolate: str = ExtrapOpt,
    law_name: str = LawOpt,
    workers: int = typer.Option(0, "--workers", help="Processes for the per-geometry plan search (0: the usable CPUs)."),
    csv: Path = typer.Option(None, "--csv", help="Write the full feasible frontier (every feasible candidate) here."),
    plot: Path = typer.Option(None, "--plot", help="PNG: loss vs C_model by G (or optimal loss vs budget in a sweep)."),
    mem_fraction: float = typer.Option(0.95, "--mem-fraction", help="Usable fraction of HBM per device (default "
                                       "0.95: headroom for allocator fragmentation and transient buffers; README)."),
    calibration: str = CalibrationOpt,
    emit: str = EmitOpt,
    emit_spec: Path = EmitSpecOpt,
    html: Path = HtmlOpt,
    db: str = DbOpt,
    json_out: bool = JsonOpt,
) -> None:
    """MOSAIC: the loss-optimal MoE geometry, tokens and layout for a cluster and window (exact enumeration)."""
    from scaleplan.estimator import Estimator, PlanConstraints
    from scaleplan.mosaic.ladder import LadderGrid
    from scaleplan.mosaic.law import load_law_full
    from scaleplan.mosaic.search import Envelope, Mosaic, default_workers, sweep_row
    from scaleplan.specs import OPTIMIZERS, parse_ckpt_modes

    node_list, day_list = _ints("--nodes", nodes), _floats("--days", days)
    if len(node_list) > 1 and len(day_list) > 1:
        raise SpecError("--nodes/--days", f"{nodes} / {days}", "a list for at most one of them (a 1-D sweep)")
    if optimizer not in OPTIMIZERS:
        raise SpecError("--optimizer", optimizer, f"one of {', '.join(OPTIMIZERS)}")
    modes = parse_ckpt_modes(ckpt)
    if not 0 <= s_min < 1:
        raise SpecError("--s-min", s_min, "a sparsity in [0, 1)")
    if s_max is not None and not s_min < s_max < 1:
        raise SpecError("--s-max", s_max, f"a sparsity in ({s_min}, 1)")
    if samples < 0:
        raise SpecError("--samples", samples, "0 or a positive number of draws")
    if not s_step > 0 or (prescription is not None and not prescription > 0):
        raise SpecError("--s-step/--prescription", (s_step, prescription), "positive numbers")
    if top < 1:
        raise SpecError("--top", top, "a positive integer")
    if vocab <= 0 or kv_heads <= 0:
        raise SpecError("--vocab/--kv-heads", (vocab, kv_heads), "positive integers")
    grid = LadderGrid(q=_ints("--q", q), experts=_ints("--experts", experts), topk=_ints("--topk", topk),
                      g=_ints("--g", g), s_min=s_min, s_max=1.0 if s_max is None else s_max, vocab=vocab, kv_heads=kv_heads)
    url = db_url(db)
    loaded = load_law_full(url if law_name else None, law_name)
    law, law_source = loaded.law, loaded.source
    check_emit(emit, optimizer, "--optimizer", {"--emit-spec": emit_spec, "--html": html})
    if not 0 < mem_fraction <= 1:
        raise SpecError("--mem-fraction", mem_fraction, "a fraction in (0, 1]")
    cal_id, use_cal = calibration_option(calibration)
    est = Estimator(profile=profile, db_url=url, extrapolate=extrapolate, calibration_id=cal_id,
                    use_calibration=use_cal)
    if workers < 0:
        raise SpecError("--workers", workers, "0 (auto) or a positive integer")
    plan_c = PlanConstraints(mbs=_ints("--mbs", mbs), ckpt=modes, mem_fraction=mem_fraction)
    m = Mosaic(est, grid, law, plan_c, progress=True,
               workers=workers or default_workers(), support=loaded.support)
    if m.geoms.empty:
        raise SpecError("grid", f"{grid.n_combinations} combinations", "at least one realizable geometry "
                        "(K <= E, d_ff divisible by G, S >= --s-min)")
    envs = [Envelope(nodes=n, days=d, goodput=goodput, gbs=gbs, seqlen=seqlen, optimizer=optimizer,
                     tpp_min=tpp_min, tpp_max=tpp_max) for n in node_list for d in day_list]
    results = [(e, m.run(e)) for e in envs]
    sweep = len(envs) > 1
    env0, res0 = results[0]  # a sweep reports its first budget in full, every budget in "sweep"
    unc = _uncertainty(results, loaded, url, est.profile.name, samples, seed)
    out = res0.to_json(top)
    out["law"] = law_source
    out["law_support"] = loaded.support.to_dict()
    out["profile"] = est.profile.name
    if unc:
        out.update(unc[0])
    if sweep:
        out["sweep"] = [sweep_row(r, e) for e, r in results]
        out["sweep_axis"] = "nodes" if len(node_list) > 1 else "days"
        if unc:
            from scaleplan.mosaic.report import sweep_fields

            for row, u in zip(out["sweep"], unc):
                row.update(sweep_fields(u, row["best"]))
    if by_sparsity:
        from scaleplan.mosaic.sparsity import by_sparsity as view

        c_rx = prescription or (out["best"]["c_model"] if out["best"] else 1.0)
        out.update(view(res0.table, loaded.support, c_rx, s_step))
    if compare_measured:
        from scaleplan.mosaic.report import measured_only

        est_err = Estimator(profile=profile, db_url=url, extrapolate="error", calibration_id=cal_id,
                            use_calibration=use_cal)
        out["measured_only"] = measured_only(m, est_err, env0, out["best"])
    if csv:
        frames = []
        for e, r in results:
            f = r.frontier.assign(nodes=e.nodes, days=e.days)
            frames.append(f.drop(columns=["why", "feasible", "plan_ok"], errors="ignore"))
        import pandas as pd

        pd.concat(frames).to_csv(csv, index=False)
    if plot:
        from scaleplan.mosaic.plots import plot_pareto, plot_sweep

        if sweep:
            plot_sweep(out["sweep"], plot, out["sweep_axis"])
        elif by_sparsity:
            from scaleplan.mosaic.plots import plot_by_sparsity

            plot_by_sparsity(out, plot, f"{est.profile.name}: {env0.nodes} nodes, {env0.days:g} days")
        else:
            plot_pareto(res0.frontier, out["best"], plot,
                        f"{est.profile.name}: {env0.nodes} nodes, {env0.days:g} days, C_peak {res0.c_peak:.3g} FLOP")
    finish_launch(out, res0, grid, est, env0, mem_fraction, emit, emit_spec, html)
    if want_json(json_out):
        print_json(out)
        return
    if emit == "megatron":
        typer.echo(out["megatron_args"])
        return
    _human(out, results, est, env0, csv, plot)
    print_launch(out)


def _uncertainty(results, loaded, url, profile, samples, seed):
    """Per budget, the --samples JSON (and per-candidate columns in each result's table); None for 0 draws."""
    if samples == 0:
        return None
    from scaleplan.mosaic.report import attach_uncertainty
    from scaleplan.mosaic.uncertainty import mfu_error

    return attach_uncertainty(results, loaded.law, loaded.ridge, loaded.source, mfu_error(url, profile), samples,
                              seed)


def _unc_cells(r) -> tuple[str, str]:
    """P(optimal) and the 90% loss band of a candidate ('-' without --samples)."""
    if r.get("p_optimal") is None:
        return "-", "-"
    return f"{r['p_optimal']:.0%}", f"[{r['loss_p05']:.4f}, {r['loss_p95']:.4f}]"


def _wide():
    """A console at least 150 columns wide, so the result table is never truncated when piped."""
    from rich.console import Console

    return Console(width=max(stdout.width, 190), soft_wrap=True)


def _human(out, results, est, env0, csv, plot) -> None:
    from rich.table import Table

    res0 = results[0][1]
    if out["analytic_components"]:
        stderr.print(f"[yellow]analytic (no measured table) components:[/yellow] {', '.join(out['analytic_components'])}")
    stdout.print(f"{est.profile.name}: {env0.nodes} nodes ({res0.n_devices} devices), {env0.days:g} days, "
                 f"C_peak = {res0.c_peak:.3g} FLOP; {out['n_candidates']} realizable geometries, "
                 f"{out['n_feasible']} feasible ({out['n_no_plan']} without a feasible plan, "
                 f"{out['n_below_tpp_min']} below the TPP floor); {out['elapsed_s']:.1f} s; law: {out['law']}")
    if out["best"] is None:
        stdout.print("[red]no feasible configuration[/red] in this envelope")
    cols = ("L", "E", "K", "G", "N_act (B)", "N_tot (B)", "S", "TPP", "D (T)", "MFU (%)", "Loss", "pp", "ep",
            "mb", "cp", "tp", "ckpt", "composed", "extrap", "P(opt)", "loss 90%")
    t = Table(title="optimum and top candidates (MFU: non-embedding N_act, eq:mfu)")
    for c in cols:
        t.add_column(c, justify="right")
    for i, r in enumerate(out["top"]):
        lay = r["layout"]
        t.add_row(str(r["n_layers"]), str(r["n_experts"]), str(r["topk"]), str(r["g"]), f"{r['n_act'] / 1e9:.1f}",
                  f"{r['n_tot'] / 1e9:.1f}", f"{r['s']:.3f}", f"{r['tpp']:.0f}", f"{r['d_tokens'] / 1e12:.2f}",
                  f"{100 * r['mfu']:.2f}", f"[bold]{r['loss']:.4f}[/bold]" if i == 0 else f"{r['loss']:.4f}",
                  str(lay["pp"]), str(lay["ep"]), str(lay["mbs"]), str(lay["cp"]), str(lay["tp"]), lay["ckpt"],
                  f"{r['composed_share']:.0%}", ",".join(r["extrapolated"]) or "-", *_unc_cells(r))
    _wide().print(t)
    if "samples" in out:
        from scaleplan.mosaic.report import print_uncertainty

        print_uncertainty(out, _wide())
    if "by_sparsity" in out:
        from scaleplan.mosaic.report import print_by_sparsity

        print_by_sparsity(out, _wide())
    if "measured_only" in out:
        from scaleplan.mosaic.report import print_measured_only

        print_measured_only(out["measured_only"], _wide())
    if "sweep" in out:
        s = Table(title=f"budget sweep over {out['sweep_axis']}")
        for c in ("nodes", "days", "C_peak", "L", "E", "K", "G*", "P(G*)", "S*", "S* 90%", "N_act* (B)", "N_tot* (B)",
                  "MFU (%)", "L*", "extrap"):
            s.add_column(c, justify="right")
        for row in out["sweep"]:
            b = row["best"]
            if b is None:
                s.add_row(str(row["nodes"]), f"{row['days']:g}", f"{row['c_peak']:.3g}", *["-"] * 12)
                continue
            band = row.get("s_band90")
            s.add_row(str(row["nodes"]), f"{row['days']:g}", f"{row['c_peak']:.3g}", str(b["n_layers"]),
                      str(b["n_experts"]), str(b["topk"]), str(b["g"]),
                      "-" if row.get("p_g_star") is None else f"{row['p_g_star']:.0%}", f"{b['s']:.3f}",
                      f"[{band[0]:.3f}, {band[1]:.3f}]" if band else "-", f"{b['n_act'] / 1e9:.1f}",
                      f"{b['n_tot'] / 1e9:.1f}", f"{100 * b['mfu']:.2f}", f"{b['loss']:.4f}",
                      ",".join(b["extrapolated"]) or "-")
        _wide().print(s)
    if csv:
        stderr.print(f"wrote the feasible frontier to {csv}")
    if plot:
        stderr.print(f"wrote {plot}")
