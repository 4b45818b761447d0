"""Host dispatch of the reference training model on a serial-dispatch device (the ``ops:*`` modes of
the dispatch suite; see :mod:`scaleplan.bench.suites.dispatch` for the definition and units).

On a CPU the host issues every op on the cores that run it, so per micro-batch the host time
L_stage kappa t_op (sec:iteration-time-model, "Compute versus dispatch") adds to the compute
instead of hiding behind it. kappa (ops per layer and micro-batch) is counted here for the model
``scaleplan validate`` trains; the GPU law kappa0 = 642 counts Megatron-Core CUDA kernels instead.
"""
from __future__ import annotations

import functools
import time

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

PARTS = ("moe", "dense", "microbatch", "step_moe", "step_dense", "step")
REPS = 15


class _OpCounter(TorchDispatchMode):
    """Counts every aten op that reaches the dispatcher (forward, autograd backward, recompute)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def _spec(tokens: int, hidden: int, experts: int, layers: int, moe: bool, precision: str):
    from scaleplan.specs import parse_spec

    model = {"hidden_sz": hidden, "inter_sz": 2 * hidden, "n_q_heads": 2, "n_kv_heads": 1,
             "head_dim": max(hidden // 2, 8), "vocab_sz": 256, "n_layers": layers, "precision": precision}
    if moe:
        model["moe"] = {"n_experts": experts, "experts_per_token": min(2, experts),
                        "expert_inter_sz": hidden // 2, "shared_expert_inter_sz": hidden // 2}
    return parse_spec({"model": model, "data": {"gbs": 1, "seqlen": tokens, "microbatch_sz": 1},
                       "hardware": {"node_type": "cpu-local"}})


@functools.lru_cache(maxsize=64)
def _probe(tokens, hidden, experts, layers, moe, ckpt, precision, dtype_name) -> tuple[int, int, float, float]:
    """(ops of one fwd+bwd, ops of one optimizer step, floor wall s of fwd+bwd, of the step)."""
    from scaleplan.validate.model import build_model
    from scaleplan.validate.runner import MasterAdamW

    dt = getattr(torch, dtype_name)
    spec = _spec(tokens, hidden, experts, layers, moe, precision)
    model = build_model(spec.model, ckpt, "cpu", dt)
    opt = MasterAdamW(model.parameters())
    tok = torch.randint(0, spec.model.vocab_sz, (1, tokens))

    def fb():
        model.set_microbatch(0)
        model(tok, tok).backward()

    fb()
    opt.step()
    with _OpCounter() as c:
        fb()
    with _OpCounter() as c2:
        opt.step()
    fbs, sts = [], []
    for _ in range(REPS):
        t0 = time.perf_counter()
        fb()
        t1 = time.perf_counter()
        opt.step()
        fbs.append(t1 - t0)
        sts.append(time.perf_counter() - t1)
    # the median, like every other table (and like the validate step time it adds to)
    return c.n, c2.n, float(np.median(fbs)), float(np.median(sts))


def measure(p: dict, dt: torch.dtype, ctx) -> dict:
    """One ``ops:<part>[:<ckpt>]`` point: host seconds of the part (see the dispatch suite docstring)."""
    from scaleplan.bench import harness as h

    if ctx.is_cuda:
        raise h.Unsupported("ops:* modes cost host dispatch on serial-dispatch (CPU) devices")
    _, part, *rest = p["mode"].split(":")
    ckpt = rest[0] if rest else "none"
    if part not in PARTS:
        raise h.Unsupported(f"unknown model part {part!r}; one of {PARTS}")
    prec = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(dt)
    if prec is None:
        raise h.Unsupported(f"the reference model runs in bf16/fp16/fp32, not {dt}")
    args = (p["m"], p["n"], p["k"])
    dn = str(dt).removeprefix("torch.")
    # the first block is dense, every later one MoE: L=2 -> L=3 adds one MoE layer; the dense-only
    # model L=1 -> L=2 adds one dense layer; the dense L=1 model minus its layer is the rest
    m2, m3 = _probe(*args, 2, True, ckpt, prec, dn), _probe(*args, 3, True, ckpt, prec, dn)
    d1, d2 = _probe(*args, 1, False, ckpt, prec, dn), _probe(*args, 2, False, ckpt, prec, dn)
    per_op_fb = m3[2] / m3[0]  # seconds per op of a forward + backward (largest probe)
    per_op_st = m3[3] / max(m3[1], 1)
    n_ops = {"moe": m3[0] - m2[0], "dense": d2[0] - d1[0], "microbatch": d1[0] - (d2[0] - d1[0]),
             "step_moe": m3[1] - m2[1], "step_dense": d2[1] - d1[1], "step": d1[1] - (d2[1] - d1[1])}[part]
    per_op = per_op_st if part.startswith("step") else per_op_fb
    if n_ops == 0 and part.startswith("step"):  # e.g. fp32: no master copies, one fused AdamW call
        raise h.Unsupported(f"part {part} issues no ops in {prec} (counted: 0)")
    if n_ops <= 0:
        raise RuntimeError(f"non-positive op count {n_ops} for part {part} ({ckpt})")
    return dict(wall_per_kernel_s=n_ops * per_op, active_per_kernel_s=None, n_rep=REPS,
                note=f"n_ops={n_ops}; t_op_s={per_op:.3e}; ckpt={ckpt}; probe tokens={p['m']} hidden={p['n']} "
                f"experts={p['k']} ({m3[0]} fwd+bwd ops, {m3[1]} step ops at L=3)")
