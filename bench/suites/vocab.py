"""Vocabulary stage: LM-head GEMM and cross-entropy on fp32-upcast logits, forward and backward
(paper sec:microbenchmarks, "Cross-entropy over the vocabulary"; it lands on the last PP stage).

Key: (op, tokens, hidden, vocab, dtype).
- ``lm_head_gemm``: logits[T, V] = x[T, d] @ W[V, d]^T in ``dtype``; backward = input and weight grads.
- ``cross_entropy``: logits in the training precision (``ce_input_dtype``: the first non-fp32
  entry of ``dtypes``, else fp32) upcast to fp32, then ``F.cross_entropy`` (mean over tokens);
  stored with dtype ``fp32`` (the precision the loss runs in), the input precision in the note.
  Its time does not depend on hidden; hidden is kept in the key so a row pairs with its GEMM.
Times in seconds; bwd_s is the backward pass alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from scaleplan.bench import harness as h
from scaleplan.bench.config import SuiteConfig, explicit_points, grid

from scaleplan.db import models as m

NAME = "vocab"
TABLE = m.VocabPoint
KEY = ("op", "tokens", "hidden", "vocab", "dtype")


class Config(SuiteConfig):
    dtypes: list[str] = ["bf16"]
    ops: list[str] = ["lm_head_gemm", "cross_entropy"]
    tokens: list[int] = [4096]
    hidden: list[int] = [2048]
    vocab: list[int] = [131072]


def expand(cfg: Config, ctx: h.Context) -> list[dict]:
    ctx.extra["ce_input_dtype"] = next((d for d in cfg.dtypes if d != "fp32"), "fp32")
    if cfg.points is not None:
        return explicit_points(cfg.points, KEY, NAME)
    out = []
    for p in grid(op=cfg.ops, tokens=cfg.tokens, hidden=cfg.hidden, vocab=cfg.vocab, dtype=cfg.dtypes):
        if p["op"] == "cross_entropy":
            p["dtype"] = "fp32"
        if p not in out:
            out.append(p)
    return out


def probe_s(p: dict, ctx: h.Context) -> float | None:
    """Seconds of one forward and one timed backward of the LM head GEMM (about 4 forwards) from a probe;
    None for the cross-entropy (elementwise over tokens x vocab: no GEMM to probe)."""
    if p["op"] != "lm_head_gemm":
        return None
    return 4.0 * h.probe_mm_s(p["tokens"], p["vocab"], p["hidden"], p["dtype"], ctx)


def measure(p: dict, ctx: h.Context) -> dict:
    t, d, v, dev = p["tokens"], p["hidden"], p["vocab"], ctx.device
    note = None
    if p["op"] == "lm_head_gemm":
        dt = h.torch_dtype(p["dtype"], ctx)
        if p["dtype"] in ("fp8", "tf32"):
            raise h.Unsupported(f"the LM head is benchmarked in bf16/fp16/fp32, not {p['dtype']}")
        h.check_memory(ctx, dt.itemsize * (2 * t * d + 2 * v * d + 2 * t * v))
        x = h.randn((t, d), dt, dev, grad=True)
        w = h.randn((v, d), dt, dev, scale=d**-0.5, grad=True)
        leaves = [x, w]

        def fwd():
            return x @ w.t()

        g = torch.randn((t, v), dtype=dt, device=dev)

        def bwd(y):
            y.backward(g)
    elif p["op"] == "cross_entropy":
        in_name = p["dtype"] if p["dtype"] != "fp32" else ctx.extra.get("ce_input_dtype", "fp32")
        dt = h.torch_dtype(in_name, ctx)
        h.check_memory(ctx, t * v * (2 * dt.itemsize + 8))
        logits = h.randn((t, v), dt, dev, grad=True)
        target = torch.randint(0, v, (t,), device=dev)
        leaves = [logits]
        note = f"input logits {in_name}, upcast to fp32"

        def fwd():
            return F.cross_entropy(logits.float(), target)

        def bwd(loss):
            loss.backward()
    else:
        raise h.Unsupported(f"unknown vocab op {p['op']!r}")
    f = h.time_fn(lambda _: fwd(), ctx)

    def setup():
        for x_ in leaves:
            x_.grad = None
        return fwd()

    b = h.time_fn(bwd, ctx, setup=setup)
    return dict(fwd_s=f.median, bwd_s=b.median, n_rep=f.n, note=note)
