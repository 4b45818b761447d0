"""Enumeration of the realizable plan set P_disc(N_dev) (paper app:plan-realization, eq:mesh-moe).

N_dev = TP CP PP DP for the dense layers; inside an MoE layer DP = EP EDP (EP | DP). Plans are
generated as numpy arrays (one element per plan) and structurally checked:

* integral micro-batch count n_mb = gbs / (DP B_micro);
* layers divisible by PP VPP (the dense first block counts as a layer);
* query heads divisible by TP; key/value heads: TP | n_kv, or n_kv | TP with the KV heads
  replicated over TP / n_kv ranks (Megatron supports both; we allow both, replication costs are in
  the time/memory model via kv_loc = max(n_kv / TP, 1));
* experts divisible by EP, EP | DP, expert width divisible by ETP, ETP | TP (ETP <= TP);
* CP: the sequence splits into 2 CP chunks (load-balanced causal context parallelism);
* TP up to ``max_tp`` (default 8, one node).

Each structurally invalid plan is counted under its first failing reason.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scaleplan.estimator.geom import Geometry
from scaleplan.estimator.model import CKPT_CODES, Plans

from scaleplan.specs import CKPT_MODES, LAYOUT_FIELDS


@dataclass(frozen=True)
class PlanConstraints:
    """Which plans to enumerate. None for a degree means every divisor (up to its max_*)."""

    tp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    etp: tuple[int, ...] = (1,)
    vpp: tuple[int, ...] = (1,)
    mbs: tuple[int, ...] = (1, 2, 4)
    ckpt: tuple[str, ...] = tuple(CKPT_MODES)
    mem_fraction: float = 1.0
    max_tp: int = 8
    max_cp: int | None = None
    max_pp: int | None = None
    max_ep: int | None = None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _choose(given, n, cap):
    vals = list(given) if given is not None else _divisors(n)
    return [v for v in vals if v >= 1 and (cap is None or v <= cap)]


def enumerate_plans(g: Geometry, n_devices: int, gbs: int, c: PlanConstraints,
                    seqlen: int | None = None) -> tuple[Plans, dict[str, int], int]:
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
        for f in LAYOUT_FIELDS:
            getattr(plans, f).flags.writeable = False
        hit = _PLAN_CACHE[key] = (plans, counts, total)
    return hit


def _enumerate(g: Geometry, n_devices: int, gbs: int, c: PlanConstraints,
               seqlen: int | None = None) -> tuple[Plans, dict[str, int], int]:
    tps = _choose(c.tp, n_devices, c.max_tp)
    cps = _choose(c.cp, n_devices, c.max_cp)
    pps = _choose(c.pp, n_devices, c.max_pp)
    eps = _choose(c.ep, n_devices, c.max_ep)
    ck = [CKPT_CODES[m] for m in c.ckpt]
    axes = [np.asarray(v, dtype=np.int64) for v in (tps, cps, pps, eps, c.etp, c.vpp, c.mbs, ck)]
    total = int(np.prod([len(a) for a in axes]))
    if total == 0:
        return Plans(*(np.zeros(0, dtype=np.int64) for _ in range(9))), {}, 0
    # the mesh check first, on the (TP, CP, PP) product only, so the full product stays small
    t3 = np.stack(np.meshgrid(axes[0], axes[1], axes[2], indexing="ij"), -1).reshape(-1, 3)
    mesh_ok = n_devices % t3.prod(axis=1) == 0
    counts: dict[str, int] = {}
    n_bad_mesh = int((~mesh_ok).sum()) * (total // max(len(t3), 1))
    if n_bad_mesh:
        counts["mesh_not_dividing_devices"] = n_bad_mesh
    t3 = t3[mesh_ok]
    rest = np.stack(np.meshgrid(*axes[3:], indexing="ij"), -1).reshape(-1, 5)
    grid = np.concatenate([np.repeat(t3, len(rest), axis=0), np.tile(rest, (len(t3), 1))], axis=1)
    tp, cp, pp, ep, etp, vpp, mbs, ckc = grid.T
    dp = n_devices // (tp * cp * pp)
    checks = [
        ("ep_not_dividing_dp", dp % ep == 0),
        ("experts_not_divisible_by_ep", (g.E % ep == 0) if g.is_moe else ep == 1),
        ("gbs_not_divisible", gbs % (dp * mbs) == 0),
        ("layers_not_divisible_by_pp_vpp", g.L % (pp * vpp) == 0),
        ("vpp_needs_pp", (vpp == 1) | (pp > 1)),
        ("heads_not_divisible_by_tp", g.nq % tp == 0),
        ("kv_heads_vs_tp", (g.nkv % tp == 0) | (tp % g.nkv == 0)),
        ("etp_not_dividing_tp", (tp % etp == 0) & (g.dexp % etp == 0)),
        # Megatron's load-balanced causal CP cuts the sequence into 2 CP chunks
        ("cp_not_dividing_seq", True if seqlen is None else (cp == 1) | (seqlen % (2 * cp) == 0)),
    ]
    valid = np.ones(len(grid), dtype=bool)
    for reason, ok in checks:
        ok = np.broadcast_to(np.asarray(ok, dtype=bool), valid.shape)
        bad = valid & ~ok
        if bad.any():
            counts[reason] = int(bad.sum())
        valid &= ok
    sel = np.nonzero(valid)[0]
    plans = Plans(tp[sel], cp[sel], pp[sel], dp[sel], ep[sel], etp[sel], vpp[sel], mbs[sel], ckc[sel])
    return plans, counts, total


def plans_from_layouts(layouts, n_devices: int) -> Plans:
    """Explicit layouts (specs.Layout) -> Plans arrays; DP derived as N / (TP CP PP) when omitted."""
    rows = []
    for lo in layouts:
        dp = lo.dp if lo.dp is not None else n_devices // max(lo.tp * lo.cp * lo.pp, 1)
        rows.append((lo.tp, lo.cp, lo.pp, dp, lo.ep, lo.etp, lo.vpp, lo.mbs, CKPT_CODES[lo.ckpt]))
    a = np.array(rows, dtype=np.int64).reshape(-1, 9)
    return Plans(*a.T)
