"""Roofline composition outside a kernel table's measured range (``--extrapolate compose``).

A kernel's time is bounded below by each resource it needs: its launch and set-up (a fixed floor),
the bytes it moves at the device's memory bandwidth, and its FLOPs at the throughput it can reach.
Where the affine rule of tables.COMPOSE_RULES (continue the last measured interval) reads a
transition as a trend, these bounds hold whatever regime the edge sits in (each rule's hold-out error:
docs/accuracy.md, ``benchmarks/compose_accuracy.py``):

* grouped GEMM above the measured tokens per expert: ``max(t_edge, W / R_sat, t_dense)``. A call with
  more tokens per expert never takes less than one with fewer (its host and launch part is the same),
  its GPU part cannot run faster than the fastest grouped-GEMM throughput measured on the device
  (``R_sat``, FLOP/s, per direction and dtype, over every shape of the table), nor than the dense GEMMs
  of all its tokens concatenated where the dense table of the same dtype holds them
  (:func:`concatenated_time`). The affine rule
  charges the edge interval's slope, which mid-ramp is the wave fill still improving and, where the
  edge is launch-bound, noise.
* grouped GEMM below the measured tokens per expert: ``max(t_fixed(num_gemms), W / R_edge)``, the
  fastest any shape ran that many GEMMs (the call's host and launch part) or the FLOPs at the edge's
  throughput.
* dense GEMM below the measured m: ``max(t_min + B / BW, W / R_edge)``: the operands B = m k + k n +
  m n at the device's best measured bandwidth BW after its fastest kernel time t_min (alpha-beta
  in bytes), or the FLOPs W = 2 m n k at the edge's own throughput R_edge (throughput only falls
  as m shrinks). The affine rule ran the edge's compute slope down into the memory-bound regime.
  Where the transposed problem (n, m', k) lies inside the table it is read
  instead (:func:`transposed_time`).
* grouped GEMM grids are undominated first (:func:`undominated_grid`): a disturbed point is no edge.
* causal SDPA below the measured seq_len: the call's fixed part plus the edge's GPU time scaled by its
  linear + quadratic work (:class:`SdpaFloor`).
* collectives beyond the largest message: alpha-beta from a robust edge, beta fitted over the last
  messages and bounded by the regime's saturated bus bandwidth and, for an all-reduce, by its
  reduce-scatter plus all-gather (:func:`collective_tail`, :func:`ring_all_reduce_bound`), where the
  last interval's slope alone is noise-bound.

Every quantity is read off the measured table itself: the SDPA and collective fits are least squares
over the table's own points, no coefficient is set by hand.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from scaleplan.estimator.lookup_points import on_grid

if TYPE_CHECKING:
    from scaleplan.estimator.tables import GridTable


@dataclass(frozen=True)
class Ceiling:
    """Above axis ``axis``: t = max(t_composed_other_axes, W / r_sat, t_dense), W = ``flops_per_point`` x
    the product of the coordinates (FLOPs), r_sat in FLOP/s, t_dense (seconds) the GEMMs ``gemms`` of
    the concatenated tokens (:func:`concatenated_time`) on ``dense``, the dense GEMM table of the same
    dtype (None: no such bound). Picklable (the tables are cached on disk)."""

    axis: int
    flops_per_point: float
    r_sat: float
    dense: object = None
    gemms: tuple = ()

    def work(self, cs: Sequence[np.ndarray]) -> np.ndarray:
        return self.flops_per_point * np.prod(np.broadcast_arrays(*cs), axis=0)

    def above(self, cs: Sequence[np.ndarray], t_comp: np.ndarray, mask: np.ndarray) -> np.ndarray:
        t = np.maximum(t_comp, self.work(cs) / self.r_sat)
        if self.dense is not None and np.any(mask):
            tokens = np.asarray(cs[0], dtype=float) * np.asarray(cs[1], dtype=float)  # G T rows
            tokens = np.broadcast_to(tokens, np.shape(mask))
            t = np.fmax(t, concatenated_time(self.dense, self.gemms, tokens, mask))
        return np.where(mask, t, t_comp)


def expert_gemms(hidden: int, ffn: int, direction: str) -> tuple:
    """One expert MLP's GEMMs as (m, n, k) of the dense table, 0 where the call's tokens go: fc1 (h -> 2 ffn,
    SwiGLU gate and up) and fc2 (ffn -> h); backward, each layer's data gradient (tokens, in, out) and
    weight gradient (in, out, tokens)."""
    h, f2, f = float(hidden), 2.0 * ffn, float(ffn)
    if direction == "fwd":
        return ((0, f2, h), (0, h, f))
    return ((0, h, f2), (h, f2, 0), (0, f, h), (f, h, 0))


def concatenated_time(dense: GridTable, gemms: tuple, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Seconds of the dense GEMMs ``gemms`` (:func:`expert_gemms`) over ``tokens`` rows (num_gemms x tokens
    per expert), read off the dense GEMM table ``dense``: a grouped GEMM of G groups of T tokens does the
    work of one dense GEMM of G T tokens and cannot run faster (the dense call is one launch, one tile
    schedule over all the rows, one weight). Where ``mask`` holds and every GEMM's point lies inside the
    table (measured or interpolated); NaN elsewhere (the caller keeps its other bounds)."""
    out = np.full(np.shape(mask), np.nan)
    x = tokens[mask]
    if not x.size:
        return out
    # every GEMM's points in one lookup (one table call per grouped lookup, not one per GEMM)
    c = [np.concatenate([x if g[a] == 0 else np.full(x.size, g[a]) for g in gemms]) for a in range(3)]
    inside = np.all([(ci >= lo) & (ci <= hi) for ci, lo, hi in zip(c, dense.lo, dense.hi)], axis=0)
    t = np.where(inside, dense.lookup(*c).t, np.nan).reshape(len(gemms), x.size)
    out[mask] = t.sum(axis=0)  # NaN where any GEMM leaves the table
    return out


@dataclass(frozen=True)
class MemoryFloor:
    """Below axis ``axis`` of an (m, n, k) GEMM table: t = max(t_min + B / bw, W / R_edge), R_edge =
    W / t at the edge coordinates (the clamped request); B, W: :func:`gemm_bytes`, :func:`gemm_work`."""

    axis: int
    t_min: float   # seconds
    bw: float      # bytes/s (in the units of gemm_bytes)
    align: float = 8.0  # elements in 16 bytes (:func:`transposed_time`)

    def below(self, cs: Sequence[np.ndarray], at_edge: Sequence[np.ndarray], t_edge: np.ndarray,
              t_comp: np.ndarray, mask: np.ndarray, table: GridTable | None = None) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            r_edge = gemm_work(at_edge) / t_edge
            t = np.maximum(self.t_min + gemm_bytes(cs) / self.bw, gemm_work(cs) / r_edge)
        if table is not None:
            t_tr = transposed_time(table, cs, mask, self.align)
            t = np.where(np.isfinite(t_tr), t_tr, t)
        return np.where(mask, t, t_comp)


def transposed_time(table: GridTable, cs: Sequence[np.ndarray], mask: np.ndarray,
                    align: float = 8.0) -> np.ndarray:
    """Seconds of the (m, n, k) GEMMs of ``mask`` below the table's measured m read off the transposed
    problem C^T = B^T A^T, the measured (n, m, k) GEMM (the same FLOPs and bytes; cuBLAS picks a kernel
    for either). A row count under ``align`` (16 bytes of elements: 8 in bf16) is a misaligned row of
    the transposed problem, which the library runs 2-3x slower (recorded B200: 2 or 4 vs 8 rows), and a
    GEMM of fewer rows never takes longer: the fastest measured row count from max(m, ``align``) up to the
    table's smallest m. Only where that row count itself is measured on the n axis: across a sparse axis
    (scaleplan's own H200 table: n = 32 then 640) a skinny GEMM is no log-linear blend, nor is 640 rows
    a bound for 256. inf elsewhere (the caller keeps its roofline)."""
    shape = np.shape(mask)
    m, n, k = (np.broadcast_to(np.asarray(c, dtype=float), shape) for c in cs)
    rows = np.maximum(m, align)
    out = np.full(shape, np.inf)
    sel = (mask & (n >= table.lo[0]) & (n <= table.hi[0]) & (k >= table.lo[2]) & (k <= table.hi[2])
           & on_grid(rows, table.grid[1]))
    for g in table.grid[1][(table.grid[1] >= align) & (table.grid[1] <= table.lo[0])]:
        at = sel & (g >= rows)
        if at.any():
            out[at] = np.minimum(out[at], table._lookup([n[at], np.full(int(at.sum()), g), k[at]]).t)
    return out


@dataclass(frozen=True)
class LaunchFloor:
    """Below axis ``axis`` (tokens per expert) of a grouped table: t = max(t_fixed(num_gemms),
    W / R_edge): the fixed host and launch part of a call of that many GEMMs (the fastest time any
    shape took at that num_gemms, log-interpolated between measured counts) or the FLOPs at the
    edge's own throughput (throughput only falls with fewer tokens)."""

    axis: int
    flops_per_point: float
    num_gemms: tuple[float, ...]   # measured counts, increasing
    t_fixed: tuple[float, ...]     # seconds at each

    def below(self, cs: Sequence[np.ndarray], at_edge: Sequence[np.ndarray], t_edge: np.ndarray,
              t_comp: np.ndarray, mask: np.ndarray, table: GridTable | None = None) -> np.ndarray:
        ng = np.clip(cs[0], self.num_gemms[0], self.num_gemms[-1])
        fixed = np.exp(np.interp(np.log(ng), np.log(self.num_gemms), np.log(self.t_fixed)))
        with np.errstate(invalid="ignore", divide="ignore"):
            scale = (np.asarray(cs[1], dtype=float) / np.asarray(at_edge[1], dtype=float))
            t = np.maximum(fixed, t_edge * scale)  # W / R_edge = t_edge x (tokens / edge tokens)
        return np.where(mask, t, t_comp)


def undominated_grid(vals: np.ndarray) -> np.ndarray:
    """A grid of seconds (one axis per table axis, each increasing in work) with every point no slower
    than any point of more work on all axes: the running minimum from the far corner. A call with more
    GEMMs or more tokens per expert of the same shape never takes less time, so a point slower than a
    larger one is a disturbed measurement (the larger call shows the device does it faster); left in,
    it is the edge a composition continues from (the recorded B200 grouped GEMM of 4096 x 1280 at 16
    GEMMs and 1,024 tokens: 1,085 us, at 2,048 tokens 819 us; composed down to 4 GEMMs, 3.9x the
    measured time). Like the collectives' ``table_build._undominated``."""
    out = np.asarray(vals, dtype=float)
    for ax in range(out.ndim):
        out = np.flip(np.minimum.accumulate(np.flip(out, ax), axis=ax), ax)
    return out


def gemm_work(cs: Sequence[np.ndarray]) -> np.ndarray:
    """FLOPs of an (m, n, k) GEMM: 2 m n k."""
    return 2.0 * cs[0] * cs[1] * cs[2]


def gemm_bytes(cs: Sequence[np.ndarray]) -> np.ndarray:
    """Elements an (m, n, k) GEMM moves at least (A m k, B k n, C m n); per-element size cancels
    against the bandwidth measured in the same units."""
    m, n, k = cs[0], cs[1], cs[2]
    return m * k + k * n + m * n


def gemm_floor(m: ArrayLike, n: ArrayLike, k: ArrayLike, t: ArrayLike,
               elem_bytes: float = 2.0) -> MemoryFloor:
    """The MemoryFloor of a GEMM table from its measured points (arrays m, n, k, seconds t): the
    fastest kernel time and the best elements-per-second any point reached; rows align at 16 bytes of
    ``elem_bytes`` elements."""
    return MemoryFloor(0, float(np.min(t)), float(np.max(gemm_bytes([m, n, k]) / t)), 16.0 / elem_bytes)


def grouped_flops_per_point(hidden: int, ffn: int, direction: str) -> float:
    """FLOPs per (gemm, token) of one expert MLP's grouped GEMMs (fc1 of width 2 ffn for the SwiGLU
    gate and up, fc2): 2 x 3 h f forward, twice that backward."""
    return 6.0 * hidden * ffn * (2.0 if direction == "bwd" else 1.0)


def grouped_rules(points: dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray, np.ndarray]],
                  dense: GridTable | None = None) -> dict[tuple[str, int, int], tuple[Ceiling, LaunchFloor]]:
    """(Ceiling, LaunchFloor) on tokens_per_expert per grouped table, from every table's measured
    points: (direction, hidden, ffn) -> (num_gemms, tokens_per_expert, seconds). Per direction, R_sat
    is the fastest throughput any shape reached on the device and t_fixed(num_gemms) the fastest
    time any shape took at that count. ``dense``: the dense GEMM table of the same dtype, or None
    (the Ceiling's concatenated-token bound, :func:`concatenated_time`)."""
    r_sat: dict[str, float] = {}
    fixed: dict[str, dict[float, float]] = {}
    for (dirn, h, f), (ng, tpe, t) in points.items():
        r = float(np.max(grouped_flops_per_point(h, f, dirn) * ng * tpe / t))
        r_sat[dirn] = max(r_sat.get(dirn, 0.0), r)
        for n, tt in zip(ng.tolist(), t.tolist()):
            fixed.setdefault(dirn, {})[n] = min(fixed.get(dirn, {}).get(n, np.inf), tt)
    out = {}
    for key in points:
        fpp = grouped_flops_per_point(key[1], key[2], key[0])
        ns = sorted(fixed[key[0]])
        out[key] = (Ceiling(1, fpp, r_sat[key[0]], dense, expert_gemms(key[1], key[2], key[0])),
                    LaunchFloor(1, fpp, tuple(ns), tuple(fixed[key[0]][n] for n in ns)))
    return out


@dataclass(frozen=True)
class CollectiveTail:
    """Beyond the largest measured message of each curve (group size) of one collective regime:
    alpha-beta, t(S) = t_edge + beta (S - S_edge), bounded to [t_edge, t_edge S / S_edge] (never shrinking,
    never below the edge's own algorithm bandwidth). Per curve, increasing group order: ``edge`` (bytes),
    ``t_edge`` (seconds), ``beta`` (seconds per byte). :func:`collective_tail` says where each comes from."""

    edge: tuple[float, ...]
    t_edge: tuple[float, ...]
    beta: tuple[float, ...]

    def time(self, j: int, size: np.ndarray) -> np.ndarray:
        s_e, t_e = self.edge[j], self.t_edge[j]
        return np.clip(t_e + self.beta[j] * (size - s_e), t_e, t_e * size / s_e)


def collective_tail(coll: str, groups: ArrayLike, sizes: ArrayLike, times: ArrayLike) -> CollectiveTail:
    """The :class:`CollectiveTail` of one regime from its measured curves (group sizes; per group the
    message sizes, bytes, increasing, and seconds).

    * edge time: a larger message never moves at a lower algorithm bandwidth (alpha-beta: S / t grows
      with S), so the edge takes at most the time any smaller message's bandwidth implies. The recorded
      B200 inter-node all-to-all of 16 ranks at 302 MB took 7.45 ms where 256 MB took 2.99 ms; composed
      from it, the larger messages came out 2.3x (hold-out at a quarter of the largest message).
    * beta: the alpha-beta fit t = a + beta S over the curve's last three messages (least squares in
      seconds; the single last interval is noise-bound, e.g. 64 -> 128 MB of an 8-GPU all-gather
      at 1,016 GB/s where the curve saturates at ~750), and never faster than the regime's saturated bus
      bandwidth (busbw invariance across group sizes: bus factor / beta) read off its most
      bandwidth-bound curve (the largest share of its edge time above its smallest message's): a curve
      whose edge is still latency-bound (the 32-rank all-gather is flat at 0.38 ms to 64 MB) shows no
      bandwidth of its own, only the overlap of the latency. Not for all-to-all: NCCL runs it as n - 1
      point-to-point sends, whose bandwidth per rank depends on the peer count (recorded B200 intra-node
      at 1.2 GB: 412 / 584 / 586 GB/s bus bandwidth at 2 / 4 / 8 ranks); each curve keeps its own fit."""
    from scaleplan.estimator.analytic import bus_factor

    edge, t_edge, beta, share = [], [], [], []
    for s, t in zip(sizes, times):
        s, t = np.asarray(s, dtype=float), np.asarray(t, dtype=float)
        tr = s / np.maximum.accumulate(s / t)  # algorithm bandwidth never falls with size
        edge.append(float(s[-1]))
        t_edge.append(float(tr[-1]))
        share.append(1.0 - float(tr.min()) / float(tr[-1]))
        beta.append(_alpha_beta_slope(s[-3:], tr[-3:]))
    if coll == "all_to_all":  # point-to-point sends, no ring: no busbw invariance to lend (see above)
        return CollectiveTail(tuple(edge), tuple(t_edge), tuple(beta))
    f = np.asarray(bus_factor(coll, np.asarray(groups, dtype=float)), dtype=float)
    j = int(np.argmax(share))
    beta_bus = beta[j] / max(float(f[j]), 1e-9)  # seconds per bus byte of the most bandwidth-bound curve
    beta = [b if sh >= share[j] - 1e-9 else max(b, beta_bus * float(fi)) for b, fi, sh in zip(beta, f, share)]
    return CollectiveTail(tuple(edge), tuple(t_edge), tuple(beta))


def _alpha_beta_slope(s: np.ndarray, t: np.ndarray) -> float:
    """beta (seconds per byte) of t = a + beta s fitted to (s, t) by least squares in seconds (Hockney's
    fit: the largest messages, the most bandwidth-bound, weigh most; in relative error the latency-bound
    ones would pull the slope down); one point: t / s."""
    if len(s) < 2:
        return float(t[-1] / s[-1])
    a, b = np.linalg.lstsq(np.stack([np.ones_like(t), s], axis=1), t, rcond=None)[0]
    return max(float(b), 0.0)


@dataclass(frozen=True)
class SdpaFloor:
    """Below the measured seq_len of a causal SDPA table (axes seq_len, micro_bs, n_q_heads, head_dim):
    t = c + (t_edge - c) g(x) / g(edge), g = (l s + q s^2) B H D. The call's fixed part ``c`` (seconds:
    launch and host, the same for every shape) stays; the edge's own GPU time scales with its linear
    (Q, K, V, O and their gradients read and written: s B H D) and quadratic (the causal score tiles:
    s^2 B H D) work, split as the whole table says (``l``, ``q``: seconds per unit). The affine rule
    continued the edge interval's slope in s^2 alone: the linear and fixed parts, which dominate below
    4k tokens, came out 2x too fast in the backward."""

    axis: int
    c: float
    l: float
    q: float

    def work(self, cs: Sequence[np.ndarray]) -> np.ndarray:
        s = np.asarray(cs[0], dtype=float)
        return (self.l * s + self.q * s * s) * cs[1] * cs[2] * cs[3]

    def below(self, cs: Sequence[np.ndarray], at_edge: Sequence[np.ndarray], t_edge: np.ndarray,
              t_comp: np.ndarray, mask: np.ndarray, table: GridTable | None = None) -> np.ndarray:
        w, w_edge = self.work(cs), self.work(at_edge)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(w_edge > 0, w / w_edge, 1.0)
        return np.where(mask, self.c + np.maximum(t_edge - self.c, 0.0) * ratio, t_comp)


def sdpa_floor(seq: ArrayLike, micro_bs: ArrayLike, heads: ArrayLike, head_dim: ArrayLike,
               t: ArrayLike) -> SdpaFloor | None:
    """The :class:`SdpaFloor` of an SDPA table from its measured points (arrays; seconds ``t``): c, l, q of
    t = c + (l s + q s^2) B H D, non-negative least squares in relative error over every point. None with
    fewer than 3 points (the affine rule then)."""
    t = np.asarray(t, dtype=float)
    if len(t) < 3:
        return None
    from scipy.optimize import nnls  # building only, like fill_grid

    s, bhd = np.asarray(seq, dtype=float), np.asarray(micro_bs * heads * head_dim, dtype=float)
    x = np.stack([np.ones_like(s), s * bhd, s * s * bhd], axis=1)
    scale = x.max(axis=0)
    w = nnls(x / scale / t[:, None], np.ones(len(t)))[0] / scale
    return SdpaFloor(0, float(w[0]), float(w[1]), float(w[2]))


def ring_all_reduce_bound(ar: CollectiveTail, ar_groups: ArrayLike, rs: CollectiveTail, rs_groups: ArrayLike,
                          ag: CollectiveTail, ag_groups: ArrayLike) -> CollectiveTail:
    """The all-reduce tail with each group's beta at most the reduce-scatter's plus the all-gather's of the
    same group size and regime (seconds per byte): a ring all-reduce is a reduce-scatter then an all-gather,
    and NCCL runs the faster of its algorithms, so beyond the measured messages an all-reduce never costs
    more per byte than the two in sequence (recorded B200 at 2 GB: 4.96 vs 2.82 + 2.84 ms on 8 GPUs, 10.59
    vs 5.42 + 5.42 ms on 32 across nodes). Groups the other two do not measure keep their beta."""
    rs_b = dict(zip((float(g) for g in rs_groups), rs.beta))
    ag_b = dict(zip((float(g) for g in ag_groups), ag.beta))
    beta = tuple(min(b, rs_b.get(float(g), np.inf) + ag_b.get(float(g), np.inf)) for g, b in zip(ar_groups, ar.beta))
    return CollectiveTail(ar.edge, ar.t_edge, beta)
