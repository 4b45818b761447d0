"""What the reference model really stores: parameter-state bytes and the activations saved for backward.

* :func:`state_bytes`: bytes of the weights, gradients, fp32 master copies, master gradients and
  AdamW moments of a model after one optimizer step of :class:`scaleplan.reference.optim.MasterAdamW`
  (the tensors themselves, counted by storage).
* :func:`saved_activation_bytes`: bytes of the tensors autograd saves for the backward pass in one
  forward, captured with ``torch.autograd.graph.saved_tensors_hooks`` and attributed to the stage
  that was running ('embed', 'block<i>', 'head'; the model announces them through ``on_stage``).
  A tensor counts its whole storage (a view keeps its base alive) once, in the first stage that
  saves it; parameters and buffers are not activations and are left out. Checkpointed regions
  show what checkpointing really keeps: their inputs (torch's non-reentrant checkpoint saves them
  through the same hooks), not their internals.

These are the measurements estimator/memory.py's static and activation terms are tested against
(tests/validate/test_memory.py), on CPU, exactly as the model runs on a GPU.
"""
from __future__ import annotations

from collections import defaultdict

import torch


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    st = t.untyped_storage()
    return (str(t.device), st.data_ptr())


def saved_activation_bytes(model, tokens: torch.Tensor, labels: torch.Tensor) -> dict[str, int]:
    """{stage: bytes saved for backward} for one forward of ``model(tokens, labels)`` (the graph is
    built, not run backward). Raises AttributeError when the model has no ``on_stage`` hook."""
    skip = {_storage_key(p) for p in model.parameters()} | {_storage_key(b) for b in model.buffers()}
    seen: set[tuple[str, int]] = set()
    by_stage: dict[str, int] = defaultdict(int)
    stage = ["outside"]

    def pack(t: torch.Tensor):
        key = _storage_key(t)
        if key not in skip and key not in seen:
            seen.add(key)
            by_stage[stage[0]] += t.untyped_storage().nbytes()
        return t

    prev = model.on_stage
    model.on_stage = lambda name: stage.__setitem__(0, name)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(tokens, labels)
    finally:
        model.on_stage = prev
    return dict(by_stage)


def state_bytes(model, opt) -> dict[str, int]:
    """Bytes of the model state on this rank after ``opt.step()`` (``opt`` a MasterAdamW): weights
    and gradients (the parameters' own dtype), master weights and master gradients (fp32 copies,
    only for low-precision parameters), moments (AdamW exp_avg and exp_avg_sq), and step counters
    (one scalar per parameter tensor)."""
    out = {"weights": 0, "grads": 0, "master": 0, "master_grads": 0, "moments": 0, "step_counters": 0}
    for p, m in zip(opt.params, opt.masters):
        out["weights"] += p.numel() * p.element_size()
        if p.grad is not None:
            out["grads"] += p.grad.numel() * p.grad.element_size()
        if m is not p:
            out["master"] += m.numel() * m.element_size()
            if m.grad is not None:
                out["master_grads"] += m.grad.numel() * m.grad.element_size()
        st = opt.opt.state.get(m, {})
        out["moments"] += sum(st[k].numel() * st[k].element_size() for k in ("exp_avg", "exp_avg_sq") if k in st)
        if "step" in st and torch.is_tensor(st["step"]):
            out["step_counters"] += st["step"].numel() * st["step"].element_size()
    return out


def measured_allocator_overhead(db_url: str | None, gpu_name: str) -> tuple[float, float, str] | None:
    """(allocator_fraction, context_bytes, source) from the allocator suite's OK rows measured on
    this GPU model (medians), None when there are none."""
    from sqlalchemy import select

    from scaleplan.bench.suites.allocator import overhead_from_rows
    from scaleplan.db import models as m
    from scaleplan.db.session import ensure_schema, session_scope

    ensure_schema(db_url)
    with session_scope(db_url) as s:
        q = (select(m.AllocatorPoint, m.BenchRun.id).join(m.BenchRun, m.BenchRun.id == m.AllocatorPoint.run_id)
             .where(m.BenchRun.gpu_name == gpu_name))
        got = s.execute(q).all()
        rows = [{"status": p.status, "allocator_fraction": p.allocator_fraction, "context_bytes": p.context_bytes}
                for p, _ in got]
        runs = sorted({rid for _, rid in got})
    out = overhead_from_rows(rows)
    return None if out is None else (*out, f"measured (allocator runs {','.join(map(str, runs))})")


def predict_reference_memory(spec, layout, device: str, overhead: tuple[float, float, str] | None = None) -> dict:
    """The memory model's prediction for the reference runner (DDP + MasterAdamW, one process per
    rank) of ``spec`` under ``layout`` (dp set): peak allocated (what torch.cuda.max_memory_allocated
    measures), reserved (+ the allocator term) and device total (+ context), in GB (1e9 bytes),
    with the categories. ``overhead``: measured (fraction, context bytes, source); else the
    documented defaults on CUDA, and none on a CPU (no caching allocator; RSS is measured there)."""
    import numpy as np

    from scaleplan.estimator import memory as mm
    from scaleplan.estimator.model_dims import geometry
    from scaleplan.estimator.layout import ParallelLayout
    from scaleplan.estimator.shapes import plan_shapes

    if overhead is None:
        overhead = ((mm.DEFAULT_ALLOCATOR_FRACTION, mm.DEFAULT_CONTEXT_BYTES, "default") if device == "cuda"
                    else (0.0, 0.0, "none on CPU"))
    frac, ctx, source = overhead
    dp = layout.dp or 1
    g, pl = geometry(spec.model), ParallelLayout.from_specs([layout], dp)
    sh = plan_shapes(g, pl, spec.data.seqlen, spec.data.gbs)
    mem = mm.memory_breakdown(g, pl, spec.data.gbs, spec.data.seqlen, "adamw", state=mm.REFERENCE_DDP,
                              allocator_fraction=frac, context_bytes=ctx, rope=spec.model.rotary_embeds, shapes=sh)
    alloc = float(mm.reference_peak_allocated(mem, sh.n_mb)[0])
    reserved = alloc * (1.0 + frac)
    gb = 1e9
    return {"allocated_gb": alloc / gb, "reserved_gb": reserved / gb, "device_gb": (reserved + ctx) / gb,
            "breakdown_gb": {k: float(np.asarray(v)[0]) / gb for k, v in mem.items()},
            "allocator_fraction": frac, "overhead_source": source}
