"""Communication: TP/CP/EP/DP collectives from the measured tables (busbw invariance across group
sizes, inter-node all-to-all by NIC bytes), the distributed optimizer's DP traffic and the
expert-bias all-reduce; seconds, bytes. The functions take the tables they read and the profile (link
bandwidths, GPUs per node, serial dispatch) as one argument (:class:`~scaleplan.estimator.context.Lookups`,
or the whole :class:`~scaleplan.estimator.context.EvalContext` where they read the plans).

Group sizes outside the measured set of the regime use busbw invariance: nccl-tests busbw of
ring algorithms does not depend on the group size once the bottleneck link is fixed, so
t(n, S) = t(n_ref, S') with S' chosen to keep the per-link bytes (labelled "analytic").

Inter-node all-to-all is not a ring: each rank sends S/n to every peer directly, the bytes to the
m peers on its own node stay on NVLink and the rest, S (n - m) / n, crosses the rank's NIC, which is
the bottleneck. So the invariant is the inter-node bytes per rank: S' (n_ref - m_ref) / n_ref =
S (n - m) / n, with m_ref = the GPUs per node (the table's contiguous groups fill whole nodes).
Busbw invariance would keep S (n - 1) / n instead and under-count a 128-rank all-to-all by
(120/128) / (24/32) = 1.25x against a 32-rank measurement on 8-GPU nodes.

A strided group with ``rails`` > 1 ranks per node (:meth:`ParallelLayout.ranks_per_node`) takes the
strided table's time / rails, bounded below by the contiguous table's time for the same group: each
of those ranks drives its own NIC rail, and NCCL reduces inside the node over NVLink first, so an
inter-node strided group with m ranks per node moves its bytes over m rails."""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from scaleplan.estimator import analytic as an
from scaleplan.estimator.context import EvalContext, Lookups
from scaleplan.estimator.layerwise import Tensors, stage_tensors
from scaleplan.estimator.layout import ParallelLayout, degree_groups
from scaleplan.estimator.model_dims import Geometry
from scaleplan.estimator.optimizer import GRAD_BYTES_COMM, PARAM_BYTES_COMM, dp_collectives, optimizer  # noqa: F401
from scaleplan.estimator.params import dp_stages, stage_params  # noqa: F401  (dp_stages: re-exported)
from scaleplan.estimator.placement import plans_domain
from scaleplan.estimator.shapes import StageCounts, concat_stages, plan_shapes
from scaleplan.estimator.sources import Recorder, _arr, distinct
from scaleplan.estimator.tables import ANALYTIC, LookupResult, Tables
from scaleplan.estimator.topology import latency_floor, step_latency

from scaleplan.stack import PAPER_STACK, Stack

# Megatron distributed-data-parallel bucket: max(40M, 1M x DP) parameters (DistributedDataParallelConfig)
DDP_BUCKET_PARAMS = 40_000_000
P2P_LAT_INTRA_S, P2P_LAT_INTER_S = 10e-6, 25e-6
def dp_buckets(g: Geometry, lay: ParallelLayout, gpn: int, stage: StageCounts | np.ndarray | float = 0.0) -> list[tuple]:
    """The distributed optimizer's two gradient groups on the pipeline stage whose blocks ``stage``
    counts (a :class:`~scaleplan.estimator.shapes.StageCounts` or a stage index; arrays over plans), as
    ``[(params, group, layout, inter_node, n_buckets)]`` (parameters per rank).

    The stage's parameters are :func:`params.stage_params`'s (embedding, LM head and final norm where
    Megatron-Core puts them, the padded vocabulary).
    Dense grads (attention, dense and shared MLPs, router, embedding or LM head, final norm): over the DP x CP
    group of contiguous ranks. Expert grads: over EDP = TP CP DP / (EP ETP) strided ranks, which
    leave the node once ETP EP fills it (:meth:`ParallelLayout.spans_nodes`). Megatron buckets
    max(40M, 1M x group) parameters.
    """
    p = stage_params(g, lay, stage)
    out = []
    for params, group, layout, inter in ((p.dense, lay.dp * lay.cp, "contiguous", lay.spans_nodes("dp_cp", gpn)),
                                         (p.experts, lay.edp, "strided", lay.spans_nodes("edp", gpn))):
        nb = np.maximum(np.ceil(params / np.maximum(DDP_BUCKET_PARAMS, 1e6 * group)), 1)
        out.append((params, group, layout, inter, nb))
    return out


def bias_sync(g: Geometry, lay: ParallelLayout, gpn: int, n_moe_stage: np.ndarray | None = None) -> tuple:
    """The loss-free balancing bias update (eq:bias-update): Megatron-Core stacks the fp32 token counts
    per expert of every MoE layer on the stage and all-reduces them once per step over the TP x CP x DP
    group (``_update_router_expert_bias`` in finalize_model_grads): (1 all-reduce where the stage has
    MoE layers, group, inter_node, bytes = MoE layers on the stage x E x 4); ``n_moe_stage``: the most
    MoE blocks a stage holds (:attr:`PlanShapes.max_moe_per_stage`, computed unless given), whose all-reduce
    the step waits for."""
    if n_moe_stage is None:
        n_moe_stage = plan_shapes(g, lay, 1).max_moe_per_stage
    n_layers = np.asarray(n_moe_stage, dtype=float)  # 0 for a dense model
    _, group = lay.group("tp_cp_dp")
    return np.minimum(n_layers, 1.0), group, lay.spans_nodes("tp_cp_dp", gpn), 4 * g.E * n_layers


def _warn_off_grid(rec: Recorder, comp: str, coll: str, layout: str, inter: bool, g_lo: float, g_hi: float,
                   by_nic_bytes: bool, where: np.ndarray) -> None:
    """Say that group sizes outside a table's measured ones were mapped by an invariance (for the
    plans in ``where``: mosaic/evidence.py reads it as extrapolation to more ranks)."""
    how = "inter-node bytes per rank" if by_nic_bytes else "busbw"
    msg = (f"{comp}: {coll} group sizes outside the measured {int(g_lo)}..{int(g_hi)} "
           f"({layout}, {'inter' if inter else 'intra'}-node) use {how} invariance (labelled analytic)")
    rec.warn(msg, where)


def collective_time(lk: Lookups, comp: str, coll: str, n: ArrayLike, size: ArrayLike, inter: ArrayLike,
                    layout: str = 'contiguous', *, active: ArrayLike = True,
                    per_node: ArrayLike | None = None, small_analytic: bool = False,
                    rails: ArrayLike | None = None, ring_floor: bool = True) -> np.ndarray:
    """Seconds (shape (P,)) of collective ``coll`` on groups of ``n`` ranks moving ``size`` bytes per
    rank, for component ``comp``, from the table of the regime (:meth:`Tables.collective`: coll, layout,
    inter-node) of ``lk``; the analytic ring formula where unmeasured (labelled analytic), at the profile's
    link bandwidths. Group sizes outside the measured ones: busbw invariance, or the
    inter-node bytes per rank for an inter-node all-to-all (``per_node`` given: its ranks per node);
    ``rails``: a strided group's ranks per node (:func:`_multi_rail`). ``active``: plans where it runs
    (else 0). ``small_analytic``: messages below the measured sizes take the analytic time. ``ring_floor``:
    groups beyond the largest measured one held to the ring's (or tree's) latency floor (off for a caller
    that counts the added hops itself). Why each invariance: the module docstring."""
    if rails is not None and layout == "strided":
        return _multi_rail(lk, comp, coll, n, size, inter, active, per_node, small_analytic, rails, ring_floor)
    tb, prof, rec, P = lk.tables, lk.profile, lk.rec, lk.P
    n = _arr(n, P)
    size = _arr(size, P)
    inter = np.broadcast_to(np.asarray(inter, dtype=bool), (P,))
    active = np.broadcast_to(np.asarray(active, dtype=bool), (P,)) & (n > 1)
    out = np.zeros(P)
    bw = np.where(inter, prof.scaleout_bandwidth, prof.scaleup_bandwidth)
    ana = an.collective_time(coll, n, size, np.maximum(bw, 1.0), inter)
    if coll == "all_to_all" and per_node is not None:  # across domains, the bytes that leave on the NICs
        ana = np.where(inter, an.all_to_all_across(n, _arr(per_node, P), size, max(prof.scaleout_bandwidth, 1.0),
                                                   max(prof.scaleup_bandwidth, 1.0)), ana)
    for flag in (False, True):
        sel = active & (inter == flag)
        if not sel.any():
            continue
        tab = tb.collective(coll, layout, flag, n[sel], size[sel])
        if tab is None and layout == "strided":
            tab = tb.collective(coll, "contiguous", flag, n[sel], size[sel])
        if tab is None:
            out[sel] = ana[sel]
            rec.mark(comp, np.where(sel, ANALYTIC, 0))
            continue
        g_lo, g_hi = tab.groups[0], tab.groups[-1]
        nref = np.clip(n, g_lo, g_hi)
        if flag and coll == "all_to_all" and per_node is not None:
            m = np.minimum(np.broadcast_to(np.asarray(per_node, dtype=float), (P,)), n)
            m_ref = np.minimum(float(prof.scaleup_domain), nref)
            s_ref = size * ((n - m) / n) / np.maximum((nref - m_ref) / nref, 1e-9)
        else:
            # busbw invariance across group sizes: keep bytes per link, factor(n) S / busbw
            s_ref = size * an.bus_factor(coll, n) / np.maximum(an.bus_factor(coll, nref), 1e-9)
        t, lo, hi, exact = tab.time(nref, s_ref)
        below = s_ref < lo * (1 - 1e-9)
        if small_analytic:  # latency-bound messages under the measured range: the analytic time
            t = np.where(below, ana, t)
            rec.mark(comp, np.where(below & sel, ANALYTIC, 0))
        oor_s = (below & (not small_analytic)) | (s_ref > hi * (1 + 1e-9))
        res = LookupResult(tab.name, ("size_bytes",), t, np.where(exact, 0, 1).astype(np.int8),
                           np.where(oor_s, 0, -1).astype(np.int16), s_ref, lo, hi,
                           np.where(below, t, tab.composed(nref, s_ref)))
        tt = rec.use(comp, res, sel)
        out[sel] = tt[sel]
        _off_grid(rec, comp, coll, layout, flag, tab, n, sel, out, flag and coll == "all_to_all"
                  and per_node is not None, ring_floor)
    return out


def _off_grid(rec: Recorder, comp: str, coll: str, layout: str, inter: bool, tab, n: np.ndarray, sel: np.ndarray,
              out: np.ndarray, by_nic_bytes: bool, ring_floor: bool = True) -> None:
    """Plans in ``sel`` whose group size ``n`` lies outside the table's measured ones: labelled analytic and
    extrapolated, with a warning; beyond the largest, ``out`` held to the ring's (or tree's) latency floor
    (estimator/topology.py)."""
    g_lo, g_hi = tab.groups[0], tab.groups[-1]
    above = sel & (n > g_hi)
    if ring_floor and above.any():
        out[above] = np.maximum(out[above], _beyond_floor(rec, comp, coll, tab, n, above)[above])
    off_grid = sel & ((n < g_lo) | (n > g_hi))
    if off_grid.any():
        rec.mark(comp, np.where(off_grid, ANALYTIC, 0))
        rec.mark_extrapolated(comp, off_grid)
        _warn_off_grid(rec, comp, coll, layout, inter, g_lo, g_hi, by_nic_bytes, off_grid)


def _beyond_floor(rec: Recorder, comp: str, coll: str, tab, n: np.ndarray, where: np.ndarray) -> np.ndarray:
    """The latency floor of ``coll`` on ``n`` ranks (the plans in ``where``) beyond the table's largest measured
    group: its smallest message's time there plus the table's own per-step latency for each added ring step,
    an all-reduce's tree where fewer (estimator/topology.py); the algorithm is noted per plan."""
    times = [np.exp(lt) for lt in getattr(tab, "log_t", ())]
    alpha = step_latency(tab.groups, tab.sizes, times, coll) if times else None
    if alpha is None:  # not identified by the table's curves: busbw invariance alone
        return np.zeros(rec.P)
    floor, algo = latency_floor(coll, n, tab.groups[-1], float(times[-1][0]), alpha)
    for a in sorted(set(algo[where].tolist())):
        rec.note(f"{comp}: {coll} beyond the measured {int(tab.groups[-1])} ranks: busbw invariance for the "
                 f"bandwidth, the {a}'s latency over its added steps (estimator/topology.py)", where & (algo == a))
    return floor


def _multi_rail(lk: Lookups, comp: str, coll: str, n, size, inter, active, per_node, small_analytic: bool,
                rails, ring_floor: bool = True) -> np.ndarray:
    """A strided group on ``rails`` ranks per node: the strided table's time / rails, never below
    the contiguous table's (:func:`collective_time`)."""
    t1 = collective_time(lk, comp, coll, n, size, inter, "strided", active=active, per_node=per_node,
                         small_analytic=small_analytic, ring_floor=ring_floor)
    m = np.broadcast_to(np.asarray(rails, dtype=float), (lk.P,))
    multi = np.asarray(inter, dtype=bool) & (m > 1)
    if not multi.any():
        return t1
    tc = collective_time(lk, comp, coll, n, size, inter, "contiguous", active=np.asarray(active) & multi,
                         per_node=per_node, small_analytic=small_analytic, ring_floor=ring_floor)
    return np.where(multi, np.maximum(t1 / m, tc), t1)


def dp_comm_time(ctx: EvalContext, w_fwd: ArrayLike, w_bwd: ArrayLike, optimizer_name: str = 'adamw',
                 degrees: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Exposed data-parallel traffic per iteration (seconds, shape (P,)): the most any pipeline
    stage leaves exposed (:func:`dp_stages`); groups and buckets: :func:`dp_buckets`; each
    collective's time: :func:`collective_time`.

    adam/adamw/sgd run Megatron's distributed optimizer (ZeRO-1): a bucketed fp32 gradient
    reduce-scatter overlapped with the stage's last backward and a bf16 parameter all-gather
    overlapped with the next first forward; the last bucket of each is always exposed.
    muon/scion (:class:`~scaleplan.estimator.optimizer.Optimizer`) run Megatron-Core's layer-wise distributed
    optimizer: DDP all-reduces the fp32 gradients bucket by bucket during the backward (overlapped like the
    reduce-scatter); after the step, which waits for every stage (the global gradient norm), the
    owners broadcast the updated bf16 parameters one tensor at a time (:func:`_broadcast_loop`,
    estimator/layerwise.py): nothing, not the drain either, hides that; the slowest stage's counts.
    sgd (not sharded) runs plain DDP: the bucketed all-reduce alone.
    On a serial-dispatch profile (a CPU) nothing overlaps: the collective runs on the computing cores.
    ``w_fwd`` / ``w_bwd``: the overlap windows (seconds, shape (P,), or (stages, P) in :func:`dp_stages`'
    order), the wall time of one forward / backward pass of a stage, which a dispatch-bound pass sets by
    its host issue time. What a stage's own passes leave (at least its last bucket) runs on while the
    earlier stages drain, and a ZeRO-1 gather's remainder while they fill the next step; the step waits
    for the stage that leaves the most. ``degrees``: the plans' :func:`~scaleplan.estimator.layout.degree_groups`,
    when the caller has them.
    """
    # the collectives depend on the parallel degrees alone: each distinct tuple is looked up once,
    # for the k stages at once (k U elements); the overlap windows are per plan
    g, lay = ctx.g, ctx.lay
    first, inv = degrees if degrees is not None else degree_groups(g, lay)
    stages = dp_stages(g.take(first), lay.take(first))
    k, U = len(stages), len(first)
    idx = np.arange(k)[:, None] * U + inv[None, :]  # (k, P): plan p's stage-j element
    present, st = np.concatenate([p for p, _ in stages]), concat_stages([c for _, c in stages])
    drain = st.index[idx] / np.asarray(lay.vpp, dtype=float)  # VPP chunks: each stage drains 1/VPP of its pass
    sub = ctx.with_rec(Recorder(k * U, ctx.rec.mode))
    opt = optimizer(optimizer_name)
    ortho = opt.sharded and opt.orthogonalises
    # after the stage's last backward; before its first forward; the layer-wise broadcasts after the step
    tail, fill, bcast = np.zeros((k, ctx.P)), np.zeros((k, ctx.P)), np.zeros((k, ctx.P))
    for rs, ag, nb in _stage_collectives(sub, g.take(np.tile(first, k)), lay.take(np.tile(first, k)), st, present,
                                         optimizer_name, ctx.stack):
        rs, ag, nb = rs[idx], (ag[idx] if ag is not None else 0.0), nb[idx]
        if ctx.serial:
            tail += rs + ag
            continue
        tail += np.maximum(rs - w_bwd, rs / nb)
        bcast, fill = (bcast + ag, fill) if ortho else (bcast, fill + np.maximum(ag - w_fwd, ag / nb))
    ctx.rec.fold(sub.rec, idx)
    if not ctx.serial:  # the drain (fill) of the earlier stages hides what is left after (before) them
        tail, fill = np.maximum(tail - drain * w_bwd, 0.0), np.maximum(fill - drain * w_fwd, 0.0)
    return (tail + fill).max(axis=0) + bcast.max(axis=0)  # an absent stage looked nothing up: 0


def _stage_collectives(lk: Lookups, g: Geometry, lay: ParallelLayout, stage: StageCounts, present: np.ndarray,
                       optimizer_name: str, stack: Stack = PAPER_STACK
                       ) -> list[tuple[np.ndarray, np.ndarray | None, np.ndarray]]:
    """Per gradient group of :func:`dp_buckets` (dense, experts): (gradient-side seconds, parameter-side
    seconds or None for plain DDP, buckets) of the stages ``stage`` of the plans ``lay`` (elements of ``lk``);
    absent stages (not ``present``) look nothing up. The training ``stack`` sets the bytes: gradients
    reduced in fp32 or bf16 (``grads_fp32``), parameters gathered in bf16 or FP8 (``fp8_param``)."""
    opt = optimizer(optimizer_name)
    ortho = opt.sharded and opt.orthogonalises
    nbytes_of = {GRAD_BYTES_COMM: 4 if stack.grads_fp32 else 2,
                 PARAM_BYTES_COMM: 1 if (stack.fp8_param and stack.recipe(g.precision)) else 2}
    colls = tuple((c, nbytes_of.get(b, b)) for c, b in opt.dp_collectives)
    per_tensor = stage_tensors(g, lay, stage) if ortho else (None, None)
    out, gpn = [], plans_domain(lk.profile, lay.n_devices)
    for (params, group, layout, inter, nb), tensors in zip(dp_buckets(g, lay, gpn, stage), per_tensor):
        act = (group > 1) & (params > 0) & present
        rails = lay.ranks_per_node("edp", gpn) if layout == "strided" else None
        # the layer-wise optimizer gathers by one broadcast per tensor (layerwise.py): no all-gather lookup
        t = [nb * collective_time(lk, "dp_comm", coll, group, params / nb * nbytes, inter, layout, active=act,
                                  rails=rails) for coll, nbytes in (colls[:1] if ortho else colls)]
        if ortho:
            t.append(_broadcast_loop(lk, tensors, group, inter, layout, act, rails))
        out.append((t[0], t[1] if len(t) > 1 else None, nb))
    return out


def _broadcast_loop(lk: Lookups, tensors: Tensors, group, inter, layout: str, active, rails) -> np.ndarray:
    """Seconds (shape (P,)) of the layer-wise optimizer's parameter broadcasts over ``group``: one call
    per tensor of ``tensors`` ([(count, elements)], :func:`layerwise.stage_tensors`), bf16, each read
    from the all-gather table at the size that puts the same bytes on every link of the ring
    (S n / (n - 1) for a broadcast of S bytes). The calls are synchronous (``async_op`` False): each makes
    the current stream wait for it and the next starts after the current stream, so the dense group's
    and the expert group's loops add, though they run on two communicators' streams (the caller sums
    them). Most of these calls are latency-bound, so two rules of
    the bandwidth-bound lookup change: a tensor whose ring-equivalent size is below the table's smallest
    message is read at that message's ring-equivalent size (smallest x n / (n - 1): the measured latency
    floor, as the collectives' compose rule has it below the range), and a
    ring longer than the largest measured inter-node group adds the measured latency per extra rank
    (:func:`_ring_hop_latency`: NCCL broadcasts along a ring, one hop per rank, strided groups too), where
    busbw invariance would keep the largest group's time (collective_time's own floor is off: the hops are
    counted here). Without a table: the analytic time."""
    tb = lk.tables
    n = np.asarray(group, dtype=float)
    per_link = n / np.maximum(n - 1, 1)
    floor = np.where(inter, _smallest_size(tb, layout, True), _smallest_size(tb, layout, False)) * per_link
    g_hi, hop = _ring_hop_latency(tb)
    longer = np.where(inter, np.maximum(n - g_hi, 0.0) * hop, 0.0)
    total = np.zeros(lk.P)
    for count, numel in tensors:
        on = active & (count > 0)
        if np.any(on):
            size = np.maximum(numel * PARAM_BYTES_COMM * per_link, floor)
            t = collective_time(lk, "dp_comm", "all_gather", group, size, inter, layout, active=on,
                                small_analytic=True, rails=rails, ring_floor=False)
            total += count * (t + np.where(on, longer, 0.0))
    return total


def _ring_hop_latency(tb: Tables) -> tuple[float, float]:
    """(largest measured group, seconds per added rank) of the inter-node contiguous all-gather at its
    smallest message: the growth of the latency floor between the two largest measured groups (about
    11 us per rank from 16 to 32 ranks on the recorded B200 tables); (inf, 0) with fewer than two
    (or none measured: a recording view)."""
    tab = _gather_table(tb, "contiguous", True)
    if tab is None or len(tab.groups) < 2 or not hasattr(tab, "log_t"):
        return np.inf, 0.0
    (g0, g1), (t0, t1) = tab.groups[-2:], (float(np.exp(lt[0])) for lt in tab.log_t[-2:])
    return float(g1), max((t1 - t0) / (g1 - g0), 0.0)


def _smallest_size(tb: Tables, layout: str, inter: bool) -> float:
    """The smallest message (bytes) the all-gather tables of a regime measure (the strided regime falls
    back to the contiguous one, as :func:`collective_time` does); 0 where none is measured."""
    tab = _gather_table(tb, layout, inter) or _gather_table(tb, "contiguous", inter)
    sizes = getattr(tab, "sizes", None)  # a recording view's table has none: the sizes asked are recorded
    return float(min(s[0] for s in sizes)) if sizes else 0.0


def _gather_table(tb: Tables, layout: str, inter: bool):
    """The all-gather table of a regime, or None, read without a request (a recording view,
    :class:`~scaleplan.estimator.lookup_listing.RecordingTables`, lists only the lookups collective_time makes)."""
    return getattr(tb, "collectives", {}).get(("all_gather", layout, bool(inter)))


def bias_sync_time(ctx: EvalContext, degrees: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """The expert-bias token-count all-reduce of one step (:func:`bias_sync`), exposed: it runs
    between the backward and the optimizer step. A few kB: below a GPU table's measured sizes this
    is the analytic latency-bound ring time (labelled analytic). Seconds, shape (P,).

    It depends on the geometry, (TP, CP, PP, DP) and the MoE blocks per stage alone (a few per geometry
    against thousands of plans): each distinct tuple is evaluated once and handed to its plans
    (:meth:`Recorder.fold`); found among ``degrees`` (:func:`~scaleplan.estimator.layout.degree_groups`,
    finer) when the caller has them."""
    g, lay = ctx.g, ctx.lay
    first, inv = degrees if degrees is not None else degree_groups(g, lay)
    n_moe = ctx.shapes.max_moe_per_stage
    f2, i2 = distinct(*(c[first] for c in (*g.batch_keys, lay.tp, lay.cp, lay.pp, lay.dp, n_moe)))
    first, inv = first[f2], i2[inv]
    sub = ctx.with_rec(Recorder(len(first), ctx.rec.mode))
    g1, lay1 = g.take(first), lay.take(first)
    n_layers, group, inter, size = bias_sync(g1, lay1, ctx.gpn, n_moe[first])
    act = (n_layers > 0) & (group > 1)
    t = n_layers * collective_time(sub, "bias_sync", "all_reduce", group, size, inter, "contiguous", active=act,
                                   small_analytic=True)
    ctx.rec.fold(sub.rec, inv)
    return np.broadcast_to(t, (len(first),))[inv]
