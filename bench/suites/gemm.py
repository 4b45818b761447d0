"""Dense GEMM C[M,N] = A[M,K] @ B[K,N], forward (paper sec:microbenchmarks, "Dense GEMMs").

Stores the median time (s) with p10/p90, the achieved FLOP/s (2*M*N*K / t) and ``util``, that rate
as a fraction of the profile's peak lane for the dtype (``ClusterProfile.peak``). dtypes: fp32
(TF32 off), tf32 (CUDA only), bf16, fp16, fp8 (e4m3 via ``torch._scaled_mm`` with unit scales,
bf16 output; needs K and N multiples of 16). An fp8 row's note holds the eager wall per call, calls
issued back to back (host included), beside its device time: a flat per-call floor in a table of FP8
calls is then measured host time, not inferred (estimator/floors.py).
"""

from __future__ import annotations

import contextlib

import torch
from scaleplan.bench import harness as h
from scaleplan.bench.config import SuiteConfig, explicit_points, grid

from scaleplan.db import models as m
from scaleplan.errors import SpecError

NAME = "gemm"
TABLE = m.GemmPoint
KEY = ("m", "n", "k", "dtype")


class Config(SuiteConfig):
    dtypes: list[str] = ["bf16"]
    m: list[int] = [1024]
    n: list[int] = [1024]
    k: list[int] = [1024]


def expand(cfg: Config, ctx: h.Context) -> list[dict]:
    if cfg.points is not None:
        return explicit_points(cfg.points, KEY, NAME)
    return grid(m=cfg.m, n=cfg.n, k=cfg.k, dtype=cfg.dtypes)


def _operand_bytes(p: dict) -> float:
    size = 1 if p["dtype"] == "fp8" else h.DTYPES[p["dtype"]].itemsize
    return size * (p["m"] * p["k"] + p["k"] * p["n"]) + 4 * p["m"] * p["n"]


def _peak(ctx: h.Context, dtype: str) -> float | None:
    if ctx.profile is None:
        return None
    try:
        return ctx.profile.peak(dtype)
    except SpecError:
        return None


def probe_s(p: dict, ctx: h.Context) -> float:
    """Seconds of one call of the point, from a cheap probe (:func:`harness.probe_mm_s`). Raises SkipMem
    first, as :func:`measure` does, so a point too big for memory is stored as such, not skipped."""
    h.check_memory(ctx, _operand_bytes(p))
    return h.probe_mm_s(p["m"], p["n"], p["k"], p["dtype"], ctx)


def measure(p: dict, ctx: h.Context) -> dict:
    dt = h.torch_dtype(p["dtype"], ctx)
    mm, n, k = p["m"], p["n"], p["k"]
    h.check_memory(ctx, _operand_bytes(p))
    if p["dtype"] == "fp8":
        if k % 16 or n % 16:
            raise h.SkipAlign("fp8 _scaled_mm needs K and N multiples of 16")
        a = h.randn((mm, k), dt, ctx.device)
        b = h.randn((n, k), dt, ctx.device).t()  # column-major B, as the fp8 kernels require
        one = torch.ones((), device=ctx.device)

        def run(_):
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

        backend = "torch_scaled_mm"
    else:
        a = h.randn((mm, k), dt, ctx.device)
        b = h.randn((k, n), dt, ctx.device)

        def run(_):
            return torch.mm(a, b)

        backend = "torch"
    with h.tf32_mode(p["dtype"]) if ctx.is_cuda else contextlib.nullcontext():
        st = h.time_fn(run, ctx)
    flops = 2.0 * mm * n * k / st.median
    peak = _peak(ctx, p["dtype"])
    note = f"wall_per_call_s={h.wall_per_call_s(lambda: run(None), ctx):.3e}" if p["dtype"] == "fp8" else None
    return dict(
        note=note,
        t_s=st.median,
        t_p10_s=st.p10,
        t_p90_s=st.p90,
        n_rep=st.n,
        flops_per_s=flops,
        util=flops / peak if peak else None,
        backend=backend,
    )
