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

from dataclasses import dataclass

from scaleplan.estimator.ckpt import CkptMode
from scaleplan.estimator.ckpt import codes as ckpt_codes
from scaleplan.estimator.model_dims import Geometry
from scaleplan.estimator.layout import COLUMNS, SPLIT_FIELDS, LayoutContext, ParallelLayout, enumerate_grid
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
    (:func:`~scaleplan.estimator.layout.enumerate_grid`: the first column slowest)."""
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
    ctx = LayoutContext(g, n_devices, gbs, seqlen, c.fold_experts, c.uneven_stages)
    plans, counts, total = enumerate_grid(axes, ctx)
    return resolve_split(g, plans), counts, total  # an uneven split stated where the even one does not exist
