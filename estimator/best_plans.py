"""The inner max of eq:c-flops for many geometries at once (:meth:`Estimator.best_plans`): each geometry's
best plan under the memory cap, its plans and those of the other geometries of one structure evaluated as one
plan set.

Most of a geometry's plans are slower than its best before the DP traffic, the optimizer step and memory
are costed: the time model's first half runs on every plan (:meth:`TimeModel.pipelined`), its floor of
t_iter (:meth:`TimeModel.t_iter_floor`) against the t_iter of a plan that fits sets which plans can still be
the best (:func:`_candidates`), and only those get memory and the rest of the time model. The pick is the
one the full ranking (:meth:`Estimator.layouts`) puts first.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.memory import StageMemory
from scaleplan.estimator.model_dims import Geometry, GeometryBatch
from scaleplan.estimator.plans import PlanConstraints, enumerate_plans
from scaleplan.estimator.shapes import plan_shapes

if TYPE_CHECKING:
    from scaleplan.estimator.api import Estimator
    from scaleplan.estimator.model import Pipelined
    from scaleplan.estimator.results import EstimateResult

#: plans the memory and time models evaluate at once: a batch's plans go in pieces of whole geometries, up to
#: this many plans each. The arrays take ~1 kB per plan, and a worker's heap grows to its largest evaluation,
#: every page of it faulted in (zeroed) once: past this size the per-call overhead saved is less than that
EVAL_PLANS = 120_000
#: :func:`_candidates` probes each geometry's plans of lowest t_iter floor in rounds ending at these
#: ranks (then the rest) until one fits in memory: the fastest plans often need the most memory
PROBE_ROUNDS = (4, 32, 256)


def probe_rounds(floor: np.ndarray, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order, round): the plans in order of geometry (``owner``, sorted), then of floor within it, and the
    probe round of each place in that order (0 for a geometry's first :data:`PROBE_ROUNDS`[0] plans, ...,
    len(PROBE_ROUNDS) for the rest). One sort of a float key (the geometry plus the floor scaled into
    [0, 0.5] within it): the order only sets which plans are probed first, never which are kept."""
    n = len(owner)
    starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    sizes = np.diff(np.r_[starts, n])
    fin = np.isfinite(floor)
    lo = np.repeat(np.minimum.reduceat(np.where(fin, floor, np.inf), starts), sizes)
    span = np.repeat(np.maximum.reduceat(np.where(fin, floor, -np.inf), starts), sizes) - lo
    ok = fin & (span > 0)
    scaled = np.zeros(n)
    scaled[ok] = (floor[ok] - lo[ok]) / span[ok]  # finite floors in [0, 1]
    # -inf first (0), the finite ones (0.1-0.4), +inf and NaN last (0.5)
    key = owner + np.where(fin, 0.1 + 0.3 * scaled, np.where(floor < 0, 0.0, 0.5))
    order = np.argsort(key)
    place = np.arange(n) - np.repeat(starts, sizes)  # the keys keep the geometries apart: a place's rank in its own
    return order, np.searchsorted(np.asarray(PROBE_ROUNDS), place, side="right")


def pieces(counts: list[int], limit: int) -> list[tuple[int, int]]:
    """Ranges [a, b) of items with ``counts`` (plans per geometry), in order, each holding at most ``limit``
    in all or one item alone."""
    out, a, n = [], 0, 0
    for j, c in enumerate(counts):
        if n + c > limit and j > a:
            out.append((a, j))
            a, n = j, 0
        n += c
    return out + [(a, len(counts))]


def first_max_per_group(value: np.ndarray, group: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Per run of equal ``group`` (sorted, shape (n,)): ``where`` at its first element of highest
    ``value``, where no value of the run is higher (a NaN only where the whole run is NaN: then its
    first). What a stable sort by (group, -value) puts first in each group, in O(n) instead of a sort."""
    if len(group) == 0:
        return where[:0]
    starts = np.r_[0, np.nonzero(group[1:] != group[:-1])[0] + 1]
    run = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(group)]))
    top = np.fmax.reduceat(value, starts)[run]
    hit = np.nonzero((value == top) | np.isnan(top))[0]
    return where[hit[np.r_[True, run[hit][1:] != run[hit][:-1]]]]


def best_of_batch(est: Estimator, geoms: list[Geometry], rope: bool, n_devices: int, gbs: int, seqlen: int,
                  optimizer: str, constraints: PlanConstraints) -> list[EstimateResult | None]:
    """The best plan of each geometry of one structure (``rope``: the models' rotary embeddings) on
    ``n_devices``, all their plans evaluated as one set, in pieces of at most :data:`EVAL_PLANS` plans: the
    plans whose model state alone exceeds the cap dropped first (:meth:`Estimator._state_fits`), then per
    geometry the first plan of highest MFU among those that fit and are in range (:func:`_best_in`): the
    same plan as :meth:`Estimator.layouts` ranks first (every evaluation is elementwise over plans, and the
    subsets keep the plans' order for ties). A list aligned with ``geoms``, None where no plan is feasible."""
    sets = [enumerate_plans(g, n_devices, gbs, est.runnable(constraints), seqlen)[0] for g in geoms]
    out: list[EstimateResult | None] = [None] * len(geoms)
    if not any(len(s) for s in sets):
        return out
    # each geometry's fields once (GeometryBatch.take gives them to any selection of its plans)
    each = geoms[0] if len(geoms) == 1 else GeometryBatch.stack(geoms, np.arange(len(geoms)))
    keep = est._state_fits(each, sets, optimizer, constraints.mem_fraction * est.profile.hbm_bytes)
    for a, b in pieces([len(k) for k in keep], EVAL_PLANS):
        _best_in(est, geoms, each, rope, a, [s.take(k) for s, k in zip(sets[a:b], keep[a:b])], gbs, seqlen,
                 optimizer, constraints.mem_fraction, out)
    return out


def _best_in(est: Estimator, geoms: list[Geometry], each: Geometry, rope: bool, first: int,
             sets: list[ParallelLayout], gbs: int, seqlen: int, optimizer: str, frac: float,
             out: list[EstimateResult | None]) -> None:
    """Into ``out``, the best plan of each of ``geoms[first:first + len(sets)]`` among its plans ``sets``
    (those whose model state fits), under ``frac`` of HBM: the time model's first half on every plan, then
    memory and the rest of the time model on the plans that can be their geometry's best
    (:func:`_candidates`), the first plan of highest MFU among those that fit and are in range. ``each``:
    the geometries, one plan each (:func:`best_of_batch`)."""
    owner = np.repeat(np.arange(first, first + len(sets)), [len(s) for s in sets])  # sorted
    if len(owner) == 0:
        return
    plans, cap = ParallelLayout.concat(sets), est.profile.hbm_bytes
    batch = each.take(owner)
    sh = plan_shapes(batch, plans, seqlen, gbs)

    def fitting(idx: np.ndarray) -> tuple[np.ndarray, StageMemory]:
        mem = est._memory(batch.take(idx), plans.take(idx), gbs, seqlen, optimizer, rope, sh.take(idx))
        ok = np.nonzero(~(sum(mem.values()) > frac * cap))[0]
        return idx[ok], mem.take(ok)

    part = est.model.pipelined(batch, plans, gbs, seqlen, shapes=sh, stack=est.training_stack)
    cand, mem = fitting(_candidates(est, part, owner, optimizer, fitting))
    if len(cand) == 0:
        return
    owner = owner[cand]
    ev = est.model.finish(part.take(cand), optimizer)
    ok = np.nonzero(ev.oor.reason == None)[0]  # noqa: E711 (an object array: elementwise)
    bounds = np.searchsorted(owner, np.arange(len(geoms) + 1))
    for b in first_max_per_group(ev.mfu[ok], owner[ok], ok):
        j = owner[b]
        out[j] = est._result(geoms[j], ev, mem, b, gbs * seqlen, cap, frac, slice(bounds[j], bounds[j + 1]))


def _candidates(est: Estimator, part: Pipelined, owner: np.ndarray, optimizer: str,
                fitting: Callable[[np.ndarray], tuple[np.ndarray, StageMemory]]) -> np.ndarray:
    """Indices (ascending) of the plans of ``part`` that can be their geometry's best: those whose t_iter
    floor (:meth:`TimeModel.t_iter_floor`) does not exceed the bar, the t_iter of an in-range plan of the
    same geometry (``owner``, sorted) that fits in memory (``fitting``: the indices that do, with their
    memory). The bar comes from each geometry's plans of lowest floor, finished in full, in rounds of
    more of them (:data:`PROBE_ROUNDS`) until one fits and is in range; a geometry none of whose plans
    does keeps none. Every plan at the geometry's lowest t_iter (highest MFU: the same model FLOPs) is
    kept, so :func:`_best_in` picks the plan it would pick among all of them, while memory and the DP and
    optimizer terms, the costliest to evaluate, run on few plans (most of a geometry's plans are slower
    than its best before those terms are added)."""
    floor = est.model.t_iter_floor(part)
    order, rnd = probe_rounds(floor, owner)
    bar = np.full(int(owner[-1]) + 1, np.inf)
    for r in range(len(PROBE_ROUNDS) + 1):
        probe = np.sort(order[(rnd == r) & np.isinf(bar)[owner[order]]])
        if len(probe) == 0:
            break
        probe, _ = fitting(probe)
        if len(probe):
            ev = est.model.finish(part.take(probe), optimizer)
            np.minimum.at(bar, owner[probe], np.where(ev.oor.reason == None, ev.t_iter, np.inf))  # noqa: E711
    # a geometry left at an infinite bar was probed whole: none of its plans fits and is in range
    return np.nonzero((floor <= bar[owner]) & np.isfinite(bar[owner]))[0]
