"""estimator/analytic.py: the fallbacks where no table is measured, by hand: roofline GEMM and attention,
bandwidth-bound kernels with a launch floor, ring collectives in the nccl-tests convention."""
import numpy as np
import pytest
from scaleplan.estimator import analytic as an

PEAK, HBM = 1e15, 4e12


def test_gemm_roofline_compute_bound_memory_bound_and_floor():
    # 8192^3: 2 m n k = 1.1e12 FLOPs -> 1.1 ms at 1 PFLOP/s; bytes 3 x 8192^2 x 2 = 0.4 GB -> 0.1 ms
    assert float(an.gemm_time(8192, 8192, 8192, PEAK, HBM)) == pytest.approx(2 * 8192 ** 3 / PEAK)
    # a skinny GEMM 16 x 8192 x 8192: the 8192^2 weight dominates the bytes, 2 (16 k + k n + 16 n) / HBM
    want = 2.0 * (16 * 8192 + 8192 * 8192 + 16 * 8192) / HBM
    assert float(an.gemm_time(16, 8192, 8192, PEAK, HBM)) == pytest.approx(want)
    assert float(an.gemm_time(1, 1, 1, PEAK, HBM)) == an.KERNEL_FLOOR_S


def test_grouped_gemm_is_fc1_and_fc2_per_local_expert():
    # SwiGLU: fc1 [t, d] x [d, 2 ff], fc2 [t, ff] x [ff, d]; both compute-bound at t = 4096
    t, d, ff = 4096, 4096, 2048
    want = 8 * (2 * t * 2 * ff * d + 2 * t * d * ff) / PEAK
    assert float(an.grouped_gemm_time(8, t, d, ff, PEAK, HBM)) == pytest.approx(want)


def test_causal_attention_forward():
    # 2 s^2 hd q b FLOPs (QK^T and PV over half the square): s 8192, 32 heads of 128, b 1
    assert float(an.sdpa_fwd_time(8192, 1, 32, 128, PEAK, HBM)) == pytest.approx(2 * 8192 ** 2 * 128 * 32 / PEAK)


def test_memory_time_has_the_launch_floor():
    assert float(an.memory_time(4e9, HBM)) == pytest.approx(1e-3)
    assert float(an.memory_time(1.0, HBM)) == an.KERNEL_FLOOR_S


def test_ring_collectives_by_hand():
    S, bw = 1e9, 100e9
    # all-reduce over 8 ranks in a node: 2 (n-1) hops of 5 us + 2 (7/8) S / bw
    assert float(an.collective_time("all_reduce", 8, S, bw, False)) == pytest.approx(14 * 5e-6 + 1.75 * S / bw)
    # all-gather over 16 ranks across nodes: (n-1) hops of 20 us + (15/16) S / bw
    assert float(an.collective_time("all_gather", 16, S, bw, True)) == pytest.approx(15 * 20e-6 + 15 / 16 * S / bw)
    assert float(an.collective_time("send_recv", 2, S, bw, True)) == pytest.approx(20e-6 + S / bw)
    assert float(an.collective_time("all_to_all", 1, S, bw, False)) == 0.0  # a group of one moves nothing
    assert list(an.bus_factor("reduce_scatter", np.array([2, 4]))) == [0.5, 0.75]
