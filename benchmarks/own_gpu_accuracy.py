"""The reference MoE on scaleplan's own GPUs: predicted against measured step time, from the shipped tables.

Imports cluster_profiles/recorded into a temporary SQLite database, estimates the reference model
(tests/data/validate_specs/gpu_small.yaml, ``Estimator(stack="reference")``) on each own profile from that
profile's tables alone, and prints per layout the measured step time (median over the profile's
``validate`` sweeps in cluster_profiles/observed/<profile>-validate.csv, with their spread), the prediction
and the error; then each traced step's device time per component, measured against predicted
(<profile>-trace.csv). Prints figures; asserts nothing (tests/estimator/test_own_gpu_tables.py does).

Usage: python benchmarks/own_gpu_accuracy.py [--profiles h200-single,h100-single]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
OBSERVED = REPO / "cluster_profiles" / "observed"
SPEC = REPO / "tests" / "data" / "validate_specs" / "gpu_small.yaml"


def steps(url: str, profile: str) -> None:
    from scaleplan.estimator import Estimator

    from scaleplan.specs import load_spec, parse_layout

    obs = pd.read_csv(OBSERVED / f"{profile}-validate.csv")
    by = obs.groupby(["mbs", "ckpt"])["measured_t_iter_s"]
    med, lo, hi = by.median(), by.min(), by.max()
    sp = load_spec(SPEC)
    lays = [parse_layout(f"mbs={m},ckpt={c}", sp.default_layout()).model_copy(update={"dp": 1}) for m, c in med.index]
    res = Estimator(profile, url, stack="reference").estimate(sp, 1, lays)
    print(f"{profile}: {obs['sweep'].nunique()} sweeps of {len(med)} layouts, gpu {obs['gpu_name'].iloc[0]}")
    errs = {}
    for r, key in zip(res, med.index):
        errs[key] = r.t_iter_s / med[key] - 1
        print(f"  mbs={key[0]} ckpt={key[1]:5s} measured {med[key]:.4f} s (sweeps {lo[key]:.4f}..{hi[key]:.4f})"
              f"  predicted {r.t_iter_s:.4f} s  error {errs[key]:+.1%}")
    host = [e for (m, c), e in errs.items() if m < 4]
    print(f"  MAPE over the host-bound layouts (mbs < 4): {np.mean(np.abs(host)):.1%}; all: "
          f"{np.mean(np.abs(list(errs.values()))):.1%}")


def traces(profile: str) -> None:
    tr = pd.read_csv(OBSERVED / f"{profile}-trace.csv")
    for (m, c), g in tr.groupby(["mbs", "ckpt"]):
        one = g.iloc[0]
        print(f"  traced mbs={m} ckpt={c}: {int(one['kernels_per_step'])} kernels, device {one['trace_device_s']:.4f} s "
              f"of a {one['traced_step_wall_s']:.4f} s traced step; per component measured / predicted by the code at its git_rev (s):")
        dev = g[g["component"] != "host gaps/idle"]
        print("    " + ", ".join(f"{r.component} {r.measured_s:.4f}/{r.predicted_s:.4f}" for r in dev.itertuples()))
        print(f"    device total measured {dev['measured_s'].sum():.4f} s, predicted {dev['predicted_s'].sum():.4f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", default="h200-single,h100-single")
    args = ap.parse_args()
    from scaleplan.db.recorded import own_tables_db

    url = own_tables_db()
    for p in args.profiles.split(","):
        steps(url, p)
        traces(p)


if __name__ == "__main__":
    main()
