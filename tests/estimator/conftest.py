"""Estimator test helpers: specs, synthetic tables, the validation sweeps."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from scaleplan.specs import Layout, parse_spec


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
    """(sweep name, Spec, n_devices, [Layout], measured MFU %, reference MFU %) per validation sweep."""
    models = yaml.safe_load((validation_dir / "models.yaml").read_text())
    df = pd.read_csv(validation_dir / "mfu_sweeps.csv")
    out = []
    for name, g in df.groupby("sweep", sort=False):
        r0 = g.iloc[0]
        d = dict(models[r0.model])
        d["data"] = {"seqlen": int(r0.seqlen), "gbs": int(r0.gbs)}
        lays = [Layout(tp=int(r.tp), cp=int(r.cp), pp=int(r.pp), dp=int(r.dp), ep=int(r.ep), mbs=int(r.mbs),
                       ckpt="full") for r in g.itertuples()]
        out.append((name, parse_spec(d), int(r0.n_devices), lays, g.real_mfu_pct_est.to_numpy(),
                    g.reference_pred_mfu_pct.to_numpy()))
    return out


def rel(a, b) -> float:
    return float(np.abs(a - b) / np.abs(b))
