"""Predicted vs measured: MFU of a measured step, the estimator's prediction, and the ObservedRun row.

MFU (eq:mfu) is counted exactly as the estimator's ``mfu``: N = N_act, the active non-embedding
parameters (:func:`scaleplan.geometry.spec_param_counts`; no input embedding, no LM head), model FLOPs
per step = 6 N gbs seqlen (no attention-score FLOPs), divided by t_iter * n_devices * peak, the
profile's peak for the model precision (FLOP/s per device). The measured and predicted MFU of a
`validate` row are the same quantity.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from scaleplan.geometry import spec_param_counts
from scaleplan.specs import Layout, Spec

GB = 1e9


def model_flops_per_step(spec: Spec) -> float:
    """6 N_act gbs seqlen (FLOP per optimizer step, eq:mfu's numerator; N_act without embeddings,
    as the estimator's ``mfu``: counting them here made measured and predicted MFU differ by N_emb/N_act)."""
    return 6.0 * spec_param_counts(spec.model).n_act * spec.data.gbs * spec.data.seqlen


def mfu(spec: Spec, t_iter_s: float, n_devices: int, peak_flops: float) -> float:
    """Model FLOPs utilisation (fraction) of one step of ``t_iter_s`` seconds on ``n_devices``."""
    return model_flops_per_step(spec) / (t_iter_s * n_devices * peak_flops)


def default_profile(device: str, nproc: int) -> str:
    """The local machine's profile: cpu-local on CPU; on CUDA the profile whose GPU name matches."""
    if device != "cuda":
        return "cpu-local"
    import torch

    from scaleplan.profiles import load_profile, profile_names

    name = torch.cuda.get_device_name(0)
    fits = [p for p in profile_names() if p != "cpu-local" and load_profile(p).gpu_name in name]
    fits.sort(key=lambda p: (load_profile(p).gpus_per_node < nproc, load_profile(p).gpus_per_node))
    if not fits:
        from scaleplan.errors import SpecError

        raise SpecError("--profile", None, f"no built-in profile matches GPU {name!r}; pass --profile")
    return fits[0]


def predict(spec: Spec, layouts: list[Layout], n_devices: int, profile: str, db_url: str | None,
            extrapolate: str = "error") -> tuple[list[dict[str, Any] | None], str | None]:
    """The estimator's results (as dicts) for ``layouts``, or (Nones, one-line reason) when it cannot.
    Predicted with the estimator's reference stack: validate trains scaleplan's own reference model,
    whose host dispatch the ``ops:*`` rows measure (not Megatron's kernel count)."""
    try:
        from scaleplan.estimator import Estimator
    except ImportError as e:
        return [None] * len(layouts), f"estimator unavailable ({e})"
    from scaleplan.errors import ScaleplanError

    try:
        est = Estimator(profile, db_url, extrapolate=extrapolate, stack="reference")
        res = est.estimate(spec, n_devices, layouts)
    except ScaleplanError as e:
        return [None] * len(layouts), str(e)
    return [r.to_dict() for r in res], None


def _git_rev() -> str | None:
    """Short HEAD of this checkout; outside one (a copy shipped to a GPU host) $SCALEPLAN_GIT_REV, else None."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5, check=False,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or os.environ.get("SCALEPLAN_GIT_REV") or None
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("SCALEPLAN_GIT_REV") or None


def store_observation(db_url: str | None, spec: Spec, spec_name: str, layout: Layout, n_devices: int,
                      profile: str, result, measured_mfu: float, prediction: dict[str, Any] | None,
                      sweep: str, steps: int, warmup: int, device: str) -> int:
    """Insert one ObservedRun (source 'validate', provenance in ``extra``); return its id."""
    from scaleplan.db.models import ObservedRun
    from scaleplan.db.session import ensure_schema, read_back, session_scope
    from scaleplan.estimator.layout import ParallelLayout

    ensure_schema(db_url)
    now = dt.datetime.now(dt.timezone.utc)
    spec_js = spec.model_dump(mode="json")
    lay = layout.model_dump()
    key_src = json.dumps([spec_js, lay, n_devices, profile, now.isoformat(), platform.node()], sort_keys=True)
    extra = {
        "provenance": {"host": platform.node(), "device": device, "device_name": result.device_name,
                       "torch_version": result.torch_version, "backend": result.backend,
                       "threads_per_process": result.threads, "grouped_gemm_impl": result.grouped_impl,
                       "git_rev": _git_rev(), "python": platform.python_version(), "started_at": now.isoformat(),
                       "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None},
        "steps": steps, "warmup": warmup, "n_mb": result.n_mb, "step_times_s": result.step_times_s,
        "warmup_times_s": result.extra.get("warmup_times_s"),
        "step_cpu_s_rank0": result.extra.get("step_cpu_s_rank0"),
        "dp_replicas_in_sync": result.extra.get("dp_replicas_in_sync"),
        "load": result.extra.get("load"),  # machine load during the timed steps (validate.load)
        "peak_reserved_bytes": result.extra.get("peak_reserved_bytes"),
        "peak_mem_kind": "cuda_max_memory_allocated" if device == "cuda" else "rss_growth_over_import",
        "peak_rss_bytes": result.peak_rss_bytes, "rss_baseline_bytes": result.rss_baseline_bytes,
        "final_loss": result.final_loss, "starved_experts": result.starved_experts,
        "predicted_mfu": prediction["mfu"] if prediction else None,
        "predicted_mem_gb": prediction["mem_per_device_gb"] if prediction else None,
        "predicted_breakdown_s": prediction.get("breakdown_s") if prediction else None,
        "predicted_sources": prediction.get("sources") if prediction else None,
    }
    row = ObservedRun(
        dedup_key=hashlib.sha256(key_src.encode()).hexdigest()[:64], source="validate", sweep=sweep,
        model_name=spec_name, spec=spec_js, profile=profile, n_devices=n_devices, gbs=spec.data.gbs,
        seqlen=spec.data.seqlen, **ParallelLayout.from_specs([layout], n_devices).row(0),
        measured_t_iter_s=result.t_iter_s, measured_mfu=measured_mfu, mfu_flops="eq-mfu",
        measured_peak_mem_gb=result.peak_mem_bytes / GB if result.peak_mem_bytes > 0 else None,
        predicted_t_iter_s=prediction["t_iter_s"] if prediction else None, extra=extra,
    )
    with session_scope(db_url) as s:
        s.add(row)
        s.flush()
        oid = int(row.id)
    read_back(db_url, ObservedRun, [oid])
    return oid


def comparison_row(layout: Layout, n_devices: int, result, measured_mfu: float,
                   prediction: dict[str, Any] | None, observation_id: int | None) -> dict[str, Any]:
    """One entry of ``scaleplan validate --json`` (keys fixed by the issue)."""
    lay = {**layout.model_dump(), "dp": n_devices}
    return {
        "layout": lay,
        "measured_t_iter_s": result.t_iter_s,
        "predicted_t_iter_s": prediction["t_iter_s"] if prediction else None,
        "measured_mfu": measured_mfu,
        "predicted_mfu": prediction["mfu"] if prediction else None,
        "measured_peak_mem_gb": result.peak_mem_bytes / GB,
        "predicted_mem_gb": prediction["mem_per_device_gb"] if prediction else None,
        "observation_id": observation_id,
    }
