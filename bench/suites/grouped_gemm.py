"""Grouped GEMM: one projection of the MoE expert MLP over the local experts, forward and backward
(paper sec:microbenchmarks, "Grouped GEMMs"; the per-group tile M_expert = ceil(T_seq*B_micro*K/E)).

Key: (proj, distribution, num_gemms, tokens_per_expert, hidden, ffn, dtype). ``num_gemms`` is the
number of local experts, ``tokens_per_expert`` the mean rows per expert (total rows =
num_gemms * tokens_per_expert). fc1 maps hidden -> 2*ffn (the SwiGLU gate and up halves in one
GEMM), fc2 maps ffn -> hidden. ``balanced`` gives every expert the same rows; ``skewed`` gives
them rows proportional to a fixed Zipf-like weight 1/(i+1) (same total, deterministic, every
expert at least one row), the imbalance a router without load balancing produces.

dtype "fp8" (per-tensor current scaling) or "mxfp8": an FP8 recipe's grouped GEMM, quantize kernels included,
each expert's rows padded to the recipe's alignment, device time stored (bench/fp8_grouped.py); ``impl: loop``
runs FP8 as one ``torch._scaled_mm`` per expert where the grouped FP8 kernel would be picked.

Implementations, first available wins unless ``impl`` is set: Transformer Engine ``GroupedLinear``
(te_grouped_linear; CUDA only), ``torch._grouped_mm`` (torch_grouped_mm), else one ``torch.mm`` per
expert (loop). The row records which one ran. fwd_s / bwd_s are medians in seconds; bwd is the
backward pass alone (grads of input and weights), timed after an untimed forward.
"""

from __future__ import annotations

import torch
from scaleplan.bench import harness as h
from scaleplan.bench.config import SuiteConfig, explicit_points, grid
from scaleplan.bench.fp8 import RECIPE_OF_DTYPE
from scaleplan.bench.fp8_grouped import measure_fp8

from scaleplan.db import models as m

NAME = "grouped_gemm"
TABLE = m.GroupedGemmPoint
KEY = ("proj", "distribution", "num_gemms", "tokens_per_expert", "hidden", "ffn", "dtype")
IMPLS = ("auto", "te_grouped_linear", "torch_grouped_mm", "loop")


class Config(SuiteConfig):
    dtypes: list[str] = ["bf16"]
    proj: list[str] = ["fc1", "fc2"]
    distribution: list[str] = ["balanced", "skewed"]
    num_gemms: list[int] = [8]
    tokens_per_expert: list[int] = [512]
    hidden: list[int] = [2048]
    ffn: list[int] = [1024]
    impl: str = "auto"


def expand(cfg: Config, ctx: h.Context) -> list[dict]:
    if cfg.impl not in IMPLS:
        from scaleplan.errors import SpecError

        raise SpecError("suites.grouped_gemm.impl", cfg.impl, ", ".join(IMPLS))
    ctx.extra["grouped_impl"] = cfg.impl
    if cfg.points is not None:
        return explicit_points(cfg.points, KEY, NAME)
    return grid(
        proj=cfg.proj,
        distribution=cfg.distribution,
        num_gemms=cfg.num_gemms,
        tokens_per_expert=cfg.tokens_per_expert,
        hidden=cfg.hidden,
        ffn=cfg.ffn,
        dtype=cfg.dtypes,
    )


def splits(num_gemms: int, tokens_per_expert: int, distribution: str) -> list[int]:
    """Rows per expert; they sum to num_gemms * tokens_per_expert. Raises ValueError for an
    unknown distribution."""
    total = num_gemms * tokens_per_expert
    if distribution == "balanced":
        return [tokens_per_expert] * num_gemms
    if distribution != "skewed":
        raise ValueError(f"distribution {distribution!r} is not balanced or skewed")
    w = [1.0 / (i + 1) for i in range(num_gemms)]
    rest = total - num_gemms  # one row each first, the rest by weight
    out = [1 + int(rest * x / sum(w)) for x in w]
    out[0] += total - sum(out)
    return out


def features(proj: str, hidden: int, ffn: int) -> tuple[int, int]:
    """(in_features, out_features) of the projection."""
    if proj == "fc1":
        return hidden, 2 * ffn
    if proj == "fc2":
        return ffn, hidden
    raise ValueError(f"proj {proj!r} is not fc1 or fc2")


def _te_available(ctx: h.Context) -> bool:
    if not ctx.is_cuda:
        return False
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:
        return False
    return True


def _grouped_mm_works(ctx: h.Context, dtype: torch.dtype) -> bool:
    """Probe torch._grouped_mm on a tiny problem (the op exists in more builds than it runs in)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        a = torch.randn(32, 16, dtype=dtype, device=ctx.device, requires_grad=True)
        b = torch.randn(2, 16, 16, dtype=dtype, device=ctx.device, requires_grad=True)
        y = torch._grouped_mm(a, b, offs=torch.tensor([16, 32], dtype=torch.int32, device=ctx.device))
        y.backward(torch.randn_like(y))
        return True
    except Exception:
        return False


def pick_impl(ctx: h.Context, dtype: torch.dtype) -> str:
    """The implementation for this run (``impl`` setting, else the first that works), decided once
    per dtype so a sweep does not switch implementation midway."""
    want = ctx.extra.get("grouped_impl", "auto")
    if want != "auto":
        return want
    cache = ctx.extra.setdefault("grouped_impl_resolved", {})
    if dtype not in cache:
        if _te_available(ctx):
            cache[dtype] = "te_grouped_linear"
        else:
            cache[dtype] = "torch_grouped_mm" if _grouped_mm_works(ctx, dtype) else "loop"
    return cache[dtype]


def _forward_fn(impl: str, x: torch.Tensor, n_g: int, fin: int, fout: int, rows: list[int], ctx: h.Context):
    """A closure computing the grouped projection of x; returns (fn, params)."""
    dt, dev = x.dtype, ctx.device
    if impl == "te_grouped_linear":
        import transformer_engine.pytorch as te

        layer = te.GroupedLinear(n_g, fin, fout, bias=False, params_dtype=dt, device=dev)
        return (lambda: layer(x, rows)), list(layer.parameters())
    w = h.randn((n_g, fin, fout), dt, dev, scale=fin**-0.5, grad=True)
    if impl == "torch_grouped_mm":
        offs = torch.tensor(rows, device=dev, dtype=torch.int32).cumsum(0).to(torch.int32)
        return (lambda: torch._grouped_mm(x, w, offs=offs)), [w]
    if impl == "loop":

        def loop():
            return torch.cat([torch.mm(xi, w[i]) for i, xi in enumerate(torch.split(x, rows))])

        return loop, [w]
    raise h.Unsupported(f"grouped gemm implementation {impl!r}")


def probe_s(p: dict, ctx: h.Context) -> float:
    """Seconds of one forward and one timed backward (with its untimed forward): about 4 forwards,
    each the FLOPs of one GEMM over all the point's rows (a probe, :func:`harness.probe_mm_s`)."""
    fin, fout = features(p["proj"], p["hidden"], p["ffn"])
    dtype = "bf16" if p["dtype"] in RECIPE_OF_DTYPE else p["dtype"]  # an FP8 point: its bf16 twin bounds it
    return 4.0 * h.probe_mm_s(p["num_gemms"] * p["tokens_per_expert"], fout, fin, dtype, ctx)


def measure(p: dict, ctx: h.Context) -> dict:
    fin, fout = features(p["proj"], p["hidden"], p["ffn"])
    rows = splits(p["num_gemms"], p["tokens_per_expert"], p["distribution"])
    if p["dtype"] in RECIPE_OF_DTYPE:  # FP8: a recipe's quantize + GEMMs, rows padded (bench/fp8_grouped.py)
        return measure_fp8(p, ctx, fin, fout, rows)
    dt = h.torch_dtype(p["dtype"], ctx)
    total = sum(rows)
    h.check_memory(ctx, dt.itemsize * 3 * (total * (fin + fout) + p["num_gemms"] * fin * fout))
    impl = pick_impl(ctx, dt)
    x = h.randn((total, fin), dt, ctx.device, grad=True)
    fwd, params = _forward_fn(impl, x, p["num_gemms"], fin, fout, rows, ctx)
    dy = h.randn((total, fout), dt, ctx.device)
    f = h.time_fn(lambda _: fwd(), ctx)  # autograd on: the training forward, saving what backward needs

    def setup():
        x.grad = None
        for w in params:
            w.grad = None
        return fwd()

    b = h.time_fn(lambda y: y.backward(dy), ctx, setup=setup)
    return dict(
        fwd_s=f.median,
        fwd_p10_s=f.p10,
        fwd_p90_s=f.p90,
        bwd_s=b.median,
        n_rep=f.n,
        impl=impl,
        in_features=fin,
        out_features=fout,
        note=f"m_splits={rows}" if p["distribution"] == "skewed" else None,
    )
