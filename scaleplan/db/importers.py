"""Importers for published measurement tables.

``import_scaleplan_dir`` reads the table format of the paper's reference estimator (the files
listed in ../shared/recorded/README.md). Each source file becomes one ``bench_run`` with
``source='imported'`` and ``source_file`` naming it; every source row lands (rows whose status
is not OK are kept with their status); importing twice adds nothing, because a run is unique per
(source_file, suite) and points are unique per (run, key).

Row mapping: one stored point per source row, except sdpa.parquet, whose wide rows carry two
backends (te and pt) and become two points each. CSV files that sit beside a parquet file of the
same stem hold the same rows and are skipped.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scaleplan.db import models as m
from scaleplan.db.validation import validate_rows
from scaleplan.errors import ScaleplanError

MS = 1e-3
US = 1e-6

# GPU name in a source file -> the cluster profile its rows describe
_PROFILE_BY_DEVICE = {"b200": "p6-b200.48xlarge", "h200": "p5en.48xlarge", "h100": "p5.48xlarge",
                      "a100": "p4d.24xlarge"}


def profile_for_device(device: str) -> str:
    return _PROFILE_BY_DEVICE.get(str(device).lower(), str(device).lower())


def _status(s: Any) -> tuple[str, str | None]:
    """Map a source status to ours; keep the source text in the note when it carries detail."""
    s = "ERROR" if s is None or (isinstance(s, float) and math.isnan(s)) else str(s)
    head = s.split(":", 1)[0].strip().upper()
    if head in m.STATUSES:
        return head, (s if head != s else None)
    if "OUT OF MEMORY" in s.upper():
        return "OOM", s
    return "ERROR", s


def _f(x: Any, scale: float = 1.0) -> float | None:
    """A finite positive float times ``scale``, else None (the DB rejects anything else)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v * scale if math.isfinite(v) and v > 0 else None


def _ok_time(status: str, *times: float | None) -> str:
    """An OK row whose required time is missing is stored as ERROR rather than dropped."""
    return "ERROR" if status == "OK" and times[0] is None else status


@dataclass
class FileSpec:
    suite: str
    table: type[m.Base]
    rows: Callable[[pd.DataFrame], Iterable[dict[str, Any]]]


def _gemm_rows(df: pd.DataFrame):
    for r in df.reset_index().rename(columns={"util_%": "util_pct"}).itertuples(index=False):
        st, note = _status(r.status)
        t = _f(r.time_ms_med, MS)
        note = note or (None if r.note in ("cuda", None) else str(r.note))
        yield dict(_profile=profile_for_device(r.GPU_MODEL), m=int(r.M), n=int(r.N), k=int(r.K), dtype=str(r.dtype),
                   t_s=t, flops_per_s=_f(r.tflops, 1e12), util=_f(r.util_pct, 0.01),
                   backend=_gemm_backend(str(r.dtype), str(r.note)), status=_ok_time(st, t), note=note)


# The fp8 rows of gemm_util.parquet time Transformer Engine's MXFP8 path, its input quantize included: the
# sweep's failed fp8 points carry TE's quantizer.cpp error "MXFP8 requires tensor dims that are divisible by
# 32", and its flat ~0.15 ms per call is TE's host work (estimator/floors.py)
FP8_RECORDED_BACKEND = "te_mxfp8"


def _gemm_backend(dtype: str, note: str) -> str:
    if dtype == "fp8":
        return FP8_RECORDED_BACKEND
    return "te" if "te." in note else "torch"


def _grouped_rows(df: pd.DataFrame):
    for r in df.itertuples(index=False):
        st, note = _status(r.status)
        fwd = _f(r.fwd_ms, MS)
        yield dict(_profile=profile_for_device(r.device), proj=r.proj, distribution=r.distribution,
                   num_gemms=int(r.num_gemms), tokens_per_expert=int(r.tokens_per_expert), hidden=int(r.hidden),
                   ffn=int(r.ffn), in_features=int(r.in_features), out_features=int(r.out_features), dtype=r.dtype,
                   fwd_s=fwd, bwd_s=_f(r.bwd_ms, MS), impl=f"te_grouped_linear {r.te_version}",
                   status=_ok_time(st, fwd), note=note or f"kernel={r.kernel_name}; m_splits={r.m_splits_repr}")


def _sdpa_long_rows(df: pd.DataFrame):
    for r in df.itertuples(index=False):
        st, note = _status(r.status)
        fwd = _f(r.fwd_time_ms_med, MS)
        yield dict(_profile=profile_for_device(r.device), seq_len=int(r.seq_len), micro_bs=int(r.micro_bs),
                   n_q_heads=int(r.n_q_heads), n_kv_heads=int(r.n_kv_heads), head_dim=int(r.head_dim), causal=True,
                   dtype=r.dtype, backend=r.backend, fwd_s=fwd, bwd_s=_f(r.bwd_time_ms_med, MS),
                   status=_ok_time(st, fwd), note=note)


def _sdpa_wide_rows(df: pd.DataFrame):
    for r in df.reset_index().itertuples(index=False):
        for be in ("te", "pt"):
            st, note = _status(getattr(r, f"status_{be}"))
            fwd = _f(getattr(r, f"time_ms_{be}_med"), MS)
            yield dict(_profile="p6-b200.48xlarge", seq_len=int(r.seq_len), micro_bs=int(r.micro_bs),
                       n_q_heads=int(r.n_q_heads), n_kv_heads=int(r.n_kv_heads), head_dim=int(r.head_dim),
                       causal=True, dtype="bf16", backend=be, fwd_s=fwd, bwd_s=None,
                       status=_ok_time(st, fwd), note=note or "forward only (older wide sweep)")


def _topk_rows(df: pd.DataFrame):
    has_bwd = "bwd_event_time_ms" in df.columns
    for r in df.itertuples(index=False):
        fwd = _f(r.event_time_ms, MS)
        yield dict(_profile=profile_for_device(r.device), variant="topk", num_tokens=int(r.num_tokens),
                   num_experts=int(r.num_experts), k=int(r.k), hidden=0, dtype=r.dtype, fwd_s=fwd,
                   bwd_s=_f(r.bwd_event_time_ms, MS) if has_bwd else None,
                   status=_ok_time("OK", fwd), note=f"kernel-only {r.profiler_kernel_ms:.6f} ms")


def _vocab_rows(df: pd.DataFrame):
    for r in df.itertuples(index=False):
        st, note = _status(r.status)
        fwd = _f(r.fwd_ms_p50, MS)
        yield dict(_profile=profile_for_device(r.device), op=r.op, tokens=int(r.m_tokens), hidden=int(r.hidden),
                   vocab=int(r.vocab_padded), dtype=r.dtype, fwd_s=fwd, bwd_s=_f(r.bwd_ms_p50, MS), n_rep=int(r.n_iter),
                   status=_ok_time(st, fwd), note=note or f"model_tag={r.model_tag}")


def _collective_rows(layout: str):
    def rows(df: pd.DataFrame):
        is_a2a = "egress_gbps_p50" in df.columns
        for r in df.itertuples(index=False):
            st, note = _status(r.status)
            t = _f(r.time_ms_p50, MS)
            size = int(r.buffer_bytes if is_a2a else r.payload_bytes)
            n = int(r.group_size)
            if is_a2a:  # per-rank egress: (n-1)/n of the buffer leaves the rank
                algbw = size / t / 1e9 if t else None
                busbw = _f(r.egress_gbps_p50)
            else:
                algbw, busbw = _f(r.algbw_gbps_p50), _f(r.busbw_gbps_p50)
            yield dict(_profile=profile_for_device(r.device), collective="all_to_all" if is_a2a else r.collective,
                       group_size=n, world_size=int(r.world_size), layout=layout, inter_node=bool(r.inter_node),
                       size_bytes=size, dtype=r.dtype, t_s=t, t_p10_s=_f(r.time_ms_p10, MS),
                       t_p90_s=_f(r.time_ms_p90, MS), algbw_gbps=algbw, busbw_gbps=busbw, n_rep=int(r.n_iter),
                       backend="nccl", status=_ok_time(st, t), note=note)
    return rows


def _dispatch_rows(df: pd.DataFrame):
    for r in df.itertuples(index=False):
        st, note = _status(r.status)
        wall = _f(r.wall_us_per_kernel, US)
        yield dict(_profile=profile_for_device(r.device), mode=r.mode, m=int(r.M), n=int(r.N), k=int(r.K),
                   dtype=r.dtype, chain_len=int(r.chain_len), wall_per_kernel_s=wall,
                   active_per_kernel_s=_f(r.gpu_active_us_per_kernel, US), status=_ok_time(st, wall),
                   note=note or f"torch {r.torch_version}")


def file_spec(name: str) -> FileSpec | None:
    """How to import one file of the recorded format (None: not a measurement table we know)."""
    stem = name.rsplit(".", 1)[0]
    if stem == "gemm_util":
        return FileSpec("gemm", m.GemmPoint, _gemm_rows)
    if stem.startswith("gemm_grouped"):
        return FileSpec("grouped_gemm", m.GroupedGemmPoint, _grouped_rows)
    if stem == "sdpa":
        return FileSpec("sdpa", m.SdpaPoint, _sdpa_wide_rows)
    if stem.startswith("sdpa_"):
        return FileSpec("sdpa", m.SdpaPoint, _sdpa_long_rows)
    if stem.startswith("topk_"):
        return FileSpec("router", m.RouterPoint, _topk_rows)
    if stem.startswith("vocab_gemm_ce"):
        return FileSpec("vocab", m.VocabPoint, _vocab_rows)
    if stem.startswith("dp_collectives"):
        return FileSpec("collectives", m.CollectivePoint, _collective_rows("strided" if "stride" in stem else "contiguous"))
    if stem.startswith("a2a_"):
        return FileSpec("collectives", m.CollectivePoint, _collective_rows("contiguous"))
    if stem.startswith("dispatch_gap"):
        return FileSpec("dispatch", m.DispatchPoint, _dispatch_rows)
    return None


def _read(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)


def insert_points(sess: Session, table: type[m.Base], rows: list[dict[str, Any]]) -> int:
    """Insert rows, skipping any whose (run, key) already exists. Returns the number inserted.

    Uses the dialect's ON CONFLICT DO NOTHING, so it is idempotent and safe under concurrent writers.
    Raises MeasurementError (nothing of the batch written) when a row is bad: see db/validation.py.
    """
    rows = validate_rows(table, rows)
    if not rows:
        return 0
    dialect = sess.get_bind().dialect.name
    ins = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}.get(dialect)
    if ins is None:
        raise ScaleplanError(f"unsupported database dialect {dialect!r} (use SQLite or PostgreSQL)")
    stmt = ins(table).on_conflict_do_nothing().returning(table.id)
    total = 0
    try:
        for i in range(0, len(rows), 500):  # RETURNING counts inserted rows on both dialects
            total += len(sess.execute(stmt, rows[i:i + 500]).all())
    except IntegrityError as e:  # a CHECK the Python validation does not mirror: still one line, exit 2
        first = (str(e.orig).strip().splitlines() or [type(e.orig).__name__])[0]
        raise ScaleplanError(f"{table.__tablename__}: the database refused the batch ({first}); "
                             "roll the transaction back") from None
    return total


@dataclass
class ImportResult:
    file: str
    suite: str
    rows_in_file: int
    points: int
    inserted: int
    run_ids: list[int]


def _run_for(sess: Session, suite: str, profile: str, source_file: str, gpu_name: str | None, sha: str) -> int:
    key = f"{source_file}#{profile}"
    run = sess.scalar(select(m.BenchRun).where(m.BenchRun.source_file == key, m.BenchRun.suite == suite))
    if run is None:
        run = m.BenchRun(suite=suite, profile=profile, source="imported", source_file=key, status="imported",
                         gpu_name=gpu_name, config_hash=sha[:64],
                         notes="recorded table (dmlc/ScalePlan benchmarks/results, CC BY-NC 4.0)")
        sess.add(run)
        sess.flush()
    elif gpu_name and run.gpu_name != gpu_name:  # a run imported before the per-profile GPU name fix
        run.gpu_name = gpu_name
    return run.id


def _gpu_by_profile(df: pd.DataFrame) -> dict[str, str]:
    """The GPU name of each profile's rows, from the file's own device and gpu_name columns.

    A file can hold several GPUs (sdpa_fwd_bwd_timings: A100, H200, B200); its first row's name used
    to label every profile's run (B200 SDPA runs shown as A100).
    """
    if not {"device", "gpu_name"} <= set(df.columns):
        return {}
    pairs = df[["device", "gpu_name"]].dropna().drop_duplicates()
    return {profile_for_device(d): str(g) for d, g in pairs.itertuples(index=False)}


def _profile_gpu(profile: str) -> str | None:
    """The profile's own GPU name, for files that name none (gemm_util: a GPU_MODEL index; sdpa: 'cuda')."""
    from scaleplan.profiles import profile_file

    try:
        return profile_file(profile).gpu_name
    except ScaleplanError:
        return None


def import_file(sess: Session, path: Path) -> ImportResult | None:
    spec = file_spec(path.name)
    if spec is None:
        return None
    try:  # a corrupt or foreign file rejects the whole import (the caller's transaction rolls back)
        df = _read(path)
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        gpus = _gpu_by_profile(df)
        by_profile: dict[str, list[dict[str, Any]]] = {}
        for row in spec.rows(df):
            by_profile.setdefault(row.pop("_profile"), []).append(row)
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise ScaleplanError(f"{path.name}: not a readable {spec.suite} table in the recorded format "
                             f"({type(e).__name__}: {first})") from None
    inserted, run_ids, points = 0, [], 0
    for profile, rows in sorted(by_profile.items()):
        run_id = _run_for(sess, spec.suite, profile, path.name, gpus.get(profile) or _profile_gpu(profile), sha)
        run_ids.append(run_id)
        for r in rows:
            r["run_id"] = run_id
        points += len(rows)
        inserted += insert_points(sess, spec.table, rows)
    return ImportResult(path.name, spec.suite, len(df), points, inserted, run_ids)


def import_scaleplan_dir(sess: Session, directory: str | Path) -> list[ImportResult]:
    """Import every known table file of a recorded-tables directory (parquet preferred over CSV).

    Raises ScaleplanError when the directory does not exist or holds no known table.
    """
    d = Path(directory)
    if not d.is_dir():
        raise ScaleplanError(f"DIR: {str(directory)!r} is not a directory")
    files = sorted(p for p in d.iterdir() if p.suffix in (".parquet", ".csv"))
    stems_with_parquet = {p.stem for p in files if p.suffix == ".parquet"}
    files = [p for p in files if p.suffix == ".parquet" or p.stem not in stems_with_parquet]
    results = [r for p in files if (r := import_file(sess, p)) is not None]
    if not results:
        raise ScaleplanError(f"DIR: no known measurement table in {str(directory)!r}")
    return results
