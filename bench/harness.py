"""Timing harness shared by every suite (paper section sec:microbenchmarks).

Method: ``warmup`` untimed calls, then ``reps`` timed repetitions, each timed on its own so the
median and the 10th/90th percentiles can be stored. On a GPU each repetition is bracketed by CUDA
events on the current stream (device time, not host time) and, when ``flush`` is set, a buffer
larger than the L2 cache is overwritten before the repetition so a kernel never reads operands
the previous repetition left in L2. On a CPU, ``time.perf_counter`` brackets each repetition (the
kernel runs on the calling thread, so wall time is its time). All times are seconds.

Errors become a stored status instead of stopping a sweep: :func:`classify_error` maps an
exception to OOM / UNSUPPORTED / ERROR plus a one-line note.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.float8_e4m3fn,
}


class Unsupported(Exception):
    """The point cannot run on this device/build (stored as UNSUPPORTED with the message)."""


class SkipMem(Exception):
    """The point's operands would not fit the memory guard (stored as SKIP_MEM)."""


class SkipAlign(Exception):
    """The shape violates the kernel's alignment rule (stored as SKIP_ALIGN)."""


class OverBudget(Exception):
    """The point would take longer than the CPU point budget (not stored: a later run with a larger
    budget, or on a faster machine, measures it); the message is the one-line reason."""


@dataclass
class Timing:
    """How to time one point: warm-up calls, timed repetitions, and a per-point time budget.

    ``max_time_s`` caps the timed phase: when a warm-up call shows that ``reps`` repetitions would
    exceed it, fewer are run (never fewer than ``min_reps``). ``cpu_point_budget_s`` bounds a whole
    point on a CPU (warm-up plus ``min_reps`` repetitions): a point estimated above it is skipped
    (:func:`check_budget`), from a probe before it runs or from its first warm-up call.
    """

    warmup: int = 3
    reps: int = 20
    min_reps: int = 3
    max_time_s: float = 5.0
    flush_l2: bool = True
    cpu_point_budget_s: float = 20.0


@dataclass
class Stats:
    """Per-repetition times (seconds) summarised: median, p10, p90, repetition count."""

    times: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return float(np.median(self.times))

    @property
    def p10(self) -> float:
        return float(np.percentile(self.times, 10))

    @property
    def p90(self) -> float:
        return float(np.percentile(self.times, 90))

    @property
    def n(self) -> int:
        return len(self.times)


@dataclass
class Context:
    """What every suite needs: device, timing policy, profile and a memory guard (bytes)."""

    device: torch.device
    timing: Timing
    profile: Any = None  # scaleplan.profiles.ClusterProfile
    mem_limit_bytes: float = float("inf")
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def budget_s(self) -> float | None:
        """Seconds one point may take: the CPU point budget on a CPU, unbounded on a GPU."""
        return None if self.is_cuda else self.timing.cpu_point_budget_s

    @property
    def calls(self) -> int:
        """The fewest calls of a point's unit of work a measurement makes (warm-up + min_reps)."""
        return max(1, self.timing.warmup) + self.timing.min_reps


def check_budget(one_call_s: float, calls: int, ctx: Context, what: str = "measured") -> None:
    """Raise OverBudget when ``calls`` calls of ``one_call_s`` seconds exceed the context's budget."""
    budget = ctx.budget_s
    if budget is not None and one_call_s * calls > budget:
        raise OverBudget(f"~{one_call_s * calls:.3g} s ({calls} calls x {one_call_s:.3g} s {what}) "
                         f"> the {budget:g} s CPU point budget")


def probe_mm_s(m: int, n: int, k: int, dtype: str, ctx: Context, max_flop: float = 2e8) -> float:
    """Seconds of one ``[m, k] @ [k, n]`` product in ``dtype`` on this device, from a cheap probe: the
    product on at most ``max_flop`` FLOP worth of rows (every row when it fits), best of two after a
    warm-up, scaled to m rows. Raises Unsupported for a dtype the device lacks."""
    dt = torch_dtype(dtype, ctx)
    if dtype == "fp8":
        dt = torch.bfloat16  # the probe of an fp8 point: its bf16 twin bounds it
    rows = int(max(1, min(m, max_flop // max(2.0 * n * k, 1.0))))
    a, b = randn((rows, k), dt, ctx.device), randn((k, n), dt, ctx.device)
    best = float("inf")
    for i in range(3):
        synchronize(ctx.device)
        t0 = time.perf_counter()
        torch.mm(a, b)
        synchronize(ctx.device)
        if i:
            best = min(best, time.perf_counter() - t0)
    return best * m / rows


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall_per_call_s(fn: Callable[[], Any], ctx: Context, calls: int = 20) -> float:
    """Eager wall seconds per call of ``fn()`` with ``calls`` issued back to back, host launch cost included:
    beside a device time, it tells a call's host floor from its device work (estimator/floors.py)."""
    synchronize(ctx.device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(ctx.device)
    return (time.perf_counter() - t0) / calls


_FLUSH: dict[int, torch.Tensor] = {}


def _flush_buffer(device: torch.device) -> torch.Tensor:
    """A byte buffer of twice the L2 size (at least 256 MiB), allocated once per device."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _FLUSH:
        l2 = getattr(torch.cuda.get_device_properties(idx), "L2_cache_size", 0) or 0
        _FLUSH[idx] = torch.empty(max(256 << 20, 2 * l2), dtype=torch.uint8, device=device)
    return _FLUSH[idx]


def time_fn(
    run: Callable[[Any], Any], ctx: Context, setup: Callable[[], Any] | None = None, flush: bool = True
) -> Stats:
    """Time ``run(state)`` where ``state = setup()`` is prepared, untimed, before every repetition.

    ``setup`` lets a backward pass be timed alone: it runs the forward (untimed), ``run`` the
    backward. Returns per-repetition device (CUDA) or wall (CPU) seconds.
    """
    t = ctx.timing
    setup = setup or (lambda: None)
    t_one = _warmup(run, setup, ctx)
    reps = t.reps if t_one <= 0 else int(min(t.reps, max(t.min_reps, t.max_time_s // max(t_one, 1e-9))))
    if ctx.is_cuda:
        return _time_cuda(run, setup, ctx, reps, flush and t.flush_l2)
    return _time_cpu(run, setup, reps)



def time_fwd_bwd(fwd: Callable[[], Any], leaves: list[Any], grad: Any, ctx: Context) -> tuple[Stats, Stats]:
    """Time a forward ``fwd()`` and, separately, its backward with output gradient ``grad``.

    The backward is timed alone: every repetition re-runs the forward untimed after clearing the
    ``leaves``' gradients. Returns (forward stats, backward stats) in seconds.
    """
    f = time_fn(lambda _: fwd(), ctx)

    def setup():
        for x in leaves:
            x.grad = None
        return fwd()

    return f, time_fn(lambda y: y.backward(grad), ctx, setup=setup)

def _warmup(run, setup, ctx: Context) -> float:
    """Run the warm-up calls; return the wall seconds of the last one (a budget estimate). Raises
    OverBudget after the first when the calls still to come would exceed the CPU point budget."""
    last = 0.0
    for i in range(max(1, ctx.timing.warmup)):
        state = setup()
        synchronize(ctx.device)
        t0 = time.perf_counter()
        run(state)
        synchronize(ctx.device)
        last = time.perf_counter() - t0
        if i == 0:
            check_budget(last, ctx.calls - 1, ctx, "the first call took")
    return last


def _time_cpu(run, setup, reps: int) -> Stats:
    out = []
    for _ in range(reps):
        state = setup()
        t0 = time.perf_counter()
        run(state)
        out.append(time.perf_counter() - t0)
    return Stats(out)


def _time_cuda(run, setup, ctx: Context, reps: int, flush: bool) -> Stats:
    """CUDA events around each repetition; no host sync inside the loop, so the queue stays full
    and launch latency is not counted as device time (the flush kernel gives the host slack)."""
    buf = _flush_buffer(ctx.device) if flush else None
    events = []
    for _ in range(reps):
        state = setup()
        if buf is not None:
            buf.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run(state)
        end.record()
        events.append((start, end))
    torch.cuda.synchronize(ctx.device)
    return Stats([s.elapsed_time(e) * 1e-3 for s, e in events])


def classify_error(exc: BaseException) -> tuple[str, str]:
    """Map an exception raised while measuring a point to (status, one-line note)."""
    msg = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:400]
    if isinstance(exc, Unsupported):
        return "UNSUPPORTED", msg
    if isinstance(exc, SkipMem):
        return "SKIP_MEM", msg
    if isinstance(exc, SkipAlign):
        return "SKIP_ALIGN", msg
    if (
        isinstance(exc, (torch.OutOfMemoryError, MemoryError))
        or "out of memory" in msg.lower()
        or "can't allocate memory" in msg.lower()
    ):
        return "OOM", msg
    if (
        isinstance(exc, NotImplementedError)
        or "not implemented" in msg.lower()
        or "not supported" in msg.lower()
        or "no viable backend" in msg.lower()
        or "no available kernel" in msg.lower()
    ):
        return "UNSUPPORTED", msg
    return "ERROR", f"{type(exc).__name__}: {msg}"


def release_memory(device: torch.device) -> None:
    """After a failed point (OOM above all): collect its tensors and drop cached blocks so the next
    point starts clean."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def check_memory(ctx: Context, nbytes: float) -> None:
    """Raise SkipMem when a point's operands (``nbytes``) exceed the context's memory guard."""
    if nbytes > ctx.mem_limit_bytes:
        raise SkipMem(f"needs ~{nbytes / 1e9:.2f} GB > guard {ctx.mem_limit_bytes / 1e9:.2f} GB")


def torch_dtype(name: str, ctx: Context) -> torch.dtype:
    """The torch dtype for a precision name; raises Unsupported where the device lacks it."""
    if name not in DTYPES:
        raise Unsupported(f"unknown dtype {name!r}")
    if name == "tf32" and not ctx.is_cuda:
        raise Unsupported("tf32 is a tensor-core mode of CUDA devices")
    if name == "fp8" and ctx.is_cuda and torch.cuda.get_device_capability(ctx.device) < (8, 9):
        raise Unsupported("fp8 needs compute capability >= 8.9")
    return DTYPES[name]


class tf32_mode:
    """Context manager: TF32 matmuls on for dtype 'tf32', off (IEEE fp32) for anything else (CUDA).

    Uses ``torch.backends.cuda.matmul.fp32_precision`` where the build has it (the newer API),
    else ``allow_tf32``; restores the previous setting on exit.
    """

    def __init__(self, dtype_name: str):
        self.on = dtype_name == "tf32"
        self.knob = torch.backends.cuda.matmul
        self.new_api = hasattr(self.knob, "fp32_precision")

    def __enter__(self):
        if self.new_api:
            self.prev = self.knob.fp32_precision
            self.knob.fp32_precision = "tf32" if self.on else "ieee"
        else:
            self.prev = self.knob.allow_tf32
            self.knob.allow_tf32 = self.on
        return self

    def __exit__(self, *exc):
        if self.new_api:
            self.knob.fp32_precision = self.prev
        else:
            self.knob.allow_tf32 = self.prev
        return False


def randn(
    shape, dtype: torch.dtype, device: torch.device, scale: float = 1.0, grad: bool = False
) -> torch.Tensor:
    """Random normal operands (fp8 is generated in bf16 and cast)."""
    gen_dtype = torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype
    x = torch.randn(shape, dtype=gen_dtype, device=device) * scale
    x = x.to(dtype)
    return x.requires_grad_(grad) if grad else x
