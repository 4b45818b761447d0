"""The geometry scaling ladder (sec:geometry-ladder, tab:scale-ladder) as a grid of realizable MoE geometries.

Seed q fixes L = 4q layers, n_head = 4q, d = 128 n_head, d_ff = 2.5 d; the MoE axes (E, K, G) sit on top
with d_expert = d_ff / G, one shared expert of width d_expert and the first block dense. Parameter counts
come from :mod:`scaleplan.geometry` (the one place that counts parameters).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from scaleplan.geometry import DEFAULT_KV_HEADS, DEFAULT_VOCAB, ladder_dims, ladder_model, ladder_param_counts
from scaleplan.specs import ModelBlock

#: The paper's search grid (sec:minlp-implementation).
PAPER_Q = (8, 10, 12, 14, 16, 18)
PAPER_E = (4, 6, 8, 16, 24, 32, 48, 96, 128, 192, 256, 384, 512)
PAPER_K = (1, 2, 4, 6, 8)
PAPER_G = (1, 2, 4, 8)
PAPER_S_MIN = 0.7


@dataclass(frozen=True)
class LadderGrid:
    """The outer architecture grid of MOSAIC: seeds q, expert counts E, top-K, split factors G."""

    q: tuple[int, ...] = PAPER_Q
    experts: tuple[int, ...] = PAPER_E
    topk: tuple[int, ...] = PAPER_K
    g: tuple[int, ...] = PAPER_G
    s_min: float = PAPER_S_MIN
    s_max: float = 1.0  # no upper guard by default (the paper's grid has none); --s-max sets one
    vocab: int = DEFAULT_VOCAB
    kv_heads: int = DEFAULT_KV_HEADS

    @property
    def n_combinations(self) -> int:
        return len(self.q) * len(self.experts) * len(self.topk) * len(self.g)


def enumerate_geometries(grid: LadderGrid) -> pd.DataFrame:
    """All realizable geometries of the grid, one row each, computed as numpy arrays at once.

    Realizable: K <= E, d_ff divisible by G, kv_heads dividing n_head, s_min <= S <= s_max.
    Columns: q, n_layers, d, d_ff, n_experts, topk, g, d_expert, n_tot, n_act, s, n_embed (parameters).
    """
    combos = np.array(list(itertools.product(grid.q, grid.experts, grid.topk, grid.g)), dtype=np.int64)
    if combos.size == 0:
        return pd.DataFrame(columns=["q", "n_layers", "d", "d_ff", "n_experts", "topk", "g", "d_expert",
                                     "n_tot", "n_act", "s", "n_embed"])
    q, E, K, G = combos.T
    L, n_head, d, d_ff = ladder_dims(q)
    kv = np.minimum(grid.kv_heads, n_head)
    ok = (K <= E) & (d_ff % G == 0) & (n_head % kv == 0)
    n_tot, n_act, emb = ladder_param_counts(q, E, K, G, vocab=grid.vocab, kv_heads=grid.kv_heads)
    n_tot, n_act = np.asarray(n_tot, dtype=float), np.asarray(n_act, dtype=float)
    s = 1.0 - n_act / n_tot
    ok &= (s >= grid.s_min) & (s <= grid.s_max)
    df = pd.DataFrame({"q": q, "n_layers": L, "d": d, "d_ff": d_ff, "n_experts": E, "topk": K, "g": G,
                       "d_expert": d_ff // G, "n_tot": n_tot, "n_act": n_act, "s": s,
                       "n_embed": np.broadcast_to(emb, q.shape).astype(float)})
    return df[ok].reset_index(drop=True)


def geometry_model(row, grid: LadderGrid) -> ModelBlock:
    """The concrete model block of one enumerated geometry (a row of :func:`enumerate_geometries`)."""
    return ladder_model(int(row.q), int(row.n_experts), int(row.topk), int(row.g), vocab=grid.vocab,
                        kv_heads=grid.kv_heads)
