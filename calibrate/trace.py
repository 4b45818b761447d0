"""`scaleplan calibrate trace`: the dispatch law's inputs measured in a profiler trace of a training step.

The dispatch law (sec:iteration-time-model, "Compute versus dispatch"; :mod:`scaleplan.estimator.dispatch`)
says what the host spends to launch one micro-batch of one pipeline stage,
t_disp = L_stage kappa(E_loc) t_gap + n_moe [EP > 1] t_ep_host + t_host, kappa(E_loc) = kappa0 + kappa1 E_loc
kernels per layer and micro-batch in full-recompute units. Its counts were read off rank-0 profiler traces
of the paper's stack (two points); whether a cluster's step is host- or device-bound, and what its syncs
cost, is what held-out layouts turn on. This module measures those inputs in a trace of one rank:

* a **torch.profiler Chrome trace** (JSON, or .json.gz): what Megatron-LM writes with
  ``--profile --use-pytorch-profiler``, or any ``torch.profiler.profile(activities=[CPU, CUDA])`` export.
  Each ``ProfilerStep#N`` annotation is one step (no annotation: the whole trace is one);
* per step: the device **kernels** it launched (``kernel`` events, joined to their launch call by
  ``correlation``; memory copies and sets counted apart), the host's **launch calls**, the **device busy**
  seconds (the union of the step's kernel, copy and set intervals over every stream; the NCCL kernels'
  share apart, since they hold the device while they wait for peers), and the host's
  **blocking syncs** (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, ``cudaEventSynchronize``,
  synchronous ``cudaMemcpy``): their count, seconds, and where each was called (the innermost Python
  function or op of the same thread that encloses it: the token dispatcher's count read, the loss
  check's ``item``, the pipeline's batched p2p sync);
* **host busy** = step wall - blocked seconds: the time the host spent issuing work. Threads are taken to
  take turns (the forward on the main thread, the backward on autograd's), as they do in a training step;
* the step's two **overlap bounds** over its segments between blocking syncs (:func:`_segments`): the max
  of the summed host and device times, which is what the law's max(GPU, t_disp) assumes, and the sum of the
  per-segment maxes, which is what a step lasts when every sync drains the device before the host goes on.
  Where the wall sits between them says how much overlap the syncs leave.

Against the law in force for the same plan (:func:`compare`): kernels per layer-micro-batch measured
(the step's count over n_mb L_stage, in full-recompute units; it includes the embedding, loss and optimizer
kernels, so it bounds the per-layer count from above) against kappa(E_loc); host seconds per micro-batch
against t_disp; the t_gap that makes the law give the measured host time with the measured count; the
estimator's step time against the wall; the 1F1B schedule and the expert all-to-all of the traced stage
(:mod:`scaleplan.calibrate.trace_pipeline`: the first micro-batch's round trip in steady periods, the
exchanges between stages, the all-to-all kernels per MoE layer and the share of them hidden behind compute).
Across the traces of several ranks of one stage
(:func:`peer_waits`): how long their collectives wait for the last rank. :func:`fit_law` turns traces into a
'dispatch' calibration
(``--store``): kappa0, kappa1 from the counts (both with two or more E_loc, else kappa0 with kappa1 kept),
t_gap from the host seconds, host_scale 1 (the trace measured the host itself). Seconds throughout.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import statistics
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scaleplan.calibrate.trace_pipeline import schedules, summary
from scaleplan.errors import SpecError

#: host calls that launch device work (the kernels themselves are counted on the device side)
LAUNCH_PREFIXES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel", "cudaGraphLaunch")
#: host calls that block the calling thread until the device has caught up
SYNC_CALLS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"})
DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
HOST_CATS = frozenset({"cuda_runtime", "cuda_driver"})
#: events that can enclose a sync and name its caller (innermost wins)
CALLER_CATS = frozenset({"python_function", "cpu_op", "user_annotation"})
STEP_PREFIX = "ProfilerStep#"
TOP_CAUSES = 8


@dataclass
class TraceStep:
    """One profiled step of one rank (seconds; counts)."""

    wall_s: float
    kernels: int = 0             # device kernels launched in the step
    copies: int = 0              # device memory copies and sets
    launches: int = 0            # host launch calls
    device_busy_s: float = 0.0   # union of the step's device intervals, every stream
    syncs: int = 0               # blocking host syncs
    sync_s: float = 0.0          # seconds the host spent blocked in them
    causes: dict[str, list] = field(default_factory=dict)  # caller -> [count, seconds]
    nccl_s: float = 0.0     # union of its NCCL kernels' intervals (they occupy the device while they wait for peers)
    overlap_bound_s: float = 0.0  # max(sum host, sum device) over the segments between syncs (the law's max)
    serial_bound_s: float = 0.0   # sum over those segments of max(host, device): what the syncs allow
    number: int | None = None     # the N of ProfilerStep#N
    nccl_calls: list = field(default_factory=list)  # (kernel name, seconds) of each NCCL kernel, in issue order

    @property
    def host_busy_s(self) -> float:
        return max(self.wall_s - self.sync_s, 0.0)


@dataclass
class Trace:
    """A rank's trace: its steps and where it came from."""

    file: str
    sha256: str
    rank: int | None
    world_size: int | None
    steps: list[TraceStep]
    schedule: list = field(default_factory=list)  # per step: calibrate.trace_pipeline.Schedule

    def median(self, attr: str) -> float:
        return float(statistics.median(getattr(s, attr) for s in self.steps))

    def causes(self) -> list[dict[str, Any]]:
        """Sync callers over all steps, most seconds first, per step (count and seconds)."""
        tot: dict[str, list] = defaultdict(lambda: [0, 0.0])
        for s in self.steps:
            for k, (n, t) in s.causes.items():
                tot[k][0] += n
                tot[k][1] += t
        k = len(self.steps)
        rows = sorted(tot.items(), key=lambda kv: -kv[1][1])[:TOP_CAUSES]
        return [{"caller": c, "per_step": n / k, "seconds_per_step": t / k} for c, (n, t) in rows]


def _load(path: Path) -> tuple[list[dict], dict, bytes]:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise SpecError("TRACE", str(path), f"a readable file ({e.strerror})") from None
    try:  # a corrupt gzip stream raises BadGzipFile (an OSError), EOFError or zlib.error (not one)
        doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except Exception:
        raise SpecError("TRACE", str(path), "a torch.profiler Chrome trace (JSON, optionally gzip)") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise SpecError("TRACE", str(path), "a Chrome trace with a traceEvents list")
    num = (int, float)
    kept = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("ts"), num)
            and isinstance(e.get("dur", 0), num)]
    return kept, doc if isinstance(doc, dict) else {}, raw


def _windows(host: list[dict]) -> list[tuple[float, float, int | None]]:
    """[start, end) in us and the step number of each ProfilerStep annotation, else the whole host timeline
    (number None)."""
    steps = sorted((e["ts"], e["ts"] + e.get("dur", 0), _step_number(e["name"])) for e in host
                   if e.get("cat") in ("user_annotation", "cpu_op") and str(e.get("name", "")).startswith(STEP_PREFIX))
    if steps:
        return steps
    return [(min(e["ts"] for e in host), max(e["ts"] + e.get("dur", 0) for e in host), None)]


def _step_number(name: str) -> int | None:
    tail = name[len(STEP_PREFIX):]
    return int(tail) if tail.isdigit() else None


def _busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [a, b) intervals (us)."""
    total, end = 0.0, -np.inf
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


class _Callers:
    """The innermost caller-category event of a thread that encloses a time interval."""

    def __init__(self, events: list[dict]):
        by_tid: dict[Any, list] = defaultdict(list)
        for e in events:
            if e.get("cat") in CALLER_CATS and not str(e.get("name", "")).startswith(STEP_PREFIX):
                by_tid[(e.get("pid"), e.get("tid"))].append((e["ts"], e["ts"] + e.get("dur", 0), str(e["name"])))
        self.by_tid = {k: sorted(v) for k, v in by_tid.items()}
        self.starts = {k: [x[0] for x in v] for k, v in self.by_tid.items()}

    def of(self, e: dict, scan: int = 4000) -> str:
        key = (e.get("pid"), e.get("tid"))
        evs, starts = self.by_tid.get(key, []), self.starts.get(key, [])
        a, b = e["ts"], e["ts"] + e.get("dur", 0)
        i = bisect_right(starts, a) - 1
        for j in range(i, max(i - scan, -1), -1):
            if evs[j][1] >= b:  # the latest-starting enclosing event: nesting makes it the innermost
                return evs[j][2][:100]
        return "(no enclosing op: an explicit synchronize)"


def _segments(window: tuple[float, float], syncs: list[tuple[float, float]],
              dev: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(max of sums, sum of maxes) in us over the step's segments between blocking syncs: per segment the
    host's busy time (its wall less the wait that closes it) and the device time of the work launched in it
    (``dev``: (launch ts, start, end)). A step whose syncs let host and device overlap throughout lasts the
    max of the sums (the dispatch law's max(GPU, t_disp)); one whose every segment drains the device before
    the host issues more lasts the sum of the per-segment maxes."""
    a, b = window
    cuts = sorted((ts + dur, dur) for ts, dur in syncs)
    bounds = [a] + [c for c, _ in cuts] + [b]
    waits = [w for _, w in cuts] + [0.0]
    by_seg: list[list] = [[] for _ in waits]
    ends = bounds[1:-1]
    for launch, start, end in dev:
        by_seg[bisect_right(ends, launch)].append((start, end))
    h = [max(bounds[j + 1] - bounds[j] - waits[j], 0.0) for j in range(len(waits))]
    d = [_busy_us(iv) for iv in by_seg]
    return max(sum(h), sum(d)), sum(max(x, y) for x, y in zip(h, d))


class _Steps:
    """The steps of a trace being read: which step a host time falls in, and what each step gathered (device
    intervals with their launch time, NCCL intervals, blocking syncs), in us."""

    def __init__(self, windows: list[tuple[float, float, int | None]]):
        self.windows = windows
        self.starts = [w[0] for w in windows]
        self.steps = [TraceStep(b - a, number=n) for a, b, n in windows]
        self.busy: list[list] = [[] for _ in windows]
        self.comm: list[list] = [[] for _ in windows]
        self.syncs: list[list] = [[] for _ in windows]

    def of(self, ts: float) -> int | None:
        i = bisect_right(self.starts, ts) - 1
        return i if i >= 0 and ts < self.windows[i][1] else None

    def add_device(self, dev: list[dict], launch_at: dict) -> None:
        """Each device event to the step its launch call fell in (its own start without one)."""
        for e in dev:
            launch = launch_at.get((e.get("args") or {}).get("correlation"), e["ts"])
            k = self.of(launch)
            if k is None:
                continue
            iv = (e["ts"], e["ts"] + e.get("dur", 0))
            self.busy[k].append((launch, *iv))
            if str(e.get("name", "")).startswith("nccl"):
                self.comm[k].append(iv)
                self.steps[k].nccl_calls.append((launch, str(e["name"]), e.get("dur", 0) * 1e-6))
            if e["cat"] == "kernel":
                self.steps[k].kernels += 1
            else:
                self.steps[k].copies += 1

    def add_host(self, host: list[dict]) -> None:
        """Launch calls counted; blocking syncs kept with their callers."""
        callers = _Callers(host)
        for e in host:
            k = self.of(e["ts"]) if e.get("cat") in HOST_CATS else None
            if k is None:
                continue
            name = str(e.get("name", ""))
            if name.startswith(LAUNCH_PREFIXES):
                self.steps[k].launches += 1
            elif name in SYNC_CALLS:
                c = self.steps[k].causes.setdefault(callers.of(e), [0, 0.0])
                c[0] += 1
                c[1] += e.get("dur", 0) * 1e-6
                self.syncs[k].append((e["ts"], e.get("dur", 0)))

    def finish(self) -> list[TraceStep]:
        """The steps that launched device work, with their times in seconds."""
        for s, w, iv, sy, cm in zip(self.steps, self.windows, self.busy, self.syncs, self.comm):
            s.wall_s *= 1e-6
            s.device_busy_s = _busy_us([(x, y) for _, x, y in iv]) * 1e-6
            s.nccl_s = _busy_us(cm) * 1e-6
            s.nccl_calls = [(name, dur) for _, name, dur in sorted(s.nccl_calls)]  # in launch (issue) order
            s.syncs, s.sync_s = len(sy), sum(dur for _, dur in sy) * 1e-6
            s.overlap_bound_s, s.serial_bound_s = (x * 1e-6 for x in _segments(w[:2], sy, iv))
        return [s for s in self.steps if s.kernels]


def read_trace(path: str | Path) -> Trace:
    """The steps of one rank's trace (module docstring). Raises SpecError (one line) on a file that is not
    a Chrome trace, or one with no device kernels (a CPU-only trace: nothing for the law to count)."""
    p = Path(path)
    events, doc, raw = _load(p)
    host = [e for e in events if e.get("cat") not in DEVICE_CATS | {"gpu_user_annotation"}]
    dev = [e for e in events if e.get("cat") in DEVICE_CATS]
    if not any(e.get("cat") == "kernel" for e in dev):
        raise SpecError("TRACE", p.name, "a trace with CUDA activity (device kernels): this one has none")
    if not host:
        raise SpecError("TRACE", p.name, "a trace with host activity (CPU ops and CUDA runtime calls) as well")
    st = _Steps(_windows(host))
    launches = {e["args"]["correlation"]: e for e in host
                if e.get("cat") in HOST_CATS and "correlation" in (e.get("args") or {})}
    st.add_device(dev, {c: e["ts"] for c, e in launches.items()})
    st.add_host(host)
    kept = [w for w, k in zip(st.windows, st.steps) if k.kernels]  # the windows of the steps finish() keeps
    steps = st.finish()
    if not steps:
        raise SpecError("TRACE", p.name, "device kernels launched inside a profiled step (ProfilerStep#N)")
    dist = doc.get("distributedInfo") or {}
    return Trace(p.name, hashlib.sha256(raw).hexdigest(), dist.get("rank"), dist.get("world_size"), steps,
                 schedules(host, dev, kept, launches))


def peer_waits(traces: list[Trace]) -> dict[str, Any]:
    """How long each rank's collectives wait for their peers, from the traces of several ranks that run the
    same program (one pipeline stage: each issues the same collectives in the same order). Clock-free: the
    k-th NCCL kernel of a name in a step is the same collective on every rank, the one that started it last
    waited least, so its duration there stands for the transfer and each rank's excess over it for its wait
    (a lower bound: the last rank's own wait counts as 0). This is the input of the coupled-delay check
    (estimator/jitter_ep.py: per-rank delays that every MoE layer's all-to-all makes the group wait for).

    Returns seconds per step and rank: ``wait_s`` (the excesses summed), ``nccl_s`` (NCCL kernel time), and per
    kernel name its calls per step, mean and 90th-percentile excess per call; ``steps`` matched by
    ProfilerStep number, ``unmatched`` calls (a name called more often on some ranks). Raises SpecError
    with fewer than two traces or no step number common to all."""
    if len(traces) < 2:
        raise SpecError("TRACE", len(traces), "traces of two or more ranks to compare their collectives")
    numbers = set.intersection(*({s.number for s in t.steps} for t in traces))
    if not numbers:
        raise SpecError("TRACE", ", ".join(t.file for t in traces), "traces with a ProfilerStep number in common")
    excess: dict[str, list] = defaultdict(list)
    wait, nccl, unmatched = 0.0, 0.0, 0
    for n in sorted(numbers, key=lambda x: (x is None, x)):
        seqs = [next(s for s in t.steps if s.number == n).nccl_calls for t in traces]
        nccl += float(np.mean([sum(d for _, d in q) for q in seqs]))
        for name in sorted({nm for q in seqs for nm, _ in q}):
            per_rank = [[d for nm, d in q if nm == name] for q in seqs]
            m = min(len(x) for x in per_rank)
            unmatched += sum(len(x) - m for x in per_rank)
            if m == 0:
                continue
            d = np.array([x[:m] for x in per_rank])  # ranks x calls
            e = d - d.min(axis=0)
            excess[name].extend(e.mean(axis=0).tolist())
            wait += float(e.mean(axis=0).sum())
    k = len(numbers)
    kinds = [{"kernel": name, "calls_per_step": len(v) / k, "mean_wait_s": float(np.mean(v)),
              "p90_wait_s": float(np.percentile(v, 90))} for name, v in excess.items()]
    return {"ranks": [t.rank for t in traces], "files": [t.file for t in traces], "steps": k,
            "wait_s": wait / k, "nccl_s": nccl / k, "unmatched": unmatched,
            "by_kernel": sorted(kinds, key=lambda r: -r["calls_per_step"] * r["mean_wait_s"])}


def group_waits(traces: list[Trace], rows: list[dict], runs: list) -> list[dict[str, Any]]:
    """:func:`peer_waits` of each group of two or more traces of one run (``runs``: a key per trace, the log
    it was paired with) at one pipeline stage (``rows``: their :func:`compare` rows); a group whose steps do
    not match carries a ``note`` instead."""
    groups: dict[tuple, list] = defaultdict(list)
    for t, r, run in zip(traces, rows, runs):
        groups[(str(run), r["stage"])].append(t)
    out = []
    for (_, stage), g in groups.items():
        if len(g) < 2:
            continue
        try:
            out.append({"stage": stage, **peer_waits(g)})
        except SpecError as e:
            out.append({"stage": stage, "files": [t.file for t in g], "note": str(e)})
    return out


def stage_of(trace: Trace, layout: dict, stage: int | None = None) -> tuple[int, str]:
    """The pipeline stage the traced rank runs, and how it was found: ``stage`` when given, else the trace's
    rank in Megatron-Core's default rank order tp-cp-ep-dp-pp (pipeline outermost: rank // (TP CP DP))."""
    pp = int(layout["pp"])
    if stage is not None:
        if not 0 <= stage < pp:
            raise SpecError("--stage", stage, f"a pipeline stage in 0..{pp - 1}")
        return stage, "given"
    if trace.rank is None:
        return 0, "the trace names no rank: stage 0 assumed"
    s = int(trace.rank) // (int(layout["tp"]) * int(layout["cp"]) * int(layout["dp"])) % pp
    return s, f"rank {trace.rank} in Megatron-Core's tp-cp-ep-dp-pp order"


def compare(trace: Trace, spec, layout: dict, n_devices: int, est, stage: int | None = None) -> dict[str, Any]:
    """The trace's medians beside the dispatch law in force (``est``: an Estimator on the run's profile) for
    the traced stage of the plan ``layout`` (Layout fields) of ``spec`` on ``n_devices``. Seconds; kernels
    per layer and micro-batch in full-recompute units. Keys: module docstring and the CLI's output."""
    from scaleplan.estimator.ckpt import CkptMode, full_recompute_units
    from scaleplan.estimator.dispatch import dispatch_time
    from scaleplan.estimator.layout import ParallelLayout
    from scaleplan.estimator.model_dims import geometry
    from scaleplan.estimator.shapes import layout_shapes, stage_counts

    from scaleplan.specs import Layout

    g = geometry(spec.model)
    lay = ParallelLayout.from_specs([Layout(**layout)], n_devices)
    s, how = stage_of(trace, layout, stage)
    st = stage_counts(g, lay, s)
    L, n_moe, ep = float(st.n_layers[0]), float(st.n_moe[0]), int(layout["ep"])
    one = layout_shapes(spec.model, Layout(**layout), spec.data.seqlen, spec.data.gbs, n_devices)
    n_mb = one.n_mb
    # the law's kappa(E_loc) counts the kernels of the E / EP local experts a rank launches (each runs its
    # 1/ETP share of the expert's GEMMs: ETP does not change their number)
    e_loc = one.E_loc if g.is_moe else 0.0
    codes, eps = np.array([CkptMode.parse(layout["ckpt"]).value]), np.array([ep])
    u = float(full_recompute_units(codes)[0])
    law = est.dispatch
    kernels, host = trace.median("kernels"), trace.median("host_busy_s")
    kappa = kernels / (n_mb * L * u)
    fixed = float(dispatch_time(law, 0.0, e_loc, codes, n_moe, eps)[0])  # the law without its layers' kernels
    pred = est.estimate(spec, n_devices, [Layout(**layout)])[0]
    return {
        "file": trace.file, "sha256": trace.sha256, "steps": len(trace.steps), "stage": s, "stage_from": how,
        "n_mb": n_mb, "L_stage": L, "n_moe_stage": n_moe, "E_loc": e_loc, "ckpt": layout["ckpt"], "kernel_units": u,
        "wall_s": trace.median("wall_s"), "predicted_t_iter_s": pred.t_iter_s,
        "kernels": kernels, "copies": trace.median("copies"), "launches": trace.median("launches"),
        "device_busy_s": trace.median("device_busy_s"), "nccl_s": trace.median("nccl_s"), "host_busy_s": host,
        "syncs": trace.median("syncs"), "sync_s": trace.median("sync_s"), "sync_callers": trace.causes(),
        "overlap_bound_s": trace.median("overlap_bound_s"), "serial_bound_s": trace.median("serial_bound_s"),
        "kappa_measured": kappa, "kappa_law": law.kappa(e_loc),
        "host_per_mb_s": host / n_mb,
        "t_disp_law_s": float(dispatch_time(law, L, e_loc, codes, n_moe, eps)[0]),
        "t_gap_law_s": law.t_gap_s, "t_gap_implied_s": (host / n_mb - fixed) / (L * kappa * u),
        "law_fixed_per_mb_s": fixed, "law_source": law.source,
        "pipeline": summary(trace.schedule, int(layout["pp"]), s, n_mb, n_moe),
    }


def fit_law(rows: list[dict], kappa1_prior: float) -> tuple[dict[str, float], list[str]]:
    """kappa0, kappa1, t_gap_s of a 'dispatch' calibration from :func:`compare` rows (kernel counts per
    layer-micro-batch at each E_loc; each row's implied t_gap recomputed on the fitted kappa). Two or more
    distinct E_loc fit both kappa terms (least squares), one keeps ``kappa1_prior``. Raises SpecError when the
    counts fall with E_loc (kappa1 < 0: not the law's shape), leave kappa0 < 0, or the host time is all in
    the fixed terms."""
    e = np.array([r["E_loc"] for r in rows])
    k = np.array([r["kappa_measured"] for r in rows])
    notes = []
    if len(set(e.tolist())) >= 2:
        kappa1, kappa0 = (float(x) for x in np.polyfit(e, k, 1))
        if kappa1 < 0:
            raise SpecError("TRACE", ", ".join(r["file"] for r in rows),
                            f"kernel counts that grow with E_loc (they fall: kappa1 = {kappa1:.3g})")
    else:
        kappa1 = float(kappa1_prior)
        kappa0 = float(np.mean(k - kappa1 * e))
        notes.append(f"one E_loc ({e[0]:g}): kappa1 = {kappa1:g} kept from the law in force")
    if kappa0 < 0:
        raise SpecError("TRACE", ", ".join(r["file"] for r in rows),
                        f"kernel counts above kappa1 E_loc (they leave kappa0 = {kappa0:.3g} < 0)")
    gaps = [(r["host_per_mb_s"] - r["law_fixed_per_mb_s"])
            / (r["L_stage"] * (kappa0 + kappa1 * r["E_loc"]) * r["kernel_units"]) for r in rows]
    t_gap = float(np.median(gaps))
    if not t_gap > 0:
        raise SpecError("TRACE", ", ".join(r["file"] for r in rows),
                        "host time beyond the law's fixed per-micro-batch terms (t_ep_host, t_host); "
                        f"the traces leave t_gap = {t_gap:.3g} s")
    return {"kappa0": kappa0, "kappa1": kappa1, "t_gap_s": t_gap}, notes


def store_law(url: str | None, profile: str, rows: list[dict], law, stack: str = "megatron") -> dict[str, Any]:
    """Fit (:func:`fit_law`) and store a new 'dispatch' version of ``profile``: kappa0, kappa1, t_gap_s from
    the traces, the law's non-kernel host terms as they were in force (``law``, scales applied) and the
    host scales at 1 (the traces measured the host); what else the previous row carried (kernel_scale, the
    chain gap) stays. It stores no step-time residuals: the errors of a new law are not known until runs are
    compared under it (`calibrate report`), so `search --samples` falls back to its default sigma until then.
    ``stack``: the traced runs' training stack (a Stack.key): the row is that stack's, and its kappa counts
    that stack's kernels (``kappa_from_traces`` 1: estimator.dispatch.law_in_force)."""
    from scaleplan.calibrate.writers import keys_not_in, write_dispatch

    from scaleplan.db import session as dbs

    fitted, notes = fit_law(rows, law.kappa1)
    coeffs = {**fitted, "t_ep_host_s": law.t_ep_host_s, "t_host_s": law.t_host_s, "host_scale": 1.0,
              "ep_host_scale": 1.0, "kappa_from_traces": 1.0}
    host_err = [((r["L_stage"] * (fitted["kappa0"] + fitted["kappa1"] * r["E_loc"]) * r["kernel_units"]
                  * fitted["t_gap_s"] + r["law_fixed_per_mb_s"]) / r["host_per_mb_s"] - 1) for r in rows]
    inputs = {"traces": [{"file": r["file"], "sha256": r["sha256"], "E_loc": r["E_loc"],
                          "kappa_measured": r["kappa_measured"], "host_per_mb_s": r["host_per_mb_s"]} for r in rows],
              "host_time_rel_err": host_err}
    dbs.ensure_schema(url)
    with dbs.session_scope(url) as s:
        row = write_dispatch(s, profile, coeffs, keep=keys_not_in(coeffs), stack=stack, inputs=inputs, residuals=[],
                             cv_error=None, n_obs=len(rows), notes="; ".join(["from profiler traces", *notes]))
        cid, version, stored = row.id, row.version, dict(row.coefficients)
    return {"calibration_id": cid, "version": version, "profile": profile, "coefficients": stored,
            "fitted": sorted(fitted), "host_time_rel_err": host_err, "notes": notes}
