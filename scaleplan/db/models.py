"""The calibration database: SQLAlchemy 2 typed ORM models.

Units in every table: seconds for times, bytes for sizes, FLOP/s for rates, GB/s (1e9 bytes/s)
for nccl-tests style algbw/busbw. Times of OK rows must be finite and > 0: enforced by CHECK
constraints in the database itself, not only in Python (NaN is stored as NULL by SQLite and as
'NaN' by PostgreSQL; ``x < 1e300`` is false for NaN and +inf on both).

Each measurement table has a unique key per (run, point), so re-writing a point is idempotent.
Rows whose status is not OK (OOM, UNSUPPORTED, SKIP_MEM, SKIP_ALIGN, ERROR) are kept with their
status and a note; their times may be NULL.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (JSON, BigInteger, Boolean, CheckConstraint, DateTime, Float, ForeignKey, String,
                        Text, UniqueConstraint, false, func)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

STATUSES = ("OK", "OOM", "UNSUPPORTED", "SKIP_MEM", "SKIP_ALIGN", "ERROR")
RUN_STATUSES = ("running", "complete", "interrupted", "failed", "imported")


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


def _positive_time(*cols: str, required: tuple[str, ...] = ()) -> list[CheckConstraint]:
    """CHECKs: a given time column is NULL or finite and > 0; ``required`` ones are non-NULL when OK."""
    out = []
    for c in cols:
        out.append(CheckConstraint(f"{c} IS NULL OR ({c} > 0 AND {c} < 1e300)", name=f"{c}_finite_positive"))
    for c in required:
        out.append(CheckConstraint(f"status <> 'OK' OR {c} IS NOT NULL", name=f"{c}_present_when_ok"))
    return out


def _status_check() -> CheckConstraint:
    allowed = ", ".join(f"'{s}'" for s in STATUSES)
    return CheckConstraint(f"status IN ({allowed})", name="status_known")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class HardwareProfile(Base):
    """A node type's datasheet facts (mirrors cluster_profiles/*.yaml at the time of use)."""

    __tablename__ = "hardware_profile"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    gpu_name: Mapped[str] = mapped_column(String(128))
    gpus_per_node: Mapped[int]
    peak_flops: Mapped[dict[str, Any]]
    hbm_bytes: Mapped[float]
    hbm_bandwidth: Mapped[float]
    scaleup_bandwidth: Mapped[float]
    scaleout_bandwidth: Mapped[float]
    source: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)


class BenchRun(Base):
    """One benchmark run (one suite) with its provenance.

    ``source`` is 'measured' for runs of ``scaleplan bench`` and 'imported' for recorded tables
    (``source_file`` then names the file). ``config_hash`` identifies the sweep so ``--resume``
    can find the points still missing.
    """

    __tablename__ = "bench_run"
    __table_args__ = (
        CheckConstraint("status IN ('running', 'complete', 'interrupted', 'failed', 'imported')",
                        name="run_status_known"),
        UniqueConstraint("source_file", "suite", name="uq_bench_run_source_file"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    suite: Mapped[str] = mapped_column(String(32), index=True)
    profile: Mapped[str] = mapped_column(String(128), index=True)
    source: Mapped[str] = mapped_column(String(16), default="measured")
    source_file: Mapped[str | None] = mapped_column(String(512))
    status: Mapped[str] = mapped_column(String(16), default="running")
    preset: Mapped[str | None] = mapped_column(String(256))
    config: Mapped[dict[str, Any] | None]
    config_hash: Mapped[str | None] = mapped_column(String(64), index=True)
    host: Mapped[str | None] = mapped_column(String(256))
    device: Mapped[str | None] = mapped_column(String(32))  # cuda | cpu
    gpu_name: Mapped[str | None] = mapped_column(String(128))
    gpu_uuid: Mapped[str | None] = mapped_column(String(128))
    driver_version: Mapped[str | None] = mapped_column(String(64))
    cuda_version: Mapped[str | None] = mapped_column(String(64))
    torch_version: Mapped[str | None] = mapped_column(String(64))
    nccl_version: Mapped[str | None] = mapped_column(String(64))
    te_version: Mapped[str | None] = mapped_column(String(64))
    git_rev: Mapped[str | None] = mapped_column(String(64))
    world_size: Mapped[int | None]
    # stored under a profile whose GPU is not the device it ran on (`bench run --as-profile`)
    as_profile: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    nvml_start: Mapped[dict[str, Any] | None]  # clocks, power limit, temperature at start
    nvml_end: Mapped[dict[str, Any] | None]
    started_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)
    ended_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    notes: Mapped[str | None] = mapped_column(Text)


class _Point:
    """Columns every measurement row has."""

    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(String(16), default="OK")
    note: Mapped[str | None] = mapped_column(Text)
    n_rep: Mapped[int | None]
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now,
                                                    server_default=func.current_timestamp())


def _run_fk() -> Mapped[int]:
    return mapped_column(ForeignKey("bench_run.id", ondelete="CASCADE"), index=True)


class GemmPoint(_Point, Base):
    """Dense GEMM C[M,N] = A[M,K] B[K,N], forward. ``t_s`` median seconds; p10/p90 beside it."""

    __tablename__ = "gemm_point"
    __table_args__ = (UniqueConstraint("run_id", "m", "n", "k", "dtype"), _status_check(),
                      CheckConstraint("m > 0 AND n > 0 AND k > 0", name="gemm_dims_positive"),
                      *_positive_time("t_s", "t_p10_s", "t_p90_s", required=("t_s",)))
    run_id: Mapped[int] = _run_fk()
    m: Mapped[int]
    n: Mapped[int]
    k: Mapped[int]
    dtype: Mapped[str] = mapped_column(String(16))
    t_s: Mapped[float | None] = mapped_column(Float)
    t_p10_s: Mapped[float | None] = mapped_column(Float)
    t_p90_s: Mapped[float | None] = mapped_column(Float)
    flops_per_s: Mapped[float | None] = mapped_column(Float)
    util: Mapped[float | None] = mapped_column(Float)  # fraction of the profile's peak lane
    backend: Mapped[str | None] = mapped_column(String(64))


class GroupedGemmPoint(_Point, Base):
    """MoE expert MLP projection (fc1: d -> 2*d_expert with GLU, fc2: d_expert -> d) over
    ``num_gemms`` local experts with ``tokens_per_expert`` rows each (the per-group tile M_expert).
    ``fwd_s``/``bwd_s`` medians in seconds; ``impl`` names what ran (te_grouped_linear,
    torch_grouped_mm, loop)."""

    __tablename__ = "grouped_gemm_point"
    __table_args__ = (UniqueConstraint("run_id", "proj", "distribution", "num_gemms", "tokens_per_expert",
                                       "hidden", "ffn", "dtype"), _status_check(),
                      CheckConstraint("num_gemms > 0 AND tokens_per_expert > 0 AND hidden > 0 AND ffn > 0",
                                      name="grouped_dims_positive"),
                      *_positive_time("fwd_s", "bwd_s", "fwd_p10_s", "fwd_p90_s", required=("fwd_s",)))
    run_id: Mapped[int] = _run_fk()
    proj: Mapped[str] = mapped_column(String(8))  # fc1 | fc2
    distribution: Mapped[str] = mapped_column(String(16))  # balanced | skewed
    num_gemms: Mapped[int]
    tokens_per_expert: Mapped[int]
    hidden: Mapped[int]
    ffn: Mapped[int]
    in_features: Mapped[int | None]
    out_features: Mapped[int | None]
    dtype: Mapped[str] = mapped_column(String(16))
    fwd_s: Mapped[float | None] = mapped_column(Float)
    bwd_s: Mapped[float | None] = mapped_column(Float)
    fwd_p10_s: Mapped[float | None] = mapped_column(Float)
    fwd_p90_s: Mapped[float | None] = mapped_column(Float)
    impl: Mapped[str | None] = mapped_column(String(64))


class SdpaPoint(_Point, Base):
    """Attention forward/backward on one GPU's heads: (seq_len, micro_bs, n_q_heads, n_kv_heads,
    head_dim, causal) per backend (flash, cudnn, efficient, math, te, pt)."""

    __tablename__ = "sdpa_point"
    __table_args__ = (UniqueConstraint("run_id", "seq_len", "micro_bs", "n_q_heads", "n_kv_heads", "head_dim",
                                       "causal", "dtype", "backend"), _status_check(),
                      CheckConstraint("seq_len > 0 AND micro_bs > 0 AND n_q_heads > 0 AND n_kv_heads > 0 "
                                      "AND head_dim > 0", name="sdpa_dims_positive"),
                      *_positive_time("fwd_s", "bwd_s", required=("fwd_s",)))
    run_id: Mapped[int] = _run_fk()
    seq_len: Mapped[int]
    micro_bs: Mapped[int]
    n_q_heads: Mapped[int]
    n_kv_heads: Mapped[int]
    head_dim: Mapped[int]
    causal: Mapped[bool] = mapped_column(Boolean, default=True)
    dtype: Mapped[str] = mapped_column(String(16))
    backend: Mapped[str] = mapped_column(String(32))
    fwd_s: Mapped[float | None] = mapped_column(Float)
    bwd_s: Mapped[float | None] = mapped_column(Float)


class RouterPoint(_Point, Base):
    """Routing kernels over (num_tokens, num_experts, k). ``variant``: topk (the top-k kernel
    alone), router (GEMM + sigmoid + top-k), gumbel (the paper's proposal-correction), permute,
    unpermute."""

    __tablename__ = "router_point"
    __table_args__ = (UniqueConstraint("run_id", "variant", "num_tokens", "num_experts", "k", "hidden", "dtype"),
                      _status_check(),
                      CheckConstraint("num_tokens > 0 AND num_experts > 0 AND k > 0", name="router_dims_positive"),
                      *_positive_time("fwd_s", "bwd_s", required=("fwd_s",)))
    run_id: Mapped[int] = _run_fk()
    variant: Mapped[str] = mapped_column(String(16))
    num_tokens: Mapped[int]
    num_experts: Mapped[int]
    k: Mapped[int]
    hidden: Mapped[int] = mapped_column(default=0)  # 0 where the kernel does not see d
    dtype: Mapped[str] = mapped_column(String(16))
    fwd_s: Mapped[float | None] = mapped_column(Float)
    bwd_s: Mapped[float | None] = mapped_column(Float)


class ElementwisePoint(_Point, Base):
    """Element-wise ops over (tokens, hidden): swiglu, silu, residual_add, rmsnorm, layernorm, rope."""

    __tablename__ = "elementwise_point"
    __table_args__ = (UniqueConstraint("run_id", "op", "tokens", "hidden", "dtype"), _status_check(),
                      CheckConstraint("tokens > 0 AND hidden > 0", name="elementwise_dims_positive"),
                      *_positive_time("fwd_s", "bwd_s", required=("fwd_s",)))
    run_id: Mapped[int] = _run_fk()
    op: Mapped[str] = mapped_column(String(32))
    tokens: Mapped[int]
    hidden: Mapped[int]
    dtype: Mapped[str] = mapped_column(String(16))
    fwd_s: Mapped[float | None] = mapped_column(Float)
    bwd_s: Mapped[float | None] = mapped_column(Float)


class VocabPoint(_Point, Base):
    """LM head GEMM (op=lm_head_gemm) and cross-entropy on fp32-upcast logits (op=cross_entropy)."""

    __tablename__ = "vocab_point"
    __table_args__ = (UniqueConstraint("run_id", "op", "tokens", "hidden", "vocab", "dtype"), _status_check(),
                      CheckConstraint("tokens > 0 AND hidden > 0 AND vocab > 0", name="vocab_dims_positive"),
                      *_positive_time("fwd_s", "bwd_s", required=("fwd_s",)))
    run_id: Mapped[int] = _run_fk()
    op: Mapped[str] = mapped_column(String(32))
    tokens: Mapped[int]
    hidden: Mapped[int]
    vocab: Mapped[int]
    dtype: Mapped[str] = mapped_column(String(16))
    fwd_s: Mapped[float | None] = mapped_column(Float)
    bwd_s: Mapped[float | None] = mapped_column(Float)


class CollectivePoint(_Point, Base):
    """An NCCL/gloo collective: ``size_bytes`` is the nccl-tests message size (per-rank buffer for
    all_to_all, the full tensor for all_reduce/reduce_scatter/all_gather). ``layout``: contiguous
    (dense DP groups) or strided (expert-DP groups). algbw = size/t; busbw = algbw * the nccl-tests
    factor (2(n-1)/n all_reduce, (n-1)/n reduce_scatter, all_gather and all_to_all, 1 send_recv)."""

    __tablename__ = "collective_point"
    __table_args__ = (UniqueConstraint("run_id", "collective", "group_size", "layout", "inter_node",
                                       "size_bytes", "dtype"), _status_check(),
                      CheckConstraint("group_size > 0 AND size_bytes > 0", name="collective_dims_positive"),
                      *_positive_time("t_s", "t_p10_s", "t_p90_s", required=("t_s",)))
    run_id: Mapped[int] = _run_fk()
    collective: Mapped[str] = mapped_column(String(32))
    group_size: Mapped[int]
    world_size: Mapped[int | None]
    layout: Mapped[str] = mapped_column(String(16), default="contiguous")
    inter_node: Mapped[bool] = mapped_column(Boolean)
    size_bytes: Mapped[int] = mapped_column(BigInteger)  # messages above 2 GiB (revision 0002)
    dtype: Mapped[str] = mapped_column(String(16))
    t_s: Mapped[float | None] = mapped_column(Float)
    t_p10_s: Mapped[float | None] = mapped_column(Float)
    t_p90_s: Mapped[float | None] = mapped_column(Float)
    algbw_gbps: Mapped[float | None] = mapped_column(Float)
    busbw_gbps: Mapped[float | None] = mapped_column(Float)
    backend: Mapped[str | None] = mapped_column(String(16))  # nccl | gloo


class DispatchPoint(_Point, Base):
    """CPU dispatch gap: a chain of ``chain_len`` small kernels, wall vs device-active time per
    kernel (mode gemm, gemm_relu, ...); mode=host_overhead stores the fixed per-microbatch host
    time in ``wall_per_kernel_s`` with chain_len=1."""

    __tablename__ = "dispatch_point"
    __table_args__ = (UniqueConstraint("run_id", "mode", "m", "n", "k", "dtype", "chain_len"), _status_check(),
                      *_positive_time("wall_per_kernel_s", "active_per_kernel_s", required=("wall_per_kernel_s",)))
    run_id: Mapped[int] = _run_fk()
    mode: Mapped[str] = mapped_column(String(32))
    m: Mapped[int]
    n: Mapped[int]
    k: Mapped[int]
    dtype: Mapped[str] = mapped_column(String(16))
    chain_len: Mapped[int]
    wall_per_kernel_s: Mapped[float | None] = mapped_column(Float)
    active_per_kernel_s: Mapped[float | None] = mapped_column(Float)


class AllocatorPoint(_Point, Base):
    """Caching-allocator overhead over a few training steps of the reference model (CUDA): peak
    allocated vs peak reserved bytes, memory outside the allocator (CUDA context, NCCL, handles),
    and the memory model's predicted peak allocated for the same configuration."""

    __tablename__ = "allocator_point"
    __table_args__ = (UniqueConstraint("run_id", "layers", "hidden", "experts", "k", "seq_len", "micro_bs", "ckpt",
                                       "dtype"), _status_check(),
                      CheckConstraint("layers > 0 AND hidden > 0 AND experts > 0 AND k > 0 AND seq_len > 0 "
                                      "AND micro_bs > 0", name="allocator_dims_positive"),
                      *_positive_time("step_s", required=("step_s",)))
    run_id: Mapped[int] = _run_fk()
    layers: Mapped[int]
    hidden: Mapped[int]
    experts: Mapped[int]
    k: Mapped[int]
    seq_len: Mapped[int]
    micro_bs: Mapped[int]
    ckpt: Mapped[str] = mapped_column(String(24))
    dtype: Mapped[str] = mapped_column(String(16))
    step_s: Mapped[float | None] = mapped_column(Float)  # median step seconds (context only)
    max_allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    max_reserved_bytes: Mapped[int | None] = mapped_column(BigInteger)
    allocator_fraction: Mapped[float | None] = mapped_column(Float)  # reserved / allocated - 1
    context_bytes: Mapped[int | None] = mapped_column(BigInteger)  # device used minus reserved
    predicted_allocated_bytes: Mapped[float | None] = mapped_column(Float)


MEASUREMENT_TABLES: dict[str, type[Base]] = {
    "gemm": GemmPoint, "grouped_gemm": GroupedGemmPoint, "sdpa": SdpaPoint, "router": RouterPoint,
    "elementwise": ElementwisePoint, "vocab": VocabPoint, "collectives": CollectivePoint,
    "dispatch": DispatchPoint, "allocator": AllocatorPoint,
}


class ObservedRun(Base):
    """A real training run (or one point of a measured sweep): layout + measured step time/MFU/memory.

    The measured step time ``measured_t_iter_s`` is the truth every comparison uses. ``measured_mfu``
    (a fraction) is kept only with ``mfu_flops``, the FLOP count it was logged in
    (calibrate/flops.py COUNTS), from which the step time was derived; ``measured_mfu_norm`` is MFU
    divided by the sweep's maximum when only ratios are known. ``dedup_key`` makes re-imports idempotent.
    """

    __tablename__ = "observed_run"
    __table_args__ = (
        CheckConstraint("n_devices > 0 AND gbs > 0 AND seqlen > 0", name="obs_sizes_positive"),
        CheckConstraint("tp > 0 AND cp > 0 AND pp > 0 AND dp > 0 AND ep > 0 AND etp > 0 AND vpp > 0 AND mbs > 0",
                        name="obs_layout_positive"),
        *_positive_time("measured_t_iter_s", "measured_mfu", "measured_mfu_norm", "measured_peak_mem_gb",
                        "predicted_t_iter_s"),
        CheckConstraint("measured_t_iter_s IS NOT NULL OR measured_mfu IS NOT NULL OR measured_mfu_norm IS NOT NULL",
                        name="obs_has_measurement"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    dedup_key: Mapped[str] = mapped_column(String(128), unique=True)
    source: Mapped[str] = mapped_column(String(256))
    sweep: Mapped[str | None] = mapped_column(String(128), index=True)
    model_name: Mapped[str | None] = mapped_column(String(128))
    spec: Mapped[dict[str, Any]]
    profile: Mapped[str] = mapped_column(String(128), index=True)
    n_devices: Mapped[int]
    gbs: Mapped[int]
    seqlen: Mapped[int]
    tp: Mapped[int]
    cp: Mapped[int]
    pp: Mapped[int]
    dp: Mapped[int]
    ep: Mapped[int]
    etp: Mapped[int] = mapped_column(default=1)
    vpp: Mapped[int] = mapped_column(default=1)
    mbs: Mapped[int]
    ckpt: Mapped[str] = mapped_column(String(32))
    measured_t_iter_s: Mapped[float | None] = mapped_column(Float)
    measured_mfu: Mapped[float | None] = mapped_column(Float)
    mfu_flops: Mapped[str | None] = mapped_column(String(16))  # the FLOP count of measured_mfu
    measured_mfu_norm: Mapped[float | None] = mapped_column(Float)
    measured_peak_mem_gb: Mapped[float | None] = mapped_column(Float)
    predicted_t_iter_s: Mapped[float | None] = mapped_column(Float)
    reference_mfu: Mapped[float | None] = mapped_column(Float)  # a peer estimator's prediction, if known
    extra: Mapped[dict[str, Any] | None]
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)


class Calibration(Base):
    """A fitted, versioned calibration for one hardware profile.

    kind 'chi_sys': coefficients c_A2A, c_PP, c_ovl (eq:desync); kind 'dispatch': t_gap_s,
    kappa0, kappa1, t_host_s. ``inputs`` holds the data fitted, ``residuals`` the per-point log
    residuals, ``cv_error`` the cross-validated error (fraction). ``stack``: the training stack the fit's
    runs ran (it applies to plans of that stack only).
    """

    __tablename__ = "calibration"
    __table_args__ = (UniqueConstraint("profile", "kind", "version"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    profile: Mapped[str] = mapped_column(String(128), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    version: Mapped[int]
    coefficients: Mapped[dict[str, Any]]
    inputs: Mapped[dict[str, Any] | None]
    residuals: Mapped[list[Any] | None]
    cv_error: Mapped[float | None] = mapped_column(Float)
    n_obs: Mapped[int]
    notes: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)
    # the training stack its runs ran (scaleplan.stack.Stack.key); NULL: the paper's stack, "megatron"
    stack: Mapped[str | None] = mapped_column(String(256))


class LawRun(Base):
    """One scaling-law training run: (N_tot, N_act, S, G, D) -> final smoothed loss."""

    __tablename__ = "law_run"
    __table_args__ = (
        UniqueConstraint("dataset", "n_tot", "n_act", "g", "d", "e", "k", "layers"),
        CheckConstraint("n_tot > 0 AND n_act > 0 AND d > 0 AND g > 0 AND loss > 0 AND loss < 1e300",
                        name="law_run_positive"),
        CheckConstraint("s >= 0 AND s < 1", name="law_run_sparsity"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    dataset: Mapped[str] = mapped_column(String(256))
    n_tot: Mapped[float]
    n_act: Mapped[float]
    s: Mapped[float]
    g: Mapped[float]
    d: Mapped[float]
    loss: Mapped[float]
    e: Mapped[int] = mapped_column(default=0)
    k: Mapped[int] = mapped_column(default=0)
    layers: Mapped[int] = mapped_column(default=0)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)


class LawFit(Base):
    """A fitted joint scaling law (eq:joint-law) with its uncertainty and identifiability."""

    __tablename__ = "law_fit"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    dataset: Mapped[str | None] = mapped_column(String(256))
    coefficients: Mapped[dict[str, Any]]
    ci95: Mapped[dict[str, Any] | None]
    heldout_rmse: Mapped[float | None] = mapped_column(Float)
    identified: Mapped[list[Any] | None]
    n_runs: Mapped[int]
    settings: Mapped[dict[str, Any] | None]
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)

