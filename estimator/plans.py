"""Enumeration of the realizable plan set P_disc(N_dev) (paper app:plan-realization, eq:mesh-moe).

N_dev = TP CP PP DP for the dense layers; inside an MoE layer DP = EP EDP (EP | DP). Plans are
generated as a :class:`~scaleplan.estimator.layout.ParallelLayout` and structurally checked by its
rules (:data:`~scaleplan.estimator.layout.RULES`), among them:

* integral micro-batch count n_mb = gbs / (DP B_micro);
* layers divisible by PP VPP (the dense first block counts as a layer);
* query heads divisible by TP; key/value heads: TP | n_kv, or n_kv | TP with the KV heads
  replicated over TP / n_kv ranks (Megatron supports both; we allow both, replication costs are in
  the time/memory model via kv_loc = max(n_kv / TP, 1));
* experts divisible by EP, EP | DP, expert width divisible by ETP, ETP | TP (ETP <= TP);
* CP: the sequence splits into 2 CP chunks (load-balanced causal context parallelism);
* TP up to ``max_tp`` (default 8, one node).

Each structurally invalid plan is counted under its first failing rule.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

import numpy as np

from scaleplan.estimator.ckpt import CkptMode
from scaleplan.estimator.ckpt import codes as ckpt_codes
from scaleplan.estimator.model_dims import Geometry
from scaleplan.estimator.layout import (COLUMNS, GEOMETRIC_COLUMNS, RULES, SPLIT_FIELDS, LayoutContext,
                                        ParallelLayout)
from scaleplan.estimator.shapes import resolve_split

from scaleplan.specs import CKPT_MODES
from scaleplan.units import SEARCH_MBS


@dataclass(frozen=True)
class PlanConstraints:
    """Which plans to enumerate. None for a degree means every divisor (up to its max_*). ``fold_experts``: also
    the expert meshes folded over TP and CP (EP x ETP dividing TP x CP x DP, Megatron-Core's MoE parallel
    folding), not only the paper's P_disc (eq:mesh-moe: EP dividing DP); they are valid layouts either way, but
    they double the plans a search evaluates. ``uneven_stages``: also the plans whose PP x VPP chunks cannot split
    the layers evenly, with the first and last stage's layers scaleplan states for them
    (:func:`~scaleplan.estimator.shapes.auto_split`), not only the even splits."""

    tp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    etp: tuple[int, ...] = (1,)
    vpp: tuple[int, ...] = (1,)
    mbs: tuple[int, ...] = SEARCH_MBS
    ckpt: tuple[str, ...] = tuple(CKPT_MODES)
    mem_fraction: float = 1.0
    max_tp: int = 8
    max_cp: int | None = None
    max_pp: int | None = None
    max_ep: int | None = None
    fold_experts: bool = False
    uneven_stages: bool = False
    a2a_overlap: bool = False  # only the plans --overlap-moe-expert-parallel-comm runs (the Estimator's stack sets it)
    layer_graphs: bool = False  # only what per-layer CUDA graphs run (no full recompute; set by the stack)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _choose(given, n, cap):
    vals = list(given) if given is not None else _divisors(n)
    return [v for v in vals if v >= 1 and (cap is None or v <= cap)]


def enumerate_plans(g: Geometry, n_devices: int, gbs: int, c: PlanConstraints,
                    seqlen: int | None = None) -> tuple[ParallelLayout, dict[str, int], int]:
    """All candidate plans -> (structurally valid plans, counts of invalid ones by reason, total).

    Memoised on what the structure depends on (a search asks again for every geometry sharing the
    layer count, heads, expert count and width); the returned plan arrays are read-only and the
    counts dict is the caller's own copy.
    """
    key = (g.L, g.nq, g.nkv, g.E, g.dexp, g.is_moe, int(n_devices), int(gbs), c,
           None if seqlen is None else int(seqlen))
    try:
        hash(key)
    except TypeError:  # constraints built with lists: not memoisable
        return _enumerate(g, n_devices, gbs, c, seqlen)
    plans, counts, total = _enumerate_cached(key, g, n_devices, gbs, c, seqlen)
    return plans, dict(counts), total


_PLAN_CACHE: dict = {}


def _enumerate_cached(key, g, n_devices, gbs, c, seqlen):
    hit = _PLAN_CACHE.get(key)
    if hit is None:
        if len(_PLAN_CACHE) >= 512:
            _PLAN_CACHE.clear()
        plans, counts, total = _enumerate(g, n_devices, gbs, c, seqlen)
        hit = _PLAN_CACHE[key] = (plans.readonly(), counts, total)
    return hit


def plan_axes(n_devices: int, c: PlanConstraints) -> dict[str, list[int]]:
    """The candidate values of every column but DP (ckpt by code; the first / last stage splits 0, stated
    afterwards where the even split does not exist), in the order :func:`enumerate_plans` combines them
    (:func:`enumerate_grid`: the first column slowest)."""
    return {"tp": _choose(c.tp, n_devices, c.max_tp), "cp": _choose(c.cp, n_devices, c.max_cp),
            "pp": _choose(c.pp, n_devices, c.max_pp), "ep": _choose(c.ep, n_devices, c.max_ep),
            "etp": list(c.etp), "vpp": list(c.vpp), "mbs": list(c.mbs), "ckpt": [int(x) for x in ckpt_codes(c.ckpt)],
            **dict.fromkeys(SPLIT_FIELDS, [0])}


def grid_position(axes: dict[str, list[int]], layout: dict) -> tuple[int, ...]:
    """Where a plan (a result's ``layout``: Layout fields, ckpt by name) comes in the enumeration over ``axes``
    (:func:`plan_axes`): its place along each column, the first column first. Raises ValueError for a plan
    off the grid."""
    code = {**layout, "ckpt": CkptMode.parse(str(layout["ckpt"])).value}
    return tuple(axes[f].index(int(code[f])) for f in COLUMNS if f != "dp" and f not in SPLIT_FIELDS)


def _enumerate(g: Geometry, n_devices: int, gbs: int, c: PlanConstraints,
               seqlen: int | None = None) -> tuple[ParallelLayout, dict[str, int], int]:
    axes = plan_axes(n_devices, c)
    # the paper's P_disc unless asked for more: the expert mesh inside DP, the layers split evenly
    ctx = LayoutContext(g, n_devices, gbs, seqlen, c.fold_experts, c.uneven_stages, c.a2a_overlap,
                        c.layer_graphs)
    plans, counts, total = enumerate_grid(axes, ctx)
    return resolve_split(g, plans), counts, total  # an uneven split stated where the even one does not exist


def enumerate_grid(axes: dict[str, Iterable[int]], ctx: LayoutContext) -> tuple[ParallelLayout, dict[str, int], int]:
    """Every combination of the candidate values ``axes`` (keys: the columns but dp; ckpt by code), DP
    derived as N / (TP CP PP) -> (the valid plans, counts of the others by their first failing rule,
    the number of combinations). The mesh rule runs first on the (TP, CP, PP) product alone, so the
    full product stays small; the rules that do not read the model run once per grid and run
    (:func:`_grid`, shared by every model searched on it), the others per call."""
    ax = tuple(tuple(int(v) for v in axes[f]) for f in COLUMNS if f != "dp")
    lay, free, counts, total, (small, inv) = _grid(ax, ctx)
    geo = np.zeros(len(small), dtype=np.int8)  # the first geometric rule each plan breaks (code i + 1)
    for i, r in enumerate(RULES):
        if r.geometric:
            ok = np.broadcast_to(np.asarray(r.check(small, ctx), dtype=bool), geo.shape)
            geo[~ok & (geo == 0)] = i + 1
    geo = geo[inv]
    why = np.minimum(np.where(free == 0, 127, free), np.where(geo == 0, 127, geo)) % 127  # the first of either
    counts = dict(counts)
    for r, n in zip(RULES[1:], np.bincount(why, minlength=len(RULES) + 1)[2:]):
        if n:
            counts[r.name] = int(n)
    return lay.take(np.nonzero(why == 0)[0]), counts, total


_GRIDS: dict = {}  # _grid's memo


def _grid(ax: tuple[tuple[int, ...], ...], ctx: LayoutContext) -> tuple[ParallelLayout, np.ndarray, dict[str, int], int]:
    """The combinations of the axis values ``ax`` (the fields but dp, in order) that pass the mesh rule
    (read-only), the code of the first other rule of :data:`RULES` that does not read the model each
    breaks (int8, 0: none), the mesh rule's count, the number of combinations, and (the distinct
    combinations of :data:`GEOMETRIC_COLUMNS`, each combination's among them): the geometric rules run on
    those few rows for every model searched on the grid. Memoised per (ax, the context's facts, RULES)."""
    key = (ax, *(getattr(ctx, f.name) for f in fields(ctx) if f.name != "g"), tuple(RULES))
    hit = _GRIDS.get(key)
    if hit is not None:
        return hit
    arr = [np.asarray(a, dtype=np.int64) for a in ax]
    total = int(np.prod([len(a) for a in arr]))
    t3 = np.stack(np.meshgrid(*arr[:3], indexing="ij"), -1).reshape(-1, 3)
    mesh_ok = ctx.n_devices % t3.prod(axis=1) == 0
    n_bad_mesh = int((~mesh_ok).sum()) * (total // max(len(t3), 1))
    t3 = t3[mesh_ok]
    rest = np.stack(np.meshgrid(*arr[3:], indexing="ij"), -1).reshape(-1, len(arr) - 3)
    grid = np.concatenate([np.repeat(t3, len(rest), axis=0), np.tile(rest, (len(t3), 1))], axis=1)
    tp, cp, pp = grid[:, 0], grid[:, 1], grid[:, 2]
    lay = ParallelLayout(tp, cp, pp, ctx.n_devices // (tp * cp * pp), *grid[:, 3:].T).readonly()
    free = np.zeros(len(lay), dtype=np.int8)
    for i, r in enumerate(RULES[1:], start=1):
        if not r.geometric:
            ok = np.broadcast_to(np.asarray(r.check(lay, ctx), dtype=bool), free.shape)
            free[~ok & (free == 0)] = i + 1
    free.flags.writeable = False
    first, inv = lay.distinct(*GEOMETRIC_COLUMNS)
    if len(_GRIDS) >= 64:
        _GRIDS.clear()
    hit = _GRIDS[key] = (lay, free, {RULES[0].name: n_bad_mesh} if n_bad_mesh else {}, total,
                         (lay.take(first).readonly(), inv))
    return hit
