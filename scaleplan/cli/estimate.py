"""`scaleplan estimate` and `scaleplan layouts`: the performance model on the command line.

Both print one JSON document with ``--json`` (estimate: a list of result objects; layouts: an
object with ``ranked`` and ``infeasible_counts``), else rich tables. Components costed without a
measured table are labelled "analytic" and a one-line banner on stderr says to run
`scaleplan bench`. Never imports torch.
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
from scaleplan.specs import CKPT_MODES, load_spec, parse_ckpt_modes, parse_layout

ProfileOpt = typer.Option(None, "--profile", help="Hardware profile (default: the spec's hardware.node_type).")


def _banner(components: list[str]) -> None:
    if components:
        stderr.print(f"[yellow]note:[/yellow] analytic (no measured table or outside its groups): "
                     f"{', '.join(sorted(set(components)))} - run `scaleplan bench` for measured tables",
                     highlight=False)


def _ints(text: str | None, name: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SpecError(name, text, "comma-separated positive integers") from None
    if not vals or min(vals) <= 0:
        raise SpecError(name, text, "comma-separated positive integers")
    return vals


def _estimator(spec, profile, db, extrapolate, calibration=None):
    from scaleplan.estimator import Estimator

    return Estimator(profile or spec.hardware.node_type, db_url=db_url(db), extrapolate=extrapolate,
                     calibration_id=calibration)


def _row(r) -> list[str]:
    lo = r.layout
    return [f"tp={lo['tp']} cp={lo['cp']} pp={lo['pp']} dp={lo['dp']} ep={lo['ep']} etp={lo['etp']} "
            f"vpp={lo['vpp']} mbs={lo['mbs']} {lo['ckpt']}",
            f"{100 * r.mfu:.2f}", f"{100 * r.hfu:.2f}", f"{r.t_iter_s:.3f}", f"{r.mem_per_device_gb:.1f}",
            f"{r.chi_sys:.3f}", "yes" if r.feasible else (r.reason or "no")]


def _device_count(spec, devices: int | None) -> int:
    """--devices, else the spec's search.num_devices. Raises SpecError when neither is positive."""
    n = devices or spec.search.num_devices
    if not n or n <= 0:
        raise SpecError("--devices", devices, "a positive device count (or search.num_devices in the spec)")
    return n


def estimate(
    spec_path: Path = typer.Argument(..., metavar="SPEC.yaml", help="Model spec (paper listing format)."),
    devices: int = typer.Option(None, "--devices", help="N_dev (default: the spec's search.num_devices)."),
    layout: list[str] = typer.Option(None, "--layout", help="tp=1,cp=1,pp=2,ep=8,mbs=1,ckpt=full,vpp=1 (repeatable)."),
    profile: str = ProfileOpt,
    db: str = DbOpt,
    extrapolate: str = ExtrapOpt,
    calibration: int = typer.Option(None, "--calibration", help="Calibration id to apply (default: the newest)."),
    json_out: bool = JsonOpt,
) -> None:
    """Predict t_iter, MFU, HFU and memory of a spec under one or more layouts."""
    spec = load_spec(spec_path)
    n = _device_count(spec, devices)
    base = spec.default_layout()
    layouts = [parse_layout(t, base) for t in layout] if layout else [base]
    est = _estimator(spec, profile, db, extrapolate, calibration)
    res = est.estimate(spec, n, layouts)
    _banner([k for r in res for k, v in r.sources.items() if v == "analytic" and r.breakdown_s.get(k, 0) > 0])
    if want_json(json_out):
        print_json([r.to_dict() for r in res])
        return
    from rich.table import Table

    t = Table(title=f"{spec_path} on {n} x {est.profile.name}")
    for c in ("layout", "MFU %", "HFU %", "t_iter s", "mem GB", "chi_sys", "fits"):
        t.add_column(c)
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
        mem = ", ".join(f"{k} {v:.1f}" for k, v in r.mem_breakdown_gb.items())
        stdout.print(b)
        stdout.print(f"memory (GB, worst stage): {mem}", highlight=False)
        for w in r.warnings:
            stdout.print(f"[yellow]warning:[/yellow] {w}", highlight=False)


def layouts(
    spec_path: Path = typer.Argument(..., metavar="SPEC.yaml", help="Model spec (paper listing format)."),
    devices: int = typer.Option(None, "--devices", help="N_dev (default: the spec's search.num_devices)."),
    top: int = typer.Option(10, "--top", help="How many ranked plans to show."),
    max_tp: int = typer.Option(8, "--max-tp"),
    max_pp: int = typer.Option(None, "--max-pp"),
    max_ep: int = typer.Option(None, "--max-ep"),
    max_cp: int = typer.Option(None, "--max-cp"),
    mbs: str = typer.Option("1,2,4", "--mbs", help="Micro-batch sizes to try."),
    vpp: str = typer.Option("1", "--vpp", help="Virtual pipeline degrees to try."),
    ckpt: str = typer.Option(",".join(CKPT_MODES), "--ckpt", help="Checkpointing modes to try."),
    mem_fraction: float = typer.Option(1.0, "--mem-fraction", help="Usable fraction of HBM per device."),
    profile: str = ProfileOpt,
    db: str = DbOpt,
    extrapolate: str = ExtrapOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Rank the feasible execution plans P_disc(N_dev) of a spec by predicted MFU."""
    from scaleplan.estimator import PlanConstraints

    spec = load_spec(spec_path)
    n = _device_count(spec, devices)
    modes = parse_ckpt_modes(ckpt)
    if not (0 < mem_fraction <= 1.0):
        raise SpecError("--mem-fraction", mem_fraction, "a fraction in (0, 1]")
    if top <= 0:
        raise SpecError("--top", top, "a positive integer")
    c = PlanConstraints(mbs=_ints(mbs, "--mbs"), vpp=_ints(vpp, "--vpp"), ckpt=modes, mem_fraction=mem_fraction,
                        max_tp=max_tp, max_pp=max_pp, max_ep=max_ep, max_cp=max_cp)
    est = _estimator(spec, profile, db, extrapolate)
    res = est.layouts(spec, n, c, top=top)
    _banner(res.analytic_components)
    if want_json(json_out):
        print_json(res.to_dict())
        return
    from rich.table import Table

    t = Table(title=f"{spec_path} on {n} x {est.profile.name}: {res.n_feasible} feasible of {res.n_plans} plans")
    for col in ("#", "layout", "MFU %", "HFU %", "t_iter s", "mem GB", "chi_sys", "fits"):
        t.add_column(col)
    for i, r in enumerate(res.ranked, 1):
        t.add_row(str(i), *_row(r))
    stdout.print(t)
    if res.infeasible_counts:
        stdout.print("infeasible: " + ", ".join(f"{k} {v}" for k, v in sorted(res.infeasible_counts.items())),
                     highlight=False)
