"""Allocator overhead: what the caching allocator reserves beyond what the training step allocates
(the memory model's 'allocator' and 'context' terms, estimator/memory.py).

Each point trains the reference model of ``scaleplan validate`` (scaleplan.reference.model; one
process, AdamW on fp32 masters) for ``steps`` optimizer steps after ``warmup`` and reads
``torch.cuda.max_memory_allocated`` and ``torch.cuda.max_memory_reserved`` over those steps
(peaks reset after the warm-up, so the first-step allocations settle first).

Key: (layers, hidden, experts, k, seq_len, micro_bs, ckpt, dtype); the other widths follow the
hidden size like ``benchmarks/validate_accuracy.py``'s configurations (d_ff = 2.5 d, head_dim 32 or
64, 2 KV groups, expert width d_ff / 4, one shared expert, vocab 8192). Stored per point:
  * max_allocated_bytes, max_reserved_bytes; allocator_fraction = reserved / allocated - 1 (the
    fragmentation and cached free blocks the memory model adds as 'allocator');
  * context_bytes = device memory in use (cudaMemGetInfo) minus torch's reserved bytes: CUDA
    context, cuBLAS/cuDNN handles, anything outside the allocator (other processes on the same
    GPU count here too: run it on an otherwise idle GPU);
  * predicted_allocated_bytes: estimator.memory.reference_peak_allocated for the same model and
    layout, so a row also says how far the model's allocated prediction is off;
  * step_s: median step seconds (for context; the time tables come from the other suites).
On a CPU there is no caching allocator to measure: every point is stored UNSUPPORTED.
"""
from __future__ import annotations

import statistics
import time

import numpy as np
import torch
from scaleplan.bench import harness as h
from scaleplan.bench.config import SuiteConfig, explicit_points, grid

from scaleplan.db import models as m

NAME = "allocator"
TABLE = m.AllocatorPoint
KEY = ("layers", "hidden", "experts", "k", "seq_len", "micro_bs", "ckpt", "dtype")
VOCAB = 8192


class Config(SuiteConfig):
    dtypes: list[str] = ["bf16"]
    layers: list[int] = [4]
    hidden: list[int] = [1024]
    experts: list[int] = [16]
    k: list[int] = [2]
    seq_len: list[int] = [2048]
    micro_bs: list[int] = [1, 2]
    ckpt: list[str] = ["none", "full"]
    steps: int = 4
    warmup: int = 2


def expand(cfg: Config, ctx: h.Context) -> list[dict]:
    ctx.extra["allocator_steps"] = (cfg.steps, cfg.warmup)
    if cfg.points is not None:
        return explicit_points(cfg.points, KEY, NAME)
    return grid(layers=cfg.layers, hidden=cfg.hidden, experts=cfg.experts, k=cfg.k, seq_len=cfg.seq_len,
                micro_bs=cfg.micro_bs, ckpt=cfg.ckpt, dtype=cfg.dtypes)


def spec_for(p: dict) -> dict:
    """The spec (dict) of a point's reference model; one micro-batch per step (gbs = micro_bs)."""
    d = p["hidden"]
    hd = 64 if d >= 512 else 32
    nq = max(d // hd, 2)
    f = max(int(2.5 * d) // 4, 8)
    model = {"n_layers": p["layers"], "hidden_sz": d, "inter_sz": int(2.5 * d), "n_q_heads": nq,
             "n_kv_heads": max(nq // 4, 1) if nq % 4 == 0 else nq, "head_dim": hd, "vocab_sz": VOCAB,
             "precision": p["dtype"], "sdpa_precision": p["dtype"],
             "moe": {"n_experts": p["experts"], "experts_per_token": p["k"], "expert_inter_sz": f,
                     "shared_expert_inter_sz": f}}
    return {"model": model, "data": {"gbs": p["micro_bs"], "seqlen": p["seq_len"], "microbatch_sz": p["micro_bs"]},
            "performance": {"activation_checkpointing_type": p["ckpt"]}, "hardware": {"node_type": "cpu-local"}}


def predicted_allocated(spec_d: dict, ckpt: str) -> float:
    """The memory model's peak allocated bytes of the reference runner for one process."""
    from scaleplan.estimator import memory as mm
    from scaleplan.estimator.model_dims import geometry
    from scaleplan.estimator.layout import ParallelLayout

    from scaleplan.specs import Layout, parse_spec

    sp = parse_spec(spec_d)
    pl = ParallelLayout.from_specs([Layout(dp=1, mbs=sp.data.microbatch_sz, ckpt=ckpt)], 1)
    mem = mm.memory_breakdown(geometry(sp.model), pl, sp.data.gbs, sp.data.seqlen, "adamw",
                              state=mm.REFERENCE_DDP, rope=sp.model.rotary_embeds)
    return float(mm.reference_peak_allocated(mem, 1)[0])


def train_steps(spec_d: dict, ckpt: str, device: torch.device, steps: int, warmup: int,
                on_warm=None) -> list[float]:
    """Warm-up + timed steps of the reference model (forward, backward, AdamW, bias update) on
    ``device``; ``on_warm()`` runs between warm-up and timed steps. Returns the timed steps' seconds."""
    from scaleplan.reference.model import build_model
    from scaleplan.reference.optim import MasterAdamW, torch_dtype
    from scaleplan.specs import parse_spec

    sp = parse_spec(spec_d)
    torch.manual_seed(0)
    model = build_model(sp.model, ckpt, device, torch_dtype(sp.model.precision))
    opt = MasterAdamW(model.parameters())
    g = torch.Generator().manual_seed(0)
    shape = (sp.data.microbatch_sz, sp.data.seqlen)
    tok, lab = (torch.randint(0, sp.model.vocab_sz, shape, generator=g).to(device) for _ in range(2))
    times = []
    for i in range(warmup + steps):
        if i == warmup and on_warm is not None:
            on_warm()
        h.synchronize(device)
        t0 = time.perf_counter()
        opt.zero_grad()
        model.set_microbatch(0)
        model(tok, lab).backward()
        opt.step()
        for r in model.routers():
            r.update_bias()
        h.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def measure(p: dict, ctx: h.Context) -> dict:
    if not ctx.is_cuda:
        raise h.Unsupported("allocator overhead needs CUDA (torch.cuda.max_memory_reserved); a CPU has no "
                            "caching allocator to measure")
    cfg_steps = ctx.extra.get("allocator_steps", (4, 2))
    spec_d = spec_for(p)
    pred = predicted_allocated(spec_d, p["ckpt"])
    h.check_memory(ctx, 1.3 * pred)
    dev = ctx.device
    h.release_memory(dev)
    times = train_steps(spec_d, p["ckpt"], dev, *cfg_steps, on_warm=lambda: torch.cuda.reset_peak_memory_stats(dev))
    alloc = int(torch.cuda.max_memory_allocated(dev))
    reserved = int(torch.cuda.max_memory_reserved(dev))
    free, total = torch.cuda.mem_get_info(dev)
    context = int(total - free - torch.cuda.memory_reserved(dev))
    h.release_memory(dev)
    return {"step_s": statistics.median(times), "n_rep": len(times), "max_allocated_bytes": alloc,
            "max_reserved_bytes": reserved, "allocator_fraction": reserved / alloc - 1.0,
            "context_bytes": max(context, 0), "predicted_allocated_bytes": pred,
            "note": f"predicted allocated {pred / 1e9:.3f} GB vs measured {alloc / 1e9:.3f} GB "
                    f"({(pred - alloc) / alloc:+.1%})"}


def overhead_from_rows(rows: list[dict]) -> tuple[float, float] | None:
    """(allocator_fraction, context_bytes): medians over OK rows, None without any (then the memory
    model's documented defaults apply)."""
    ok = [r for r in rows if r.get("status") == "OK" and r.get("allocator_fraction") is not None]
    if not ok:
        return None
    return (float(np.median([r["allocator_fraction"] for r in ok])),
            float(np.median([r["context_bytes"] or 0 for r in ok])))
