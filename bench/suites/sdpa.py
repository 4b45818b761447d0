"""Scaled dot-product attention, forward and backward, on the heads one device executes (paper
sec:microbenchmarks, "Scaled dot-product attention"; head counts are the TP-sharded ones).

Key: (seq_len, micro_bs, n_q_heads, n_kv_heads, head_dim, causal, dtype, backend). Each torch
backend is forced with ``torch.nn.attention.sdpa_kernel`` so the stored backend is the one that
ran; a backend that cannot run the shape on this device is stored as UNSUPPORTED with torch's
reason. ``backends: [auto]`` means every backend of this device: flash, cudnn, efficient, math on
CUDA (plus te when Transformer Engine imports), math and flash (torch's CPU flash kernel) on CPU.
Grouped-query attention uses ``enable_gqa``; a backend that refuses it gets K/V expanded to the
query heads outside the timed region (noted on the row). Times in seconds; bwd_s is the backward
pass alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from scaleplan.bench import harness as h
from scaleplan.bench.config import SuiteConfig, explicit_points, grid
from torch.nn.attention import SDPBackend, sdpa_kernel

from scaleplan.db import models as m

NAME = "sdpa"
TABLE = m.SdpaPoint
KEY = ("seq_len", "micro_bs", "n_q_heads", "n_kv_heads", "head_dim", "causal", "dtype", "backend")
TORCH_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


class Config(SuiteConfig):
    dtypes: list[str] = ["bf16"]
    seq_len: list[int] = [2048]
    micro_bs: list[int] = [1]
    n_q_heads: list[int] = [16]
    n_kv_heads: list[int] = [8]
    head_dim: list[int] = [128]
    causal: list[bool] = [True]
    backends: list[str] = ["auto"]


def device_backends(ctx: h.Context) -> list[str]:
    if not ctx.is_cuda:
        return ["math", "flash"]
    out = ["flash", "cudnn", "efficient", "math"]
    try:
        import transformer_engine.pytorch  # noqa: F401

        out.append("te")
    except Exception:
        pass
    return out


def expand(cfg: Config, ctx: h.Context) -> list[dict]:
    backends = [b for name in cfg.backends for b in (device_backends(ctx) if name == "auto" else [name])]
    backends = list(dict.fromkeys(backends))
    if cfg.points is not None:  # a point without a backend (an estimator lookup) is measured with each
        pts = [
            {**p, "backend": b} for p in cfg.points for b in ([p["backend"]] if "backend" in p else backends)
        ]
        return list({tuple(q.items()): q for q in explicit_points(pts, KEY, NAME)}.values())
    pts = grid(
        seq_len=cfg.seq_len,
        micro_bs=cfg.micro_bs,
        n_q_heads=cfg.n_q_heads,
        n_kv_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
        causal=cfg.causal,
        dtype=cfg.dtypes,
        backend=backends,
    )
    return [p for p in pts if p["n_q_heads"] >= p["n_kv_heads"]]


def _torch_attention(p: dict, q, k, v, backend: SDPBackend):
    """A forward closure forcing one backend; falls back to expanded K/V when GQA is refused."""
    gqa = p["n_q_heads"] != p["n_kv_heads"]

    def native():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=p["causal"], enable_gqa=gqa)

    try:
        native()
        return native, None, [q, k, v]
    except RuntimeError:
        if not gqa:
            raise
    rep = p["n_q_heads"] // p["n_kv_heads"]
    ke = k.detach().repeat_interleave(rep, dim=1).requires_grad_()
    ve = v.detach().repeat_interleave(rep, dim=1).requires_grad_()

    def expanded():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, ke, ve, is_causal=p["causal"])

    expanded()
    return expanded, "backend refused enable_gqa: K/V expanded to the query heads before timing", [q, ke, ve]


def _te_attention(p: dict, dt: torch.dtype, ctx: h.Context):
    """Transformer Engine DotProductAttention in bshd layout (CUDA only)."""
    if not ctx.is_cuda:
        raise h.Unsupported("Transformer Engine attention needs CUDA")
    try:
        import transformer_engine.pytorch as te
    except Exception as e:
        raise h.Unsupported(f"transformer_engine not importable: {e}") from None
    b, s, hq, hk, d = p["micro_bs"], p["seq_len"], p["n_q_heads"], p["n_kv_heads"], p["head_dim"]
    attn = te.DotProductAttention(
        hq, d, num_gqa_groups=hk, attn_mask_type="causal" if p["causal"] else "no_mask", qkv_format="bshd"
    )
    q = h.randn((b, s, hq, d), dt, ctx.device, grad=True)
    k = h.randn((b, s, hk, d), dt, ctx.device, grad=True)
    v = h.randn((b, s, hk, d), dt, ctx.device, grad=True)
    return (lambda: attn(q, k, v)), [q, k, v], None


def measure(p: dict, ctx: h.Context) -> dict:
    dt = h.torch_dtype(p["dtype"], ctx)
    if p["dtype"] in ("fp8", "tf32"):
        raise h.Unsupported(f"sdpa is benchmarked in bf16/fp16/fp32, not {p['dtype']}")
    b, s, hq, hk, d = p["micro_bs"], p["seq_len"], p["n_q_heads"], p["n_kv_heads"], p["head_dim"]
    if hq % hk:
        raise h.Unsupported(f"n_q_heads {hq} is not a multiple of n_kv_heads {hk}")
    # q,k,v,o and their grads; the math backend also materialises the S x S scores (fp32 here)
    scores = b * hq * s * s * 4 * 2 if p["backend"] == "math" else 0
    h.check_memory(ctx, dt.itemsize * 2 * b * s * d * (2 * hq + 2 * hk) + scores)
    if p["backend"] == "te":
        fwd, leaves, note = _te_attention(p, dt, ctx)
    elif p["backend"] in TORCH_BACKENDS:
        q = h.randn((b, hq, s, d), dt, ctx.device, grad=True)
        k = h.randn((b, hk, s, d), dt, ctx.device, grad=True)
        v = h.randn((b, hk, s, d), dt, ctx.device, grad=True)
        fwd, note, leaves = _torch_attention(p, q, k, v, TORCH_BACKENDS[p["backend"]])
    else:
        raise h.Unsupported(f"unknown sdpa backend {p['backend']!r}")
    f, bw = h.time_fwd_bwd(fwd, leaves, torch.randn_like(fwd()), ctx)
    return dict(fwd_s=f.median, bwd_s=bw.median, n_rep=f.n, note=note)
