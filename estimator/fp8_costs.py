"""FP8 GEMMs on the device where no FP8 table of their kind is measured (sec:microbenchmarks): the grouped
expert GEMMs composed from the bf16 grouped table and the FP8 / bf16 device-time ratio of the dense tables at
the same shapes, and the quantize (cast) kernels of a recipe. Seconds.

Why the ratio and not the FP8 dense loop: the grouped table measures what a grouped call does beyond its
GEMMs (per-group launches on several streams, the split of the input), the dense tables what FP8 does to one
GEMM of that shape (the lane, the operand bytes, and with Transformer Engine's rows the quantize of the
inputs). Both are read as device time: the dense tables with their per-call host floor taken off
(estimator/floors.py), so the ratio is not the ratio of two host costs.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike
from scaleplan.estimator.tables import COMPOSED, LookupResult

if TYPE_CHECKING:
    from scaleplan.estimator.tables import GridTable

# E4M3 elements read and written by one quantize of a bf16 tensor per element, by recipe: per-tensor current
# scaling reads it twice (amax, then cast) and writes the row-wise and the column-wise copy; MXFP8 reads it
# once and writes both copies with one E8M0 byte per 32 elements each (bench/fp8.py cast_bytes)
CAST_BYTES_PER_ELEMENT = {"tensorwise": 6.0, "delayed": 4.0, "blockwise": 4.0 + 2 * 4 / 128, "mxfp8": 4.0 + 2 / 32}


def expert_gemm_shapes(tile: ArrayLike, d: ArrayLike, f: ArrayLike,
                       glu: bool) -> tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                       list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """(forward, backward) GEMM shapes (m, n, k) of one expert's fc1 and fc2 on ``tile`` rows (arrays): forward
    fc1 [tile, d] x [d, w f] and fc2 [tile, f] x [f, d] (w = 2 with GLU); backward each one's data gradient
    (m, k, n) and weight gradient (k, n, m)."""
    w = 2 if glu else 1
    fwd = [(tile, w * f, d), (tile, d, f)]
    return fwd, [s for m, n, k in fwd for s in gradient_shapes(m, n, k)]


def gradient_shapes(m: ArrayLike, n: ArrayLike, k: ArrayLike) -> list[tuple[ArrayLike, ArrayLike, ArrayLike]]:
    """The backward GEMMs (m, n, k) of the forward GEMM [m, k] x [k, n]: data gradient [m, n] x [n, k] and
    weight gradient [k, m] x [m, n]."""
    return [(m, k, n), (k, n, m)]


def device_ratio(fp8_gemm: GridTable, bf16_gemm: GridTable,
                 shapes: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray,
                 list[LookupResult]]:
    """Sum of FP8 over sum of bf16 dense-GEMM device time over ``shapes`` [(m, n, k)], each a GridTable
    (host floors already off, table_build); returns (ratio, the FP8 lookups, for the record)."""
    r8 = [fp8_gemm.lookup(m, n, k) for m, n, k in shapes]
    r16 = [bf16_gemm.lookup(m, n, k) for m, n, k in shapes]
    t8 = sum(r.t_composed for r in r8)
    t16 = sum(r.t_composed for r in r16)
    return np.asarray(t8, dtype=float) / np.maximum(np.asarray(t16, dtype=float), 1e-30), r8


def composed_grouped(bf16_f: ArrayLike, bf16_b: ArrayLike, ratio_f: ArrayLike,
                     ratio_b: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """FP8 grouped expert GEMMs (forward, backward seconds): the bf16 grouped table's times scaled by the dense
    tables' FP8 / bf16 device-time ratio of the same GEMMs (labelled composed by the caller: COMPOSED)."""
    return np.asarray(bf16_f) * ratio_f, np.asarray(bf16_b) * ratio_b


def composed_projection(fp8_gemm: GridTable, bf16_gemm: GridTable, m: ArrayLike, n: ArrayLike, k: ArrayLike,
                        bf16_f: ArrayLike, bf16_b: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """:func:`composed_grouped` of one grouped projection [m, k] x [k, n] per group (arrays over points: rows
    per group, out and in features, and the bf16 grouped forward and backward seconds): what the rule gives a
    measured bf16 grouped row (benchmarks/fp8_ratios.py and the tests hold it to measured FP8 rows)."""
    r_f = device_ratio(fp8_gemm, bf16_gemm, [(m, n, k)])[0]
    r_b = device_ratio(fp8_gemm, bf16_gemm, gradient_shapes(m, n, k))[0]
    return composed_grouped(bf16_f, bf16_b, r_f, r_b)


def cast_time(rows: ArrayLike, cols: ArrayLike, recipe: str, hbm: float, kernel_min_s: float) -> np.ndarray:
    """Seconds of one quantize of a bf16 [rows, cols] GEMM input in ``recipe`` (arrays): the bytes it moves
    (CAST_BYTES_PER_ELEMENT) at HBM bandwidth ``hbm`` (B/s), never under ``kernel_min_s`` per kernel
    (estimator/kernel_counts.py QUANTIZE_KERNELS launches). Not the bench's measured casts (elementwise suite,
    quantize_<recipe>): those are torch ops or compiled ones, 4-50x these bytes on an H200, not Transformer
    Engine's fused cast kernels. Used by compute.fp8_cast_times."""
    from scaleplan.estimator.kernel_counts import QUANTIZE_KERNELS

    t = np.asarray(rows, dtype=float) * np.asarray(cols, dtype=float) * CAST_BYTES_PER_ELEMENT[recipe] / hbm
    return np.maximum(t, QUANTIZE_KERNELS.get(recipe, 1) * kernel_min_s)


SOURCE = COMPOSED  # what a composed FP8 grouped lookup is labelled
