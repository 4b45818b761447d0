"""Database side of a bench run: create the run with its provenance, find points already stored,
write points as they are measured, close the run, list and export runs.

Every write is one short transaction (``session_scope`` inside ``with_retry``), so a killed
process loses at most the point in flight, and concurrent writers on SQLite or PostgreSQL do not
fail. Points go through ``insert_points`` (ON CONFLICT DO NOTHING on the table's unique key), so
re-measuring a stored point never duplicates it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from pathlib import Path
from typing import Any

import pandas as pd
from sqlalchemy import func, select

from scaleplan.db import models as m
from scaleplan.db.importers import insert_points
from scaleplan.db.recorded import PROVENANCE
from scaleplan.db.session import session_scope, with_retry
from scaleplan.errors import ScaleplanError

RUN_COLUMNS = (
    "host",
    "device",
    "gpu_name",
    "gpu_uuid",
    "driver_version",
    "cuda_version",
    "torch_version",
    "nccl_version",
    "te_version",
    "git_rev",
    "world_size",
    "nvml_start",
    "notes",
    "as_profile",
)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def create_run(
    url: str, suite: str, profile: str, preset: str, config: dict, config_hash: str, prov: dict[str, Any]
) -> int:
    """Insert a BenchRun (status running) with its provenance; return its id."""

    def tx() -> int:
        with session_scope(url) as s:
            run = m.BenchRun(
                suite=suite,
                profile=profile,
                source="measured",
                status="running",
                preset=preset,
                config=config,
                config_hash=config_hash,
                **{k: v for k, v in prov.items() if k in RUN_COLUMNS},
            )
            s.add(run)
            s.flush()
            return run.id

    return with_retry(tx)


def load_run(url: str, run_id: int) -> m.BenchRun:
    """The BenchRun ``run_id`` (detached). Raises ScaleplanError when it does not exist."""
    with session_scope(url) as s:
        run = s.get(m.BenchRun, run_id)
        if run is None:
            raise ScaleplanError(f"--resume: no bench run with id {run_id}")
        s.expunge(run)
        return run


def norm(v: Any) -> Any:
    """A key value in a comparable form (numpy scalars -> Python; integral floats -> int)."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def key_of(row: dict[str, Any], key: tuple[str, ...]) -> tuple:
    return tuple(norm(row[k]) for k in key)


def existing_keys(url: str, run_id: int, table: type[m.Base], key: tuple[str, ...]) -> set[tuple]:
    """Keys of the points of ``run_id`` already stored (any status)."""
    with session_scope(url) as s:
        cols = [getattr(table, k) for k in key]
        return {tuple(norm(v) for v in r) for r in s.execute(select(*cols).where(table.run_id == run_id))}


class _Held:
    """A stop signal (SIGTERM/SIGINT, bench/runner.py) that arrived inside :func:`held_signals`."""

    depth = 0
    pending = False


@contextlib.contextmanager
def held_signals():
    """Hold the runner's stop signals until this write ends, then raise KeyboardInterrupt. An
    exception raised in the middle of a SQLite commit can leave the connection's write lock held,
    and the 'interrupted' status written next then waits on it (seen: bench run ignoring SIGTERM)."""
    _Held.depth += 1
    try:
        yield
    finally:
        _Held.depth -= 1
    if _Held.depth == 0 and _Held.pending:
        _Held.pending = False
        raise KeyboardInterrupt("SIGTERM")


def hold_signal() -> bool:
    """Inside :func:`held_signals`: note a stop signal for its end and return True; else False."""
    if _Held.depth:
        _Held.pending = True
    return bool(_Held.depth)


def write_points(url: str, table: type[m.Base], rows: list[dict[str, Any]]) -> int:
    """Commit ``rows`` in one short transaction (idempotent); returns how many were new."""

    def tx() -> int:
        with session_scope(url) as s:
            return insert_points(s, table, rows)

    with held_signals():
        return with_retry(tx)


def finish_run(
    url: str, run_id: int, status: str, nvml_end: dict | None = None, note: str | None = None
) -> None:
    """Set the run's final status (complete | interrupted | failed) and end snapshot."""

    def tx() -> None:
        with session_scope(url) as s:
            run = s.get(m.BenchRun, run_id)
            run.status, run.ended_at = status, _now()
            if nvml_end is not None:
                run.nvml_end = nvml_end
            if note:
                run.notes = f"{run.notes}; {note}" if run.notes else note

    with held_signals():
        with_retry(tx)


def unfinished_runs(url: str, config_hash: str) -> list[int]:
    """Ids of measured runs with this config hash that did not complete (resumable)."""
    with session_scope(url) as s:
        q = select(m.BenchRun.id).where(
            m.BenchRun.config_hash == config_hash,
            m.BenchRun.source == "measured",
            m.BenchRun.status.in_(("running", "interrupted")),
        )
        return list(s.scalars(q.order_by(m.BenchRun.id)))


def reopen_run(url: str, run_id: int) -> None:
    """Mark a run being resumed as running again."""

    def tx() -> None:
        with session_scope(url) as s:
            run = s.get(m.BenchRun, run_id)
            run.status, run.ended_at = "running", None

    with_retry(tx)


def list_runs(url: str, source: str | None = None) -> list[dict[str, Any]]:
    """Every run with provenance and point counts per status (newest first)."""
    out = []
    with session_scope(url) as s:
        q = select(m.BenchRun).order_by(m.BenchRun.id.desc())
        if source:
            q = q.where(m.BenchRun.source == source)
        runs = s.scalars(q).all()
        counts: dict[int, dict[str, int]] = {}
        for table in m.MEASUREMENT_TABLES.values():
            for rid, st, n in s.execute(
                select(table.run_id, table.status, func.count()).group_by(table.run_id, table.status)
            ):
                counts.setdefault(rid, {})[st] = n
        for r in runs:
            c = counts.get(r.id, {})
            out.append(
                dict(
                    id=r.id,
                    suite=r.suite,
                    profile=r.profile,
                    source=r.source,
                    status=r.status,
                    preset=r.preset,
                    source_file=r.source_file,
                    config_hash=r.config_hash,
                    host=r.host,
                    device=r.device,
                    gpu_name=r.gpu_name,
                    gpu_uuid=r.gpu_uuid,
                    driver_version=r.driver_version,
                    cuda_version=r.cuda_version,
                    torch_version=r.torch_version,
                    nccl_version=r.nccl_version,
                    te_version=r.te_version,
                    git_rev=r.git_rev,
                    nvml_start=r.nvml_start,
                    nvml_end=r.nvml_end,
                    world_size=r.world_size,
                    as_profile=bool(r.as_profile),
                    started_at=r.started_at.isoformat() if r.started_at else None,
                    ended_at=r.ended_at.isoformat() if r.ended_at else None,
                    points=sum(c.values()),
                    by_status=c,
                    notes=r.notes,
                )
            )
    return out


def export_runs(url: str, run_ids: list[int], out_dir: Path) -> list[tuple[Path, int]]:
    """Write ``<suite>.csv`` per suite for the given runs in the format ``scaleplan.db.recorded``
    imports (table columns minus ids + provenance columns). Returns (file, rows) pairs."""
    frames: dict[str, list[pd.DataFrame]] = {}
    with session_scope(url) as s:
        for rid in run_ids:
            run = s.get(m.BenchRun, rid)
            if run is None:
                raise ScaleplanError(f"RUN_ID: no bench run with id {rid}")
            table = m.MEASUREMENT_TABLES[run.suite]
            cols = [c.key for c in table.__table__.columns if c.key not in ("id", "run_id", "created_at")]
            rows = s.execute(select(*[getattr(table, c) for c in cols]).where(table.run_id == rid)).all()
            df = pd.DataFrame([tuple(r) for r in rows], columns=cols)  # a Row has a .dtype attribute
            for p in PROVENANCE:
                val = (
                    run.started_at.isoformat()
                    if p == "run_started_at" and run.started_at
                    else getattr(run, p, None)
                )
                df[p] = val
            frames.setdefault(run.suite, []).append(df)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for suite, dfs in sorted(frames.items()):
        path = out_dir / f"{suite}.csv"
        df = pd.concat(dfs, ignore_index=True)
        df.to_csv(path, index=False)
        written.append((path, len(df)))
    return written
