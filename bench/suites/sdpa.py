"""Scaled dot-product attention, forward and backward, on the heads one device executes (paper
sec:microbenchmarks, "Scaled dot-product attention"; head counts are the TP-sharded ones).

Key: (seq_len, micro_bs, n_q_heads, n_kv_heads, head_dim, causal, dtype, backend). Each torch
backend is forced with ``torch.nn.attention.sdpa_kernel`` so the stored backend is the one that
ran; a backend that cannot run the shape on this device is stored as UNSUPPORTED with torch's
reason. ``backends: [auto]`` means every backend of this device: flash, cudnn, efficient, math on
CUDA (plus te when Transformer Engine imports), math and flash (torch's CPU flash kernel) on CPU.
Grouped-query attention runs natively with ``enable_gqa`` (checked forward and backward before
timing); a backend that refuses it gets K/V expanded to the query heads inside the timed forward.
The row's note names the method that ran (``method=enable_gqa``, ``method=expand_kv`` with torch's
reason, ``method=native`` for MHA, ``method=te``). Times in seconds; bwd_s is the backward pass alone.
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


def _sdpa(p: dict, backend: SDPBackend, gqa: bool):
    def run(q, k, v):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=p["causal"], enable_gqa=gqa)

    return run


def _fwd_bwd_once(fwd, leaves) -> None:
    """One untimed forward and backward: a backend may take a shape forward and refuse its backward."""
    fwd().sum().backward()
    for x in leaves:
        x.grad = None


def torch_attention(p: dict, q, k, v, backend: SDPBackend):
    """(forward closure, note naming the method that ran, leaves) with ``backend`` forced.

    GQA runs as Megatron runs it: natively with ``enable_gqa`` (flash, cuDNN and math take it); a
    backend that refuses it, forward or backward, gets K/V expanded to the query heads inside the
    timed forward (``repeat_interleave``, Megatron's unfused path), so its backward includes the
    reduction of the expanded K/V gradients. MHA runs natively. Raises RuntimeError when the
    backend cannot run the shape either way (stored UNSUPPORTED with torch's reason)."""
    gqa = p["n_q_heads"] != p["n_kv_heads"]
    native = _sdpa(p, backend, gqa)
    leaves = [q, k, v]

    def fwd_native():
        return native(q, k, v)

    if not gqa:
        _fwd_bwd_once(fwd_native, leaves)
        return fwd_native, "method=native (MHA)", leaves
    try:
        _fwd_bwd_once(fwd_native, leaves)
        return fwd_native, "method=enable_gqa (native GQA)", leaves
    except RuntimeError as e:
        reason = (str(e).strip().splitlines() or ["refused"])[0][:160]
    rep = p["n_q_heads"] // p["n_kv_heads"]
    plain = _sdpa(p, backend, False)

    def fwd_expanded():
        return plain(q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1))

    _fwd_bwd_once(fwd_expanded, leaves)
    return fwd_expanded, f"method=expand_kv (K/V repeated x{rep} in the timed forward; enable_gqa refused: {reason})", leaves


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
    return (lambda: attn(q, k, v)), [q, k, v], f"method=te (num_gqa_groups={hk})"


def probe_s(p: dict, ctx: h.Context) -> float:
    """Seconds of one forward and one timed backward (about 4 forwards); a forward is two S x S x
    head_dim products per query head and sequence (scores, then values), probed as one GEMM."""
    heads = p["micro_bs"] * p["n_q_heads"]
    return 4.0 * 2 * heads * h.probe_mm_s(p["seq_len"], p["seq_len"], p["head_dim"], p["dtype"], ctx)


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
        fwd, note, leaves = torch_attention(p, q, k, v, TORCH_BACKENDS[p["backend"]])
    else:
        raise h.Unsupported(f"unknown sdpa backend {p['backend']!r}")
    f, bw = h.time_fwd_bwd(fwd, leaves, torch.randn_like(fwd()), ctx)
    return dict(fwd_s=f.median, bwd_s=bw.median, n_rep=f.n, note=note)
