"""The iteration-time model (paper sec:iteration-time-model), vectorised over plans: :class:`TimeModel`
composes, per plan, the per-layer kernel times (:mod:`kernels`), each pipeline stage's work from the blocks
the shapes record counts on it (:mod:`stages`), the 1F1B periods (:mod:`pipeline`), the PP exchanges, the DP
traffic and the optimizer step (:mod:`comm`, :mod:`optimizer`) into an :class:`~iteration.IterationTime`,
then t_iter = chi_sys t_analytic (eq:cal-iter, eq:desync).

Per pipeline stage and micro-batch, t_mb = max(t_GPU, t_disp) + t_A2A + t_LM-head-fwd
(:func:`pipeline.stage_periods` says why the all-to-all and the loss's forward sit outside the dispatch
max); the slowest stage sets the 1F1B period, and each fill and drain slot lasts one such period (the
paper's eq:bubble and t_vocab ramp term, fitted: :mod:`pipeline`). Where the model departs from
the paper's equations and why: docs/accuracy.md. The tables every lookup reads are an argument of
:meth:`TimeModel.evaluate`, never state; a recording view of them
(:class:`lookup_listing.RecordingTables`) lists what an evaluation looks up.

Units: seconds, bytes, FLOP/s. Arrays: one element per plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass, replace

import numpy as np
from scaleplan.estimator import analytic as an
from scaleplan.estimator.ckpt import recompute, recomputes_block
from scaleplan.estimator.comm import (  # noqa: F401  (re-exported: the model's public names)
    DDP_BUCKET_PARAMS,
    P2P_LAT_INTER_S,
    P2P_LAT_INTRA_S,
    bias_sync,
    bias_sync_time,
    dp_buckets,
    dp_comm_time,
)
from scaleplan.estimator.compute import measured_host_times
from scaleplan.estimator.context import EvalContext
from scaleplan.estimator.desync import ChiCoefficients, chi_sys, desync_features  # noqa: F401
from scaleplan.estimator.dispatch import (  # noqa: F401
    COSTED_KERNELS_PER_FWD,
    KAPPA0_DEFAULT,
    KAPPA1_DEFAULT,
    STACKS,
    T_GAP_DEFAULT_S,
    T_HOST_DEFAULT_S,
    DispatchLaw,
    dispatch_time,
)
from scaleplan.estimator.ep_overlap import with_overlapped_a2a
from scaleplan.estimator.exchanges import critical_exchanges
from scaleplan.estimator.kernel_counts import framework_delta
from scaleplan.estimator.iteration import TERMS, IterationTime, layer_terms
from scaleplan.estimator.kernels import LayerKernels, layer_kernels
from scaleplan.estimator.layout import ParallelLayout, degree_groups
from scaleplan.estimator.model_dims import Geometry
from scaleplan.estimator.optimizer import optimizer as optimizer_spec
from scaleplan.estimator.optimizer import slowest_step
from scaleplan.estimator.pipeline import (  # noqa: F401
    Middle,
    StagePeriods,
    StageWork,
    Vocab,
    bubble_fraction,
    pipeline_time,
    stage_periods,
)
from scaleplan.estimator.params import dp_stages
from scaleplan.estimator.shapes import PlanShapes, StageCounts, plan_shapes
from scaleplan.estimator.sources import OOR, Recorder
from scaleplan.estimator.stages import (
    LayerTotals,
    PipelineWork,
    dp_windows,
    layer_totals,
    pipeline_work,
    stage_dispatch,
)
from scaleplan.estimator.table_build import te_attention_backend
from scaleplan.estimator.tables import ANALYTIC, COMPOSED, EXTRAPOLATE_MODES, MEASURED, Tables

from scaleplan.profiles import COMPUTE_CAPABILITY, ClusterProfile, gpu_model
from scaleplan.stack import PAPER_STACK, Stack, stack_from_key


@dataclass
class Evaluation:
    """Per-plan results (arrays of length P)."""

    plans: ParallelLayout
    n_mb: np.ndarray
    time: IterationTime                 # seconds per iteration per term; time.total is t_analytic
    sources: dict[str, np.ndarray]      # int8 source codes per component
    t_analytic: np.ndarray
    chi: np.ndarray
    t_iter: np.ndarray
    t_a2a: np.ndarray
    ep_nodes: np.ndarray
    pp_nodes: np.ndarray
    deep_pp_in_node: np.ndarray
    mfu: np.ndarray
    mfu_validation: np.ndarray  # MFU in the published validation sweeps' FLOP count (Geometry.n_mfu_validation)
    hfu: np.ndarray
    n_clamped: np.ndarray
    oor: OOR
    warnings: list[str] = field(default_factory=list)
    notes: dict[str, np.ndarray] = field(default_factory=dict)  # message -> bool mask over plans
    composed_share: np.ndarray | None = None  # fraction of t_analytic from composed lookups
    warned: dict[str, np.ndarray] = field(default_factory=dict)  # each of ``warnings`` -> the plans that raised it
    # component -> plans whose collective of it was read at an unmeasured group size (Recorder.extrapolated)
    extrapolated: dict[str, np.ndarray] = field(default_factory=dict)
    shapes: PlanShapes | None = None  # the plans' per-rank shapes the evaluation read

    @property
    def components(self) -> dict[str, np.ndarray]:
        """{term: seconds per iteration}, summing to t_analytic (:meth:`IterationTime.as_dict`)."""
        return self.time.as_dict()

    def t_iter_with(self, c: ChiCoefficients) -> np.ndarray:
        """Seconds per iteration of every plan under other eq:desync coefficients ``c``: chi multiplies
        t_analytic and reads only the placement features kept here, so a fit of ``c`` needs no new
        evaluation (the same arithmetic as :meth:`TimeModel.evaluate`'s own t_iter)."""
        return chi_sys(c, self.t_a2a, self.t_analytic, self.ep_nodes, self.pp_nodes - 1,
                       self.deep_pp_in_node) * self.t_analytic


@dataclass(frozen=True)
class Pipelined:
    """The first half of an evaluation over P plans (:meth:`TimeModel.pipelined`): its context (with the
    lookup record so far), the global batch, the per-layer kernels, their per-block totals, each stage's work
    and the 1F1B periods (arrays over plans), and the optimizer step's host seconds."""

    ctx: EvalContext
    gbs: int
    k: LayerKernels
    lt: LayerTotals
    w: PipelineWork
    st: StagePeriods
    t_step_host: np.ndarray

    def take(self, idx: np.ndarray) -> Pipelined:
        """The plans at ``idx`` (int indices), their record so far with them (:meth:`Recorder.take`): what
        :meth:`TimeModel.finish` gives for them is what it gives for them among all the plans."""
        P = self.ctx.P
        return Pipelined(self.ctx.take(idx, self.ctx.rec.take(idx)), self.gbs,
                         *(_take_plans(x, idx, P) for x in (self.k, self.lt, self.w, self.st, self.t_step_host)))


def _chunk_forward(part: Pipelined) -> np.ndarray:
    """The forward GPU seconds per micro-batch of the smaller end stage's virtual chunk (shape (P,)), its blocks
    (the shapes record's ``chunk_layers``) each at a block's forward (:class:`~scaleplan.estimator.stages.LayerTotals`:
    an MoE block's in an MoE model): what an overlapped interleaved exchange hides under."""
    sh, lt = part.ctx.shapes, part.lt
    return np.minimum(sh.first.chunk_layers, sh.last.chunk_layers) * (lt.moe_f if part.ctx.g.is_moe else lt.dense_f)


def _take_plans(x, idx: np.ndarray, P: int):
    """``x`` at the plans ``idx``: an array over the P plans gathered, a dataclass field by field, a scalar
    (one value for every plan) kept. Raises ValueError on an array of any other shape (it would be
    ambiguous)."""
    if is_dataclass(x):
        return replace(x, **{f.name: _take_plans(getattr(x, f.name), idx, P) for f in fields(x)})
    if isinstance(x, np.ndarray) and x.ndim > 0:
        if x.shape != (P,):
            raise ValueError(f"a per-plan array of shape {x.shape}: expected ({P},)")
        return x[idx]
    return x


class TimeModel:
    """Evaluate eq:mfu for arrays of plans of one geometry on one profile.

    Args:
        profile: the hardware profile (peaks, HBM bandwidth, link bandwidths, GPUs per node).
        tables: measured tables (components without a table fall back to :mod:`analytic`).
        extrapolate: "compose" | "error" | "clamp": what an out-of-range lookup becomes (:class:`Recorder`).
        dispatch: the dispatch law (kappa0, kappa1, t_gap, t_host).
        chi: eq:desync coefficients (zeros: chi_sys = 1).
        kernel_scale: multiplies every device-kernel time (GEMM, grouped GEMM, SDPA, router,
            element-wise, vocabulary, optimizer, framework kernels), never collectives or host time:
            an isolated microbenchmark runs with warm caches that a real step does not give it. 1
            unless ``calibrate fit --kind dispatch --from-runs`` fitted it (calibrate/run_scales.py).
        stack: the software stack whose host dispatch is predicted (:data:`STACKS`): "megatron" (the
            kernel-count law on a GPU profile; ``ops:*`` rows used only on a serial-dispatch profile)
            or "reference" (scaleplan's own reference model, ``scaleplan validate``: the measured
            ``ops:*`` rows on every profile, :func:`compute.measured_host_times`). Raises ValueError otherwise.
    """

    def __init__(self, profile: ClusterProfile, tables: Tables, extrapolate: str, dispatch: DispatchLaw,
                 chi: ChiCoefficients, kernel_scale: float = 1.0, stack: str = "megatron"):
        if extrapolate not in EXTRAPOLATE_MODES:
            raise ValueError(f"extrapolate: got {extrapolate!r}; one of {', '.join(EXTRAPOLATE_MODES)}")
        if stack not in STACKS:
            raise ValueError(f"stack: got {stack!r}; one of {', '.join(STACKS)}")
        self.prof, self.mode, self.disp, self.chi_c = profile, extrapolate, dispatch, chi
        # Megatron-Core's attention is Transformer Engine's, which picks its SDPA backend by GPU generation; the
        # reference model runs PyTorch's SDPA (the tables' default backend)
        cc = COMPUTE_CAPABILITY.get(gpu_model(profile.gpu_name))
        self.sdpa_pick = te_attention_backend(tables.sdpa_backends, cc) if stack == "megatron" else None
        self.tables = tables.with_sdpa_backend(self.sdpa_pick)
        self.kernel_scale = float(kernel_scale)
        self.serial = bool(getattr(profile, "serial_dispatch", False))
        # the host time of the reference model's own ops (measured rows) replaces the Megatron law
        self.measured_host = self.serial or stack == "reference"
        # every framework kernel (counted by kappa, not costed individually) occupies the GPU at least
        # this long: the measured GPU-active time of the smallest chained kernel, else the analytic floor
        self.t_kernel_min = tables.t_kernel_min_s or an.KERNEL_FLOOR_S

    def evaluate(self, g: Geometry, lay: ParallelLayout, gbs: int, seqlen: int, optimizer: str,
                 tables: Tables | None = None, shapes: PlanShapes | None = None,
                 stack: Stack = PAPER_STACK) -> Evaluation:
        """Evaluate every plan of ``lay`` (arrays of length P): the terms of :class:`IterationTime`, chi_sys,
        t_iter, MFU and HFU. ``tables``: what the lookups read (default: this model's tables); either way
        their view in the spec's precision (:meth:`Tables.view`). ``shapes``: the plans' shapes when the
        caller has them (:func:`~scaleplan.estimator.shapes.plan_shapes` at ``seqlen`` and ``gbs``).
        ``stack``: the training stack the plans run on (scaleplan/stack.py)."""
        return self.finish(self.pipelined(g, lay, gbs, seqlen, tables, shapes, stack), optimizer)

    def pipelined(self, g: Geometry, lay: ParallelLayout, gbs: int, seqlen: int, tables: Tables | None = None,
                  shapes: PlanShapes | None = None, stack: Stack = PAPER_STACK) -> Pipelined:
        """The first half of :meth:`evaluate` (arguments as there): the per-layer kernels, each stage's work
        and the 1F1B periods, everything but the DP traffic, the expert-bias all-reduce and the optimizer
        step (:meth:`finish` adds them)."""
        ctx = self.context(g, lay, seqlen, gbs, tables, shapes, stack)
        k = layer_kernels(ctx)
        if stack.a2a_overlap and g.is_moe:  # the merged 1F1B passes hide the exchanges (estimator/ep_overlap.py)
            wire = k.a2a_f + k.a2a_b
            k = with_overlapped_a2a(k, lay.pp, lay.vpp, ctx.shapes.n_mb)
            ctx.rec.note("ep_a2a: the exposed part of the all-to-all under --overlap-moe-expert-parallel-comm "
                         "(stack.a2a_overlap), the rest hidden under another micro-batch's compute",
                         (wire > 0) & (k.a2a_f + k.a2a_b < wire))
        lt = layer_totals(k, lay.ckpt, self._framework_kernels(ctx), g.is_moe, stack.overlaps_shared_expert(),
                          stack.recompute_modules, bool(np.any(g.is_mla)))
        w, t_step_host = self._stage_work(ctx, k, lt)
        return Pipelined(ctx, gbs, k, lt, w, self._periods(ctx, k, w), t_step_host)

    def t_iter_floor(self, part: Pipelined) -> np.ndarray:
        """A lower bound of :meth:`finish`'s t_iter per plan of ``part`` (seconds, shape (P,)): the terms
        of t_analytic but the last three (the DP traffic, the expert-bias all-reduce and the optimizer step,
        each >= 0), in closed form: the layer terms add up to n_mb t_cmp (:func:`~iteration.layer_terms`), so
        with the dispatch floor, bubble and vocabulary terms they are n_mb period + ramp / VPP, and the PP
        exchanges add. Then eq:desync, whose chi_sys t is A t + c_a2a t_A2A with the same A: increasing in t
        while A >= 0 (-inf, no bound, where a fitted A is negative). Scaled down by 1e-9, far more than
        the rounding of either sum, so that it never exceeds the t_iter it bounds. The search skips the
        plans that cannot be their geometry's best with it (``best_plans._candidates``)."""
        ctx, st = part.ctx, part.st
        t_part = (ctx.shapes.n_mb * st.period + st.ramp / np.asarray(ctx.lay.vpp, dtype=float)
                  + self._pp_p2p(ctx, part.k, _chunk_forward(part)))
        ep_nodes, pp_hops, deep, t_a2a_wire = self._desync_inputs(part)
        c = self.chi_c
        slope = 1.0 + c.c_level + c.c_pp * pp_hops + c.c_ovl * deep
        floor = slope * t_part + c.c_a2a * t_a2a_wire * (ep_nodes > 1)
        return np.where(slope >= 0, floor * (1.0 - 1e-9), -np.inf)

    def finish(self, part: Pipelined, optimizer: str) -> Evaluation:
        """:meth:`evaluate` of the plans of ``part`` (:meth:`pipelined`, or a :meth:`Pipelined.take` of it):
        the DP traffic, the expert-bias all-reduce and the optimizer step added, then eq:cal-iter and
        eq:desync."""
        ctx = part.ctx
        g, lay, rec, sh, stack = ctx.g, ctx.lay, ctx.rec, ctx.shapes, ctx.stack
        deg = degree_groups(g, lay)  # shared by the DP traffic, the optimizer step and the bias all-reduce
        t_dp, t_opt = self._dp_and_optimizer(part, optimizer, deg)
        it = self._iteration(part, t_dp, t_opt, deg)
        if not self.serial:
            rec.mark("dispatch_floor", 0)
        rec.mark("bubble", rec.src.get("dispatch_floor", 0))
        t_an = it.total
        # the share of the predicted time whose term read a composed (out-of-range) lookup
        composed_share = sum(np.where(rec.src.get(name, 0) == COMPOSED, getattr(it, name), 0.0)
                             for name in TERMS) / t_an
        ep_nodes, pp_hops, deep, t_a2a_wire = self._desync_inputs(part)
        chi = chi_sys(self.chi_c, t_a2a_wire, t_an, ep_nodes, pp_hops, deep)
        t_iter = chi * t_an
        mfu, mfu_val, hfu = self._utilization(g, lay, part.gbs, ctx.seqlen, t_iter, stack.recompute_modules)
        return Evaluation(lay, sh.n_mb, it, rec.src, t_an, chi, t_iter, t_a2a_wire, ep_nodes.astype(int),
                          (pp_hops + 1).astype(int), deep, mfu, mfu_val, hfu, rec.n_clamped, rec.oor, rec.warnings,
                          rec.notes, composed_share, rec.warned, rec.extrapolated, sh)

    def _iteration(self, part: Pipelined, t_dp: np.ndarray, t_opt: np.ndarray,
                   deg: tuple[np.ndarray, np.ndarray]) -> IterationTime:
        """The terms of t_analytic (eq:cal-iter) from the pipelined work, the DP and optimizer seconds and the
        expert-bias all-reduce of the plans' :func:`~scaleplan.estimator.layout.degree_groups` ``deg``."""
        ctx, k, w, st = part.ctx, part.k, part.w, part.st
        g, stack, n_mb, ckc = ctx.g, ctx.stack, ctx.shapes.n_mb, ctx.lay.ckpt
        vpp = np.asarray(ctx.lay.vpp, dtype=float)
        return IterationTime(
            **layer_terms(k, part.lt.fw, n_mb, w.slowest_layers, w.slowest_moe if g.is_moe else 0.0, ckc, g.is_moe,
                          stack.overlaps_shared_expert(), stack.recompute_modules, bool(np.any(g.is_mla))),
            dispatch_floor=n_mb * (st.period_disp - w.t_cmp),
            bubble=st.ramp_disp / vpp,
            vocab=n_mb * (st.period - st.period_disp) + (st.ramp - st.ramp_disp) / vpp,
            pp_p2p=self._pp_p2p(ctx, k, _chunk_forward(part)), dp_comm=t_dp,
            bias_sync=bias_sync_time(ctx, deg), optimizer=t_opt)

    def _desync_inputs(self, part: Pipelined) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """eq:desync's placement features of Megatron's rank order (:func:`desync_features`: EP nodes,
        inter-node PP hops, deep pipeline in one node) and the step's all-to-all wire seconds."""
        ctx, k, w = part.ctx, part.k, part.w
        ep_nodes, pp_hops, deep = desync_features(ctx.lay, ctx.gpn)
        rc = recompute(ctx.lay.ckpt, ctx.stack.recompute_modules)
        rc = rc.block + rc.moe  # the forward exchange runs again when the whole MoE block is re-run
        t_a2a_wire = (ctx.shapes.n_mb * w.slowest_moe * (k.a2a_f * (1 + rc) + k.a2a_b) if ctx.g.is_moe
                      else np.zeros(ctx.P))
        return ep_nodes, pp_hops, deep, t_a2a_wire

    def context(self, g: Geometry, lay: ParallelLayout, seqlen: int, gbs: int | None = None,
                tables: Tables | None = None, shapes: PlanShapes | None = None,
                stack: Stack = PAPER_STACK) -> EvalContext:
        """The :class:`EvalContext` an evaluation of the plans ``lay`` of model ``g`` reads: this model's
        tables (or ``tables``) in the spec precision, its profile, a fresh record in its extrapolation mode,
        the plans' shapes (computed unless given) and its kernel scale."""
        base = self.tables if tables is None else tables.with_sdpa_backend(self.sdpa_pick)
        lane = an.gemm_lane_ratio(self.prof, g.precision)
        tb = base.view(g.precision, lane)
        sh = shapes if shapes is not None else plan_shapes(g, lay, seqlen, gbs)
        rec = Recorder(len(lay), self.mode)
        if base.lane_scaled(g.precision, lane):
            rec.note(f"gemm in {g.precision}: the bf16 GEMM table x {lane:.3g}, the bf16 / {g.precision} "
                     f"peak (no measured {g.precision} rows)")
        elif g.precision != "bf16" and getattr(tb.gemm, "label", None) == COMPOSED:
            rec.note(f"gemm in {g.precision}: {tb.gemm.name} (same die; no measured {g.precision} rows of this GPU)")
        return EvalContext(tb, self.prof, rec, g, lay, sh, seqlen, self.kernel_scale, stack)

    # -- evaluate's steps, in the order it runs them ---------------------------------------------
    def _framework_kernels(self, ctx: EvalContext) -> np.ndarray:
        """Seconds per layer and micro-batch (fwd + bwd + recompute) of the kernels kappa0 counts
        but no table costs; zero where measured host rows are used."""
        ckc = ctx.lay.ckpt
        # framework kernels (permutation copies, casts, router bookkeeping, bias-adds...) counted in
        # kappa0 but not costed one by one: each occupies the GPU for at least t_kernel_min.
        # With measured host rows none is charged: on a CPU these ops are host work (in the dispatch
        # term); for the reference stack on a GPU, kappa0 counts Megatron's kernels, not the reference
        # model's, and the ops:* rows hold host seconds, not kernel counts (their op counts include views
        # that launch nothing); each small op's kernel is shorter than its launch, so the host term that
        # takes the max with the GPU time (stage_periods) already bounds what they add
        if self.measured_host:
            ctx.rec.mark("framework_kernels", np.zeros(ctx.P, np.int8))
            return np.zeros(ctx.P)
        kappa0 = self.disp.kappa0
        if ctx.g.is_moe and ctx.stack.key(ctx.g.precision) != self.disp.kappa_stack:  # fused kernels run fewer
            kappa0 = kappa0 + framework_delta(ctx.stack, stack_from_key(self.disp.kappa_stack), ctx.shapes.E_loc,
                                              ctx.lay.ep, ctx.g.precision, kappa0)
        n_fw = recompute(ckc, ctx.stack.recompute_modules).units * np.maximum(kappa0 / 4.0 - COSTED_KERNELS_PER_FWD, 0.0)
        ctx.rec.mark("framework_kernels", MEASURED if ctx.tables.t_kernel_min_s else ANALYTIC)
        return n_fw * self.t_kernel_min * self.kernel_scale

    def _stage_work(self, ctx: EvalContext, k: LayerKernels, lt: LayerTotals) -> tuple[PipelineWork, np.ndarray]:
        """Each stage's work per micro-batch (:func:`stages.pipeline_work`) with its host dispatch (the
        kernel-count law, or the reference model's measured host rows), and the optimizer step's host seconds."""
        sh, seen, disp = ctx.shapes, {}, {}
        for n in ("first", "middle_lo", "middle_hi", "middle", "last"):
            st = getattr(sh, n)  # once per distinct blocks (StageCounts.blocks)
            if st.blocks not in seen:
                seen[st.blocks] = self._dispatch(ctx, st)[0]
            disp[n] = seen[st.blocks]
        t_step_host = self._dispatch(ctx, sh.first)[1] if self.measured_host else np.zeros(ctx.P)
        return pipeline_work(ctx, lt, disp), t_step_host

    def _dispatch(self, ctx: EvalContext, st: StageCounts) -> tuple[np.ndarray, np.ndarray | None]:
        """(host seconds to launch one micro-batch of stage ``st``, the optimizer step's host seconds or None):
        the kernel-count law, or the reference model's measured host rows where the model reads them."""
        law = stage_dispatch(ctx, self.disp, st)
        return measured_host_times(ctx, st, law) if self.measured_host else (law, None)

    def _periods(self, ctx: EvalContext, k: LayerKernels, w: PipelineWork) -> StagePeriods:
        """The 1F1B stage periods (:func:`pipeline.stage_periods`) of the stages' work ``w``."""
        # full recompute of an MoE block re-runs its dispatcher's host sync at the start of the last block's
        # backward: the LM head's backward, issued just before, is exposed (pipeline.stage_periods)
        x_lb = k.t_last_b * recomputes_block(ctx.lay.ckpt) if ctx.g.is_moe and not self.serial else 0.0
        vocab = Vocab(k.t_first, k.t_last_f, k.t_last_b - x_lb, x_lb, ctx.stack.nan_check)
        return stage_periods(ctx.lay.pp, w.first, w.middle, w.last, vocab, self.serial)

    def _pp_p2p(self, ctx: EvalContext, k: LayerKernels, window: np.ndarray) -> np.ndarray:
        """PP send/recv seconds per iteration (0 where PP = 1) that no compute hides; ``window``: the seconds an
        interleaved exchange can hide under (:func:`_chunk_forward`)."""
        lay, g, prof = ctx.lay, ctx.g, self.prof
        pp, vpp, n_mb = lay.pp, lay.vpp, ctx.shapes.n_mb
        # PP send/recv of [T/TP, d] activations (fwd) and grads (bwd); charged at the inter-node cost
        # where every stage boundary leaves the node (one stage per node: ParallelLayout)
        p2p_inter = lay.ranks_per_node("pp", ctx.gpn) <= 1
        p2p_bytes = k.Tsp * g.d * ctx.shapes.b_el
        p2p_bw = np.where(p2p_inter, prof.scaleout_bandwidth, prof.scaleup_bandwidth)
        t_p2p = np.where(p2p_inter, P2P_LAT_INTER_S, P2P_LAT_INTRA_S) + p2p_bytes / np.maximum(p2p_bw, 1.0)
        ctx.rec.mark("pp_p2p", np.where(pp > 1, ANALYTIC, 0))
        # non-interleaved: the blocking exchanges on the 1F1B critical path, once per slot at PP = 2 and
        # twice from PP = 3 (exchanges.critical_exchanges). Interleaved (VPP > 1): a micro-batch crosses each of
        # this rank's VPP chunk boundaries once forward, once backward, each exchange posted before the next
        # chunk's compute and waited on after it (--overlap-p2p-communication: Megatron-LM's default and
        # Megatron-Bridge's at VP > 1; schedules.forward_backward_pipelining_with_interleaving), so only what
        # outlasts that compute shows; the window taken is a chunk's forward, the shorter of its two passes
        n_x = np.where(vpp > 1, 2 * (vpp * n_mb + pp - 1), critical_exchanges(pp, n_mb))
        t_x = np.where(vpp > 1, np.maximum(t_p2p - window, 0.0), t_p2p)
        return np.where(pp > 1, n_x * t_x, 0.0)

    def _dp_and_optimizer(self, part: Pipelined, optimizer: str,
                          deg: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """The exposed DP gradient/parameter traffic and the optimizer step of the plans of ``part``, seconds
        per iteration; ``deg``: the plans' :func:`~scaleplan.estimator.layout.degree_groups`."""
        ctx, k, lt, t_step_host = part.ctx, part.k, part.lt, part.t_step_host
        g, lay = ctx.g, ctx.lay
        # DP: distributed optimizer reduce-scatter (grads) + all-gather (params), bucketed. They hide
        # behind each stage's last micro-batch's backward (and the first forward), on a later pipeline stage
        # also behind the 1F1B drain (comm.dp_stages): the windows of each of those stages (stages.dp_windows)
        stages = [st for _, st in dp_stages(g, lay)]
        w_fwd, w_bwd = dp_windows(ctx, k, lt, stages, [self._dispatch(ctx, st)[0] for st in stages])
        t_dp = dp_comm_time(ctx, w_fwd, w_bwd, optimizer, deg)
        ctx.rec.mark("optimizer", ANALYTIC)
        t_opt = self.kernel_scale * slowest_step(optimizer_spec(optimizer), g, lay, ctx.peak, ctx.hbm, deg)
        # a CPU runs the step's ops on the host: they add; a GPU's host issues them while the device
        # runs the earlier ones: the slower of the two
        t_opt = t_opt + t_step_host if self.serial else np.maximum(t_opt, t_step_host)
        return t_dp, t_opt

    def _utilization(self, g: Geometry, lay: ParallelLayout, gbs: int, seqlen: int, t_iter: np.ndarray,
                     modules: tuple[str, ...] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """eq:mfu's MFU, MFU in the validation sweeps' FLOP count, and HFU (fractions of peak; a stack's
        selective ``modules`` credit the attention scores where they hold core_attn, nothing else)."""
        ckc = lay.ckpt
        tokens = gbs * seqlen
        denom = t_iter * self.prof.peak(g.precision) * lay.n_devices
        # eq:mfu: N(Z) = N_act, the non-embedding parameters active per token (the paper's N_act of
        # tab:scale-ladder and C_model = 6 N_act D); recomputation earns no credit (HFU adds it)
        mfu = 6.0 * g.n_act * tokens / denom
        mfu_val = 6.0 * g.n_mfu_validation * tokens / denom
        # HFU: add the recomputed forward FLOPs (full: the transformer blocks' 2 N_act per token;
        # selective / super-selective: the causal attention-score FLOPs)
        attn_score = 2.0 * seqlen * g.nq * g.hd * g.L  # per token, causal fwd QK^T + PV
        r = recompute(ckc, modules)
        rec_flops = (r.block * 2.0 * g.n_act + r.sdpa * attn_score) * tokens
        hfu = (6.0 * g.n_act * tokens + rec_flops) / denom
        return mfu, mfu_val, hfu
