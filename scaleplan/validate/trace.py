"""`scaleplan validate --trace`: where a measured step's time goes, per estimator component.

A few extra training steps after the timed ones run under ``torch.profiler`` (CPU activity, plus
CUDA on a GPU) on rank 0; the trace is saved as Chrome-trace JSON (``*.pt.trace.json``: open it in
https://ui.perfetto.dev or ``tensorboard --logdir DIR``), and its events are attributed to the
components below, printed beside the estimator's prediction for the same components.

Attribution. Every profiled op event is given a *region* from the model's ``sp::<region>``
``record_function`` scopes (scaleplan.reference.model, switched on only while tracing): its own
ancestor scope, else, for autograd backward work, the scope of the forward op that created the
backward node (same ``sequence_nr``). Its time is then attributed by the first matching rule of
:data:`RULES`, which match CPU op names (``aten::mm``) and CUDA kernel names (``sm90_xmma_gemm_*``,
``ncclDevKernel_*``, ``flash_fwd_*``) alike. Time:
  * on CPU: each op's self CPU time (its children excluded, so nothing counts twice); view-like ops
    that move no data (:data:`HOST_ONLY_OPS`) count as host time;
  * on CUDA: each op's self device time (kernels it launched); device work no op holds is
    classified by kernel name alone (NCCL kernels launched by the communication threads); the
    profiler's mirror of each record_function scope on the GPU timeline is not device work.
``host gaps/idle`` = step wall time minus everything attributed: Python, dispatch, autograd-engine
work between ops, and on a GPU the device's idle time.

Predicted components from the estimator's ``breakdown_s`` (:data:`PREDICTED_PARTS`): attention = sdpa;
dense GEMMs = attn_proj + dense_mlp + shared_expert; expert GEMMs = experts; router/permute = router
+ permute; element-wise = elementwise + framework_kernels; LM head + CE = vocab; collectives =
ep_a2a + tp_comm + cp_comm + pp_p2p + dp_comm + bias_sync; optimizer; host gaps/idle =
dispatch_floor + bubble.
"""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

COMPONENTS = ("attention", "dense GEMMs", "expert GEMMs", "router/permute", "element-wise", "LM head + CE",
              "collectives", "optimizer", "host gaps/idle")
PREDICTED_PARTS = {
    "attention": ("sdpa",), "dense GEMMs": ("attn_proj", "dense_mlp", "shared_expert"),
    "expert GEMMs": ("experts",), "router/permute": ("router", "permute"),
    "element-wise": ("elementwise", "framework_kernels"), "LM head + CE": ("vocab",),
    "collectives": ("ep_a2a", "tp_comm", "cp_comm", "pp_p2p", "dp_comm", "bias_sync"),
    "optimizer": ("optimizer",), "host gaps/idle": ("dispatch_floor", "bubble"),
}
_GEMM = r"aten::(mm|addmm|bmm|baddbmm|matmul|linear)$|gemm|cublas|cutlass|xmma|nvjet|s\d+gemm"
_ROUTING = r"topk|argsort|aten::sort|bincount|index_?(add|select|copy|put)|aten::index$|indexing|scatter|gather|" \
           r"repeat_interleave|cumsum|radix|sortpairs"
# (component, name pattern or None, regions or None): first match wins; None matches anything
RULES: tuple[tuple[str, str | None, tuple[str, ...] | None], ...] = (
    ("collectives", (r"nccl|gloo|c10d::|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|"
                     r"record_param_comms|send|recv"), None),
    ("optimizer", None, ("optimizer",)),
    ("optimizer", r"adam|_foreach_|multi_tensor_apply", None),
    ("attention", (r"scaled_dot_product|flash_attention|flash_fwd|flash_bwd|fmha|efficient_attention|"
                   r"cudnn.*(sdpa|attention|attn)"), None),
    ("expert GEMMs", r"grouped_mm|grouped_gemm|groupedgemm", None),
    ("LM head + CE", _GEMM, ("head",)),
    ("expert GEMMs", _GEMM, ("experts",)),
    ("router/permute", _GEMM, ("router",)),
    ("dense GEMMs", _GEMM, None),
    ("LM head + CE", r"log_softmax|nll_loss|cross_entropy|softmax", ("head",)),
    ("router/permute", None, ("router", "bias_update")),
    ("router/permute", _ROUTING, None),
    ("element-wise", None, None),
)
_COMPILED = tuple((c, re.compile(p, re.IGNORECASE) if p else None, r) for c, p, r in RULES)
HOST_ONLY_OPS = frozenset(f"aten::{n}" for n in (
    "view", "reshape", "_reshape_alias", "t", "transpose", "as_strided", "expand", "expand_as", "slice", "select",
    "narrow", "unsqueeze", "squeeze", "split", "split_with_sizes", "chunk", "empty", "empty_like", "empty_strided",
    "resolve_conj", "resolve_neg", "_unsafe_view", "detach", "alias", "permute", "unbind", "lift_fresh", "result_type",
    "resize_", "is_nonzero", "item", "_local_scalar_dense", "size", "stride", "contiguous", "numpy_T"))
SCOPE_PREFIX = "sp::"


def classify(name: str, region: str | None) -> str:
    """The component of an op or kernel ``name`` run inside ``region`` (first matching rule)."""
    for comp, pat, regions in _COMPILED:
        if (pat is None or pat.search(name)) and (regions is None or region in regions):
            return comp
    return "element-wise"


def _scope_of(evt) -> str | None:
    e = evt
    while e is not None:
        if e.name.startswith(SCOPE_PREFIX):
            return e.name[len(SCOPE_PREFIX):]
        e = e.cpu_parent
    return None


def _root_evaluate_function(evt):
    e = evt
    while e is not None:
        if e.name.startswith("autograd::engine::evaluate_function"):
            return e
        e = e.cpu_parent
    return None


def _device_annotation(evt) -> bool:
    """A record_function scope mirrored on the GPU timeline (``gpu_user_annotation``: ``sp::router``,
    ``ProfilerStep#n``): it spans the kernels inside it, which are counted themselves. Counted as device
    work it charged each scope's whole span again (on an H200, element-wise 0.51 s of a 0.63 s step)."""
    return bool(getattr(evt, "is_user_annotation", False)) or evt.name.startswith((SCOPE_PREFIX, "ProfilerStep"))


def _unclaimed_device_s(events) -> dict[str, float]:
    """Seconds per kernel name of the device work that no CPU op's ``kernels`` holds (kernels the profiler
    linked to their launching op are counted through that op's self device time). Per name: every device
    event's duration minus the durations CPU ops hold under that name. Not by ``linked_correlation_id``:
    FunctionEvent has no such field in torch 2.11, so every kernel of an H200 trace read as unlinked and
    was counted a second time (the grouped GEMM kernel as a dense GEMM beside aten::_grouped_mm)."""
    held: dict[str, float] = defaultdict(float)
    ran: dict[str, float] = defaultdict(float)
    for e in events:
        if "cuda" in str(getattr(e, "device_type", "")).lower():
            if not _device_annotation(e):
                ran[e.name] += e.time_range.elapsed_us()
        else:
            for k in getattr(e, "kernels", ()) or ():
                held[k.name] += k.duration
    return {n: (t - held.get(n, 0.0)) * 1e-6 for n, t in ran.items() if t - held.get(n, 0.0) > 1e-3}


def attribute(events, wall_s: float, device: str, steps: int = 1) -> dict[str, Any]:
    """Seconds per component and step from profiler ``events`` (FunctionEvents of ``steps`` steps
    whose summed wall time is ``wall_s``). Returns {"components_s": {...}, "top_ops": {component:
    [(name, seconds)]}, "ops": [(component, name, seconds, calls)] for every op with time, seconds and
    calls per step (None for device work no CPU op launched), slowest first, "regions_found": sorted
    regions}. ``ops`` gives each op's seconds per call (what a rate per op, e.g. of the index kernels,
    is read from)."""
    cuda = device == "cuda"
    fwd_region: dict[int, str] = {}
    for e in events:  # forward ops: the scope that encloses the op that created each autograd node
        if e.sequence_nr >= 0 and not e.name.startswith("autograd::"):
            r = _scope_of(e)
            if r is not None:
                fwd_region.setdefault(e.sequence_nr, r)
    comp_s: dict[str, float] = defaultdict(float)
    by_op: dict[tuple[str, str], float] = defaultdict(float)
    calls: dict[tuple[str, str], int] = defaultdict(int)
    regions = set()
    claimed = 0.0
    for e in events:
        if e.name.startswith(SCOPE_PREFIX) or e.name.startswith("autograd::engine::evaluate_function") \
                or e.name.startswith("ProfilerStep"):
            continue  # wrappers: their self time is host work between ops
        dev_type = str(getattr(e, "device_type", "")).lower()
        if "cuda" in dev_type:
            continue  # kernels are read from their launching op (self device time) or below
        region = _scope_of(e)
        if region is None:
            root = _root_evaluate_function(e)
            region = fwd_region.get(root.sequence_nr) if root is not None else None
        if region is not None:
            regions.add(region)
        t = (e.self_device_time_total if cuda else e.self_cpu_time_total) * 1e-6
        if t <= 0 or (not cuda and e.name in HOST_ONLY_OPS):
            continue
        comp = classify(e.name, region)
        comp_s[comp] += t
        by_op[(comp, e.name)] += t
        calls[(comp, e.name)] += 1
        claimed += t
    if cuda:  # device work no CPU op launched (e.g. NCCL kernels): by kernel name
        for name, t in _unclaimed_device_s(events).items():
            comp = classify(name, None)
            comp_s[comp] += t
            by_op[(comp, name)] += t
            claimed += t
    comp_s["host gaps/idle"] += max(wall_s - claimed, 0.0)
    out = {c: comp_s.get(c, 0.0) / steps for c in COMPONENTS}
    top: dict[str, list] = defaultdict(list)
    for (c, n), t in sorted(by_op.items(), key=lambda kv: -kv[1]):
        if len(top[c]) < 5:
            top[c].append([n, t / steps])
    # calls None: device work no CPU op launched (its kernels are counted by name, not by launch)
    ops = [[c, n, t / steps, calls[(c, n)] / steps if (c, n) in calls else None]
           for (c, n), t in sorted(by_op.items(), key=lambda kv: -kv[1])]
    return {"components_s": out, "top_ops": dict(top), "ops": ops, "regions_found": sorted(regions)}


def predicted_components(breakdown_s: dict[str, float] | None) -> dict[str, float] | None:
    """The estimator's per-step breakdown summed into :data:`COMPONENTS` (None without a prediction)."""
    if not breakdown_s:
        return None
    return {c: sum(float(breakdown_s.get(p, 0.0)) for p in parts) for c, parts in PREDICTED_PARTS.items()}


def component_table(measured: dict[str, float], predicted: dict[str, float] | None) -> list[dict]:
    """Rows {component, measured_s, predicted_s, error} (error = (pred - meas) / meas)."""
    rows = []
    for c in COMPONENTS:
        m = measured.get(c, 0.0)
        p = None if predicted is None else predicted.get(c, 0.0)
        rows.append({"component": c, "measured_s": m, "predicted_s": p,
                     "error": None if p is None or m <= 0 else (p - m) / m})
    return rows


DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")  # device work in a Chrome trace (not gpu_user_annotation)
_LAUNCH = re.compile(r"^cu(da)?LaunchKernel", re.IGNORECASE)


def chrome_totals(path: str | Path, steps: int) -> dict[str, float]:
    """Per step, what the saved Chrome trace itself holds (a second reading, independent of
    :func:`attribute`'s FunctionEvents): ``kernels`` (events of category ``kernel``), ``launches``
    (``cudaLaunchKernel``/``cuLaunchKernel*`` runtime or driver calls), ``device_s`` (seconds of kernel,
    memcpy and memset events; record_function mirrors excluded) and ``busy_s`` (their union on the
    timeline: device_s minus overlaps). ``steps`` traced steps are in the file. On a CPU trace all are 0.
    The attributed device time of a step (every component but host gaps/idle) should equal device_s:
    twice it is the double counting an H200 trace once showed."""
    import json

    with open(path) as f:
        events = json.load(f).get("traceEvents", [])
    spans, kernels, launches = [], 0, 0
    for e in events:
        cat = e.get("cat")
        if cat in DEVICE_CATS and e.get("ph") == "X":
            spans.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))))
            kernels += cat == "kernel"
        elif cat in ("cuda_runtime", "cuda_driver") and _LAUNCH.match(str(e.get("name", ""))):
            launches += 1
    busy, end = 0.0, float("-inf")
    for t0, t1 in sorted(spans):  # union of the intervals (us)
        busy += max(0.0, t1 - max(t0, end))
        end = max(end, t1)
    n = max(int(steps), 1)
    return {"kernels": kernels / n, "launches": launches / n,
            "device_s": sum(t1 - t0 for t0, t1 in spans) * 1e-6 / n, "busy_s": busy * 1e-6 / n}


def trace_file(trace_dir: str | Path, tag: str) -> Path:
    """Where a layout's trace goes: DIR/<tag>/rank0.pt.trace.json (TensorBoard reads DIR/<tag>/)."""
    d = Path(trace_dir) / tag
    d.mkdir(parents=True, exist_ok=True)
    return d / "rank0.pt.trace.json"
