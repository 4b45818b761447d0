"""What one pipeline rank's profiler trace says about its 1F1B schedule and its expert all-to-all.

The 18B sweep turns on two costs its step times cannot place (docs/accuracy.md): how long the fill and
drain slots of a deep pipeline last, and whether an expert group's all-to-all across nodes runs between
compute kernels, as Megatron-Core's alltoall token dispatcher issues it, or beside them. A trace of one
rank (``--profile --use-pytorch-profiler`` with Python stacks, as Megatron-LM records them) measures both:

* **the round trip of the first micro-batch.** On stage s the schedule (``forward_step`` /
  ``backward_step`` of megatron/core/pipeline_parallel/schedules.py, the outermost calls of those names)
  runs PP - s - 1 warm-up forwards, then 1F1B. Its first backward starts when the first micro-batch has
  run its forward here (f), crossed the PP - s - 2 stages between here and the last one forward and back,
  and run forward and backward on the last stage. In units of the rank's steady 1F1B period p (the
  spacing of the forwards that follow a backward, which the pacing stage sets) that round trip is
  PP - s - 1 + f / p when every fill and drain hop lasts a pacing period (the paper's eq:bubble with the LM
  head in t_block), and (PP - s - 2) q / p + 1 + f / p when the hops run at the other stages' own periods
  q < p (a 1F1B schedule with fixed op times: :mod:`scaleplan.estimator.exchanges`).
* **the exchanges between stages**: every p2p call of the schedule (send/recv forward/backward, the
  batched isend/irecv followed by a device synchronize) with its host wall: the wait for the peer, the
  transfer, the drain. The median against the tail says whether cross-node stalls desynchronise the pipeline.
* **the all-to-all**: the NCCL kernels launched inside the token dispatcher (``token_dispatch``,
  ``token_combine``) or an all-to-all op, counted per MoE layer and micro-batch (the dispatcher issues
  three per pass: the tokens and the routing probabilities in the dispatch, the tokens in the combine;
  full recompute runs the forward twice), with their device seconds and the share of them during which a
  compute kernel ran on another stream (0 for a serial exchange but for the shared expert it overlaps).

Seconds throughout; one :class:`Schedule` per profiled step.
"""
from __future__ import annotations

import statistics
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

FORWARD, BACKWARD = "forward_step", "backward_step"
P2P_CALLS = frozenset({"recv_forward", "send_forward", "recv_backward", "send_backward",
                       "send_forward_recv_backward", "send_backward_recv_forward"})
A2A_MARKS = ("token_dispatch", "token_combine", "all_to_all", "alltoall")
CALLER_CATS = frozenset({"python_function", "cpu_op", "user_annotation"})


@dataclass
class Schedule:
    """One profiled step of one rank: the schedule's passes (start, end, s from the step's start), its p2p
    calls' durations, and the all-to-all kernels (count, device seconds, seconds beside a compute kernel)."""

    forwards: list[tuple[float, float]] = field(default_factory=list)
    backwards: list[tuple[float, float]] = field(default_factory=list)
    exchanges: list[float] = field(default_factory=list)
    a2a_calls: int = 0
    a2a_s: float = 0.0
    a2a_hidden_s: float = 0.0


def function(name: str) -> str:
    """The function of a python_function event ("path/file.py(123): name" -> "name")."""
    return str(name).rsplit(": ", 1)[-1].strip()


def _outermost(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intervals not inside an earlier one (a user's forward_step nests inside the schedule's)."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(iv):
        if not out or a >= out[-1][1]:
            out.append((a, b))
    return out


def _union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of union(a) intersected with union(b)."""
    ua, ub, tot, j = _union(a), _union(b), 0.0, 0
    for x0, x1 in ua:
        while j < len(ub) and ub[j][1] <= x0:
            j += 1
        k = j
        while k < len(ub) and ub[k][0] < x1:
            tot += max(0.0, min(x1, ub[k][1]) - max(x0, ub[k][0]))
            k += 1
    return tot


class _Marked:
    """Whether a host time on a thread falls inside an event whose name carries one of ``marks``."""

    def __init__(self, host: list[dict], marks: tuple[str, ...]):
        by: dict[Any, list] = defaultdict(list)
        for e in host:
            if e.get("cat") in CALLER_CATS and any(m in str(e.get("name", "")) for m in marks):
                by[(e.get("pid"), e.get("tid"))].append((e["ts"], e["ts"] + e.get("dur", 0)))
        self.starts, self.reach = {}, {}
        for k, iv in by.items():
            iv.sort()
            reach, hi = [], float("-inf")
            for _, b in iv:
                hi = max(hi, b)
                reach.append(hi)
            self.starts[k], self.reach[k] = [a for a, _ in iv], reach

    def __call__(self, e: dict) -> bool:
        key = (e.get("pid"), e.get("tid"))
        i = bisect_right(self.starts.get(key, []), e["ts"]) - 1
        return i >= 0 and self.reach[key][i] >= e["ts"] + e.get("dur", 0)


def schedules(host: list[dict], dev: list[dict], windows: list[tuple], launches: dict) -> list[Schedule]:
    """One :class:`Schedule` per step window (us in, s out). ``launches``: correlation -> the launch call."""
    out = []
    in_a2a = _Marked(host, A2A_MARKS)
    for a, b, *_ in windows:
        sc = Schedule()
        calls: dict[str, list] = defaultdict(list)
        for e in host:
            if e.get("cat") == "python_function" and a <= e["ts"] < b:
                calls[function(e["name"])].append((e["ts"], e["ts"] + e.get("dur", 0)))
        sc.forwards = [((x - a) * 1e-6, (y - a) * 1e-6) for x, y in _outermost(calls[FORWARD])]
        sc.backwards = [((x - a) * 1e-6, (y - a) * 1e-6) for x, y in _outermost(calls[BACKWARD])]
        sc.exchanges = sorted((y - x) * 1e-6 for f in P2P_CALLS for x, y in _outermost(calls[f]))
        a2a, compute = [], []
        for e in dev:
            launch = launches.get((e.get("args") or {}).get("correlation"))
            t0 = launch["ts"] if launch else e["ts"]
            if not a <= t0 < b or e.get("cat") != "kernel":
                continue
            iv = (e["ts"], e["ts"] + e.get("dur", 0))
            if str(e.get("name", "")).startswith("nccl"):
                if launch and in_a2a(launch):
                    a2a.append(iv)
            else:
                compute.append(iv)
        sc.a2a_calls = len(a2a)
        sc.a2a_s = sum(y - x for x, y in _union(a2a)) * 1e-6
        sc.a2a_hidden_s = _overlap(a2a, compute) * 1e-6
        out.append(sc)
    return out


def round_trip(sc: Schedule) -> tuple[float | None, float | None, int, float | None]:
    """(first backward's start - first forward's start, steady 1F1B period, forwards before the first
    backward, the first forward's duration), s; the period is the median spacing of the forwards that
    follow a backward (None without two of them)."""
    if not sc.forwards or not sc.backwards:
        return None, None, len(sc.forwards), None
    first_b = sc.backwards[0][0]
    warm = sum(1 for f in sc.forwards if f[0] < first_b)
    steady = [f[0] for f in sc.forwards if f[0] > first_b]
    period = statistics.median(b - a for a, b in pairwise(steady)) if len(steady) >= 2 else None
    f0 = sc.forwards[0]
    return first_b - f0[0], period, warm, f0[1] - f0[0]


def summary(scheds: list[Schedule], pp: int, stage: int, n_mb: float, n_moe: float) -> dict[str, Any]:
    """Medians over the steps (module docstring): the round trip in steady periods beside what it is when
    every ramp hop lasts a pacing period, the p2p calls, the all-to-all kernels per MoE layer-micro-batch and their
    hidden share. Keys are None where the trace lacks what they need (no Python stacks, no steady phase)."""
    trips = [round_trip(s) for s in scheds]
    rt = [(t, p, f) for t, p, _, f in trips if t is not None and p]
    per = [p for _, p, _, _ in trips if p]
    ex = [x for s in scheds for x in s.exchanges]
    a2a_s = statistics.median(s.a2a_s for s in scheds) if scheds else 0.0
    hid = statistics.median(s.a2a_hidden_s for s in scheds) if scheds else 0.0
    period = statistics.median(per) if per else None
    return {
        "pp": pp, "stage": stage,
        "forwards_per_step": statistics.median(len(s.forwards) for s in scheds) if scheds else 0,
        # PP - s on stage s: its PP - s - 1 warm-up forwards and the first steady one (fewer when n_mb is)
        "forwards_before_backward": statistics.median(w for _, _, w, _ in trips) if trips else 0,
        "steady_period_s": period,
        "round_trip_s": statistics.median(t for t, _, _ in rt) if rt else None,
        "round_trip_periods": statistics.median(t / p for t, p, _ in rt) if rt else None,
        # every hop a pacing period: PP - s - 1 hops' worth, plus this stage's own first forward
        "round_trip_pacing": statistics.median(pp - stage - 1 + f / p for _, p, f in rt) if rt else None,
        "exchanges_per_step": len(ex) / len(scheds) if scheds else 0.0,
        "exchange_median_s": statistics.median(ex) if ex else None,
        "exchange_p90_s": sorted(ex)[int(0.9 * (len(ex) - 1))] if ex else None,
        "exchange_max_s": max(ex) if ex else None,
        "exchange_s_per_step": sum(ex) / len(scheds) if scheds else 0.0,
        "a2a_per_layer_mb": (statistics.median(s.a2a_calls for s in scheds) / (n_mb * n_moe)
                             if scheds and n_mb * n_moe > 0 else None),
        "a2a_s": a2a_s, "a2a_hidden_share": hid / a2a_s if a2a_s > 0 else None,
    }
