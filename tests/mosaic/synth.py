"""Synthetic scaling-law runs on a grid like the paper's dataset (app:dataset tables), for fit tests."""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from scaleplan.geometry import ladder_param_counts
from scaleplan.mosaic.law import PAPER_JOINT_LAW

# tab:dataset-perfamily: (L, d) in {(8,1024),(12,1536),(16,2048),(24,3072)} = ladder seeds q = 2, 3, 4, 6;
# D ranges per family (tokens); tab:dataset-perG: E, K per G.
FAMILIES = {2: (2.88e9, 7.68e9), 3: (5.76e9, 11.52e9), 4: (28.19e9, 56.38e9), 6: (50e9, 50e9)}
PER_G = {1: ((8, 16, 32, 64, 128), (1, 2)), 2: ((32, 64, 128), (1, 2)),
         4: ((12, 16, 32, 64, 128, 256, 384), (2, 4, 6, 8)), 8: ((96, 128, 256, 512), (2, 4, 8))}


def synthetic_runs(noise: float = 0.002, seed: int = 0, law=PAPER_JOINT_LAW) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for q, (d_lo, d_hi) in FAMILIES.items():
        for g, (experts, topk) in PER_G.items():
            for e, k in itertools.product(experts, topk):
                if k > e:
                    continue
                n_tot, n_act, _ = ladder_param_counts(q, e, k, g)
                s = 1 - n_act / n_tot
                if not 0.5 <= s <= 0.985:
                    continue
                for d in sorted({d_lo, d_hi}):
                    rows.append({"n_tot": float(n_tot), "n_act": float(n_act), "s": float(s), "g": g, "d": d,
                                 "e": e, "k": k, "layers": 4 * q})
    df = pd.DataFrame(rows)
    clean = law(df.n_tot.to_numpy(), df.s.to_numpy(), df.d.to_numpy(), df.g.to_numpy())
    df["loss"] = clean * np.exp(noise * rng.standard_normal(len(df)))
    return df
