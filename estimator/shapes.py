"""Per-rank shapes of one micro-batch under a layout: computed once, read by the time model and by
the table-point listing (``bench plan``), so the two cannot drift apart.

All fields are float arrays over plans (one element per plan) unless noted. Token counts are rows
of the activations a rank holds; widths are columns; bytes use the model precision.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scaleplan.estimator.model_dims import Geometry, vocab_shard
from scaleplan.estimator.layout import ParallelLayout

from scaleplan.units import BYTES_PER_ELEMENT


@dataclass(frozen=True)
class RankShapes:
    T: np.ndarray        # tokens of a rank's sequence shard, seqlen * mbs / CP (all TP ranks hold them)
    Tsp: np.ndarray      # sequence-parallel shard, T / TP
    kv_loc: np.ndarray   # KV heads per TP rank (replicated once TP exceeds n_kv)
    n_qkv: np.ndarray    # QKV(+gate) GEMM output width per TP rank
    n_attn_out: np.ndarray  # attention output GEMM input width per TP rank (n_q head_dim / TP)
    E_loc: np.ndarray    # local experts, E / EP (1 for a dense model)
    R: np.ndarray        # routed rows per rank, T K ETP cf / TP (balanced routing; cf the capacity factor)
    tile: np.ndarray     # rows per local expert, R EP / E (the EP tile correction, estimator.model)
    ffn_loc: np.ndarray  # expert width per ETP rank
    V_loc: np.ndarray    # Megatron-padded vocabulary per TP rank
    a2a_bytes: np.ndarray  # EP all-to-all buffer per rank and pass, R d bytes
    b_el: int            # bytes per element of the model precision (scalar)


def rank_shapes(g: Geometry, lay: ParallelLayout, seqlen: int) -> RankShapes:
    """Shapes per plan of ``lay``; see :class:`RankShapes`."""
    tp, cp, ep, etp, mbs = (getattr(lay, f).astype(float) for f in ("tp", "cp", "ep", "etp", "mbs"))
    b_el = BYTES_PER_ELEMENT.get(g.precision, 2)
    T = seqlen * mbs / cp
    kv_loc = np.maximum(g.nkv / tp, 1.0)
    n_qkv = (g.nq * g.hd + g.gate) / tp + 2 * kv_loc * g.hd
    E_loc = g.E / ep if g.is_moe else np.ones_like(tp)
    # the capacity factor sizes the routed token budget and the all-to-all (paper sec:performance-model,
    # "model.moe"): each expert's buffer holds cf x its balanced share (dropped or padded rows)
    R = T * g.K * etp * g.capacity_factor / tp if g.is_moe else np.zeros_like(T)
    tile = R * ep / g.E if g.is_moe else np.zeros_like(T)
    V_loc = vocab_shard(g.vocab, tp)
    return RankShapes(T=T, Tsp=T / tp, kv_loc=kv_loc, n_qkv=n_qkv, n_attn_out=g.nq * g.hd / tp, E_loc=E_loc,
                      R=R, tile=tile, ffn_loc=g.dexp / etp, V_loc=V_loc, a2a_bytes=R * g.d * b_el, b_el=b_el)
