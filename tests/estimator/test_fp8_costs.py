"""FP8 expert GEMMs composed from the bf16 grouped table and the dense tables' FP8 / bf16 device-time ratio, and
the cast kernels' time (estimator/fp8_costs.py), on tables whose times are known."""
from __future__ import annotations

import numpy as np
import pytest
from scaleplan.estimator.fp8_costs import (
    CAST_BYTES_PER_ELEMENT,
    cast_time,
    composed_grouped,
    device_ratio,
    expert_gemm_shapes,
)
from scaleplan.estimator.tables import GridTable

AX = [np.array([256.0, 1024.0, 4096.0]), np.array([512.0, 1536.0, 2048.0]), np.array([512.0, 768.0, 2048.0])]


def _table(rate: float, floor: float) -> GridTable:
    """A dense-GEMM table whose time is a floor plus FLOPs at ``rate`` (FLOP/s)."""
    m, n, k = np.meshgrid(*AX, indexing="ij")
    return GridTable("gemm", ("m", "n", "k"), AX, floor + 2 * m * n * k / rate)


def test_expert_shapes_are_fc1_and_fc2_forward_and_their_gradients():
    fwd, bwd = expert_gemm_shapes(1024.0, 2048.0, 768.0, glu=True)
    assert fwd == [(1024.0, 1536.0, 2048.0), (1024.0, 2048.0, 768.0)]
    assert bwd == [(1024.0, 2048.0, 1536.0), (2048.0, 1536.0, 1024.0), (1024.0, 768.0, 2048.0),
                   (768.0, 2048.0, 1024.0)]


def test_the_ratio_is_that_of_the_summed_device_times_and_scales_the_grouped_time():
    bf16, fp8 = _table(1e15, 5e-6), _table(2e15, 5e-6)
    fwd, _ = expert_gemm_shapes(1024.0, 2048.0, 768.0, glu=True)
    ratio, looked = device_ratio(fp8, bf16, fwd)
    flops = sum(2 * m * n * k for m, n, k in fwd)
    want = (2 * 5e-6 + flops / 2e15) / (2 * 5e-6 + flops / 1e15)
    assert float(ratio) == pytest.approx(want, rel=1e-6) and len(looked) == 2
    f, b = composed_grouped(3e-4, 6e-4, ratio, 0.5)
    assert float(f) == pytest.approx(3e-4 * want) and float(b) == pytest.approx(3e-4)


def test_a_cast_moves_its_bytes_at_hbm_and_takes_at_least_its_kernels():
    rows, cols, hbm = 16384.0, 2048.0, 8e12
    t = cast_time(rows, cols, "tensorwise", hbm, 3e-6)
    assert float(t) == pytest.approx(rows * cols * 6.0 / hbm)
    assert CAST_BYTES_PER_ELEMENT["tensorwise"] == 2 + 2 + 1 + 1  # two bf16 reads, row- and column-wise E4M3
    assert float(cast_time(32.0, 32.0, "tensorwise", hbm, 3e-6)) == pytest.approx(3 * 3e-6)  # amax, scale, cast
