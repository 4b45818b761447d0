"""Element-wise and normalisation kernels over (tokens, hidden), forward and backward (paper
sec:microbenchmarks, "element-wise operations").

Ops (the ``op`` column), each on activations of ``tokens`` rows:
- ``swiglu``: silu(a) * b for an input [tokens, 2*hidden] split into halves a, b; output [tokens, hidden].
- ``silu``: silu(x), x [tokens, hidden].
- ``residual_add``: x + r.
- ``rmsnorm``: ``F.rms_norm`` with a learned scale.  ``layernorm``: ``F.layer_norm`` with scale and bias.
- ``rope``: rotary embedding (rotate-half form) of x viewed as [tokens, hidden/head_dim, head_dim]
  with per-token cos/sin (head_dim = ``rope_head_dim``, or hidden when it does not divide).
- ``quantize_tensorwise``, ``quantize_mxfp8``: the FP8 cast of a bf16 GEMM input [tokens, hidden] in a recipe
  (bench/fp8.py), rowwise and columnwise (the transposed copy the weight gradient reads), forward only: the
  cast kernels Transformer Engine runs before each FP8 GEMM. On CUDA the two casts run compiled
  (``torch.compile``: Triton kernels, the scale and cast fused; on an H200 still 4-50x the bytes of one fused
  cast at HBM bandwidth, docs/accuracy.md), else eager torch ops (several kernels and fp32 temporaries per
  cast); the note says which. Neither stands for TE's hand-written cast kernels: the model does not read them.
Times in seconds; bwd_s is the backward pass alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from scaleplan.bench import harness as h
from scaleplan.bench.config import SuiteConfig, explicit_points, grid

from scaleplan.db import models as m

NAME = "elementwise"
TABLE = m.ElementwisePoint
KEY = ("op", "tokens", "hidden", "dtype")
OPS = ("swiglu", "silu", "residual_add", "rmsnorm", "layernorm", "rope")
QUANTIZE_OPS = {"quantize_tensorwise": "tensorwise", "quantize_mxfp8": "mxfp8"}


class Config(SuiteConfig):
    dtypes: list[str] = ["bf16"]
    ops: list[str] = list(OPS)
    tokens: list[int] = [4096]
    hidden: list[int] = [2048]
    rope_head_dim: int = 128


def expand(cfg: Config, ctx: h.Context) -> list[dict]:
    ctx.extra["rope_head_dim"] = cfg.rope_head_dim
    if cfg.points is not None:
        return explicit_points(cfg.points, KEY, NAME)
    return grid(op=cfg.ops, tokens=cfg.tokens, hidden=cfg.hidden, dtype=cfg.dtypes)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE: x [T, H, D], cos/sin [T, 1, D]."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def _closure(p: dict, dt: torch.dtype, ctx: h.Context):
    """(forward closure, leaves); the closure's output is what backward starts from."""
    t, d, dev, op = p["tokens"], p["hidden"], ctx.device, p["op"]
    if op == "swiglu":
        x = h.randn((t, 2 * d), dt, dev, grad=True)

        def swiglu():
            a, b = x.chunk(2, dim=-1)
            return F.silu(a) * b

        return swiglu, [x]
    x = h.randn((t, d), dt, dev, grad=True)
    if op == "silu":
        return (lambda: F.silu(x)), [x]
    if op == "residual_add":
        r = h.randn((t, d), dt, dev, grad=True)
        return (lambda: x + r), [x, r]
    if op == "rmsnorm":
        w = torch.ones(d, dtype=dt, device=dev, requires_grad=True)
        return (lambda: F.rms_norm(x, (d,), w, eps=1e-6)), [x, w]
    if op == "layernorm":
        w = torch.ones(d, dtype=dt, device=dev, requires_grad=True)
        bias = torch.zeros(d, dtype=dt, device=dev, requires_grad=True)
        return (lambda: F.layer_norm(x, (d,), w, bias, eps=1e-5)), [x, w, bias]
    if op == "rope":
        hd = ctx.extra.get("rope_head_dim", 128)
        hd = hd if d % hd == 0 and hd % 2 == 0 else d
        if hd % 2:
            raise h.Unsupported(f"rope needs an even head_dim, hidden={d}")
        pos = torch.arange(t, device=dev, dtype=torch.float32)[:, None]
        inv = 10000.0 ** (-torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd)
        ang = torch.cat((pos * inv, pos * inv), dim=-1)[:, None, :]
        cos, sin = ang.cos().to(dt), ang.sin().to(dt)
        return (lambda: rope(x.view(t, d // hd, hd), cos, sin)), [x]
    raise h.Unsupported(f"unknown elementwise op {op!r}")


_COMPILED_CASTS: dict[str, object] = {}


def _casts(recipe: str, ctx: h.Context):
    """(cast pair of x: rowwise and columnwise copies, "compiled" | "eager"): compiled on CUDA where
    torch.compile works (one compilation per recipe, dynamic shapes), else eager."""
    from scaleplan.bench import fp8

    def pair(x):
        return fp8.quantize(x, recipe), fp8.quantize(x.t().contiguous(), recipe)

    if ctx.is_cuda:
        try:
            if recipe not in _COMPILED_CASTS:
                _COMPILED_CASTS[recipe] = torch.compile(pair, dynamic=True)
            fused = _COMPILED_CASTS[recipe]
            fused(torch.zeros((64, 64), dtype=torch.bfloat16, device=ctx.device))
            return fused, "compiled"
        except Exception:  # no compiler toolchain there: the eager ops, and the note says so
            _COMPILED_CASTS.pop(recipe, None)
    return pair, "eager"


def _quantize_point(p: dict, ctx: h.Context) -> dict:
    """A cast kernel's row: forward only (a cast has no backward of its own)."""
    from scaleplan.bench import fp8

    recipe = QUANTIZE_OPS[p["op"]]
    if recipe == "mxfp8" and (p["tokens"] % fp8.MX_BLOCK or p["hidden"] % fp8.MX_BLOCK):
        raise h.SkipAlign(f"mxfp8 casts need tokens and hidden multiples of {fp8.MX_BLOCK}")
    x = h.randn((p["tokens"], p["hidden"]), h.torch_dtype(p["dtype"], ctx), ctx.device)
    cast, how = _casts(recipe, ctx)
    f = h.time_fn(lambda _: cast(x), ctx)
    return dict(fwd_s=f.median, bwd_s=None, n_rep=f.n,
                note=f"recipe={recipe}: rowwise and columnwise copies; cast={how}")


def measure(p: dict, ctx: h.Context) -> dict:
    if p["op"] in QUANTIZE_OPS:
        return _quantize_point(p, ctx)
    dt = h.torch_dtype(p["dtype"], ctx)
    if p["dtype"] in ("fp8", "tf32"):
        raise h.Unsupported(f"element-wise ops are benchmarked in bf16/fp16/fp32, not {p['dtype']}")
    h.check_memory(ctx, dt.itemsize * 8 * p["tokens"] * p["hidden"])
    fwd, leaves = _closure(p, dt, ctx)
    f, b = h.time_fwd_bwd(fwd, leaves, torch.randn_like(fwd()), ctx)
    return dict(fwd_s=f.median, bwd_s=b.median, n_rep=f.n)
