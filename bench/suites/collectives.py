"""Collectives: all_reduce, reduce_scatter, all_gather, all_to_all, send_recv over message size x
group size x rank layout x intra/inter node (paper sec:microbenchmarks, "NCCL collectives").

This module is the suite's definition (its grid, the nccl-tests conventions) and the launcher on
one machine; what every rank runs is :mod:`scaleplan.bench.collective_ranks`. Runs in torchrun
processes (NCCL on GPUs, gloo on CPU): ``scaleplan bench run`` on one machine launches
``python -m torch.distributed.run --standalone --nproc-per-node N`` on that module; on a cluster,
torchrun itself starts ``scaleplan bench run --suite collectives`` on every node (see
docs/multinode.md). Rank 0 alone reads and writes the database; the other ranks receive the run
id and the points still missing by broadcast.

Semantics follow nccl-tests. ``size_bytes``: the full tensor for all_reduce, the full (input)
tensor for reduce_scatter, the full (output) tensor for all_gather, the per-rank buffer for
all_to_all, the message for send_recv (each rank of the group sends to the next rank of a ring
and receives from the previous one). algbw = size_bytes / t; busbw = algbw * factor with
factor 2(n-1)/n (all_reduce), (n-1)/n (reduce_scatter, all_gather, all_to_all), 1 (send_recv).
GB/s are 1e9 bytes/s. Sizes are rounded down to a multiple of n elements where the collective
splits the tensor across the group.

Groups: every rank is in exactly one group of size n; ``contiguous`` groups are consecutive ranks
(dense DP), ``strided`` groups take every (world/n)-th rank (expert DP across nodes). All groups
run concurrently, as in a training step. ``inter_node`` is true when a group spans more than one
node (node = rank // LOCAL_WORLD_SIZE). Timing: a world barrier, then the op alone, per
repetition (CUDA events on GPU, perf_counter on CPU); a repetition's time is the maximum over all
ranks (the step waits for the slowest); median, p10, p90 are stored.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import torch
from scaleplan.bench import harness as h
from scaleplan.bench.config import SuiteConfig, explicit_points

from scaleplan.db import models as m

NAME = "collectives"
TABLE = m.CollectivePoint
KEY = ("collective", "group_size", "layout", "inter_node", "size_bytes", "dtype")
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv")
SPLIT = ("reduce_scatter", "all_gather", "all_to_all")
RESULT_TAG = "SCALEPLAN_COLLECTIVES_RESULT "
STATUS_CODES = ("OK", "OOM", "UNSUPPORTED", "ERROR")  # agreed across ranks by MAX


class Config(SuiteConfig):
    dtypes: list[str] = ["bf16"]
    collectives: list[str] = list(COLLECTIVES)
    sizes_bytes: list[int] = [1 << 20, 16 << 20, 256 << 20]
    group_sizes: list[int] | None = None  # None: powers of two from 2 up to the world size
    layouts: list[str] = ["contiguous", "strided"]
    nproc: int | None = None  # processes bench run launches on this machine (None: GPUs, or 2 on CPU)
    timeout_s: float = 1800.0


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor: busbw = algbw * factor."""
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in SPLIT:
        return (n - 1) / n
    if collective == "send_recv":
        return 1.0
    raise ValueError(f"unknown collective {collective!r}")


def groups(world: int, n: int, layout: str) -> list[list[int]]:
    """Partition of ranks 0..world-1 into groups of n (contiguous or strided)."""
    if world % n:
        raise ValueError(f"group size {n} does not divide world size {world}")
    if layout == "contiguous":
        return [list(range(g * n, (g + 1) * n)) for g in range(world // n)]
    if layout == "strided":
        stride = world // n
        return [list(range(g, world, stride)) for g in range(stride)]
    raise ValueError(f"layout {layout!r} is not contiguous or strided")


def is_inter_node(group: list[int], ranks_per_node: int) -> bool:
    return len({r // ranks_per_node for r in group}) > 1


def elem_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (fp8: one byte, moved as uint8)."""
    return 1 if dtype == "fp8" else h.DTYPES[dtype].itemsize


def round_size(size: int, collective: str, n: int, dtype: str) -> int:
    """Bytes rounded down to whole elements (and to n elements for split collectives)."""
    unit = elem_bytes(dtype) * (n if collective in SPLIT else 1)
    return (size // unit) * unit


def expand_for(cfg: Config, world: int, ranks_per_node: int) -> tuple[list[dict], int]:
    """(points measurable with this world / node size, count of points that are not)."""
    if cfg.points is not None:
        pts = []
        for p in explicit_points(cfg.points, KEY, NAME):  # rounded as the grid is, so resume keys are stable
            p = {
                **p,
                "size_bytes": round_size(
                    int(p["size_bytes"]), p["collective"], int(p["group_size"]), p["dtype"]
                ),
            }
            if p["size_bytes"] > 0 and p not in pts:
                pts.append(p)
        ok = [
            p
            for p in pts
            if p["group_size"] <= world
            and world % p["group_size"] == 0
            and is_inter_node(groups(world, p["group_size"], p["layout"])[0], ranks_per_node)
            == bool(p["inter_node"])
        ]
        return ok, len(pts) - len(ok)
    sizes = cfg.group_sizes or [2**i for i in range(1, 31) if 2**i <= world]
    out = []
    for n in sizes:
        if n < 2 or n > world or world % n:
            continue
        for layout in cfg.layouts:
            if layout == "strided" and n == world:
                continue  # the same single group as contiguous
            inter = is_inter_node(groups(world, n, layout)[0], ranks_per_node)
            for coll in cfg.collectives:
                for dtype in cfg.dtypes:
                    for size in cfg.sizes_bytes:
                        sz = round_size(size, coll, n, dtype)
                        p = dict(
                            collective=coll,
                            group_size=n,
                            layout=layout,
                            inter_node=inter,
                            size_bytes=sz,
                            dtype=dtype,
                        )
                        if sz > 0 and p not in out:
                            out.append(p)
    return out, 0


def default_nproc(cfg: Config, device: torch.device) -> int:
    if cfg.nproc:
        return cfg.nproc
    return torch.cuda.device_count() if device.type == "cuda" else 2


def expand(cfg: Config, ctx: h.Context) -> list[dict]:
    n = default_nproc(cfg, ctx.device)
    return expand_for(cfg, n, n)[0]


def preflight(cfg: Config, device: torch.device) -> None:
    """Refuse a world of one rank before anything starts: no group of 2 exists, so a torchrun
    launch would spend its start-up (17 s on an H100) to record 0 points. Raises SpecError."""
    n = default_nproc(cfg, device)
    if n < 2:
        from scaleplan.errors import SpecError

        what = f"{torch.cuda.device_count()} visible GPU(s)" if device.type == "cuda" else "nproc"
        raise SpecError("suites.collectives.nproc", n,
                        f"collectives need a world of at least 2 ranks ({what}); skip this suite here")


# ---------------------------------------------------------------- parent side (one machine) ----


def launch(run_id: int, url: str, cfg: Config, ctx: h.Context, emit) -> Any:
    """Run the sweep of ``run_id`` in torchrun processes on this machine; return a SuiteResult."""
    from scaleplan.bench.runner import SuiteResult

    preflight(cfg, ctx.device)  # also on --resume, which does not pass run_preset's check
    nproc = default_nproc(cfg, ctx.device)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "scaleplan.bench.collective_ranks",
        "--run-id",
        str(run_id),
        "--device",
        ctx.device.type,
        "--managed",
        f"--timeout-s={cfg.timeout_s}",
    ]
    env = {**os.environ, "SCALEPLAN_DB": url, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    emit("suite_start", {"run_id": run_id, "suite": NAME, "points": None, "todo": None, "nproc": nproc})
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = _communicate(proc, cfg.timeout_s, run_id, emit)
    except BaseException:  # timeout, Ctrl-C: stop the process group we started, then report
        _stop(proc)
        raise
    summary = next(
        (json.loads(line.split(RESULT_TAG, 1)[1]) for line in out.splitlines() if RESULT_TAG in line), None
    )
    if proc.returncode != 0 or summary is None:
        tail = " | ".join(err.strip().splitlines()[-3:])[:500]
        res = SuiteResult(run_id, NAME, "failed")
        emit(
            "error",
            {"run_id": run_id, "suite": NAME, "message": f"torchrun exited {proc.returncode}: {tail}"},
        )
        return res
    return SuiteResult(
        run_id,
        NAME,
        "complete",
        points=summary["points"],
        measured=summary["measured"],
        already_stored=summary["already_stored"],
        by_status=summary["by_status"],
        not_measurable=summary["not_measurable"],
    )


def _communicate(proc: subprocess.Popen, timeout_s: float, run_id: int, emit) -> tuple[str, str]:
    """Like ``proc.communicate(timeout)``, but rank 0's progress lines become ``suite_progress``
    events as they arrive (the parent draws the bar). Raises subprocess.TimeoutExpired."""
    import threading

    from scaleplan.bench.progress import parse_progress

    out_lines: list[str] = []
    err_buf: list[str] = []

    def pump_out() -> None:
        for line in proc.stdout:
            done = parse_progress(line)
            if done is None:
                out_lines.append(line)
            else:
                emit("suite_progress", {"run_id": run_id, "suite": NAME, "done": done[0], "total": done[1]})

    threads = [threading.Thread(target=pump_out, daemon=True),
               threading.Thread(target=lambda: err_buf.append(proc.stderr.read()), daemon=True)]
    for t in threads:
        t.start()
    proc.wait(timeout=timeout_s)
    for t in threads:
        t.join(timeout=30)
    return "".join(out_lines), "".join(err_buf)


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
