"""`scaleplan validate SPEC.yaml`: run real training steps of the reference model, compare with the estimator.

torch is imported only inside the command (so `scaleplan --help` and the planner commands stay fast).
"""
from __future__ import annotations

from pathlib import Path

import typer

from scaleplan.cli._common import (
    DbOpt,
    ExtrapOpt,
    JsonOpt,
    check_extrapolate,
    db_url,
    print_json,
    stderr,
    stdout,
    want_json,
)
from scaleplan.errors import SpecError

BENCH_HINT = ("measure this machine's tables first: `scaleplan bench plan {spec} --devices {n} --run "
              "--profile {profile}`")


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _err(meas, pred) -> str:
    return "-" if meas is None or pred is None else f"{(pred - meas) / meas:+.0%}"


def _print_table(rows: list[dict], profile: str, reason: str | None, hint: str, device: str) -> None:
    from rich.table import Table

    t = Table(title=f"predicted vs measured ({profile})", title_justify="left")
    for c in ("layout", "t_iter meas s", "t_iter pred s", "err", "MFU meas", "MFU pred", "mem meas GB",
              "mem pred GB", "obs id"):
        t.add_column(c, justify="left" if c == "layout" else "right")
    for r in rows:
        lay = r["layout"]
        t.add_row(f"dp={lay['dp']},mbs={lay['mbs']},ckpt={lay['ckpt']}",
                  _fmt(r["measured_t_iter_s"], ".4f"), _fmt(r["predicted_t_iter_s"], ".4f"),
                  _err(r["measured_t_iter_s"], r["predicted_t_iter_s"]),
                  _fmt(r["measured_mfu"], ".2%"), _fmt(r["predicted_mfu"], ".2%"),
                  _fmt(r["measured_peak_mem_gb"], ".3f"), _fmt(r["predicted_mem_gb"], ".3f"),
                  str(r["observation_id"]))
    stdout.print(t)
    stdout.print("mem meas: " + ("torch.cuda.max_memory_allocated" if device == "cuda" else
                                 "peak RSS growth of a worker over its RSS after imports") + "; GB = 1e9 bytes")
    _print_memory_and_load(rows, device)
    _print_components(rows)
    if reason:
        stdout.print(f"no prediction: {reason}")
        stdout.print(hint)


def _print_memory_and_load(rows: list[dict], device: str) -> None:
    """mem pred is the reference runner's peak allocated (estimator/memory.py, REFERENCE_DDP); on CUDA
    reserved beside it; then each row's machine-load warning, beside its figures."""
    for r in rows:
        lay = r["layout"]
        tag = f"dp={lay['dp']},mbs={lay['mbs']},ckpt={lay['ckpt']}"
        if device == "cuda" and r.get("predicted_mem_reserved_gb") is not None:
            stdout.print(f"{tag}: reserved meas {_fmt(r.get('measured_mem_reserved_gb'), '.3f')} GB, pred "
                         f"{r['predicted_mem_reserved_gb']:.3f} GB (allocator overhead "
                         f"{r['allocator_overhead']['fraction']:.0%}, {r['allocator_overhead']['source']})",
                         highlight=False)
        for w in r.get("warnings", []):
            stdout.print(f"[yellow]warning[/yellow] {tag}: {w}", highlight=False)


def _components(res, pred: dict | None) -> dict | None:
    """Measured (--trace) beside predicted time per component (scaleplan.validate.trace), or None."""
    tr = res.extra.get("trace")
    if not tr:
        return None
    from scaleplan.validate import trace as vtrace

    predicted = vtrace.predicted_components((pred or {}).get("breakdown_s"))
    return {"trace_path": tr["path"], "steps": tr["steps"], "step_wall_s": tr["step_wall_s"],
            "rows": vtrace.component_table(tr["components_s"], predicted), "top_ops": tr["top_ops"]}


def _print_components(rows: list[dict]) -> None:
    from rich.table import Table

    for r in rows:
        comp = r.get("components")
        if not comp:
            continue
        lay = r["layout"]
        t = Table(title=f"time per component, dp={lay['dp']},mbs={lay['mbs']},ckpt={lay['ckpt']} "
                        f"(s per step; traced steps {comp['step_wall_s']:.4f} s)", title_justify="left")
        for c in ("component", "measured s", "predicted s", "err"):
            t.add_column(c, justify="left" if c == "component" else "right")
        for c in comp["rows"]:
            t.add_row(c["component"], _fmt(c["measured_s"], ".4f"), _fmt(c["predicted_s"], ".4f"),
                      _fmt(c["error"], "+.0%"))
        stdout.print(t)
        stdout.print(f"trace: {comp['trace_path']} (open in https://ui.perfetto.dev or tensorboard --logdir)",
                     highlight=False)


def _measure_tables(spec: Path, layouts, nproc: int, profile: str, url, device: str, threads: int | None) -> None:
    """bench plan --run for exactly the lookups of these layouts (CPU: with the per-process thread count)."""
    import torch

    from scaleplan.bench import plan as bplan
    from scaleplan.validate.runner import default_threads

    if device == "cpu":
        torch.set_num_threads(threads or default_threads(nproc))
    lay = [",".join(f"{k}={v}" for k, v in x.model_dump().items() if v is not None) for x in layouts]
    # the reference stack: on a GPU profile too, the host rows ops:* of the model validate trains
    points, _ = bplan.lookups(spec, nproc, lay, profile, url, stack="reference")
    stderr.print(f"measuring {sum(len(v) for v in points.values())} table points for {profile}", highlight=False)
    from scaleplan.cli.bench import SweepProgress

    with SweepProgress() as on_event:  # a bar with ETA per suite, as `bench plan --run`
        bplan.run_lookups(points, spec, url, profile=profile, device=device, on_event=on_event)
    forget_cached_tables()


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


def forget_cached_tables() -> None:
    """The estimator caches a profile's tables per process; drop them after new measurements."""
    from scaleplan.estimator import tables

    clear = getattr(getattr(tables, "cached_tables", None), "cache_clear", None)
    if clear:
        clear()


def validate(
    spec: Path = typer.Argument(..., help="Model spec YAML."),
    layout: list[str] = typer.Option(None, "--layout", help="tp=1,cp=1,pp=1,ep=1,mbs=2,ckpt=full (repeatable; "
                                     "only data parallelism runs here). Default: the spec's layout."),
    steps: int = typer.Option(5, "--steps", help="Timed optimizer steps (median reported)."),
    warmup: int = typer.Option(2, "--warmup", help="Untimed warm-up steps."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    nproc: int = typer.Option(1, "--nproc", help="Data-parallel processes (gloo on CPU, NCCL on GPU)."),
    profile: str = typer.Option(None, "--profile", help="Hardware profile for the prediction and MFU "
                                "(default: cpu-local on CPU, the matching GPU profile on CUDA)."),
    threads: int = typer.Option(None, "--threads", help="CPU threads per process (default: cores / nproc)."),
    sweep: str = typer.Option("validate", "--sweep", help="Sweep name stored with the observed runs."),
    extrapolate: str = ExtrapOpt,
    store: bool = typer.Option(True, "--store/--no-store", help="Store each run as an ObservedRun."),
    bench: bool = typer.Option(False, "--bench", help="First measure on this machine the table points the "
                               "prediction looks up (`scaleplan bench plan SPEC --devices NPROC --run`), with "
                               "the threads each DP process gets."),
    trace: Path = typer.Option(None, "--trace", metavar="DIR", help="Also profile 2 more steps per layout "
                               "(torch.profiler, CPU + CUDA) into DIR/<layout>/rank0.pt.trace.json (Perfetto, "
                               "TensorBoard) and print measured vs predicted time per component."),
    html: Path = typer.Option(None, "--html", metavar="FILE", help="Also write a self-contained HTML report "
                              "(measured vs predicted, predicted per-component bars)."),
    db: str = DbOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Run forward+backward+AdamW steps per layout, measure step time, MFU and peak memory, store them,
    and print them beside the estimator's prediction."""
    from scaleplan.profiles import load_profile
    from scaleplan.specs import load_spec, parse_layout
    from scaleplan.validate import compare
    from scaleplan.validate import memory as vmem
    from scaleplan.validate.rows import extend_row
    from scaleplan.validate.runner import RunConfig, check_layout, run_layout

    if device not in ("cpu", "cuda"):
        raise SpecError("--device", device, "cpu or cuda")
    if nproc < 1:
        raise SpecError("--nproc", nproc, "a positive integer")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SpecError("--device", "cuda", "no CUDA device is visible here; use --device cpu")
    check_extrapolate(extrapolate)
    if html is not None and not Path(html).resolve().parent.is_dir():  # before minutes of training steps
        raise SpecError("--html", str(html), "a file in an existing directory")
    sp = load_spec(spec)
    base = sp.default_layout()
    layouts = [parse_layout(s, base) for s in layout] if layout else [base]
    for lay in layouts:
        check_layout(sp, lay, nproc)  # refuse before running anything
    layouts = [lay.model_copy(update={"dp": nproc}) for lay in layouts]
    url = db_url(db)
    profile = profile or compare.default_profile(device, nproc)
    peak = load_profile(profile).peak(sp.model.precision)
    if bench:
        _measure_tables(spec, layouts, nproc, profile, url, device, threads)
    preds, reason = compare.predict(sp, layouts, nproc, profile, url, extrapolate)
    overhead = vmem.measured_allocator_overhead(url, _gpu_name()) if device == "cuda" else None
    rows = []
    for i, lay in enumerate(layouts):
        stderr.print(f"[{i + 1}/{len(layouts)}] {spec.name}: dp={nproc} mbs={lay.mbs} ckpt={lay.ckpt}, "
                     f"{warmup}+{steps} steps on {device}", highlight=False)
        cfg = RunConfig(spec=sp.model_dump(mode="json"), layout=lay.model_dump(), steps=steps, warmup=warmup,
                        device=device, nproc=nproc, threads=threads, trace_dir=str(trace) if trace else None,
                        trace_tag=f"dp{nproc}_mbs{lay.mbs}_{lay.ckpt}")
        res = run_layout(cfg)
        m = compare.mfu(sp, res.t_iter_s, nproc, peak)
        oid = compare.store_observation(url, sp, spec.stem, lay, nproc, profile, res, m, preds[i], sweep,
                                        steps, warmup, device) if store else None
        mem_pred = vmem.predict_reference_memory(sp, lay, device, overhead)
        rows.append(extend_row(compare.comparison_row(lay, nproc, res, m, preds[i], oid), res, mem_pred,
                               _components(res, preds[i])))
    if html:
        from scaleplan.report.html import write_report

        write_report(html, "validate", {"rows": [dict(r, predicted_breakdown_s=(p or {}).get("breakdown_s"))
                                                 for r, p in zip(rows, preds)], "spec_path": str(spec),
                                        "profile": profile, "device": device, "spec": sp.model_dump(mode="json")})
        stderr.print(f"wrote the report {html}", highlight=False)
    if want_json(json_out):
        print_json(rows)
    else:
        hint = BENCH_HINT.format(spec=spec, n=nproc, profile=profile)
        _print_table(rows, profile, reason, hint, device)
