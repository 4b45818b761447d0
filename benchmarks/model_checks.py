"""Figures docs/accuracy.md quotes that no other script prints (prints figures; asserts nothing).

1. tab:staged-top4 ID 1 (q=10 E=128 K=2 G=4 on 64 B200, pp=4 ep=8 mbs=4, gbs 1024, seqlen 2048, adamw):
   memory per GPU by category for each checkpointing mode (GB, ``EstimateResult.mem_breakdown_gb``), the
   figures of docs/accuracy.md's memory section.
2. The 700M sweep at PP = 1: the uncalibrated step time at EP 1, 2, 4, 8 against the measured one, and
   the jump from EP 2 to EP 1 that the layer-wise optimizer's per-tensor broadcasts make.
3. tab:staged-top4's MFU ratios (logged count, each run over ID 4, every run without recompute) with the host
   side of the dispatch law scaled from 0.2 to 5 (``Estimator(host_scale=...)``, the calibration's own knob):
   how far any balance of host and device time moves each ratio, against the measured 0.84 / 0.69 / 0.91.

    python benchmarks/model_checks.py --db URL-with-recorded-tables [--validation ../shared/validation]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import yaml
from scaleplan.estimator import Estimator, PlanConstraints

from scaleplan.geometry import ladder_model
from scaleplan.specs import Layout, parse_spec

PROFILE = "p6-b200.48xlarge"
VALIDATION = Path(__file__).resolve().parents[1].parent / "shared" / "validation"


def staged_id1_memory(est: Estimator) -> None:
    print("tab:staged-top4 ID 1, memory per GPU (GB) by checkpointing mode, on the stage with the largest "
          "peak:")
    for ckpt in ("none", "selective", "super-selective", "full"):
        fixed = PlanConstraints(tp=(1,), cp=(1,), pp=(4,), ep=(8,), mbs=(4,), ckpt=(ckpt,), mem_fraction=1.0)
        r = est.best_plan(ladder_model(10, 128, 2, 4), 64, 1024, 2048, "adamw", fixed)
        parts = ", ".join(f"{k} {v:.2f}" for k, v in r.mem_breakdown_gb.items())
        print(f"   {ckpt:15s} total {r.mem_per_device_gb:6.1f}: {parts}")


def pp1_ep_steps(est: Estimator, vdir: Path) -> None:
    runs = pd.read_csv(vdir / "mfu_sweeps.csv")
    runs = runs[(runs["sweep"] == "700m-32dev") & (runs["pp"] == 1)].set_index("ep")
    doc = dict(yaml.safe_load((vdir / "models.yaml").read_text())["moe-700m"])
    row = runs.iloc[0]
    doc["data"] = {"gbs": int(row["gbs"]), "seqlen": int(row["seqlen"]), "microbatch_sz": int(row["mbs"])}
    spec = parse_spec(doc)
    eps = sorted(runs.index)
    layouts = [Layout(pp=1, ep=int(e), dp=int(row["dp"]), mbs=int(row["mbs"])) for e in eps]
    got = est.estimate(spec, int(row["n_devices"]), layouts)
    pred = {e: r.t_iter_s for e, r in zip(eps, got)}
    meas = runs["real_step_s_est"].to_dict()
    print("700m-32dev at PP = 1, step time (s), measured | ours uncalibrated:")
    print("   " + ";  ".join(f"ep={e} {meas[e]:.2f} | {pred[e]:.2f}" for e in eps))
    if 1 in pred and 2 in pred:
        print(f"   EP 2 -> EP 1: measured {meas[1] - meas[2]:+.2f} s, ours {pred[1] - pred[2]:+.2f} s")


def staged_host_scan(db: str) -> None:
    from estimator_accuracy import _staged, staged_error, staged_plans

    meas = [r[5] for r in _staged()[1][:3]]
    print("tab:staged-top4, MFU over ID 4's (logged count, no recompute) with the host time scaled; measured "
          + " / ".join(f"{m:.2f}" for m in meas) + ":")
    for scale in (0.2, 0.5, 0.7, 1.0, 1.5, 2.0, 5.0):
        est = Estimator(PROFILE, db, use_calibration=False, host_scale=scale)
        x, mape = staged_error([r.mfu_validation for r in staged_plans(est, 2.0, ("none",))])
        print(f"   host x {scale:3.1f}: " + " / ".join(f"{v:.3f}" for v in x[:3]) + f"  MAPE {mape:.1f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=None)
    ap.add_argument("--validation", default=str(VALIDATION))
    a = ap.parse_args()
    from _db import tables_db  # benchmarks/_db.py: a database without tables is refused in one line

    a.db = tables_db(a.db)
    est = Estimator(PROFILE, a.db, use_calibration=False)
    staged_id1_memory(est)
    pp1_ep_steps(est, Path(a.validation))
    staged_host_scan(a.db)


if __name__ == "__main__":
    main()
