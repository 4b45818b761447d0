"""The collectives suite's torchrun side: what every rank runs (:mod:`scaleplan.bench.suites.collectives`
defines the suite, its grid and nccl-tests conventions, and launches these processes on one machine).

Rank 0 reads the run and the points still missing, and broadcasts them; all ranks then sweep the
points group shape by group shape, in lockstep: allocate the buffers (failures agreed across ranks
before anyone enters the collective), warm up, pick the repetitions, time each repetition after a
world barrier, and keep the maximum over ranks. Rank 0 writes each row as it is measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from scaleplan.bench import harness as h
from scaleplan.bench.config import TimingCfg
from scaleplan.bench.suites.collectives import (
    KEY,
    RESULT_TAG,
    STATUS_CODES,
    TABLE,
    Config,
    bus_factor,
    elem_bytes,
    expand_for,
    groups,
)

from scaleplan.db import models as m


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
    broadcasts its config and missing points, writes the rows and returns the summary (None on the
    other ranks). ``managed``: the launching process closes the run. Raises RuntimeError on every
    rank when rank 0 could not prepare the job."""
    from scaleplan.bench import store
    from scaleplan.bench.progress import RankProgress

    dev = _init(device_type, timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    payload: list[Any] = [_job(url, run_id, create_run, world, per_node) if rank == 0 else None]
    dist.broadcast_object_list(payload, src=0, device=dev if dev.type == "cuda" else None)
    job = payload[0]
    if "error" in job:
        dist.destroy_process_group()
        raise RuntimeError(job["error"])
    timing = TimingCfg(**job["config"]["timing"])
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
    summary = _finish(job, by_status, url, dev, managed) if rank == 0 else None
    dist.destroy_process_group()
    return summary


def _job(url: str, run_id: int | None, create_run, world: int, per_node: int) -> dict:
    """Rank 0: the run's id and config, the points this world can measure that are not stored yet, and
    the count of points it cannot measure; ``{"error": ...}`` instead of raising, so the other ranks
    stop rather than hang in the broadcast."""
    from scaleplan.bench import store

    try:
        if run_id is None:
            run_id = create_run(world)
        run = store.load_run(url, run_id)
        cfg = Config.model_validate(run.config["suite_config"])
        pts, unmeasurable = expand_for(cfg, world, per_node)
        have = store.existing_keys(url, run_id, TABLE, KEY)
        todo = [p for p in pts if store.key_of(p, KEY) not in have]
        _set_world(url, run_id, world)
        return dict(run_id=run_id, config=run.config, todo=todo, points=len(pts), not_measurable=unmeasurable)
    except Exception as e:
        return dict(error=f"{type(e).__name__}: {e}")


def _finish(job: dict, by_status: dict[str, int], url: str, dev: torch.device, managed: bool) -> dict:
    """Rank 0 after the sweep: close the run (unless the launcher does) and print the summary line
    the launcher reads."""
    from scaleplan.bench import store

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
    numel = p["size_bytes"] // elem_bytes(p["dtype"])
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
    ap = argparse.ArgumentParser(prog="scaleplan.bench.collective_ranks")
    ap.add_argument("--run-id", type=int, required=True)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--managed", action="store_true", help="the launching process closes the run")
    ap.add_argument("--timeout-s", type=float, default=1800.0)
    a = ap.parse_args(argv)
    from scaleplan.db.session import resolve_url

    run_distributed(resolve_url(None), a.device, run_id=a.run_id, managed=a.managed, timeout_s=a.timeout_s)


if __name__ == "__main__":
    main()
