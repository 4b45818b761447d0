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
    escape,
    print_json,
    stderr,
    stdout,
    want_json,
)


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
            stdout.print(f"[yellow]warning[/yellow] {tag}: {escape(w)}", highlight=False)


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
        tot = comp.get("in_trace")
        if tot and tot["device_s"] > 0:  # a GPU trace: its own device time beside what was attributed
            stdout.print(f"in the trace per step: {tot['kernels']:.0f} kernels, {tot['launches']:.0f} launches, "
                         f"device {tot['device_s']:.4f} s (busy {tot['busy_s']:.4f} s); attributed "
                         f"{comp['attributed_device_s']:.4f} s", highlight=False)
        stdout.print(f"trace: {comp['trace_path']} (open in https://ui.perfetto.dev or tensorboard --logdir)",
                     highlight=False)


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
    from scaleplan.cli.bench import SweepProgress
    from scaleplan.validate.loop import ValidateRequest, run_validation

    check_extrapolate(extrapolate)
    req = ValidateRequest(spec=spec, layouts=tuple(layout or ()), steps=steps, warmup=warmup, device=device,
                          nproc=nproc, profile=profile, threads=threads, sweep=sweep, extrapolate=extrapolate,
                          store=store, bench=bench, trace=trace, html=html, db_url=db_url(db))
    report = run_validation(req, say=lambda line: stderr.print(line, highlight=False),
                            bench_progress=SweepProgress)
    if html:
        stderr.print(f"wrote the report {html}", highlight=False)
    if want_json(json_out):
        print_json(report.rows)
    else:
        _print_table(report.rows, report.profile, report.reason, report.hint, device)
