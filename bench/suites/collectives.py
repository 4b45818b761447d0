"""Collectives: all_reduce, reduce_scatter, all_gather, all_to_all, send_recv over message size x
group size x rank layout x intra/inter node (paper sec:microbenchmarks, "NCCL collectives").

Runs in torchrun processes (NCCL on GPUs, gloo on CPU). ``scaleplan bench run`` on one machine
launches ``python -m torch.distributed.run --standalone --nproc-per-node N`` on this module; on
a cluster, torchrun itself starts ``scaleplan bench run --suite collectives`` on every node (see
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

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from scaleplan.bench import harness as h
from scaleplan.bench.config import SuiteConfig, TimingCfg, explicit_points

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


def _elem_bytes(dtype: str) -> int:
    return 1 if dtype == "fp8" else h.DTYPES[dtype].itemsize


def round_size(size: int, collective: str, n: int, dtype: str) -> int:
    """Bytes rounded down to whole elements (and to n elements for split collectives)."""
    unit = _elem_bytes(dtype) * (n if collective in SPLIT else 1)
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
        "scaleplan.bench.suites.collectives",
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


# ---------------------------------------------------------------- torchrun side (every rank) ---


def in_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ and "LOCAL_WORLD_SIZE" in os.environ
    )


def _init(device_type: str, timeout_s: float) -> torch.device:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", timeout=dt.timedelta(seconds=timeout_s), device_id=dev)
        return dev
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=timeout_s))
    return torch.device("cpu")


def run_distributed(
    url: str,
    device_type: str,
    run_id: int | None = None,
    create_run=None,
    managed: bool = False,
    timeout_s: float = 1800.0,
) -> dict | None:
    """Body of every rank. Rank 0 finds or creates (``create_run(world_size) -> id``) the run,
    broadcasts its config and missing points, writes the rows and returns the summary."""
    from scaleplan.bench import store

    dev = _init(device_type, timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    payload: list[Any] = [None]
    if rank == 0:
        try:
            if run_id is None:
                run_id = create_run(world)
            run = store.load_run(url, run_id)
            cfg = Config.model_validate(run.config["suite_config"])
            pts, unmeasurable = expand_for(cfg, world, per_node)
            have = store.existing_keys(url, run_id, TABLE, KEY)
            todo = [p for p in pts if store.key_of(p, KEY) not in have]
            _set_world(url, run_id, world)
            payload = [
                dict(
                    run_id=run_id, config=run.config, todo=todo, points=len(pts), not_measurable=unmeasurable
                )
            ]
        except Exception as e:  # tell the other ranks to stop instead of hanging in broadcast
            payload = [dict(error=f"{type(e).__name__}: {e}")]
    dist.broadcast_object_list(payload, src=0, device=dev if dev.type == "cuda" else None)
    job = payload[0]
    if "error" in job:
        dist.destroy_process_group()
        raise RuntimeError(job["error"])
    timing = TimingCfg(**job["config"]["timing"])
    from scaleplan.bench.progress import RankProgress

    bar = RankProgress(rank, len(job["todo"]), managed)  # rank 0 only: a bar, or lines to bench run
    try:
        by_status = _sweep(job, url, world, rank, dev, timing, bar)
    except BaseException as e:  # a rank-0 crash or Ctrl-C: close the run honestly, then re-raise
        if rank == 0 and not managed:
            status = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
            store.finish_run(url, job["run_id"], status, note=f"{type(e).__name__}: {e}"[:500])
        raise
    finally:
        bar.close()
    summary = None
    if rank == 0:
        summary = dict(
            run_id=job["run_id"],
            points=job["points"],
            measured=len(job["todo"]),
            already_stored=job["points"] - len(job["todo"]),
            by_status=by_status,
            not_measurable=job["not_measurable"],
        )
        if not managed:
            from scaleplan.bench.provenance import nvml_snapshot

            end = nvml_snapshot(dev.index or 0) if dev.type == "cuda" else None
            store.finish_run(url, job["run_id"], "complete", end)
        print(RESULT_TAG + json.dumps(summary), flush=True)
    dist.destroy_process_group()
    return summary


def _sweep(
    job: dict, url: str, world: int, rank: int, dev: torch.device, timing: TimingCfg, bar=None
) -> dict[str, int]:
    """Measure the missing points group shape by group shape; rank 0 writes each row at once."""
    from scaleplan.bench import store
    from scaleplan.bench.runner import sanitize

    by_status: dict[str, int] = {}
    for (n, layout), pts in _by_group(job["todo"]).items():
        mine, _ = dist.new_subgroups_by_enumeration(groups(world, n, layout))
        g_ranks = next(gr for gr in groups(world, n, layout) if rank in gr)
        for p in pts:
            row = _measure(p, mine, g_ranks, rank, dev, timing)
            if rank == 0:
                row.update(p, run_id=job["run_id"], world_size=world, backend=dist.get_backend())
                row = sanitize(row, "t_s")
                store.write_points(url, TABLE, [row])
                by_status[row["status"]] = by_status.get(row["status"], 0) + 1
                if bar is not None:
                    bar.advance()
        dist.barrier()
    return by_status


def _set_world(url: str, run_id: int, world: int) -> None:
    from scaleplan.db.session import session_scope, with_retry

    def tx():
        with session_scope(url) as s:
            s.get(m.BenchRun, run_id).world_size = world

    with_retry(tx)


def _by_group(todo: list[dict]) -> dict[tuple[int, str], list[dict]]:
    out: dict[tuple[int, str], list[dict]] = {}
    for p in todo:
        out.setdefault((p["group_size"], p["layout"]), []).append(p)
    return out


def _single(new: str, old: str):
    """The one-tensor collective under its current name: torch 2.13 renamed reduce_scatter_tensor and
    all_gather_into_tensor to *_single and warns (FutureWarning) on every call of the old names,
    which flooded stderr once per rep and rank; older torch has only the old names."""
    return getattr(dist, new, None) or getattr(dist, old)


def _reduce_scatter(out, inp, group):
    return _single("reduce_scatter_single", "reduce_scatter_tensor")(out, inp, group=group)


def _all_gather(out, inp, group):
    return _single("all_gather_single", "all_gather_into_tensor")(out, inp, group=group)


def _op(p: dict, group, g_ranks: list[int], rank: int, dev: torch.device):
    """Allocate buffers and return a closure running the collective once (blocking)."""
    n = p["group_size"]
    dtype = h.DTYPES[p["dtype"]] if p["dtype"] != "fp8" else torch.uint8
    numel = p["size_bytes"] // _elem_bytes(p["dtype"])
    c = p["collective"]
    if c == "all_reduce":
        buf = torch.ones(numel, dtype=dtype, device=dev)
        return lambda: dist.all_reduce(buf, group=group)
    if c == "reduce_scatter":
        inp, out = (
            torch.ones(numel, dtype=dtype, device=dev),
            torch.empty(numel // n, dtype=dtype, device=dev),
        )
        return lambda: _reduce_scatter(out, inp, group=group)
    if c == "all_gather":
        inp, out = (
            torch.ones(numel // n, dtype=dtype, device=dev),
            torch.empty(numel, dtype=dtype, device=dev),
        )
        return lambda: _all_gather(out, inp, group=group)
    if c == "all_to_all":
        inp, out = torch.ones(numel, dtype=dtype, device=dev), torch.empty(numel, dtype=dtype, device=dev)
        return lambda: dist.all_to_all_single(out, inp, group=group)
    if c == "send_recv":
        i = g_ranks.index(rank)
        nxt, prv = g_ranks[(i + 1) % n], g_ranks[(i - 1) % n]
        sbuf, rbuf = torch.ones(numel, dtype=dtype, device=dev), torch.empty(numel, dtype=dtype, device=dev)

        def sendrecv():
            ops = [
                dist.P2POp(dist.isend, sbuf, nxt, group=group),
                dist.P2POp(dist.irecv, rbuf, prv, group=group),
            ]
            for req in dist.batch_isend_irecv(ops):
                req.wait()

        return sendrecv
    raise h.Unsupported(f"unknown collective {c!r}")


def _agree_max(x: float, dev: torch.device) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _measure(p: dict, group, g_ranks: list[int], rank: int, dev: torch.device, timing: TimingCfg) -> dict:
    """Every rank runs this in lockstep; returns the row's value columns (meaningful on rank 0)."""
    code, note = 0, ""
    try:
        run = _op(p, group, g_ranks, rank, dev)
    except Exception as e:  # agree on failure across ranks before anyone enters the collective
        status, note = h.classify_error(e)
        code = STATUS_CODES.index(status) if status in STATUS_CODES else STATUS_CODES.index("ERROR")
    code = int(_agree_max(code, dev))
    if code:
        h.release_memory(dev)
        return {"status": STATUS_CODES[code], "note": note or "failed on another rank"}
    t0 = time.perf_counter()
    for _ in range(max(1, timing.warmup)):
        run()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t_one = _agree_max((time.perf_counter() - t0) / max(1, timing.warmup), dev)
    reps = int(min(timing.reps, max(timing.min_reps, timing.max_time_s // max(t_one, 1e-9))))
    times = _timed(run, reps, dev)
    t = torch.tensor(times, dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    st = h.Stats(t.cpu().tolist())
    algbw = p["size_bytes"] / st.median / 1e9
    return dict(
        status="OK",
        t_s=st.median,
        t_p10_s=st.p10,
        t_p90_s=st.p90,
        n_rep=st.n,
        algbw_gbps=algbw,
        busbw_gbps=algbw * bus_factor(p["collective"], p["group_size"]),
    )


def _timed(run, reps: int, dev: torch.device) -> list[float]:
    if dev.type == "cuda":
        events = []
        for _ in range(reps):
            dist.barrier(device_ids=[dev.index])
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            run()
            e.record()
            events.append((s, e))
        torch.cuda.synchronize(dev)
        return [s.elapsed_time(e) * 1e-3 for s, e in events]
    out = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        run()
        out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> None:
    """Entry point of the processes ``launch`` starts (database URL in $SCALEPLAN_DB)."""
    ap = argparse.ArgumentParser(prog="scaleplan.bench.suites.collectives")
    ap.add_argument("--run-id", type=int, required=True)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--managed", action="store_true", help="the launching process closes the run")
    ap.add_argument("--timeout-s", type=float, default=1800.0)
    a = ap.parse_args(argv)
    from scaleplan.db.session import resolve_url

    run_distributed(resolve_url(None), a.device, run_id=a.run_id, managed=a.managed, timeout_s=a.timeout_s)


if __name__ == "__main__":
    main()
