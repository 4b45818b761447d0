"""Analytic fallbacks used where a profile has no measured table (labelled "analytic").

Roofline on the profile's datasheet peak and HBM bandwidth for kernels; ring formulas on the
scale-up (NVLink) or scale-out (EFA) bandwidth for collectives. Everything is vectorised (numpy
broadcasting). Units: seconds, bytes, FLOP, FLOP/s, bytes/s.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

if TYPE_CHECKING:
    from scaleplan.profiles import ClusterProfile

# Per-hop latencies of the ring algorithms (NCCL Simple protocol order of magnitude).
ALPHA_INTRA_S = 5e-6
ALPHA_INTER_S = 20e-6
# Kernel launch floor: even a tiny kernel occupies the stream this long.
KERNEL_FLOOR_S = 4e-6

# nccl-tests bus-bandwidth factors: busbw = algbw * factor(n)
def bus_factor(collective: str, n: ArrayLike) -> np.ndarray:
    n = np.asarray(n, dtype=float)
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) / n
    return np.ones_like(n)


def gemm_time(m: ArrayLike, n: ArrayLike, k: ArrayLike, peak: ArrayLike, hbm_bw: ArrayLike,
              bytes_per_el: ArrayLike = 2.0) -> np.ndarray:
    """Roofline time of C[m,n] = A[m,k] B[k,n]: max(FLOPs / peak, bytes / HBM bandwidth)."""
    m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
    flops = 2.0 * m * n * k
    byts = bytes_per_el * (m * k + k * n + m * n)
    return np.maximum(np.maximum(flops / peak, byts / hbm_bw), KERNEL_FLOOR_S)


def grouped_gemm_time(num_gemms: ArrayLike, tile: ArrayLike, hidden: ArrayLike, ffn: ArrayLike,
                      peak: ArrayLike, hbm_bw: ArrayLike, glu: bool = True) -> np.ndarray:
    """Expert MLP (fc1 d -> (2 if GLU) d_expert, fc2 d_expert -> d) over ``num_gemms`` tiles, forward."""
    f1 = gemm_time(tile, (2 if glu else 1) * ffn, hidden, peak, hbm_bw)
    f2 = gemm_time(tile, hidden, ffn, peak, hbm_bw)
    return np.asarray(num_gemms, dtype=float) * (f1 + f2)


def sdpa_fwd_time(seq: ArrayLike, mbs: ArrayLike, q_heads: ArrayLike, head_dim: ArrayLike, peak: ArrayLike,
                  hbm_bw: ArrayLike) -> np.ndarray:
    """Causal attention forward: 4 s^2 d_head n_q b / 2 FLOPs (QK^T and PV, half masked)."""
    s, b, q, hd = (np.asarray(x, dtype=float) for x in (seq, mbs, q_heads, head_dim))
    flops = 2.0 * s * s * hd * q * b
    byts = 2.0 * 4 * s * q * hd * b
    return np.maximum(np.maximum(flops / peak, byts / hbm_bw), KERNEL_FLOOR_S)


SDPA_BWD_OVER_FWD = 2.5  # flash backward: 5 GEMM-equivalents vs 2 forward

def sdpa_peak(prof: ClusterProfile, precision: str) -> float:
    """FLOP/s of causal attention with inputs in ``precision`` (per device): the 16-bit tensor-core
    lane for bf16/fp16 and, as an upper bound on time, for fp8/fp4 (no measured low-precision
    attention); for fp32/tf32 a third of the TF32 lane: the flash and cuDNN kernels take 16-bit inputs
    only, and PyTorch's memory-efficient kernel runs fp32 as three TF32 MMAs per product (CUTLASS
    OpMultiplyAddFastF32, ``DefaultGemmType<float>`` for sm80+ in ATen's mem_eff_attention); the
    fp32 lane where the profile has no TF32 lane faster than it (a CPU)."""
    lanes = prof.peak_flops
    if precision in ("fp32", "tf32") and lanes.get("tf32", 0.0) > lanes.get("fp32", 0.0):  # TF32 tensor cores
        return max(lanes["tf32"] / 3.0, lanes.get("fp32", 0.0))
    if precision in ("fp8", "fp4") and "bf16" in lanes:
        return lanes["bf16"]
    return prof.peak(precision)


def gemm_lane_ratio(prof: ClusterProfile, precision: str) -> float:
    """Time of a GEMM in ``precision`` over its time in bf16 by the tensor-core lanes: the bf16 peak over the
    ``precision`` peak (0.5 for FP8 on H100 and B200), 1 where the profile has either lane missing: the rate the
    tensor cores give that precision, where no table of it is measured (docs/estimate.md compares it with the
    measured tables)."""
    lanes = prof.peak_flops
    if precision not in lanes or "bf16" not in lanes:
        return 1.0
    return lanes["bf16"] / lanes[precision]


def sdpa_lane_ratio(prof: ClusterProfile, precision: str) -> float:
    """Time of attention in ``precision`` over its time in bf16 (>= 1; see :func:`sdpa_peak`)."""
    if "bf16" not in prof.peak_flops:
        return 1.0
    return max(prof.peak("bf16") / sdpa_peak(prof, precision), 1.0)


def memory_time(nbytes: ArrayLike, hbm_bw: ArrayLike) -> np.ndarray:
    """A bandwidth-bound kernel moving ``nbytes`` through HBM."""
    return np.maximum(np.asarray(nbytes, dtype=float) / hbm_bw, KERNEL_FLOOR_S)


def collective_time(collective: str, n: ArrayLike, size_bytes: ArrayLike, bw: ArrayLike,
                    inter: ArrayLike) -> np.ndarray:
    """Ring collective (nccl-tests size convention) on per-GPU per-direction bandwidth ``bw``.

    all_reduce 2(n-1)/n S/bw; reduce_scatter, all_gather, all_to_all (n-1)/n S/bw; plus (n-1)
    hop latencies (alpha intra / inter node). send_recv: S/bw + alpha.
    """
    n = np.asarray(n, dtype=float)
    alpha = np.where(inter, ALPHA_INTER_S, ALPHA_INTRA_S)
    if collective == "send_recv":
        return alpha + np.asarray(size_bytes, dtype=float) / bw
    steps = 2 * (n - 1) if collective == "all_reduce" else (n - 1)
    return np.where(n > 1, steps * alpha + bus_factor(collective, n) * np.asarray(size_bytes, dtype=float) / bw, 0.0)


def all_to_all_across(n: ArrayLike, m: ArrayLike, size_bytes: ArrayLike, bw_out: float, bw_up: float) -> np.ndarray:
    """An all-to-all of ``n`` ranks across domains of ``m`` (seconds; nccl-tests size ``size_bytes`` per rank):
    each rank sends size / n to every peer at once, (n - m) / n of its bytes on its NIC at ``bw_out`` and
    (m - 1) / n over NVLink at ``bw_up`` concurrently, so the slower of the two, plus (n - 1) inter-node hop
    latencies as :func:`collective_time` counts them (comm.py's module docstring: the NIC bytes bound it)."""
    n = np.asarray(n, dtype=float)
    m = np.minimum(np.asarray(m, dtype=float), n)
    s = np.asarray(size_bytes, dtype=float)
    t = np.maximum((n - m) / np.maximum(n, 1.0) * s / bw_out, (m - 1.0) / np.maximum(n, 1.0) * s / bw_up)
    return np.where(n > 1, (n - 1) * ALPHA_INTER_S + t, 0.0)
