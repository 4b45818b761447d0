"""Run benchmark suites into the database, resumably.

One ``bench run`` creates one BenchRun per selected suite up front (status ``running``, with its
provenance and the config it sweeps; ``config_hash`` identifies that sweep) and then measures the
points suite by suite, committing each point as soon as it is measured. Ctrl-C or SIGTERM marks
the unfinished runs ``interrupted``; a SIGKILL leaves them ``running``. Either way
``resume_runs([id])`` re-expands the stored config, skips every point already stored and measures
only the rest; unique keys + ON CONFLICT DO NOTHING make a repeated point impossible.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from scaleplan.bench import harness as h
from scaleplan.bench import provenance, store
from scaleplan.bench.config import Preset, TimingCfg, config_hash, validate_suite_config
from scaleplan.bench.suites import get_suite

from scaleplan.db.session import ensure_schema, resolve_url
from scaleplan.errors import ScaleplanError

# the value column without which an OK row is no measurement (sanitize); fwd_s for the suites not named.
# allocator rows have no time: their measurement is the peak allocated bytes (without this entry every
# allocator row on a GPU was stored ERROR, and validate fell back to the default overhead)
REQUIRED = {"gemm": "t_s", "collectives": "t_s", "dispatch": "wall_per_kernel_s", "allocator": "max_allocated_bytes"}
Event = Callable[[str, dict[str, Any]], None]

# GPU name fragment -> profile, for a single GPU and for a full node of that GPU
_GPU_PROFILES = (  # first match wins: "GB200" before "B200", "GB300" before "B300", which they contain
    ("GB300", "p6e-gb300.36xlarge", "p6e-gb300.36xlarge"),
    ("B300", "p6-b300.48xlarge", "p6-b300.48xlarge"),
    ("GB200", "p6e-gb200.36xlarge", "p6e-gb200.36xlarge"),
    ("B200", "p6-b200.48xlarge", "p6-b200.48xlarge"),
    ("H200", "h200-single", "p5en.48xlarge"),
    ("H100", "h100-single", "p5.48xlarge"),
    ("A100", "p4d.24xlarge", "p4d.24xlarge"),
)


@dataclass
class SuiteResult:
    run_id: int
    suite: str
    status: str
    points: int = 0
    measured: int = 0
    already_stored: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    not_measurable: int = 0
    over_budget: int = 0
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_device(device: str | None) -> torch.device:
    """``cuda`` when available unless ``cpu`` is asked for. Raises ScaleplanError for cuda without one."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda"):
        raise ScaleplanError(f"--device: {device!r} is not one of cpu, cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ScaleplanError("--device cuda: no CUDA device is available to this torch build")
    if device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def device_gpu_name(device: torch.device) -> str | None:
    """The GPU name of ``device`` (None on CPU)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def check_profile(profile: str, device: torch.device, as_profile: bool) -> None:
    """Refuse to store runs of ``device`` under a profile of another GPU (see scaleplan.db.identity).

    Raises SpecError naming the profile's GPU and this device, unless ``as_profile``.
    """
    from scaleplan.db.identity import check_device_matches

    check_device_matches(profile, device.type, device_gpu_name(device), as_profile)


def default_profile(device: torch.device) -> str:
    """cpu-local on CPU; on a GPU the profile whose GPU name matches (node profile if >1 GPU)."""
    if device.type == "cpu":
        return "cpu-local"
    name = torch.cuda.get_device_name(device)
    for frag, single, node in _GPU_PROFILES:
        if frag in name.upper():
            return node if torch.cuda.device_count() > 1 else single
    raise ScaleplanError(f"no built-in profile for GPU {name!r}: pass --profile NAME or a profile YAML")


def _mem_limit(device: torch.device, fraction: float) -> float:
    if device.type == "cuda":
        return fraction * torch.cuda.get_device_properties(device).total_memory
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        avail = 4e9
    return fraction * avail


def make_context(device: torch.device, profile: str, timing: TimingCfg, mem_fraction: float) -> h.Context:
    from scaleplan.profiles import load_profile

    return h.Context(
        device=device,
        timing=h.Timing(**timing.model_dump()),
        profile=load_profile(profile),
        mem_limit_bytes=_mem_limit(device, mem_fraction),
    )


def measure_point(mod, point: dict[str, Any], ctx: h.Context) -> dict[str, Any]:
    """Measure one point; any failure becomes a row with status + note instead of an exception."""
    try:
        vals = dict(mod.measure(dict(point), ctx))
        vals.setdefault("status", "OK")
    except KeyboardInterrupt:
        raise
    except h.OverBudget:  # not a property of the point but of this machine's budget: not stored
        h.release_memory(ctx.device)
        raise
    except Exception as e:  # the sweep must go on: store what happened
        status, note = h.classify_error(e)
        vals = {"status": status, "note": note}
    if vals["status"] != "OK":  # outside the except block: the traceback no longer pins the tensors
        h.release_memory(ctx.device)
    return sanitize({**point, **vals}, REQUIRED.get(mod.NAME, "fwd_s"))


def sanitize(row: dict[str, Any], required: str) -> dict[str, Any]:
    """Times must be finite and > 0 (the database enforces it): others become NULL, and an OK row
    without its required time becomes ERROR with a note, rather than being lost."""
    for k, v in list(row.items()):
        if isinstance(v, float) and (not math.isfinite(v) or (k.endswith("_s") and v <= 0)):
            row[k] = None
            row["note"] = ((row.get("note") or "") + f" {k}={v} dropped").strip()
    if row.get("status", "OK") == "OK" and row.get(required) is None:
        row["status"] = "ERROR"
    return row


def _run_config(
    suite: str, block: dict, preset: Preset, device: torch.device, profile: str
) -> dict[str, Any]:
    return {
        "suite": suite,
        "suite_config": block,
        "timing": preset.timing.model_dump(),
        "mem_fraction": preset.mem_fraction,
        "cpu_threads": preset.cpu_threads,
        "device": device.type,
        "profile": profile,
    }


class SigtermAsInterrupt:
    """Turn SIGTERM (and SIGINT) into KeyboardInterrupt while a sweep runs, so the run is marked
    interrupted; a signal that arrives while a point or a status is being written is held until the
    write has committed (:func:`store.held_signals`)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __enter__(self):
        self.prev = {}
        if threading.current_thread() is threading.main_thread():
            self.prev = {sig: signal.signal(sig, self.raise_interrupt) for sig in self.SIGNALS}
        return self

    @staticmethod
    def raise_interrupt(signum, frame):
        if store.hold_signal():
            return
        raise KeyboardInterrupt(signal.Signals(signum).name)

    def __exit__(self, *exc):
        for sig, prev in self.prev.items():
            signal.signal(sig, prev)
        return False


def run_preset(
    preset: Preset,
    url: str | None,
    suites: list[str] | None = None,
    profile: str | None = None,
    device: str | None = None,
    preset_label: str | None = None,
    on_event: Event | None = None,
    as_profile: bool = False,
) -> list[SuiteResult]:
    """Create a run per suite and measure them all. Returns one SuiteResult per suite.

    Raises SpecError when ``profile``'s GPU is not this device (unless ``as_profile``: the runs
    are then stored with ``as_profile`` set in their provenance).
    """
    url = resolve_url(url)
    dev = resolve_device(device)
    profile = profile or default_profile(dev)
    check_profile(profile, dev, as_profile)  # before the schema or any run is touched
    ensure_schema(url)
    names = [s for s in (suites or list(preset.suites)) if s]
    for s in names:
        get_suite(s)
        if s not in preset.suites:
            raise ScaleplanError(f"--suite {s}: preset {preset.name!r} has no block for it")
    names = _preflight(names, preset, dev, explicit=bool(suites), on_event=on_event)
    prov = {**provenance.run_provenance(dev.type, dev.index or 0), "as_profile": as_profile}
    planned = []
    for s in names:
        mod = get_suite(s)
        block = validate_suite_config(s, mod.Config, preset.suites[s]).model_dump()
        cfg = _run_config(s, block, preset, dev, profile)
        run_prov = {**prov, "world_size": 1}
        if dev.type == "cpu":
            threads = preset.cpu_threads or torch.get_num_threads()
            run_prov["notes"] = f"{prov.get('notes')}; torch intra-op threads {threads}"
        digest = config_hash(cfg)
        unfinished = store.unfinished_runs(url, digest)
        run_id = store.create_run(url, s, profile, preset_label or preset.name, cfg, digest, run_prov)
        if unfinished and on_event:
            on_event("hint", {"run_id": run_id, "suite": s, "same_config": unfinished})
        planned.append((run_id, mod, cfg))
    return _execute(planned, url, dev, on_event)


def _preflight(names: list[str], preset: Preset, dev: torch.device, explicit: bool,
               on_event: Event | None) -> list[str]:
    """Suites whose ``preflight(cfg, device)`` refuses this machine (collectives on one rank):
    named with --suite, the refusal is raised before any run starts (exit 2); as part of a whole
    preset, the suite is left out with the same one-line reason."""
    keep = []
    for s in names:
        mod = get_suite(s)
        check = getattr(mod, "preflight", None)
        try:
            if check is not None:
                check(validate_suite_config(s, mod.Config, preset.suites[s]), dev)
            keep.append(s)
        except ScaleplanError as e:
            if explicit:
                raise
            if on_event:
                on_event("error", {"run_id": "-", "suite": s, "message": f"skipped: {e}"})
    return keep


def resume_runs(
    run_ids: list[int], url: str | None, device: str | None = None, on_event: Event | None = None
) -> list[SuiteResult]:
    """Measure only the missing points of stored runs (same config, same device kind)."""
    url = resolve_url(url)
    ensure_schema(url)
    planned = []
    dev = None
    for rid in run_ids:
        run = store.load_run(url, rid)
        if run.source != "measured" or not run.config:
            raise ScaleplanError(
                f"--resume {rid}: run is {run.source!r}, not a measured run with a stored config"
            )
        if config_hash(run.config) != run.config_hash:
            raise ScaleplanError(f"--resume {rid}: stored config does not match its config_hash")
        d = resolve_device(device or run.config["device"])
        if d.type != run.config["device"]:
            raise ScaleplanError(f"--resume {rid}: run was measured on {run.config['device']}, not {d.type}")
        if (
            d.type == "cuda"
            and run.gpu_name
            and run.gpu_name != provenance.nvml_snapshot(d.index or 0).get("name", run.gpu_name)
        ):
            raise ScaleplanError(f"--resume {rid}: run was measured on {run.gpu_name}, a different GPU")
        dev = d
        planned.append((rid, get_suite(run.suite), run.config))
    return _execute(planned, url, dev, on_event, resumed=True)


def _execute(
    planned, url: str, dev: torch.device, on_event: Event | None, resumed: bool = False
) -> list[SuiteResult]:
    emit = on_event or (lambda kind, info: None)
    results = []
    pending = [rid for rid, *_ in planned]
    with SigtermAsInterrupt():
        try:
            for run_id, mod, cfg in planned:
                if resumed:
                    store.reopen_run(url, run_id)
                res = _run_suite(run_id, mod, cfg, url, dev, emit)
                results.append(res)
                pending.remove(run_id)
        except KeyboardInterrupt:
            for rid in pending:
                store.finish_run(url, rid, "interrupted", _nvml_end(dev))
            raise
        except BaseException as e:
            for rid in pending:
                store.finish_run(url, rid, "failed", _nvml_end(dev), note=f"{type(e).__name__}: {e}"[:500])
            raise
    return results


@contextlib.contextmanager
def _cpu_threads(dev: torch.device, n: int | None):
    """torch's intra-op thread count for a CPU run (a preset's cpu_threads), restored afterwards.
    One thread avoids the OpenMP barrier stalls of an oversubscribed host (tiny ops then cost
    milliseconds instead of microseconds)."""
    prev = torch.get_num_threads()
    if dev.type == "cpu" and n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def _nvml_end(dev: torch.device) -> dict | None:
    return provenance.nvml_snapshot(dev.index or 0) if dev.type == "cuda" else None


def _run_suite(
    run_id: int, mod, cfg: dict[str, Any], url: str, dev: torch.device, emit: Event
) -> SuiteResult:
    t0 = time.perf_counter()
    ctx = make_context(dev, cfg["profile"], TimingCfg(**cfg["timing"]), cfg["mem_fraction"])
    scfg = validate_suite_config(mod.NAME, mod.Config, cfg["suite_config"])
    with _cpu_threads(dev, cfg.get("cpu_threads")):
        if hasattr(mod, "launch"):  # multi-process suites run in their own processes
            res = mod.launch(run_id, url, scfg, ctx, emit)
        else:
            res = _sweep(run_id, mod, scfg, ctx, url, emit)
    res.wall_s = time.perf_counter() - t0
    note = None
    errors = res.by_status.get("ERROR", 0)
    if errors and res.status == "complete":  # a point the suite could not measure: not a complete run
        res.status, note = "failed", f"{errors} point(s) ended ERROR (see their notes)"
        emit("error", {"run_id": run_id, "suite": mod.NAME, "message": note})
    store.finish_run(url, run_id, res.status, _nvml_end(dev), note=note)
    emit("suite_done", res.to_dict())
    return res


def _sweep(run_id: int, mod, scfg, ctx: h.Context, url: str, emit: Event) -> SuiteResult:
    points = mod.expand(scfg, ctx)
    have = store.existing_keys(url, run_id, mod.TABLE, mod.KEY)
    todo = [p for p in points if store.key_of(p, mod.KEY) not in have]
    res = SuiteResult(
        run_id, mod.NAME, "complete", points=len(points), already_stored=len(points) - len(todo)
    )
    emit("suite_start", {"run_id": run_id, "suite": mod.NAME, "points": len(points), "todo": len(todo)})
    for p in todo:
        emit("point_start", {"run_id": run_id, "suite": mod.NAME, "point": p})
        try:
            _probe_budget(mod, p, ctx)
            row = measure_point(mod, p, ctx)
        except h.OverBudget as e:
            res.over_budget += 1
            emit("skip", {"run_id": run_id, "suite": mod.NAME, "point": p, "reason": str(e)})
            continue
        row["run_id"] = run_id
        store.write_points(url, mod.TABLE, [row])
        res.measured += 1
        res.by_status[row["status"]] = res.by_status.get(row["status"], 0) + 1
        emit("point", {"run_id": run_id, "suite": mod.NAME, "row": row})
    return res


def _probe_budget(mod, p: dict[str, Any], ctx: h.Context) -> None:
    """Raise OverBudget when the suite's cheap probe (``probe_s``: seconds of one call of the point)
    says the point would exceed the CPU point budget; a suite without a probe, or a probe that
    fails (memory guard, unsupported dtype: the measurement then stores why), passes."""
    probe = getattr(mod, "probe_s", None)
    if ctx.budget_s is None or probe is None:
        return
    try:
        one = probe(dict(p), ctx)
    except KeyboardInterrupt:
        raise
    except Exception:
        return
    finally:
        h.release_memory(ctx.device)
    if one is not None:
        h.check_budget(one, ctx.calls, ctx, "estimated by a probe")


def run_under_torchrun(
    preset: Preset | None,
    url: str | None,
    profile: str | None = None,
    device: str | None = None,
    preset_label: str | None = None,
    resume_id: int | None = None,
    as_profile: bool = False,
) -> dict | None:
    """The collectives sweep when this process is one rank of a torchrun job (multi-node).

    Every rank calls this; rank 0 creates the run (or resumes ``resume_id``) and writes the rows.
    Returns the summary on rank 0, None elsewhere.
    """
    from scaleplan.bench.collective_ranks import run_distributed
    from scaleplan.bench.suites import collectives

    url = resolve_url(url)
    dev = resolve_device(device)
    rank = int(os.environ.get("RANK", "0"))
    create = None
    if resume_id is None:
        if preset is None or "collectives" not in preset.suites:
            raise ScaleplanError(
                "under torchrun only the collectives suite runs: the preset needs a collectives block"
            )
        profile = profile or default_profile(dev)
        check_profile(profile, dev, as_profile)
        block = validate_suite_config(
            "collectives", collectives.Config, preset.suites["collectives"]
        ).model_dump()
        cfg = _run_config("collectives", block, preset, dev, profile)

        def create(world: int) -> int:
            prov = {**provenance.run_provenance(dev.type, dev.index or 0), "world_size": world,
                    "as_profile": as_profile}
            return store.create_run(
                url, "collectives", profile, preset_label or preset.name, cfg, config_hash(cfg), prov
            )

    if rank == 0:
        ensure_schema(url)
        if resume_id is not None:
            store.reopen_run(url, resume_id)
    timeout = (preset.suites.get("collectives", {}) or {}).get("timeout_s", 1800.0) if preset else 1800.0
    return run_distributed(url, dev.type, run_id=resume_id, create_run=create, timeout_s=timeout)
