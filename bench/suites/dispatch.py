"""CPU dispatch: the per-kernel gap and the fixed per-microbatch host time, the inputs of the
dispatch floor t_disp = L_stage * kappa(E_loc) * t_gap + t_host (paper sec:iteration-time-model,
"Compute versus dispatch").

Key: (mode, m, n, k, dtype, chain_len).

``gemm`` / ``gemm_relu``: an eager chain of ``chain_len`` small kernels, x <- x @ W (W [k, k], so
n = k), with a ReLU after each GEMM in gemm_relu (chain_len counts every kernel: chain_len/2
GEMM + ReLU pairs). ``wall_per_kernel_s`` = host wall time of the chain (synchronised at both
ends) / chain_len. ``active_per_kernel_s`` = the time the same arithmetic keeps the device busy,
per kernel:
- CUDA: the chain captured once in a CUDA graph and replayed (no per-kernel CPU dispatch),
  timed with CUDA events, / chain_len.
- CPU: a CPU has no separate device timeline (each kernel runs on the dispatching thread), so
  "active" is defined as the kernel's compute time without the per-op dispatch cost: wall per
  kernel minus the wall per kernel of the same chain at m = n = k = 1 (same ops, same dispatch
  path, negligible arithmetic), clipped to [roofline, wall], roofline = the chain's GEMM FLOPs per
  kernel at the profile's peak. (Clipped at 0, a small chain whose difference drowned in host noise
  stored active = 0, which the database refuses as a time: the row lost it, and
  test_suite_specific_columns failed whenever the machine was busy.) So active <= wall always, and
  wall - active
  is the per-op dispatch cost, as on a GPU. (An earlier definition timed one batched ``bmm`` with
  a broadcast W; that runs a slower kernel than the chain's ``mm`` and gave active > wall.)
The per-kernel gap t_gap is wall - active.

``ops:<part>[:<ckpt>]`` (serial-dispatch profiles, e.g. cpu-local, where the host issues every op
on the cores that compute it, and GPUs, where the estimator's reference stack uses them for
``scaleplan validate``): host seconds of the reference training model
(:mod:`scaleplan.reference.model`) for one part, stored in ``wall_per_kernel_s`` with chain_len = 1:
``moe`` / ``dense`` per layer and micro-batch (forward + backward + the recompute of ``ckpt``),
``microbatch`` per micro-batch outside the layers (embedding, final norm, LM head, loss),
``step_moe`` / ``step_dense`` / ``step`` optimizer-step ops per MoE layer, per dense layer and fixed.
The op counts are measured, not typed in: every aten op reaching the dispatcher is counted
(``TorchDispatchMode``) in a forward + backward (or optimizer step) of a probe instance of the
reference model (m tokens, hidden n, k experts; op counts are structural: they do not depend on
the widths, E or K, because the experts run as one grouped GEMM), per part by differences over
the layer count. The seconds per op are the median (as in every table) of the probe's wall time
divided by its op count: at the probe's tiny widths that is the host cost of eager autograd
ops (dispatcher, autograd graph, module hooks, recompute machinery); on CUDA the probe's host
issue time (synchronised before, no trailing sync) and no uncosted-compute term
(:mod:`scaleplan.bench.suites.model_ops`). The note records n_ops and
seconds per op (kappa of sec:iteration-time-model, measured for this model).

``sync:<every>`` (CUDA only; deep pipelines): what a host-device synchronisation costs a stream
of small kernels that the host would otherwise run ahead of, the input of a pipeline whose p2p
exchanges synchronise the device (Megatron-LM's ``batch_p2p_sync``: ``torch.cuda.synchronize()``
around each batched isend/irecv). The ``gemm`` chain of ``chain_len`` kernels is issued twice per
repetition, interleaved: with ``torch.cuda.synchronize()`` after every ``every`` kernels
(``wall_per_kernel_s`` = its host wall / chain_len) and with none inside (``active_per_kernel_s`` =
that wall / chain_len: the device's pace when the host runs ahead, the host's when it cannot).
Both walls start on an empty queue and end synchronised (:func:`sync_walls`). The exposed seconds per
synchronisation, the device idling while the host wakes from the sync and issues the next kernel, are
``(wall_per_kernel_s - active_per_kernel_s) * every`` (:func:`exposed_per_sync_s`; in the note with
the host's issue time per kernel, which says whether the host was ahead: device-bound when it is
under active_per_kernel_s).

``host_overhead``: a dispatch-bound microbatch (forward + loss + backward) of a tiny MLP with L
layers of Linear(k, k) + GELU on m tokens, for L in ``host_layers``, timed round-robin over L
(>= 20 repetitions each). A robust (Theil-Sen) line through the per-L minimum wall times (host
contention only adds time, so the minimum is the dispatch cost) has slope = per-layer dispatch
time and intercept = the fixed per-microbatch host time t_host, stored in ``wall_per_kernel_s``
with chain_len = 1 (the fit is in the note). A non-positive intercept is stored as ERROR, not
clamped.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from scaleplan.bench import harness as h
from scaleplan.bench.config import SuiteConfig, explicit_points, grid

from scaleplan.db import models as m

NAME = "dispatch"
TABLE = m.DispatchPoint
KEY = ("mode", "m", "n", "k", "dtype", "chain_len")
HOST_MIN_REPS = 20  # host_overhead: repetitions per layer count (cheap: tiny model)


class Config(SuiteConfig):
    dtypes: list[str] = ["bf16"]
    modes: list[str] = ["gemm", "gemm_relu", "host_overhead"]
    m: list[int] = [8, 64, 512]
    k: list[int] = [2048]
    chain_len: list[int] = [512]
    host_tokens: int = 64
    host_hidden: int = 64
    host_layers: list[int] = [1, 2, 4, 8, 16]


def expand(cfg: Config, ctx: h.Context) -> list[dict]:
    ctx.extra["host_layers"] = cfg.host_layers
    if cfg.points is not None:
        return explicit_points(cfg.points, KEY, NAME)
    out = []
    chain_modes = [md for md in cfg.modes if md != "host_overhead"]
    for p in grid(mode=chain_modes, m=cfg.m, k=cfg.k, dtype=cfg.dtypes, chain_len=cfg.chain_len):
        out.append(
            dict(mode=p["mode"], m=p["m"], n=p["k"], k=p["k"], dtype=p["dtype"], chain_len=p["chain_len"])
        )
    if "host_overhead" in cfg.modes:
        out += [
            dict(
                mode="host_overhead",
                m=cfg.host_tokens,
                n=cfg.host_hidden,
                k=cfg.host_hidden,
                dtype=d,
                chain_len=1,
            )
            for d in cfg.dtypes
        ]
    return out


def wall_times(fn, ctx: h.Context, reps: int) -> list[float]:
    """Host wall seconds of fn(), synchronised before and after (so queued work is included)."""
    out = []
    for _ in range(reps):
        h.synchronize(ctx.device)
        t0 = time.perf_counter()
        fn()
        h.synchronize(ctx.device)
        out.append(time.perf_counter() - t0)
    return out


def _chain(x0: torch.Tensor, w: torch.Tensor, n_kernels: int, relu: bool):
    def run():
        x = x0
        for _ in range(n_kernels // 2 if relu else n_kernels):
            x = torch.mm(x, w)
            if relu:
                x = torch.relu(x)
        return x

    return run


def _active_cuda(chain, ctx: h.Context, reps: int) -> float:
    """Median device time of the chain replayed from a CUDA graph (no per-kernel CPU dispatch)."""
    s = torch.cuda.Stream(ctx.device)
    s.wait_stream(torch.cuda.current_stream(ctx.device))
    with torch.cuda.stream(s):
        chain()  # warm-up on a side stream, as graph capture requires
    torch.cuda.current_stream(ctx.device).wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    graph.replay()
    st = h.time_fn(lambda _: graph.replay(), ctx, flush=False)
    return st.median


def _active_cpu(p: dict, dt: torch.dtype, ctx: h.Context, relu: bool, wall: float) -> float:
    """Compute-only seconds per kernel (see module docstring): ``wall`` minus the wall per kernel of
    the same chain at m = n = k = 1, clipped to [roofline, wall] (roofline > 0: see module docstring)."""
    x0 = h.randn((1, 1), dt, ctx.device)
    w = h.randn((1, 1), dt, ctx.device)
    tiny = _chain(x0, w, p["chain_len"], relu)
    for _ in range(max(1, ctx.timing.warmup)):
        tiny()
    reps = max(ctx.timing.min_reps, min(ctx.timing.reps, 10))
    t_op = min(wall_times(tiny, ctx, reps)) / p["chain_len"]  # contention only adds: the floor is dispatch
    return float(min(max(wall - t_op, _roofline_s(p, ctx, relu)), wall))


def _roofline_s(p: dict, ctx: h.Context, relu: bool) -> float:
    """Seconds per kernel the chain's arithmetic needs at the profile's peak (GEMM kernels: 2 m k^2
    FLOP each; with ReLU half the kernels are GEMMs): a positive floor for the CPU's active time."""
    try:
        peak = ctx.profile.peak(p["dtype"])
    except Exception:  # no profile or no lane: 1 PFLOP/s is above any CPU, so this stays a lower bound
        peak = 1e15
    return 2.0 * p["m"] * p["k"] * p["k"] * (0.5 if relu else 1.0) / peak


def sync_walls(issue: Callable[[], object], n: int, every: int | None, sync: Callable[[], object],
               clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """(wall, issue) host seconds of ``n`` calls of ``issue()`` started on an empty device queue (``sync()``
    first): ``wall`` until the device is done (a final ``sync()``), ``issue`` until the host issued the
    last call. ``every`` k: ``sync()`` after every k-th call too (None: no sync inside). ``clock`` is
    injectable so the logic is checked against a simulated device."""
    sync()
    t0 = clock()
    synced = True
    for i in range(1, n + 1):
        issue()
        synced = bool(every) and i % every == 0
        if synced:
            sync()
    t_issue = clock() - t0
    if not synced:
        sync()
    return clock() - t0, t_issue


def exposed_per_sync_s(wall_per_kernel_s: float, active_per_kernel_s: float, every: int) -> float:
    """Seconds one synchronisation adds to a stream of kernels (a ``sync:<every>`` row): the wall per
    kernel with a sync every ``every`` kernels minus the wall per kernel with none, times ``every``."""
    return (wall_per_kernel_s - active_per_kernel_s) * every


def _sync_point(p: dict, dt: torch.dtype, ctx: h.Context) -> dict:
    """A ``sync:<every>`` row: the gemm chain with a device sync every ``every`` kernels vs none inside."""
    every = int(p["mode"].split(":", 1)[1])
    if not ctx.is_cuda:
        raise h.Unsupported("sync modes time a device queue the host runs ahead of: CUDA only")
    if p["n"] != p["k"] or every < 1 or p["chain_len"] % every:
        raise h.Unsupported("a sync chain needs n == k and chain_len a multiple of every >= 1")
    h.check_memory(ctx, dt.itemsize * (p["chain_len"] + 2) * (p["m"] * p["k"] + p["k"] * p["k"]))
    x = [h.randn((p["m"], p["k"]), dt, ctx.device)]
    w = h.randn((p["k"], p["k"]), dt, ctx.device, scale=p["k"] ** -0.5)

    def issue():
        x[0] = torch.mm(x[0], w)

    def sync():
        torch.cuda.synchronize(ctx.device)

    n = p["chain_len"]
    for _ in range(max(1, ctx.timing.warmup)):
        sync_walls(issue, n, every, sync)
        sync_walls(issue, n, None, sync)
    reps = max(ctx.timing.min_reps, min(ctx.timing.reps, 10))
    synced, free = [], []
    for _ in range(reps):  # interleaved: a slow spell of the host hits both alike
        synced.append(sync_walls(issue, n, every, sync))
        free.append(sync_walls(issue, n, None, sync))
    wall = float(np.median([w_ for w_, _ in synced])) / n
    ahead = float(np.median([w_ for w_, _ in free])) / n
    issue_s = float(np.median([i for _, i in free])) / n
    return dict(wall_per_kernel_s=wall, active_per_kernel_s=ahead, n_rep=reps,
                note=f"exposed_per_sync_s={exposed_per_sync_s(wall, ahead, every):.3e}; every={every}; "
                     f"host issue per kernel without sync {issue_s:.3e} s ({host_state(issue_s, ahead)})")


def host_state(issue_s: float, wall_s: float) -> str:
    """'host ahead' when the host issued a sync-free chain well before the device finished it (issue time
    per kernel under 0.9 of the wall per kernel: the device sets the pace), else 'host-bound' (the wall is
    the issue time plus the last kernel: an H200 chain of m=8 GEMMs, 19.0 us issued in 19.0 us)."""
    return "host ahead" if issue_s < 0.9 * wall_s else "host-bound"


def _chain_point(p: dict, dt: torch.dtype, ctx: h.Context) -> dict:
    if p["n"] != p["k"]:
        raise h.Unsupported("a GEMM chain needs n == k")
    relu = p["mode"] == "gemm_relu"
    if relu and p["chain_len"] % 2:
        raise h.Unsupported("gemm_relu needs an even chain_len (GEMM + ReLU pairs)")
    h.check_memory(ctx, dt.itemsize * (p["chain_len"] + 2) * (p["m"] * p["k"] + p["k"] * p["k"]))
    x0 = h.randn((p["m"], p["k"]), dt, ctx.device)
    w = h.randn((p["k"], p["k"]), dt, ctx.device, scale=p["k"] ** -0.5)
    chain = _chain(x0, w, p["chain_len"], relu)
    h.synchronize(ctx.device)
    t0 = time.perf_counter()
    chain()  # the first warm-up call, timed against the CPU point budget
    h.synchronize(ctx.device)
    h.check_budget(time.perf_counter() - t0, ctx.calls - 1, ctx, "the first chain took")
    for _ in range(max(1, ctx.timing.warmup) - 1):
        chain()
    walls = wall_times(chain, ctx, max(ctx.timing.min_reps, min(ctx.timing.reps, 10)))
    n = p["chain_len"]
    wall = float(np.median(walls)) / n
    active = _active_cuda(chain, ctx, ctx.timing.reps) / n if ctx.is_cuda else _active_cpu(p, dt, ctx, relu, wall)
    return dict(
        wall_per_kernel_s=wall,
        active_per_kernel_s=active,
        n_rep=len(walls),
        note=f"gap_per_kernel_s={wall - active:.3e}; active via "
        f"{'CUDA graph replay' if ctx.is_cuda else 'wall minus the m=n=k=1 chain (CPU)'}",
    )


def _host_point(p: dict, dt: torch.dtype, ctx: h.Context) -> dict:
    from scipy.stats import theilslopes

    layers = sorted(set(ctx.extra.get("host_layers", [1, 2, 4, 8, 16])))
    if len(layers) < 2:
        raise h.Unsupported("host_overhead needs at least two layer counts to fit an intercept")
    x = h.randn((p["m"], p["k"]), dt, ctx.device)
    steps = [_microbatch(n_layers, x, p, dt, ctx) for n_layers in layers]
    for step in steps:
        for _ in range(max(1, ctx.timing.warmup)):
            step()
    reps = max(HOST_MIN_REPS, ctx.timing.reps)
    walls: list[list[float]] = [[] for _ in layers]
    for _ in range(reps):  # round-robin over L, so a slow spell of the host hits every L alike
        for i, step in enumerate(steps):
            walls[i] += wall_times(step, ctx, 1)
    floor = [min(w) for w in walls]  # contention only adds time: the floor is the dispatch cost
    slope, intercept, *_ = theilslopes(floor, np.array(layers, float))
    fit = (
        f"wall(L) = {intercept:.3e} + {slope:.3e}*L s (Theil-Sen over per-L minima of {reps} reps, "
        f"L={layers}: {[f'{v:.3e}' for v in floor]})"
    )
    if intercept <= 0:
        raise RuntimeError(f"non-positive host intercept; {fit}")
    return dict(wall_per_kernel_s=float(intercept), active_per_kernel_s=None, n_rep=reps, note=fit)


def _microbatch(n_layers: int, x: torch.Tensor, p: dict, dt: torch.dtype, ctx: h.Context):
    """forward + loss + backward of an MLP of ``n_layers`` Linear(k, n) + GELU layers."""
    mods = [torch.nn.Sequential(torch.nn.Linear(p["k"], p["n"]), torch.nn.GELU()) for _ in range(n_layers)]
    model = torch.nn.Sequential(*mods).to(device=ctx.device, dtype=dt)

    def step():
        model(x).float().pow(2).mean().backward()

    return step


def probe_s(p: dict, ctx: h.Context) -> float | None:
    """Seconds of one chain of a chain point (chain_len kernels, half of them GEMMs with ReLU) from a
    probe of one of its GEMMs; None for the host modes (tiny models, no estimate needed)."""
    if p["mode"] not in ("gemm", "gemm_relu") and not p["mode"].startswith("sync:"):
        return None
    share = 0.5 if p["mode"] == "gemm_relu" else 1.0
    # the memory guard of _chain_point first (at fp32 size, an upper bound), so SKIP_MEM is stored
    h.check_memory(ctx, 4 * (p["chain_len"] + 2) * (p["m"] * p["k"] + p["k"] * p["k"]))
    return p["chain_len"] * share * h.probe_mm_s(p["m"], p["k"], p["k"], p["dtype"], ctx)


def measure(p: dict, ctx: h.Context) -> dict:
    dt = h.torch_dtype(p["dtype"], ctx)
    if p["dtype"] in ("fp8", "tf32"):
        raise h.Unsupported(f"dispatch is benchmarked in bf16/fp16/fp32, not {p['dtype']}")
    if p["mode"] in ("gemm", "gemm_relu"):
        return _chain_point(p, dt, ctx)
    if p["mode"].startswith("sync:"):
        return _sync_point(p, dt, ctx)
    if p["mode"] == "host_overhead":
        return _host_point(p, dt, ctx)
    if p["mode"].startswith("ops:"):
        from scaleplan.bench.suites import model_ops

        return model_ops.measure(p, dt, ctx)
    raise h.Unsupported(f"unknown dispatch mode {p['mode']!r}")
