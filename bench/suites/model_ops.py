"""Host dispatch of the reference training model (the ``ops:*`` modes of the dispatch suite; see
:mod:`scaleplan.bench.suites.dispatch` for the definition and units), on a CPU or a CUDA device.

kappa (ops per layer and micro-batch, sec:iteration-time-model, "Compute versus dispatch") is
counted here for the model ``scaleplan validate`` trains, on the device itself (every aten op that
reaches the dispatcher); the GPU law kappa0 = 642 counts Megatron-Core CUDA kernels instead. The
host seconds of a part = its op count x the seconds per op of a tiny probe of the same model:

* CPU (serial dispatch): the host issues every op on the cores that run it, so per micro-batch the
  host time L_stage kappa t_op adds to the compute instead of hiding behind it. t_op = the probe's
  wall per op; plus the measured compute of the ops the tables do not cost (elementwise, index,
  copies), timed one by one at the point's widths ("uncosted compute").
* CUDA: the host only launches; t_op = the probe's host ISSUE time per op (synchronised before,
  timed on the host clock without a trailing synchronisation: at the probe's tiny widths the GPU
  keeps up with the launches, so the wall is the launch cost), :func:`issue_walls`. The uncosted
  compute is 0: it runs on the GPU, where the estimator costs it. The estimator's reference stack
  (``Estimator(stack="reference")``) takes max(GPU time, host time) per stage and micro-batch.
"""
from __future__ import annotations

import functools
import time
from collections.abc import Callable

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

PARTS = ("moe", "dense", "microbatch", "step_moe", "step_dense", "step")
REPS = 40  # the per-op host time varies with the machine's state: a long sample for a stable median
TINY = (64, 64, 4)  # (tokens, hidden, experts) of the probe whose wall per op is the dispatch cost
# ops the estimator costs from its own tables (GEMM, grouped GEMM, SDPA, vocab, router top-k): their
# compute is not host work; every other op's compute at the model's widths is (elementwise, index,
# copies, router arithmetic), timed one by one in the probe
COSTED = {"mm", "addmm", "bmm", "_grouped_mm", "_scaled_dot_product_flash_attention_for_cpu",
          "_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_flash_attention",
          "_scaled_dot_product_flash_attention_backward", "_log_softmax", "_log_softmax_backward_data",
          "nll_loss_forward", "nll_loss_backward", "topk"}


class _OpCounter(TorchDispatchMode):
    """Counts every aten op that reaches the dispatcher (forward, autograd backward, recompute)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


class _OpTimer(TorchDispatchMode):
    """Sums the wall seconds of every op not in COSTED (the op's kernel, below this mode)."""

    def __init__(self):
        super().__init__()
        self.t = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t0 = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ not in COSTED:
            self.t += time.perf_counter() - t0
        return out


def _spec(tokens: int, hidden: int, experts: int, layers: int, moe: bool, precision: str):
    from scaleplan.specs import parse_spec

    hd = 32 if hidden % 32 == 0 and hidden >= 64 else max(hidden // 2, 1)  # the reference's head_dim
    heads = hidden // hd
    model = {"hidden_sz": hidden, "inter_sz": 2 * hidden, "n_q_heads": heads, "n_kv_heads": max(heads // 2, 1),
             "head_dim": hd, "vocab_sz": 256, "n_layers": layers, "precision": precision}
    if moe:
        model["moe"] = {"n_experts": experts, "experts_per_token": min(2, experts),
                        "expert_inter_sz": hidden // 2, "shared_expert_inter_sz": hidden // 2}
    return parse_spec({"model": model, "data": {"gbs": 1, "seqlen": tokens, "microbatch_sz": 1},
                       "hardware": {"node_type": "cpu-local"}})


def issue_walls(fb: Callable[[], object], step: Callable[[], object], reps: int,
                sync: Callable[[], object] | None = None,
                clock: Callable[[], float] = time.perf_counter) -> tuple[list[float], list[float]]:
    """Host seconds of ``reps`` forward+backward calls ``fb()`` and optimizer steps ``step()``.

    ``sync`` None (a CPU: the host runs the ops): back-to-back host walls, fb then step.
    ``sync`` given (a GPU's synchronize): each of fb and step starts on an empty device queue
    (``sync()`` before it) and is timed on the host WITHOUT a trailing sync, so the wall is the
    time the host takes to issue the ops, not the device's time to run them.
    ``clock`` (seconds) is injectable so the logic can be checked against a simulated device.
    Returns (fb walls, step walls), seconds, ``reps`` each.
    """
    fbs, sts = [], []
    for _ in range(reps):
        if sync is not None:
            sync()
        t0 = clock()
        fb()
        t1 = clock()
        if sync is not None:
            sync()
            t1s = clock()  # the step's issue starts after the queued fb kernels have drained
        else:
            t1s = t1
        step()
        fbs.append(t1 - t0)
        sts.append(clock() - t1s)
    return fbs, sts


@functools.lru_cache(maxsize=64)
def _probe(tokens, hidden, experts, layers, moe, ckpt, precision, dtype_name, device="cpu") -> tuple:
    """(ops of one fwd+bwd, ops of one optimizer step, median wall s of fwd+bwd, of the step,
    median seconds of the uncosted ops' kernels in a fwd+bwd, in a step). On CUDA the walls are
    host issue times (:func:`issue_walls`) and the uncosted compute is 0 (costed on the GPU)."""
    from scaleplan.reference.model import build_model
    from scaleplan.reference.optim import MasterAdamW

    dt = getattr(torch, dtype_name)
    dev = torch.device(device)
    spec = _spec(tokens, hidden, experts, layers, moe, precision)
    model = build_model(spec.model, ckpt, dev, dt)
    opt = MasterAdamW(model.parameters())
    tok = torch.randint(0, spec.model.vocab_sz, (1, tokens), device=dev)

    def fb():
        model.set_microbatch(0)
        model(tok, tok).backward()

    fb()
    opt.step()
    with _OpCounter() as c:
        fb()
    with _OpCounter() as c2:
        opt.step()
    unc_fb, unc_st = [0.0], [0.0]
    if dev.type != "cuda":  # on a GPU that compute is device time, costed by the estimator's tables
        unc_fb, unc_st = [], []
        for _ in range(5):
            with _OpTimer() as t1:
                fb()
            with _OpTimer() as t2:
                opt.step()
            unc_fb.append(t1.t)
            unc_st.append(t2.t)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else None
    fbs, sts = issue_walls(fb, opt.step, REPS, sync)
    # the median, like every other table (and like the validate step time it adds to)
    return c.n, c2.n, float(np.median(fbs)), float(np.median(sts)), float(np.median(unc_fb)), float(np.median(unc_st))


def measure(p: dict, dt: torch.dtype, ctx) -> dict:
    """One ``ops:<part>[:<ckpt>]`` point: host seconds of the part (see the dispatch suite docstring)."""
    from scaleplan.bench import harness as h

    _, part, *rest = p["mode"].split(":")
    ckpt = rest[0] if rest else "none"
    if part not in PARTS:
        raise h.Unsupported(f"unknown model part {part!r}; one of {PARTS}")
    prec = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(dt)
    if prec is None:
        raise h.Unsupported(f"the reference model runs in bf16/fp16/fp32, not {dt}")
    dn = str(dt).removeprefix("torch.")
    dev = str(ctx.device)

    def parts(args, i):
        """Per-part quantity i of _probe: the first block is dense, every later one MoE, so L=2 -> L=3
        adds one MoE layer; the dense-only model L=1 -> L=2 one dense layer; dense L=1 minus its
        layer is the rest."""
        m2, m3 = _probe(*args, 2, True, ckpt, prec, dn, dev), _probe(*args, 3, True, ckpt, prec, dn, dev)
        d1, d2 = _probe(*args, 1, False, ckpt, prec, dn, dev), _probe(*args, 2, False, ckpt, prec, dn, dev)
        j = i + 1  # the optimizer-step column beside the fwd+bwd one
        return m3, {"moe": m3[i] - m2[i], "dense": d2[i] - d1[i], "microbatch": d1[i] - (d2[i] - d1[i]),
                    "step_moe": m3[j] - m2[j], "step_dense": d2[j] - d1[j], "step": d1[j] - (d2[j] - d1[j])}

    # dispatch: op count x the seconds per op of the tiny probe (wall / ops: host cost of eager
    # autograd ops; on CUDA the host issue time); compute of the ops the tables do not cost: timed
    # at this point's widths on a CPU, 0 on a GPU (device time the estimator costs from its tables)
    m3, counts = parts(TINY, 0)
    per_op = m3[3] / max(m3[1], 1) if part.startswith("step") else m3[2] / m3[0]
    n_ops = counts[part]
    extra = 0.0
    if not ctx.is_cuda:
        _, unc = parts((p["m"], p["n"], p["k"]), 4)
        _, unc_tiny = parts(TINY, 4)
        # the tiny probe's wall per op already holds its own (small) uncosted compute
        extra = max(unc[part] - unc_tiny[part], 0.0)
    if n_ops == 0 and part.startswith("step"):  # e.g. fp32: no master copies, one fused AdamW call
        raise h.Unsupported(f"part {part} issues no ops in {prec} (counted: 0)")
    if n_ops <= 0:
        raise RuntimeError(f"non-positive op count {n_ops} for part {part} ({ckpt})")
    return dict(wall_per_kernel_s=n_ops * per_op + extra, active_per_kernel_s=None, n_rep=REPS,
                note=f"n_ops={n_ops}; t_op_s={per_op:.3e}; uncosted_compute_s={extra:.3e}; ckpt={ckpt}; "
                f"widths tokens={p['m']} hidden={p['n']} experts={p['k']}; dispatch probe {TINY} "
                f"({m3[0]} fwd+bwd ops, {m3[1]} step ops at L=3)"
                + (f"; CUDA {dev}: t_op = host issue time (synchronised before, no trailing sync), "
                   "ops counted on the device, uncosted compute 0 (GPU time)" if ctx.is_cuda else ""))
