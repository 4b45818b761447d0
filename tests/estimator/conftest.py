"""Estimator test helpers: specs, synthetic tables, the validation sweeps."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest


def moe_spec(**over) -> dict:
    """The 700M validation model (models.yaml moe-700m) as a spec dict, overridable per block."""
    d = {
        "model": {"n_layers": 16, "hidden_sz": 2048, "inter_sz": 5120, "n_q_heads": 16, "n_kv_heads": 16,
                  "head_dim": 128, "vocab_sz": 257540, "tie_embeddings": False,
                  "moe": {"n_experts": 128, "experts_per_token": 3, "expert_inter_sz": 1280,
                          "shared_expert_inter_sz": 1280}},
        "performance": {"activation_checkpointing_type": "full"},
        "optimizer": {"optimizer_type": "scion"},
        "data": {"seqlen": 8192, "gbs": 256},
        "hardware": {"node_type": "p6-b200.48xlarge"},
    }
    for k, v in over.items():
        d[k] = {**d.get(k, {}), **v} if isinstance(v, dict) else v
    return d


def frame(rows: list[dict]) -> pd.DataFrame:
    """A measurement frame as the loader returns it (one run, OK rows)."""
    df = pd.DataFrame(rows)
    df["run_started"] = pd.Timestamp("2026-01-01")
    df["run_order"] = 1
    df["status"] = "OK"
    return df


def grouped_frame(hidden: int, ffn: int, law) -> pd.DataFrame:
    """Balanced grouped-GEMM rows on the recorded grid, fwd/bwd = law(num_gemms, tokens_per_expert)."""
    rows = []
    for ng in (4, 8, 16, 32, 64, 128):
        for tpe in (64, 128, 192, 256, 512, 1024, 2048, 4096):
            for proj in ("fc1", "fc2"):
                t = law(ng, tpe) / 2
                rows.append(dict(proj=proj, distribution="balanced", num_gemms=ng, tokens_per_expert=tpe,
                                 hidden=hidden, ffn=ffn, dtype="bf16", fwd_s=t, bwd_s=2 * t))
    return frame(rows)


@pytest.fixture(scope="session")
def sweeps(validation_dir):
    """(sweep name, Spec, n_devices, [Layout], measured step time s, reference step time s) per
    validation sweep (the step time is the measurement: shared/validation/README.md)."""
    from scaleplan.calibrate.observations import sweeps_of

    return [(name, spec, n, lays, np.array([o.measured_t_iter_s for o in obs]),
             np.array([o.extra["reference_step_s"] for o in obs]))
            for name, spec, n, lays, obs in sweeps_of(validation_dir / "mfu_sweeps.csv",
                                                      validation_dir / "models.yaml")]


def rel(a, b) -> float:
    return float(np.abs(a - b) / np.abs(b))


def context(est, g, lay, seqlen: int = 8192, gbs: int | None = None, mode: str = "compose", tables=None,
            profile=None, **shapes):
    """The EvalContext ``est``'s time model reads for the plans ``lay`` of model ``g`` (a fresh record in
    ``mode``; ``tables`` instead of the estimator's, viewed in g's precision), with the shape fields given
    in ``shapes`` replaced (values broadcast over the plans): keys a test asks about directly. ``est`` None:
    ``tables`` and ``profile`` (a name or a ClusterProfile) alone."""
    from dataclasses import replace

    from scaleplan.estimator.context import EvalContext
    from scaleplan.estimator.shapes import plan_shapes
    from scaleplan.estimator.sources import Recorder
    from scaleplan.profiles import load_profile

    P = len(lay)
    if est is not None:
        ctx = est.model.context(g, lay, seqlen, gbs, tables)
    else:
        prof = load_profile(profile) if isinstance(profile, str) else profile
        ctx = EvalContext(tables.view(g.precision), prof, Recorder(P, mode), g, lay, plan_shapes(g, lay, seqlen, gbs),
                          seqlen)
    sh = replace(ctx.shapes, **{k: np.broadcast_to(np.asarray(v, dtype=float), (P,)).copy() for k, v in shapes.items()})
    return replace(ctx, rec=Recorder(P, mode), shapes=sh)
