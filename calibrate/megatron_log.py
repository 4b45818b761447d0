"""`scaleplan calibrate add --megatron-log FILE...`: observed runs from Megatron-LM training logs.

Each log is read whole first (scaleplan.megatron.log.read_log: spec, layout, median step time after warm-up);
only when every file reads are they stored, in one transaction, as observed runs with the measured step time
and their provenance (file name, sha256, iteration range, spread, logged TFLOP/s per GPU, memory). A bad or
truncated log stores nothing. The stored runs are what `calibrate fit` reads (calibrate.observations).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from scaleplan.calibrate.observations import Observation, read_back_observations, store_observations


def observation_of(run, sweep: str) -> Observation:
    """The observed run of a :class:`scaleplan.megatron.log.MegatronRun` (step time in seconds, memory in GB)."""
    name = Path(run.file).name
    extra: dict[str, Any] = {
        "megatron_log": {"file": name, "sha256": run.sha256, "iterations": list(run.iterations),
                         "intervals": run.n_intervals, "step_s_min": run.step_spread_s[0],
                         "step_s_max": run.step_spread_s[1]}}
    if run.tflops_per_gpu is not None:
        extra["megatron_log"]["tflops_per_gpu"] = run.tflops_per_gpu
    if run.peak_alloc_gb is not None:
        extra["megatron_log"]["max_allocated_gb"] = run.peak_alloc_gb
    spec = run.spec
    return Observation(sweep=sweep, model_name=None, spec=spec.model_dump(mode="json"),
                       profile=spec.hardware.node_type, n_devices=run.n_devices, gbs=spec.data.gbs,
                       seqlen=spec.data.seqlen, layout=dict(run.layout), measured_t_iter_s=run.step_s,
                       measured_peak_mem_gb=run.peak_mem_gb, source=f"megatron-log:{name}", extra=extra)


def add_megatron_logs(url: str | None, paths: list[Path], profile: str, warmup: int = 10,
                      sweep: str | None = None) -> dict[str, Any]:
    """Read every log, then store them in one transaction. Returns what was read and stored.
    Raises SpecError (one line) on the first unreadable, truncated or malformed log; nothing is stored then."""
    from scaleplan.db import session as dbs
    from scaleplan.megatron.log import read_log

    runs = [read_log(p, profile, warmup) for p in paths]
    obs = [observation_of(r, sweep or Path(r.file).stem) for r in runs]
    dbs.ensure_schema(url)

    def _go() -> int:
        with dbs.session_scope(url) as s:
            return store_observations(s, obs)

    inserted = dbs.with_retry(_go)
    read_back_observations(url, obs)
    return {"files": [str(p) for p in paths], "rows": len(obs), "inserted": inserted,
            "already_present": len(obs) - inserted,
            "runs": [{"file": Path(r.file).name, "sha256": r.sha256, "sweep": o.sweep, "layout": r.layout,
                      "n_devices": r.n_devices, "step_s": r.step_s, "step_spread_s": list(r.step_spread_s),
                      "iterations": list(r.iterations), "tflops_per_gpu": r.tflops_per_gpu,
                      "peak_mem_gb": r.peak_mem_gb, "notes": r.notes} for r, o in zip(runs, obs)]}
