"""`scaleplan estimate` and `scaleplan layouts`: the performance model on the command line.

Both print one JSON document with ``--json`` (estimate: a list of result objects; layouts: an
object with ``ranked``, ``best`` and ``infeasible_counts``), else rich tables. Every result carries the
model's full ``geometry`` (scaleplan.emit.geometry_dict) and the ``provenance`` of the answer (calibration
in force, table runs read: scaleplan.report.provenance). Components costed without a measured table are
labelled "analytic" and a one-line banner on stderr says to run `scaleplan bench`.
``--emit-spec`` (layouts) writes the best plan as a spec, ``--emit megatron`` prints Megatron-Core
arguments, ``--html`` (layouts) writes the report. Never imports torch.
"""
from __future__ import annotations

from pathlib import Path

import typer

from scaleplan.cli._common import (
    CKPT_ALL,
    DbOpt,
    ExtrapOpt,
    JsonOpt,
    MemFractionOpt,
    StackOpt,
    check_mem_fraction,
    db_url,
    escape,
    int_list,
    lazy_module,
    print_json,
    stderr,
    stdout,
    want_json,
)
from scaleplan.errors import SpecError
from scaleplan.units import SEARCH_MBS

specs = lazy_module("scaleplan.specs")  # pydantic loads on first use, not for `scaleplan --help`
emit_mod = lazy_module("scaleplan.emit")

ProfileOpt = typer.Option(None, "--profile", help="Hardware profile (default: the spec's hardware.node_type).")
CalibrationOpt = typer.Option(None, "--calibration", metavar="ID|none",
                              help="Calibration id to apply (see `scaleplan calibrate list`), or 'none' for "
                                   "chi_sys = 1 and the profile's dispatch law (default: the newest of each kind).")
EmitOpt = typer.Option(None, "--emit", metavar="megatron|megatron-hybrid",
                       help="Print the chosen model and layout as Megatron-LM training arguments (docs/megatron.md): "
                            "GPTModel's (pretrain_gpt.py), or megatron-hybrid: HybridModel's --hybrid-layer-pattern.")
EmitSpecOpt = typer.Option(None, "--emit-spec", metavar="FILE",
                           help="Write the chosen model and layout as a spec YAML that estimate/validate accept.")
HtmlOpt = typer.Option(None, "--html", metavar="FILE", help="Write a self-contained HTML report (opens offline).")
FoldOpt = typer.Option(False, "--fold-experts", help="Also try expert meshes folded over TP and CP (EP x ETP dividing "
                       "TP x CP x DP, Megatron-Core's MoE parallel folding), not only EP dividing DP: about twice the "
                       "plans to evaluate.")
UnevenOpt = typer.Option(False, "--uneven-stages", help="Also try pipelines whose PP x VPP chunks cannot split the "
                         "layers evenly, with the first and last stage's layers scaleplan states (Megatron-LM's "
                         "--decoder-first/last-pipeline-num-layers), not only even splits.")


def _banner(components: list[str]) -> None:
    if components:
        stderr.print(f"[yellow]note:[/yellow] analytic (no measured table or outside its groups): "
                     f"{', '.join(sorted(set(components)))} - run `scaleplan bench` for measured tables",
                     highlight=False)


def _estimator(spec, profile, db, extrapolate, calibration: str | None = None):
    """The Estimator for a spec's profile (or --profile) under ``--calibration ID|none``."""
    from scaleplan.estimator import Estimator
    from scaleplan.report.provenance import calibration_option

    cal_id, use = calibration_option(calibration)
    return Estimator(profile or spec.hardware.node_type, db_url=db_url(db), extrapolate=extrapolate,
                     calibration_id=cal_id, use_calibration=use)


def layout_arg(lo: dict) -> str:
    """A layout dict as --layout text (every field, ParallelLayout's order, then a stated stage split)."""
    from scaleplan.estimator.layout import FIELDS, SPLIT_FIELDS

    return ",".join(f"{k}={lo[k]}" for k in (*FIELDS, *SPLIT_FIELDS) if k in lo)


def _emit_estimates(docs: list[dict], res, spec, spec_path, n: int, profile, tokens: float | None,
                    mem_fraction: float, hybrid: bool = False) -> list[str]:
    """Give every feasible estimate its ``megatron_args``; an infeasible one gets ``megatron_refused`` (the
    estimator's reason) instead. Returns the one-line refusals."""
    from scaleplan.megatron.args import megatron_text

    refused, usable_gb, gpus_per_node = [], mem_fraction * profile.hbm_bytes / 1e9, profile.gpus_per_node
    for i, (d, r) in enumerate(zip(docs, res), 1):
        lay = layout_arg(d["layout"])
        if not r.feasible:
            why = r.reason or "infeasible"
            if why == "memory":
                why = f"memory: {r.mem_per_device_gb:,.0f} GB per GPU, {usable_gb:.0f} GB usable"
            d["megatron_refused"] = why
            refused.append(f"--layout {lay}: infeasible ({d['megatron_refused']}); no arguments emitted")
            continue
        cand = (f"{spec_path} under {lay} (layout {i} of {len(docs)}): predicted MFU {100 * r.mfu:.2f}%, "
                f"{r.mem_per_device_gb:.1f} GB per GPU")
        d["megatron_args"] = megatron_text(spec, d["layout"], n, gpus_per_node, cand, tokens, hybrid)
    return refused


def _cell(v) -> str:
    """A geometry value as printed: '-' for none, a non-integer ratio (G = d_ff / d_expert) to 3 digits."""
    if v is None:
        return "-"
    return f"{v:.3g}" if isinstance(v, float) and not v.is_integer() else str(v)


def memory_line(r) -> str:
    """The per-device memory of a result, by category, naming the pipeline stage it is the worst of (only the
    last stage holds the LM head, so elsewhere its logits are 0 and are left out)."""
    pp = int(r.layout["pp"])
    where = getattr(r, "mem_stage", None) or ("first" if r.mem_breakdown_gb.get("logits", 0.0) == 0.0 else "last")
    stage = "one stage (pp=1)" if pp == 1 else {
        "first": f"first of {pp} stages, no LM head so no logits",
        "middle": f"stage 1 of {pp}, a middle one: PP - 1 micro-batches in flight, no LM head so no logits",
        "last": f"last of {pp} stages, with the LM head"}[where]
    mem = ", ".join(f"{k} {v:.1f}" for k, v in r.mem_breakdown_gb.items() if v > 0 or k != "logits")
    return f"memory (GB per device, worst pipeline stage: {stage}): {mem}"


def print_geometry(rows: list[tuple[str, dict]], title: str) -> None:
    """A table of full geometries (label, geometry_dict) on stdout."""
    from rich.table import Table

    cols = ("", "L", "d", "d_ff", "d_expert", "heads", "kv heads", "head_dim", "vocab", "E", "K", "G", "shared")
    keys = ("n_layers", "d", "d_ff", "d_expert", "n_heads", "n_kv_heads", "head_dim", "vocab", "n_experts", "topk",
            "g", "d_shared_expert")
    t = Table(title=title)
    for c in cols:
        t.add_column(c, justify="right")
    for label, g in rows:
        t.add_row(label, *(_cell(g.get(k)) for k in keys))
    from rich.console import Console

    Console(width=max(stdout.width, 120), soft_wrap=True).print(t)  # never truncate a width when piped


def print_provenance(p: dict) -> None:
    from scaleplan.report.provenance import provenance_line

    stdout.print(provenance_line(p), highlight=False, markup=False)


def _row(r) -> list[str]:
    from scaleplan.estimator.layout import layout_text

    return [layout_text(r.layout),
            f"{100 * r.mfu:.2f}", f"{100 * r.hfu:.2f}", f"{r.t_iter_s:.3f}", f"{r.mem_per_device_gb:.1f}",
            f"{r.chi_sys:.3f}", "yes" if r.feasible else (r.reason or "no")]


def _device_count(spec, devices: int | None) -> int:
    """--devices, else the spec's device count (search.num_devices, or tp*cp*pp*dp of its parallelism block).
    Raises SpecError when neither is positive."""
    n = devices or spec.device_count()
    if not n or n <= 0:
        raise SpecError("--devices", devices, "a positive device count (or search.num_devices in the spec)")
    return n


def load_spec_with_stack(spec_path, stack: str | None = None):
    """The spec at ``spec_path``, its training stack overridden by ``stack`` (--stack key=value pairs); a note on
    stderr for each field read but not used (Spec.ignored)."""
    spec = specs.load_spec(spec_path)
    if stack:
        from scaleplan.specs import stack_features
        from scaleplan.stack import check_for_model, parse_stack

        st, moe = parse_stack(stack, spec.stack), spec.model.moe
        check_for_model(st, spec.model.precision, moe.capacity_factor if moe else None, **stack_features(spec.model))
        spec = spec.model_copy(update={"stack": st})
    for line in spec.ignored():
        stderr.print(f"note: {spec_path}: {line}", highlight=False, markup=False)
    return spec


def _batch_hint(spec, lo, dp: int, n: int, text: str | None) -> str:
    """What data.gbs must be for the layout ``lo`` (data parallel ``dp``) on ``n`` devices, with a checked fix
    (scaleplan/cli/suggest.py: a --layout on ``n`` devices, else the nearest device counts that fit)."""
    from scaleplan.cli.suggest import batch_hint

    hint = batch_hint(spec, lo, n)  # a --layout (or device count) that the same checks accept
    where = f"--layout {text}" if text else "the spec's layout"
    return f"a multiple of dp*mbs = {dp * lo.mbs} ({where}); {hint}"


def _origin(key: str, text: str | None, spec_path) -> str:
    """Where a layout degree came from: the --layout text that names it, else the spec's parallelism block."""
    if text is not None and any(p.split("=")[0].strip() == key for p in text.split(",")):
        return f"--layout {key}"
    return f"parallelism.{key} in {spec_path}"


def what_if_layouts(spec, spec_path, n: int, texts: list[str], devices_given: bool):
    """The plans `estimate` evaluates (a ParallelLayout, built once): each --layout over the spec's own layout
    as the default.

    The spec's ``parallelism.dp`` holds only for the device count it was written for: with --devices or
    --layout given and no ``dp=`` in the --layout text, dp is derived as N_dev / (tp cp pp). The layout's own
    rules (:data:`~scaleplan.estimator.layout.RULES`) judge the plans; a broken one raises SpecError naming
    where the degree came from (the --layout text or the spec file).
    """
    from scaleplan.estimator.layout import MODEL_PARALLEL, LayoutContext, ParallelLayout, stack_rules
    from scaleplan.estimator.model_dims import geometry

    base = spec.default_layout()
    derive = devices_given or bool(texts)
    los = []
    for text in texts or [None]:
        lo = specs.parse_layout(text, base) if text is not None else base
        if derive and base.dp is not None and _origin("dp", text, spec_path).startswith("parallelism"):
            lo = lo.model_copy(update={"dp": None})
        los.append(lo)
    plans = ParallelLayout.from_specs(los, n)
    # the mesh first, then a batch no dp divides: its hint names a layout that passes every rule
    v = plans.first_violation(LayoutContext(geometry(spec.model), n, spec.data.gbs, spec.data.seqlen,
                                            **stack_rules(spec.stack)),
                              prefer=("mesh_not_dividing_devices", "gbs_not_divisible"))
    if v is not None:
        text, lo = (texts or [None])[v.plan], los[v.plan]
        mesh = lo.tp * lo.cp * lo.pp
        if v.rule.name == "mesh_not_dividing_devices" and lo.dp is None:
            named = [k for k in MODEL_PARALLEL if getattr(lo, k) > 1]
            where = ", ".join(_origin(k, text, spec_path) for k in named)
            value = getattr(lo, named[0]) if len(named) == 1 else ", ".join(f"{k}={getattr(lo, k)}" for k in named)
            raise SpecError(where or "--layout", value, f"degrees whose product tp*cp*pp (here {mesh}) divides "
                            f"--devices {n}")
        if v.rule.name == "mesh_not_dividing_devices":
            hint = "" if text is not None else " (--devices or --layout on the command line derive dp)"
            raise SpecError(_origin("dp", text, spec_path), lo.dp,
                            f"dp with tp*cp*pp*dp = {n} devices, i.e. dp={n / mesh:g}, or leave dp out to "
                            f"derive it{hint}")
        if v.rule.name == "gbs_not_divisible":
            raise SpecError("data.gbs", spec.data.gbs, _batch_hint(spec, lo, int(plans.dp[v.plan]), n, text))
        raise SpecError(_origin(v.field, text, spec_path), v.value, v.allowed)
    return plans


def estimate(
    spec_path: Path = typer.Argument(..., metavar="SPEC.yaml", help="Model spec (paper listing format)."),
    devices: int = typer.Option(None, "--devices", help="N_dev (default: the spec's search.num_devices)."),
    layout: list[str] = typer.Option(None, "--layout", help="tp=1,cp=1,pp=2,ep=8,mbs=1,ckpt=full,vpp=1 (repeatable); "
                                     "keys not given keep the spec's layout, dp is derived unless given."),
    profile: str = ProfileOpt,
    db: str = DbOpt,
    extrapolate: str = ExtrapOpt,
    calibration: str = CalibrationOpt,
    stack: str = StackOpt,
    emit: str = EmitOpt,
    mem_fraction: float = MemFractionOpt,
    tokens: float = typer.Option(None, "--tokens", help="--emit megatron: the token budget D (tokens), emitted as "
                                 "--train-samples with the learning-rate schedule."),
    json_out: bool = JsonOpt,
) -> None:
    """Predict t_iter, MFU, HFU and memory of a spec under one or more layouts."""
    from scaleplan.emit import geometry_dict
    from scaleplan.report.provenance import provenance

    emit_mod.check_emit(emit)
    check_mem_fraction(mem_fraction)
    spec = load_spec_with_stack(spec_path, stack)
    emit_mod.check_emit(emit, spec.optimizer.optimizer_type)
    n = _device_count(spec, devices)
    layouts = what_if_layouts(spec, spec_path, n, layout or [], devices is not None)
    est = _estimator(spec, profile, db, extrapolate, calibration)
    res = est.estimate(spec, n, layouts, mem_fraction=mem_fraction)
    _banner([k for r in res for k, v in r.sources.items() if v == "analytic" and r.breakdown_s.get(k, 0) > 0])
    geom, prov = geometry_dict(spec.model), provenance(est)
    measured = measured_steps(res, spec, spec_path, n, est.profile.name)
    docs = [{**r.to_dict(), "geometry": geom, "provenance": prov,
             **({"measured": m} if m else {})} for r, m in zip(res, measured, strict=True)]
    if emit is not None:
        _print_megatron(docs, _emit_estimates(docs, res, spec, spec_path, n, est.profile, tokens, mem_fraction,
                                              emit == "megatron-hybrid"), want_json(json_out))
    elif want_json(json_out):
        print_json(docs)
    else:
        _print_estimates(res, f"{spec_path} on {n} x {est.profile.name}", spec, spec_path, geom, prov)
        for r, m in zip(res, measured, strict=True):
            if m:
                stdout.print(f"measured: {m['step_s']:.3f} s per step ({m['group']}; scaleplan spec published "
                             f"{m['id']}); predicted / measured {r.t_iter_s / m['step_s']:.2f}", highlight=False)


def measured_steps(res, spec, spec_path, n: int, profile: str) -> list[dict | None]:
    """For each estimate, the published step time of the run ``spec_path`` names (scaleplan.published) where the
    estimate is that run: its system, device count, batch, stack and layout (its dp derived); else None.
    ``{"id", "group", "step_s"}``."""
    from scaleplan import published
    from scaleplan.specs import Layout, parse_spec

    run = None if Path(spec_path).exists() else published.find(str(spec_path))
    if run is None or run.published_step_s is None or (profile, n) != (run.system, run.devices):
        return [None] * len(res)
    ran = parse_spec(run.doc, source=run.id)
    if (spec.stack, spec.data, spec.model) != (ran.stack, ran.data, ran.model):
        return [None] * len(res)
    want = Layout(**run.layout).model_dump(exclude={"dp"})
    hit = {"id": run.id, "group": run.group, "step_s": run.published_step_s}
    return [hit if {k: r.layout.get(k) for k in want} == want else None for r in res]


def _print_megatron(docs: list[dict], refused: list[str], as_json: bool) -> None:
    """--emit megatron: the arguments of every estimate (or the JSON); exit 2 after naming any refused."""
    if as_json:
        print_json(docs)
    else:
        typer.echo("\n\n".join(d["megatron_args"] for d in docs if "megatron_args" in d))
    for line in refused:
        stderr.print(f"error: {line}", highlight=False, markup=False)
    if refused:
        raise typer.Exit(2)


def _print_estimates(res, title: str, spec, spec_path, geom: dict, prov: dict) -> None:
    """The estimates as tables: one row per layout, then each layout's breakdown, memory and warnings."""
    from rich.table import Table

    t = Table(title=title)
    for c in ("layout", "MFU %", "HFU %", "t_iter s", "mem GB", "chi_sys", "fits"):
        t.add_column(c, overflow="fold" if c == "layout" else "ellipsis")  # a stated stage split stays whole
    for r in res:
        t.add_row(*_row(r))
    stdout.print(t)
    for r in res:
        b = Table(title=f"breakdown: {_row(r)[0]}")
        for c in ("component", "seconds", "share", "source"):
            b.add_column(c)
        tot = max(r.t_analytic_s, 1e-30)
        for k, v in sorted(r.breakdown_s.items(), key=lambda kv: -kv[1]):
            if v > 0:
                b.add_row(k, f"{v:.4f}", f"{100 * v / tot:.1f}%", r.sources.get(k, ""))
        stdout.print(b)
        stdout.print(memory_line(r), highlight=False)
        for w in r.warnings:
            stdout.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False)
    print_geometry([(spec.model.moe and "MoE" or "dense", geom)], f"geometry of {spec_path}")
    print_provenance(prov)


def layouts(
    spec_path: Path = typer.Argument(..., metavar="SPEC.yaml", help="Model spec (paper listing format)."),
    devices: int = typer.Option(None, "--devices", help="N_dev (default: the spec's search.num_devices)."),
    top: int = typer.Option(10, "--top", help="How many ranked plans to show."),
    max_tp: int = typer.Option(8, "--max-tp", help="Largest tensor-parallel degree TP to try (8: one node's NVLink)."),
    max_pp: int = typer.Option(None, "--max-pp", help="Largest pipeline degree PP to try (default: every divisor of N_dev)."),
    max_ep: int = typer.Option(None, "--max-ep", help="Largest expert-parallel degree EP to try (default: every divisor of N_dev)."),
    max_cp: int = typer.Option(None, "--max-cp", help="Largest context-parallel degree CP to try (default: every divisor of N_dev)."),
    mbs: str = typer.Option(",".join(map(str, SEARCH_MBS)), "--mbs", help="Micro-batch sizes to try."),
    vpp: str = typer.Option("1", "--vpp", help="Virtual pipeline degrees to try."),
    ckpt: str = typer.Option(CKPT_ALL, "--ckpt", help="Checkpointing modes to try."),
    fold_experts: bool = FoldOpt,
    uneven_stages: bool = UnevenOpt,
    mem_fraction: float = MemFractionOpt,
    profile: str = ProfileOpt,
    db: str = DbOpt,
    extrapolate: str = ExtrapOpt,
    calibration: str = CalibrationOpt,
    stack: str = StackOpt,
    emit: str = EmitOpt,
    emit_spec: Path = EmitSpecOpt,
    html: Path = HtmlOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Rank the feasible execution plans P_disc(N_dev) of a spec by predicted MFU."""
    from scaleplan.emit import geometry_dict
    from scaleplan.estimator import PlanConstraints
    from scaleplan.report.provenance import provenance

    emit_mod.check_emit(emit, files={"--emit-spec": emit_spec, "--html": html})
    spec = load_spec_with_stack(spec_path, stack)
    emit_mod.check_emit(emit, spec.optimizer.optimizer_type)
    n = _device_count(spec, devices)
    modes = specs.parse_ckpt_modes(ckpt)
    check_mem_fraction(mem_fraction)
    if top <= 0:
        raise SpecError("--top", top, "a positive integer")
    c = PlanConstraints(mbs=int_list("--mbs", mbs), vpp=int_list("--vpp", vpp), ckpt=modes, mem_fraction=mem_fraction,
                        max_tp=max_tp, max_pp=max_pp, max_ep=max_ep, max_cp=max_cp, fold_experts=fold_experts,
                        uneven_stages=uneven_stages)
    est = _estimator(spec, profile, db, extrapolate, calibration)
    from scaleplan.mosaic.edges import host_free_pass, layouts_edges, widened_pass

    res, edges = layouts_edges(est, spec, n, c, top)  # plan #1 on the largest mbs: one more, as the search does
    # beside the ranking: what the flags left out, and the ranking at no host cost where plan #1's host is untimed
    for key, info in (("widened", widened_pass(est, spec, n, c, res)), ("host_free", host_free_pass(est, spec, n, c, res))):
        if info is not None:
            edges[key] = info
    _banner(res.analytic_components)
    out = _layouts_doc(res, geometry_dict(spec.model), provenance(est), spec, spec_path, n, mem_fraction)
    out["edges"] = edges
    _layouts_outputs(out, spec, n, est, emit, emit_spec, html)
    if want_json(json_out):
        print_json(out)
    elif emit is not None and out["best"] is not None:
        typer.echo(out["megatron_args"])
    else:
        _print_layouts(out, res, f"{spec_path} on {n} x {est.profile.name}", spec_path)


def _print_layouts(out: dict, res, title: str, spec_path) -> None:
    """The ranked plans as a table, the infeasible counts, the geometry, provenance and files written."""
    from rich.table import Table

    t = Table(title=f"{title}: {res.n_feasible} feasible of {res.n_plans} plans")
    for col in ("#", "layout", "MFU %", "HFU %", "t_iter s", "mem GB", "chi_sys", "fits"):
        t.add_column(col, overflow="fold" if col == "layout" else "ellipsis")  # a stated stage split stays whole
    for i, r in enumerate(res.ranked, 1):
        t.add_row(str(i), *_row(r))
    stdout.print(t)
    if res.infeasible_counts:
        stdout.print("infeasible: " + ", ".join(f"{k} {v}" for k, v in sorted(res.infeasible_counts.items())),
                     highlight=False)
    from scaleplan.mosaic.edges import layouts_lines

    for line in layouts_lines(out.get("edges") or {}, out.get("best")):
        stdout.print(f"[yellow]edge:[/yellow] {escape(line)}", highlight=False)
    print_geometry([("model", out["geometry"])], f"geometry of {spec_path}")
    print_provenance(out["provenance"])
    for k, label in (("emitted_spec", "wrote the spec of plan #1 to"), ("html", "wrote the report")):
        if out.get(k):
            stderr.print(f"{label} {out[k]}", highlight=False)


def _layouts_doc(res, geom: dict, prov: dict, spec, spec_path, n: int, mem_fraction: float) -> dict:
    """The layouts JSON document: LayoutsResult.to_dict() plus geometry (on every plan and top level),
    ``best`` (plan #1 or None), provenance and the inputs."""
    out = res.to_dict()
    for r in out["ranked"]:
        r["geometry"] = geom
    out.update(best=out["ranked"][0] if out["ranked"] else None, geometry=geom, provenance=prov,
               spec=spec.model_dump(mode="json"), spec_path=str(spec_path), n_devices=n, mem_fraction=mem_fraction)
    return out


def _layouts_outputs(out: dict, spec, n: int, est, emit, emit_spec, html) -> None:
    """--emit megatron, --emit-spec and --html of `layouts` (each about plan #1)."""
    best = out["best"]
    if (emit or emit_spec) and best is None:
        raise SpecError("--emit/--emit-spec", "no feasible plan", "a spec with at least one feasible plan")
    if emit is not None:
        lay = layout_arg(best["layout"])
        from scaleplan.megatron.args import megatron_text

        out["megatron_args"] = megatron_text(spec, best["layout"], n, est.profile.gpus_per_node,
                                             f"plan #1 of {out['spec_path']}: {lay}, predicted MFU "
                                             f"{100 * best['mfu']:.2f}%, {best['mem_per_device_gb']:.1f} GB per GPU",
                                             hybrid=emit == "megatron-hybrid")
    if emit_spec:
        from scaleplan.emit import spec_from, write_spec

        lay = best["layout"]
        write_spec(emit_spec, spec_from(spec, lay, n),
                   f"scaleplan layouts: plan #1 of {out['spec_path']} on {n} x {est.profile.name}\n"
                   f"predicted MFU {100 * best['mfu']:.2f}%, {best['mem_per_device_gb']:.1f} GB per device\n"
                   f"estimate it with: scaleplan estimate {emit_spec}")
        out["emitted_spec"] = str(emit_spec)
    if html:
        from scaleplan.report.html import write_report

        write_report(html, "layouts", out)
        out["html"] = str(html)
