"""A check on the timing method (GPU): the harness's bf16 n^3 GEMM must reach at least
90% of the best plain ``torch.matmul`` throughput measured in the same process.

"Plain" = ``reps`` back-to-back matmuls between two device synchronisations, wall clock / reps,
best of ``trials`` (no events, no cache flush): the throughput a user sees from the obvious loop.
The harness times each repetition with CUDA events after an L2 flush, so it can only lose to the
plain loop by overhead it adds; a ratio below 0.9 means the method is mismeasuring.
"""

from __future__ import annotations

import contextlib
import time

import torch
from scaleplan.bench import harness as h


def plain_matmul_flops(a: torch.Tensor, b: torch.Tensor, reps: int = 20, trials: int = 3) -> float:
    """Best FLOP/s of ``reps`` back-to-back a @ b between device synchronisations."""
    n_flop = 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
    best = float("inf")
    torch.matmul(a, b)
    for _ in range(trials):
        h.synchronize(a.device)
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.matmul(a, b)
        h.synchronize(a.device)
        best = min(best, (time.perf_counter() - t0) / reps)
    return n_flop / best


def gemm_timing_check(
    device: torch.device, n: int = 8192, dtype: str = "bf16", threshold: float = 0.9
) -> dict:
    """Harness vs plain-loop throughput for an n x n x n GEMM; ``passed`` when ratio >= threshold."""
    ctx = h.Context(device=device, timing=h.Timing(warmup=5, reps=30, max_time_s=10.0))
    dt = h.torch_dtype(dtype, ctx)
    a, b = h.randn((n, n), dt, device), h.randn((n, n), dt, device)
    with h.tf32_mode(dtype) if device.type == "cuda" else contextlib.nullcontext():
        st = h.time_fn(lambda _: torch.mm(a, b), ctx)
        plain = plain_matmul_flops(a, b)
    harness = 2.0 * n**3 / st.median
    ratio = harness / plain
    return {
        "n": n,
        "dtype": dtype,
        "device": str(device),
        "harness_flops_per_s": harness,
        "plain_flops_per_s": plain,
        "ratio": ratio,
        "threshold": threshold,
        "passed": ratio >= threshold,
        "harness_t_s": st.median,
        "n_rep": st.n,
    }
