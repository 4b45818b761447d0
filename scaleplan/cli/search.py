"""`scaleplan search`: MOSAIC (eq:hw-minlp) on a cluster profile and a training window.

Every grid flag defaults to the paper's envelope (tab:results-envelope, sec:minlp-implementation).
Never imports torch (planner command).
"""
from __future__ import annotations

from pathlib import Path

import typer

from scaleplan.cli._common import (
    CKPT_ALL,
    DbOpt,
    ExtrapOpt,
    JsonOpt,
    LawOpt,
    MemFractionOpt,
    StackOpt,
    db_url,
    escape,
    float_list,
    int_list,
    print_json,
    stderr,
    stdout,
    want_json,
)
from scaleplan.cli.estimate import CalibrationOpt, EmitOpt, EmitSpecOpt, FoldOpt, HtmlOpt, UnevenOpt
from scaleplan.mosaic.run import SearchRequest as D  # the defaults (the paper's envelope); a light import


def _csv(values: tuple) -> str:
    return ",".join(map(str, values))


RobustOpt = typer.Option(False, "--robust", help="Recommend the candidate whose loss at --robust-quantile over the "
                         "draws is least (a plan that stays good where the model errs), instead of the least expected "
                         "loss; the output says whether it differs from the point optimum and the expected-loss choice.")
RobustQuantileOpt = typer.Option(0.9, "--robust-quantile", help="--robust: the loss quantile (0.9: the loss a plan "
                                 "stays under in 90% of the draws).")


def search(
    ctx: typer.Context,
    profile: str = typer.Option(..., "--profile", help="Node type (cluster profile), e.g. p6-b200.48xlarge."),
    nodes: str = typer.Option(..., "--nodes", help="Node count, or a list (16,32,64,128) for a budget sweep."),
    days: str = typer.Option(..., "--days", help="Training window in days, or a list (10,20,30,40) for a sweep."),
    goodput: float = typer.Option(D.goodput, "--goodput", help="Goodput eta_good: fraction of wall-clock spent training."),
    gbs: int = typer.Option(D.gbs, "--gbs", help="Global batch B_global (sequences)."),
    seqlen: int = typer.Option(D.seqlen, "--seqlen", help="Sequence length T_seq (tokens)."),
    q: str = typer.Option(_csv(D.q), "--q", help="Ladder seeds q (L = 4q layers, d = 512q)."),
    experts: str = typer.Option(_csv(D.experts), "--experts", help="Expert counts E."),
    topk: str = typer.Option(_csv(D.topk), "--topk", help="Top-K values."),
    g: str = typer.Option(_csv(D.g), "--g", help="Expert split factors G = d_ff / d_expert."),
    s_min: float = typer.Option(D.s_min, "--s-min", help="Geometry guard: keep S >= s_min (law's calibrated range)."),
    s_max: float = typer.Option(None, "--s-max", help="Geometry guard: keep S <= s_max (default none; the paper "
                                "law's data support ends at 0.985, candidates beyond it are flagged extrapolated)."),
    tpp_min: float = typer.Option(D.tpp_min, "--tpp-min", help="Lowest tokens per active parameter (D/N_act)."),
    tpp_max: float = typer.Option(D.tpp_max, "--tpp-max", help="Cap on tokens per active parameter."),
    mbs: str = typer.Option(_csv(D.mbs), "--mbs", help="Micro-batch sizes of the plan search."),
    ckpt: str = typer.Option(CKPT_ALL, "--ckpt", help="Activation-checkpointing modes of the plan search."),
    fold_experts: bool = FoldOpt,
    uneven_stages: bool = UnevenOpt,
    vocab: int = typer.Option(D.vocab, "--vocab", help="Vocabulary size of the ladder models."),
    kv_heads: int = typer.Option(D.kv_heads, "--kv-heads", help="GQA key/value heads of the ladder models."),
    top: int = typer.Option(D.top, "--top", help="How many of the best candidates to list."),
    samples: int = typer.Option(D.samples, "--samples", help="Draws of the law's ridge and the MFU error for P(optimal), "
                                "loss bands, regret and near-ties (0: none)."),
    seed: int = typer.Option(D.seed, "--seed", help="Random seed of the --samples draws."),
    robust: bool = RobustOpt,
    robust_quantile: float = RobustQuantileOpt,
    by_sparsity: bool = typer.Option(False, "--by-sparsity", help="Also the best candidate per sparsity bin, "
                                     "S*_cluster, the gain over s_max and S_feas^max (the paper's Figure 1)."),
    prescription: float = typer.Option(None, "--prescription", help="--by-sparsity: the model-FLOPs prescription "
                                       "C_model (FLOP) checked per sparsity (default: the optimum's C_model)."),
    s_step: float = typer.Option(D.s_step, "--s-step", help="--by-sparsity: sparsity bin width."),
    compare_measured: bool = typer.Option(False, "--compare-measured", help="Also search with measured lookups "
                                          "only (--extrapolate error) and say whether the optimum changes."),
    optimizer: str = typer.Option(D.optimizer, "--optimizer", help="Optimizer (memory of its states)."),
    extrapolate: str = ExtrapOpt,
    law_name: str = LawOpt,
    workers: int = typer.Option(D.workers, "--workers", help="Processes for the per-geometry plan search (0: the usable CPUs)."),
    csv: Path = typer.Option(None, "--csv", help="Write the full feasible frontier (every feasible candidate) here."),
    plot: Path = typer.Option(None, "--plot", help="PNG: loss vs C_model by G (or optimal loss vs budget in a sweep)."),
    mem_fraction: float = MemFractionOpt,
    calibration: str = CalibrationOpt,
    emit: str = EmitOpt,
    emit_spec: Path = EmitSpecOpt,
    html: Path = HtmlOpt,
    extend_edges: bool = typer.Option(D.extend_edges, "--extend-edges/--no-extend-edges", help="When the optimum "
                                      "sits on the smallest or largest searched q, E, K, G or mbs, add one more "
                                      "value there and search again (once; the output says which)."),
    wide: bool = typer.Option(False, "--wide", help="Every column of the candidate table (default: the columns that "
                              "decide, fitting 80-120 columns)."),
    stack: str = StackOpt,
    db: str = DbOpt,
    json_out: bool = JsonOpt,
) -> None:
    """MOSAIC: the loss-optimal MoE geometry, tokens and layout for a cluster and window (exact enumeration)."""
    from scaleplan.mosaic.run import run_search

    _print(run_search(_request(ctx.params)), want_json(json_out), emit, wide)


def _print(report, as_json: bool, emit: str | None, wide: bool) -> None:
    """The report: its JSON document, Megatron-Core's arguments (--emit megatron) or the tables."""
    if as_json:
        print_json(report.out)
    elif emit is not None:
        typer.echo(report.out["megatron_args"])
    else:
        _human(report, wide)


def _request(p: dict):
    """The search request of the parsed options ``p`` (list options split, --calibration resolved)."""
    from scaleplan.mosaic.run import SearchRequest
    from scaleplan.report.provenance import calibration_option
    from scaleplan.specs import parse_ckpt_modes

    cal_id, use_cal = calibration_option(p["calibration"])
    lists = {k: int_list(f"--{k}", p[k]) for k in ("q", "experts", "topk", "g", "mbs")}
    return SearchRequest(
        profile=p["profile"], nodes=int_list("--nodes", p["nodes"]), days=float_list("--days", p["days"]),
        ckpt=parse_ckpt_modes(p["ckpt"]), calibration_id=cal_id, use_calibration=use_cal, db_url=db_url(p["db"]),
        robust=p["robust_quantile"] if p["robust"] else None, stack=ladder_stack(p.get("stack")),
        **lists, **{k: p[k] for k in _PASSED_AS_IS})


def ladder_stack(text: str | None):
    """The training stack of --stack for the ladder's models (bf16, a shared expert, the first block dense), or
    None for the paper's. Raises SpecError (one line) for an unknown option or one those models cannot run."""
    if not text:
        return None
    from scaleplan.stack import check_for_model, parse_stack

    st = parse_stack(text)
    check_for_model(st, "bf16", None, shared_expert=True, dense_block=True)
    return st


# options that go into the SearchRequest unchanged (same name, already a number, a path or None)
_PASSED_AS_IS = ("goodput", "gbs", "seqlen", "s_min", "s_max", "tpp_min", "tpp_max", "vocab", "kv_heads", "top",
                 "samples", "seed", "by_sparsity", "prescription", "s_step", "compare_measured", "optimizer",
                 "extrapolate", "law_name", "workers", "csv", "plot", "mem_fraction", "emit", "emit_spec", "html",
                 "extend_edges", "fold_experts", "uneven_stages")


def _unc_cells(r) -> tuple[str, str]:
    """P(optimal) and the 90% loss band of a candidate ('-' without --samples)."""
    if r.get("p_optimal") is None:
        return "-", "-"
    return f"{r['p_optimal']:.0%}", f"[{r['loss_p05']:.4f}, {r['loss_p95']:.4f}]"


def _console(width: int):
    """A console of at least ``width`` columns, so a table is never squeezed or cut when piped (rich's 80)."""
    from rich.console import Console

    return Console(width=max(stdout.width, width), soft_wrap=True)


def _wide():
    return _console(190)


def _human(report, wide: bool = False) -> None:
    """The report as text: header, candidate table with each row's status, the recommendation, the edges, the
    --samples / --by-sparsity / --compare-measured views, the sweep, the files written, the launchable outputs."""
    from scaleplan.mosaic.edges import edge_lines
    from scaleplan.mosaic.report import shown_rows

    out, env0, res0 = report.out, report.envelope, report.result
    stdout.print(f"{out['profile']}: {env0.nodes} nodes ({res0.n_devices} devices), {env0.days:g} days, "
                 f"C_peak = {res0.c_peak:.3g} FLOP; {out['n_candidates']} realizable geometries, "
                 f"{out['n_feasible']} feasible ({out['n_no_plan']} without a feasible plan, "
                 f"{out['n_below_tpp_min']} below the TPP floor); {out['elapsed_s']:.1f} s; law: {out['law']}")
    if out["best"] is None:
        stdout.print("[red]no feasible configuration[/red] in this envelope")
    rows = shown_rows(out)
    floor = out["envelope"]["tpp_min"] if "envelope" in out else env0.tpp_min
    if wide:
        _console(250).print(_wide_table(rows))
    else:
        _console(120).print(_narrow_table(rows, floor))
    rec = out.get("recommendation")
    if rec:
        stdout.print(f"[bold]recommendation:[/bold] {escape(rec['statement'])}", highlight=False)
    for line in edge_lines(out.get("edges") or {}):
        stdout.print(f"[yellow]edge:[/yellow] {escape(line)}", highlight=False)
    _print_views(out, wide)
    if "sweep" in out:
        _wide().print(_sweep_table(out))
    if report.request.csv:
        stderr.print(f"wrote the feasible frontier to {report.request.csv}")
    if report.request.plot:
        stderr.print(f"wrote {report.request.plot}")
    _analytic_note(out, rec)
    _print_launch(out)


def _analytic_note(out: dict, rec: dict | None) -> None:
    """The shown plan's own analytic components (not every candidate's), and to run `scaleplan bench`."""
    r = (rec or {}).get("recommended") or out.get("best")
    if not r or not r.get("analytic_components"):
        return
    extra = set(r.get("extrapolated_collectives") or [])
    own = [c for c in r["analytic_components"] if c not in extra]
    parts = ([f"no measured table: {', '.join(own)}"] if own else []) + (
        [f"collectives extrapolated to more ranks than measured: {', '.join(sorted(extra))}"] if extra else [])
    stderr.print(f"[yellow]L{r['n_layers']} E{r['n_experts']} K{r['topk']} G{r['g']}'s plan, analytic parts[/yellow] "
                 f"({100 * (r.get('analytic_share', 0) + r.get('extrapolated_share', 0)):.0f}% of its step time, "
                 f"{100 * r.get('unmeasured_kernel_share', 0):.0f}% of its kernel and communication time): "
                 f"{'; '.join(parts)} - run `scaleplan bench` (or `scaleplan bench plan --search s.json --run`) "
                 "to measure them", highlight=False)


def _layout_cell(lay: dict) -> str:
    """Parallel degrees above 1 but DP (tp, cp, pp, ep, etp, vpp), the micro-batch, ckpt abbreviated (--wide has
    every field)."""
    from scaleplan.estimator.layout import FIELDS

    parts = [f"{k}{lay[k]}" for k in FIELDS if k not in ("dp", "mbs", "ckpt") and int(lay.get(k, 1)) > 1]
    parts.append(f"mb{lay['mbs']}")
    ck = {"none": "", "selective": "sel", "super-selective": "ssel", "full": "full"}.get(lay["ckpt"], lay["ckpt"])
    return " ".join(parts + ([ck] if ck else []))


def _narrow_table(rows: list[tuple[dict, str]], floor: float):
    """The columns that decide: model, TPP and how often it clears the floor, MFU with its 90% band, loss with
    its 90% band, P(optimal), layout, what lies beyond the measured data, status. At most 120 columns."""
    from rich import box
    from rich.table import Table

    t = Table(title=f"candidates (P(TPP): share of draws with TPP >= the floor {floor:g}; MFU: non-embedding N_act; "
                    "--wide: every column)",
              caption="loss: at the point estimates; loss 90%: its band over the draws. beyond: outside the law's "
                      "data (S, TPP)\nor the observed runs (MFU; EPn: nodes of an EP group; mb: micro-batch; PP; "
                      "N: N_act); values: the recommendation",
              box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    wrap = {"beyond": 10, "status": 12}  # wrapped at word breaks, so the table fits 120 columns
    for c in ("model", "TPP", "P(TPP)", "MFU % (90%)", "loss", "loss 90%", "P(opt)", "layout", "beyond", "status"):
        t.add_column(c, justify="left" if c in ("model", "layout", "beyond", "status") else "right",
                     no_wrap=c not in wrap, max_width=wrap.get(c))
    for i, (r, status) in enumerate(rows):
        has = r.get("p_optimal") is not None
        mfu = f"{100 * r['mfu']:.1f}" + (f" ({100 * r['mfu_p05']:.0f}-{100 * r['mfu_p95']:.0f})" if has else "")
        loss = f"{r['loss']:.4f}"
        t.add_row(f"L{r['n_layers']} E{r['n_experts']} K{r['topk']} G{r['g']}",
                  f"{r['tpp']:.0f}",
                  f"{r['p_feasible']:.0%}" if has else "-", mfu,
                  f"[bold]{loss}[/bold]" if "recommended" in status else loss,
                  f"{r['loss_p05']:.3f}-{r['loss_p95']:.3f}" if has else "-",
                  f"{r['p_optimal']:.0%}" if has else "-", _layout_cell(r["layout"]), beyond_cell(r), status)
    return t


def beyond_cell(r: dict) -> str:
    """The features a candidate lies beyond what was measured on, by name (its ``beyond`` flags without values;
    the recommendation and --wide give the values); '-' inside it."""
    from scaleplan.mosaic.evidence import FLAG_TAGS

    names = [f.rsplit(" ", 3)[0] for f in r.get("beyond") or []]
    return " ".join(FLAG_TAGS.get(n, n) for n in names) or "-"


def _wide_table(rows: list[tuple[dict, str]]):
    from rich.table import Table

    cols = ("L", "E", "K", "G", "N_act (B)", "N_tot (B)", "S", "TPP", "P(TPP ok)", "D (T)", "MFU (%)", "MFU 90%",
            "Loss", "pp", "ep", "mb", "cp", "tp", "ckpt", "composed", "analytic", "beyond", "P(opt)", "loss 90%",
            "status")
    t = Table(title="candidates, every column (MFU: non-embedding N_act, eq:mfu)")
    for c in cols:
        t.add_column(c, justify="right")
    for r, status in rows:
        lay = r["layout"]
        has = r.get("p_optimal") is not None
        t.add_row(str(r["n_layers"]), str(r["n_experts"]), str(r["topk"]), str(r["g"]), f"{r['n_act'] / 1e9:.1f}",
                  f"{r['n_tot'] / 1e9:.1f}", f"{r['s']:.3f}", f"{r['tpp']:.0f}",
                  f"{r['p_feasible']:.0%}" if has else "-", f"{r['d_tokens'] / 1e12:.2f}", f"{100 * r['mfu']:.2f}",
                  f"{100 * r['mfu_p05']:.1f}-{100 * r['mfu_p95']:.1f}" if has else "-",
                  f"[bold]{r['loss']:.4f}[/bold]" if "recommended" in status else f"{r['loss']:.4f}",
                  str(lay["pp"]), str(lay["ep"]), str(lay["mbs"]), str(lay["cp"]), str(lay["tp"]), lay["ckpt"],
                  f"{r['composed_share']:.0%}",
                  f"{r.get('analytic_share', 0) + r.get('extrapolated_share', 0):.0%}",
                  "; ".join(r.get("beyond") or []) or ",".join(r["extrapolated"]) or "-", *_unc_cells(r), status)
    return t


def _print_views(out: dict, wide: bool = False) -> None:
    """The --samples, --by-sparsity and --compare-measured sections, when present."""
    from scaleplan.mosaic import report as views

    if "samples" in out:
        views.print_uncertainty(out, _wide(), wide)
    if "by_sparsity" in out:
        views.print_by_sparsity(out, _wide())
    if "measured_only" in out:
        views.print_measured_only(out["measured_only"], _wide())


def _sweep_table(out: dict):
    from rich.table import Table

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
    return s


def _print_launch(out: dict) -> None:
    """After the tables: the full geometry of the top candidates, the provenance line, files written."""
    from scaleplan.cli.estimate import print_geometry, print_provenance

    rows = [(f"#{i + 1}", r["geometry"]) for i, r in enumerate(out.get("top", [])) if r.get("geometry")]
    if rows:
        print_geometry(rows, "full geometry of the top candidates")
    print_provenance(out["provenance"])
    for k, label in (("emitted_spec", "wrote the optimum's spec to"), ("html", "wrote the report")):
        if out.get(k):
            stderr.print(f"{label} {out[k]}", highlight=False)
