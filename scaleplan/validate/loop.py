"""The whole of ``scaleplan validate`` as one call: a :class:`ValidateRequest` in, a :class:`ValidateReport` out.

:func:`run_validation` checks the request, optionally measures this machine's table points first
(``--bench``), predicts every layout with the estimator, runs the reference model's steps per layout
(:mod:`scaleplan.validate.runner`), stores each run as an ObservedRun, predicts the reference runner's
memory and writes the HTML report. The CLI parses, calls and prints. torch is imported only when it runs.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaleplan.errors import SpecError

BENCH_HINT = ("measure this machine's tables first: `scaleplan bench plan {spec} --devices {n} --run "
              "--profile {profile}`")


@dataclass(frozen=True)
class ValidateRequest:
    """Inputs of one validation: the spec file, layout texts (``tp=1,mbs=2,ckpt=full``; empty: the spec's
    layout; only DP runs), ``steps`` timed after ``warmup`` untimed optimizer steps on ``device`` ('cpu' or
    'cuda') in ``nproc`` DP processes; ``profile`` None: the local machine's (compare.default_profile)."""

    spec: Path
    layouts: tuple[str, ...] = ()
    steps: int = 5
    warmup: int = 2
    device: str = "cpu"
    nproc: int = 1
    profile: str | None = None
    threads: int | None = None
    sweep: str = "validate"
    extrapolate: str = "compose"
    store: bool = True
    bench: bool = False
    trace: Path | None = None
    html: Path | None = None
    db_url: str | None = None


@dataclass
class ValidateReport:
    """``rows``: one dict per layout (the ``--json`` document: measured vs predicted time, MFU, memory,
    observation id, components with --trace). ``reason``: why there is no prediction (None when there is);
    ``hint``: the command that measures the missing tables."""

    request: ValidateRequest
    profile: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    reason: str | None = None

    @property
    def hint(self) -> str:
        r = self.request
        return BENCH_HINT.format(spec=r.spec, n=r.nproc, profile=self.profile)


def check_request(r: ValidateRequest) -> None:
    """Raises SpecError naming --device, --nproc or --html before any work (training takes minutes): a device
    other than cpu/cuda, cuda where none is visible, or an HTML file in no directory."""
    if r.device not in ("cpu", "cuda"):
        raise SpecError("--device", r.device, "cpu or cuda")
    if r.nproc < 1:
        raise SpecError("--nproc", r.nproc, "a positive integer")
    if r.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SpecError("--device", "cuda", "no CUDA device is visible here; use --device cpu")
    if r.html is not None and not Path(r.html).resolve().parent.is_dir():
        raise SpecError("--html", str(r.html), "a file in an existing directory")


def _layouts(r: ValidateRequest):
    """(spec, layouts with dp = nproc); raises SpecError for a layout the reference runner cannot run."""
    from scaleplan.specs import load_spec, parse_layout
    from scaleplan.validate.runner import check_layout

    sp = load_spec(r.spec)
    base = sp.default_layout()
    layouts = [parse_layout(s, base) for s in r.layouts] if r.layouts else [base]
    for lay in layouts:
        check_layout(sp, lay, r.nproc)  # refuse before running anything
    return sp, [lay.model_copy(update={"dp": r.nproc}) for lay in layouts]


def run_validation(r: ValidateRequest, say: Callable[[str], None] = lambda line: None,
                   bench_progress: Callable[[], Any] = contextlib.nullcontext) -> ValidateReport:
    """Measure (optionally), predict, run, store and compare every layout of ``r``.

    ``say`` receives one progress line per layout (and the --bench point count); ``bench_progress()`` is a
    context manager whose value is the on_event callback of the --bench sweep (None: no progress).
    Raises SpecError for a bad request, spec or layout before anything runs."""
    from scaleplan.profiles import load_profile
    from scaleplan.validate import compare
    from scaleplan.validate import memory as vmem

    check_request(r)
    sp, layouts = _layouts(r)
    profile = r.profile or compare.default_profile(r.device, r.nproc)
    peak = load_profile(profile).peak(sp.model.precision)
    if r.bench:
        _measure_tables(r, layouts, profile, say, bench_progress)
    preds, reason = compare.predict(sp, layouts, r.nproc, profile, r.db_url, r.extrapolate)
    overhead = vmem.measured_allocator_overhead(r.db_url, _gpu_name()) if r.device == "cuda" else None
    report = ValidateReport(r, profile, reason=reason)
    for i, lay in enumerate(layouts):
        say(f"[{i + 1}/{len(layouts)}] {r.spec.name}: dp={r.nproc} mbs={lay.mbs} ckpt={lay.ckpt}, "
            f"{r.warmup}+{r.steps} steps on {r.device}")
        report.rows.append(_run_one(r, sp, lay, profile, peak, preds[i], overhead))
    if r.html:
        _write_html(report, sp, preds)
    return report


def _run_one(r: ValidateRequest, sp, lay, profile: str, peak: float, pred: dict | None, overhead) -> dict:
    """Train one layout, store it (unless --no-store), and return its comparison row."""
    from scaleplan.validate import compare
    from scaleplan.validate import memory as vmem
    from scaleplan.validate.rows import extend_row
    from scaleplan.validate.runner import RunConfig, run_layout

    cfg = RunConfig(spec=sp.model_dump(mode="json"), layout=lay.model_dump(), steps=r.steps, warmup=r.warmup,
                    device=r.device, nproc=r.nproc, threads=r.threads, trace_dir=str(r.trace) if r.trace else None,
                    trace_tag=f"dp{r.nproc}_mbs{lay.mbs}_{lay.ckpt}")
    res = run_layout(cfg)
    m = compare.mfu(sp, res.t_iter_s, r.nproc, peak)
    oid = compare.store_observation(r.db_url, sp, r.spec.stem, lay, r.nproc, profile, res, m, pred, r.sweep,
                                    r.steps, r.warmup, r.device) if r.store else None
    mem_pred = vmem.predict_reference_memory(sp, lay, r.device, overhead)
    return extend_row(compare.comparison_row(lay, r.nproc, res, m, pred, oid), res, mem_pred, _components(res, pred))


def _components(res, pred: dict | None) -> dict | None:
    """Measured (--trace) beside predicted time per component (scaleplan.validate.trace), or None."""
    tr = res.extra.get("trace")
    if not tr:
        return None
    from scaleplan.validate import trace as vtrace

    predicted = vtrace.predicted_components((pred or {}).get("breakdown_s"))
    attributed = sum(t for c, t in tr["components_s"].items() if c != "host gaps/idle")
    return {"trace_path": tr["path"], "steps": tr["steps"], "step_wall_s": tr["step_wall_s"],
            "rows": vtrace.component_table(tr["components_s"], predicted), "top_ops": tr["top_ops"],
            "ops": tr.get("ops"), "in_trace": tr.get("in_trace"), "attributed_device_s": attributed}


def _write_html(report: ValidateReport, sp, preds: list) -> None:
    from scaleplan.report.html import write_report

    r = report.request
    rows = [dict(row, predicted_breakdown_s=(p or {}).get("breakdown_s")) for row, p in zip(report.rows, preds)]
    write_report(r.html, "validate", {"rows": rows, "spec_path": str(r.spec), "profile": report.profile,
                                      "device": r.device, "spec": sp.model_dump(mode="json")})


def _measure_tables(r: ValidateRequest, layouts, profile: str, say, bench_progress) -> None:
    """bench plan --run for exactly the lookups of these layouts (CPU: with the per-process thread count)."""
    import torch

    from scaleplan.bench import plan as bplan
    from scaleplan.validate.runner import default_threads

    if r.device == "cpu":
        torch.set_num_threads(r.threads or default_threads(r.nproc))
    lay = [",".join(f"{k}={v}" for k, v in x.model_dump().items() if v is not None) for x in layouts]
    # the reference stack: on a GPU profile too, the host rows ops:* of the model validate trains
    points, _ = bplan.lookups(r.spec, r.nproc, lay, profile, r.db_url, stack="reference")
    say(f"measuring {sum(len(v) for v in points.values())} table points for {profile}")
    with bench_progress() as on_event:  # a bar with ETA per suite, as `bench plan --run`
        bplan.run_lookups(points, r.spec, r.db_url, profile=profile, device=r.device, on_event=on_event)
    forget_cached_tables()


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


def forget_cached_tables() -> None:
    """The estimator caches a profile's tables per process; drop them after new measurements."""
    from scaleplan.estimator.table_build import cached_tables

    cached_tables.cache_clear()
