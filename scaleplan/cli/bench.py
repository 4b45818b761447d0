"""`scaleplan bench`: run | plan | runs | export — measure kernels and collectives into the database.

torch is imported only inside the commands, so `scaleplan --help` and the planner commands stay fast.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import typer

from scaleplan.cli._common import DbOpt, JsonOpt, db_url, print_json, stderr, stdout, want_json
from scaleplan.errors import ScaleplanError, SpecError

app = typer.Typer(no_args_is_help=True)

SuiteOpt = typer.Option(
    None,
    "--suite",
    help="Comma-separated suites (default: every suite in the preset): "
    "gemm, grouped_gemm, sdpa, router, elementwise, vocab, collectives, dispatch.",
)
ProfileOpt = typer.Option(
    None,
    "--profile",
    help="Cluster profile for utilisation and the run's label "
    "(default: cpu-local on CPU, else derived from the GPU name).",
)
DeviceOpt = typer.Option(None, "--device", help="cpu or cuda (default: cuda when available).")
AsProfileOpt = typer.Option(
    False,
    "--as-profile",
    help="Store the timings under --profile even though its GPU is not the device this runs on "
    "(recorded in the run's provenance; without it such a run is refused).",
)


def _ids(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise SpecError("--resume", text, "a comma-separated list of run ids") from None


@contextlib.contextmanager
def _exit_codes():
    """Ctrl-C / SIGTERM during a sweep -> exit status 130 (the runs are already marked interrupted).

    Raised as SystemExit here because typer, called with standalone_mode=False, turns a
    KeyboardInterrupt into a *returned* 130 that the entry point does not pass on.
    """
    try:
        yield
    except KeyboardInterrupt:
        stderr.print("interrupted: resume with --resume RUN_ID (see `scaleplan bench runs`)")
        sys.exit(130)


def point_label(point: dict, width: int = 60) -> str:
    """A point's key as one short line (``m=8 n=256 k=256 dtype=fp32``), cut at ``width`` characters."""
    text = " ".join(f"{k}={v}" for k, v in point.items())
    return text if len(text) <= width else text[: width - 1] + "…"


class SweepProgress:
    """The on_event callback of a sweep: a rich bar with ETA per suite on stderr (points measured of
    points to measure; collectives ranks report theirs through ``suite_progress``), and one line
    above it for each failed point, hint and error. A context manager: the bar lives inside ``with``."""

    def __init__(self, quiet: bool = False):
        from scaleplan.progress import make_bar

        self.bar = make_bar(console=stderr.get(), disable=quiet)
        self.quiet, self.tasks = quiet, {}

    def __enter__(self):  # the bar starts with the first suite: a refusal before it prints only its line
        return self

    def __exit__(self, *exc):
        if self.tasks:
            self.bar.stop()
        return False

    def _say(self, text: str) -> None:
        if not self.quiet:
            self.bar.console.print(text, highlight=False)

    def __call__(self, kind: str, info: dict) -> None:
        rid = info.get("run_id")
        if kind == "suite_start":
            if not self.tasks:
                self.bar.start()
            total = info.get("todo")
            self.tasks[rid] = self.bar.add_task(f"run {rid} {info['suite']}", total=total)
            if total is not None:
                self._say(f"run {rid} {info['suite']}: {total} of {info['points']} points to measure")
        elif kind == "point_start" and rid in self.tasks:  # the bar names the point being measured
            what = f"run {rid} {info['suite']} {point_label(info['point'])}"
            self.bar.update(self.tasks[rid], description=what)
        elif kind == "skip":
            if rid in self.tasks:
                self.bar.advance(self.tasks[rid])
            self._say(f"  skipped {info['suite']} {point_label(info['point'])}: {info['reason']}")
        elif kind == "point":
            if rid in self.tasks:
                self.bar.advance(self.tasks[rid])
            r = info["row"]
            if r["status"] != "OK":
                self._say(f"  {r['status']}: {r.get('note') or ''}")
        elif kind == "suite_progress" and rid in self.tasks:
            self.bar.update(self.tasks[rid], completed=info["done"], total=info["total"])
        elif kind == "suite_done" and rid in self.tasks:  # a launched suite may have reported nothing
            total = (info.get("measured") or 0) + (info.get("over_budget") or 0)
            self.bar.update(self.tasks[rid], completed=total, total=total,
                            description=f"run {rid} {info['suite']}")
        elif kind == "hint":
            ids = ",".join(map(str, info["same_config"]))
            self._say(f"  note: run(s) {ids} swept the same {info['suite']} config and did not complete; "
                      f"`--resume {ids}` would measure only their missing points")
        elif kind == "error":
            self._say(f"[red]run {rid} {info['suite']}:[/red] {info['message']}")


def _print_results(results: list, wall_s: float, as_json: bool, url: str | None) -> None:
    """The runs' table (or JSON), once a new connection sees every run it names (db.session.read_back)."""
    from scaleplan.db.models import BenchRun
    from scaleplan.db.session import read_back

    rows = [r.to_dict() for r in results]
    read_back(url, BenchRun, [r["run_id"] for r in rows])
    if as_json:
        print_json({"runs": rows, "wall_s": wall_s})
        return
    from rich.table import Table

    t = Table("run", "suite", "status", "points", "measured", "already stored", "by status", "wall s")
    for r in rows:
        t.add_row(
            str(r["run_id"]),
            r["suite"],
            r["status"],
            str(r["points"]),
            str(r["measured"]),
            str(r["already_stored"]),
            " ".join([f"{k}={v}" for k, v in sorted(r["by_status"].items())]
                     + ([f"over_budget={r['over_budget']}"] if r.get("over_budget") else [])),
            f"{r['wall_s']:.1f}",
        )
    stdout.print(t)
    stdout.print(f"total {wall_s:.1f} s")


@app.command("run")
def run(
    preset: str = typer.Option("quick", "--preset", help="quick, node, or a preset YAML file."),
    suite: str = SuiteOpt,
    profile: str = ProfileOpt,
    db: str = DbOpt,
    resume: str = typer.Option(
        None, "--resume", help="Run id(s), comma-separated: measure only their missing points (same config)."
    ),
    device: str = DeviceOpt,
    as_profile: bool = AsProfileOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Measure the suites of a preset; each point is committed as it is measured."""
    from scaleplan.bench import runner
    from scaleplan.bench.collective_ranks import in_torchrun
    from scaleplan.bench.config import load_preset

    url = db_url(db)
    suites = [s.strip() for s in suite.split(",")] if suite else None
    ids = _ids(resume)
    t0 = time.perf_counter()
    if in_torchrun():
        _run_torchrun(preset, suites, profile, url, device, ids, json_out, as_profile)
        return
    with _exit_codes(), SweepProgress() as on_event:
        if ids:
            results = runner.resume_runs(ids, url, device=device, on_event=on_event)
        else:
            results = runner.run_preset(
                load_preset(preset),
                url,
                suites=suites,
                profile=profile,
                device=device,
                preset_label=preset,
                on_event=on_event,
                as_profile=as_profile,
            )
    _print_results(results, time.perf_counter() - t0, want_json(json_out), url)
    if any(r.status != "complete" for r in results):
        sys.exit(1)


def _run_torchrun(preset, suites, profile, url, device, ids, json_out, as_profile=False) -> None:
    """One rank of a multi-process collectives sweep; only rank 0 prints."""
    from scaleplan.bench import runner
    from scaleplan.bench.config import load_preset

    if suites and suites != ["collectives"]:
        raise ScaleplanError(
            "under torchrun only --suite collectives runs (start the other suites without torchrun)"
        )
    if len(ids) > 1:
        raise ScaleplanError("under torchrun --resume takes one collectives run id")
    p = None if ids else load_preset(preset)
    summary = runner.run_under_torchrun(
        p, url, profile=profile, device=device, preset_label=preset, resume_id=ids[0] if ids else None,
        as_profile=as_profile,
    )
    if summary is not None:
        from scaleplan.db.models import BenchRun
        from scaleplan.db.session import read_back

        read_back(url, BenchRun, [summary["run_id"]])
        if want_json(json_out):
            print_json(summary)
        else:
            stdout.print(
                f"run {summary['run_id']} collectives: {summary['measured']} measured, "
                f"{summary['already_stored']} already stored, by status {summary['by_status']}"
            )


@app.command("plan")
def plan(
    spec: Path = typer.Argument(None, help="Spec YAML (or --search)."),
    devices: int = typer.Option(None, "--devices", min=1, help="Number of devices N (with SPEC)."),
    search: Path = typer.Option(None, "--search", help="A `scaleplan search --json` output: the points its "
                                "near-tie set (P(optimal) >= 5%; else the optimum) looks up, instead of SPEC's."),
    layout: list[str] = typer.Option(
        None,
        "--layout",
        help="Layout(s), e.g. tp=1,pp=2,ep=8,mbs=1,ckpt=full "
        "(default: the layouts the estimator would rank).",
    ),
    profile: str = ProfileOpt,
    db: str = DbOpt,
    run_: bool = typer.Option(False, "--run", help="Measure exactly these points now."),
    device: str = DeviceOpt,
    as_profile: bool = AsProfileOpt,
    json_out: bool = JsonOpt,
) -> None:
    """List the table points an estimate of SPEC on N devices looks up (and measure them with --run)."""
    from scaleplan.bench import plan as bplan

    url = db_url(db)
    if (spec is None) == (search is None):
        raise ScaleplanError("bench plan: give a SPEC (with --devices) or --search SEARCH.json, not both")
    if search is not None:
        _plan_search(search, profile, url, run_, device, json_out)
        return
    if devices is None:
        raise ScaleplanError("bench plan: --devices is required with a SPEC")
    lookups, prof = bplan.lookups(spec, devices, layout or None, profile, url)
    if not run_:
        if want_json(json_out):
            print_json(
                {
                    "profile": prof,
                    "devices": devices,
                    "lookups": lookups,
                    "counts": {k: len(v) for k, v in lookups.items()},
                }
            )
        else:
            for suite_name, pts in lookups.items():
                stdout.print(f"[bold]{suite_name}[/bold] ({len(pts)} points)")
                for p in pts:
                    stdout.print("  " + ", ".join(f"{k}={v}" for k, v in p.items()), highlight=False)
        return
    t0 = time.perf_counter()
    with _exit_codes(), SweepProgress() as on_event:
        results = bplan.run_lookups(
            lookups, spec, url, profile=profile, device=device, on_event=on_event,
            as_profile=as_profile,
        )
    _print_results(results, time.perf_counter() - t0, want_json(json_out), url)


def _plan_search(search: Path, profile: str | None, url, run_: bool, device, json_out: bool) -> None:
    """bench plan --search: the points the search's near-tie set looks up (see scaleplan.mosaic.table_points)."""
    from scaleplan.bench import plan as bplan
    from scaleplan.db.session import ensure_schema, resolve_url
    from scaleplan.estimator import Estimator
    from scaleplan.mosaic.table_points import deciding_points, read_search

    found = read_search(search)
    url = resolve_url(url)
    ensure_schema(url)
    prof = profile or found["profile"]
    got = deciding_points(found, Estimator(profile=prof, db_url=url, extrapolate="clamp"))
    if not run_:
        if want_json(json_out):
            print_json({"profile": prof, "devices": found["n_devices"], **got})
            return
        stdout.print(f"points the near-tie set looks up ({', '.join(got['candidates']) or 'none'}):")
        for suite_name, pts in got["lookups"].items():
            stdout.print(f"[bold]{suite_name}[/bold] ({len(pts)} points)")
            for p in pts:
                stdout.print("  " + ", ".join(f"{k}={v}" for k, v in p.items() if k != "needed_by")
                             + f"  <- {len(p['needed_by'])} candidate(s)", highlight=False)
        return
    points = {s: [{k: v for k, v in p.items() if k != "needed_by"} for p in pts] for s, pts in got["lookups"].items()}
    t0 = time.perf_counter()
    with _exit_codes(), SweepProgress() as on_event:
        results = bplan.run_lookups(points, search, url, profile=prof, device=device, on_event=on_event)
    _print_results(results, time.perf_counter() - t0, want_json(json_out), url)


@app.command("runs")
def runs(
    db: str = DbOpt,
    json_out: bool = JsonOpt,
    source: str = typer.Option(None, "--source", help="measured or imported (default: both)."),
) -> None:
    """Stored benchmark runs with their provenance and point counts per status."""
    from scaleplan.bench import store
    from scaleplan.db.session import ensure_schema, resolve_url

    url = resolve_url(db_url(db))
    ensure_schema(url)
    if source not in (None, "measured", "imported"):
        raise SpecError("--source", source, "measured or imported")
    rows = store.list_runs(url, source)
    if want_json(json_out):
        print_json({"runs": rows})
        return
    from rich.table import Table

    t = Table("id", "suite", "profile", "status", "points", "by status", "device", "started (UTC)")
    for r in rows:
        t.add_row(
            str(r["id"]),
            r["suite"],
            r["profile"],
            r["status"] if r["source"] == "measured" else "imported",
            str(r["points"]),
            " ".join([f"{k}={v}" for k, v in sorted(r["by_status"].items())]
                     + ([f"over_budget={r['over_budget']}"] if r.get("over_budget") else [])),
            (r["gpu_name"] or r["device"] or "") + (" (as profile)" if r.get("as_profile") else ""),
            (r["started_at"] or "")[:16].replace("T", " "),
        )
    stdout.print(t)


@app.command("export")
def export(
    run_ids: list[int] = typer.Argument(..., help="Run ids to export."),
    out: Path = typer.Option(..., "--out", help="Directory for <suite>.csv files."),
    db: str = DbOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Write runs as recorded CSV tables (`scaleplan db import-recorded DIR` reads them back)."""
    from scaleplan.bench import store
    from scaleplan.db.session import ensure_schema, resolve_url

    url = resolve_url(db_url(db))
    ensure_schema(url)
    written = store.export_runs(url, run_ids, out)
    if want_json(json_out):
        print_json({"files": [{"path": str(p), "rows": n} for p, n in written]})
    else:
        for p, n in written:
            stdout.print(f"{p}: {n} rows", highlight=False)


@app.command("check")
def check(
    size: int = typer.Option(None, "--size", help="n of the n^3 GEMM (default 8192 on GPU, 1024 on CPU)."),
    dtype: str = typer.Option("bf16", "--dtype"),
    device: str = DeviceOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Check the timing method: harness GEMM throughput >= 90% of a plain torch.matmul loop."""
    from scaleplan.bench.checks import gemm_timing_check
    from scaleplan.bench.runner import resolve_device

    dev = resolve_device(device)
    res = gemm_timing_check(dev, size or (8192 if dev.type == "cuda" else 1024), dtype)
    if want_json(json_out):
        print_json(res)
    else:
        stdout.print(
            f"{res['dtype']} {res['n']}^3 on {res['device']}: harness {res['harness_flops_per_s'] / 1e12:.2f} "
            f"TFLOP/s, plain loop {res['plain_flops_per_s'] / 1e12:.2f} TFLOP/s, ratio {res['ratio']:.3f} "
            f"({'pass' if res['passed'] else 'FAIL'} at {res['threshold']})"
        )
    if not res["passed"]:
        sys.exit(1)
