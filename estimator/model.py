"""The iteration-time model (paper sec:iteration-time-model), vectorised over plans.

Every quantity is a numpy array over P plans (one element per execution plan). Per micro-batch
and pipeline stage we cost, forward and backward, the blocks of the paper's architecture:

* attention: QKV(+head gate) and output projections, TP-sharded, sequence parallel (GEMM table);
  SDPA on the TP-sharded query heads, CP-sharded sequence (SDPA table);
* MoE: router GEMM + top-k (router table), permute/unpermute, grouped expert GEMMs keyed by the
  local experts E_loc = E/EP and the per-expert tile (grouped table), the shared expert (GEMM
  table) overlapped with the routed all-to-all, EP all-to-all dispatch + combine (collective
  table, intra vs inter node by the group's span);
* the first dense block's SwiGLU MLP; norms, RoPE, residual adds, SwiGLU (element-wise);
* TP all-gather / reduce-scatter (sequence parallel) and CP key/value exchange;
* activation recomputation per checkpointing mode.

**EP tile (first-principles correction of sec:microbenchmarks).** The paper keys the grouped
GEMM on M_expert = ceil(T_seq B_micro K / E) "invariant to expert parallelism". Under EP each rank
holds E/EP local experts that receive tokens from all EP ranks, so with balanced routing a rank
still processes T_seq B_micro K rows, and each local expert's tile is EP T_seq B_micro K / E. A
lookup at tile T_seq B_micro K / E with E/EP groups under-counts expert work by EP. We key on
(num_gemms = E/EP, tokens_per_expert = EP T_seq B_micro K / E) (tests/estimator/test_kernels.py).

Then, per pipeline stage and micro-batch, t_mb = max(t_GPU, t_disp) + t_A2A + t_LM-head-fwd
(:func:`pipeline.stage_periods`): the EP all-to-all and the LM head + cross-entropy forward sit
outside the dispatch max because the host synchronises on the device before each (the token counts
that size the exchange; the loss's NaN check), so launch time already spent cannot hide them; the
embedding and the LM head's backward join the GPU side. The 1F1B period is the slowest stage's;
the fill and drain run once through the other PP-1 stages at their own periods, which carry
no LM head (:mod:`pipeline`; the paper's t_vocab charges it there too, (PP-1) t_last more in the
compute-bound case, tests/estimator/test_pipeline.py). The bubble term is that fill and drain at
the stages' vocabulary-free periods (eq:bubble's f_bubble = (PP-1)/(VPP n_mb) of the layers' period
when the stages are equal); the vocabulary term is what the embedding, LM head and loss add to the
pipelined wall (:class:`iteration.IterationTime` names every term and sums them). Then PP
send/recv, the DP gradient reduce-scatter and parameter all-gather of the distributed optimizer with
the overlap 1F1B allows, the optimizer step, and t_iter = chi_sys t_analytic (eq:cal-iter, eq:desync).

**Where each piece lives.** :mod:`compute` (kernel times from the tables, a CPU's host time),
:mod:`comm` (collectives, DP traffic, bias all-reduce), :mod:`pipeline` (bubble, stage periods),
:mod:`dispatch` (the launch law), :mod:`desync` (eq:desync), :mod:`memory` (bytes per rank),
:mod:`sources` (sources, out-of-range lookups), :mod:`iteration` (the terms of t_analytic). This
module composes them per plan into an :class:`IterationTime`; the tables every lookup reads are an
argument of :meth:`TimeModel.evaluate`, never state (a recording view of them,
:class:`lookup_listing.RecordingTables`, lists what an evaluation looks up).

**Dispatch law** (precedence: these module defaults < the profile's ``dispatch`` block < measured
dispatch rows of the profile < a 'dispatch' calibration row). kappa0 = 642, kappa1 = 7.29 are kernel
counts per layer and micro-batch of the Megatron-Core MoE block read off profiler traces (two counted
points, E_loc = 16 and 128). The node-type profiles carry the per-kernel gap inside a real block
(27 us on B200, against ~15 us for the isolated chain of the dispatch table), the fixed per-micro-
batch host time and the per-MoE-layer host cost of the EP token permute/all-to-all path, all from
the reference stack's profiler traces (cluster_profiles/*.yaml cite them). Because t_disp is a max
with the GPU time, it vanishes for large models whose kernels are long (no additive launch term).
The kernels kappa counts but the model does not cost one by one (copies, casts, router bookkeeping)
each occupy the GPU at least the measured active time of the smallest chained kernel
("framework_kernels"). The law is Megatron's count: for ``stack="reference"`` (scaleplan's own
reference model, ``scaleplan validate``) and on every serial-dispatch profile, the measured host
seconds of that model's ops (dispatch rows ``ops:*``) replace it where the profile has them for the
plan's checkpoint mode (:func:`compute.measured_host_times`); on a GPU they still enter the max
with the GPU time, on a CPU they add.

**Vocabulary term for PP = 1.** The paper's t_vocab = (n_mb-1) max(t_first, t_last) + t_first
+ t_last assumes the embedding and the LM head sit on different stages. With one stage both run
on the same GPU for every micro-batch, so t_vocab = n_mb (t_first + t_last) there.

Units: seconds, bytes, FLOP/s. Arrays: one element per plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scaleplan.estimator import analytic as an
from scaleplan.estimator.ckpt import CkptMode, kernel_units, recomputes_block, recomputes_sdpa
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
from scaleplan.estimator.exchanges import critical_exchanges
from scaleplan.estimator.model_dims import Geometry
from scaleplan.estimator.iteration import TERMS, IterationTime, layer_terms
from scaleplan.estimator.kernels import KernelModel, LayerKernels
from scaleplan.estimator.layout import ParallelLayout, degree_groups
from scaleplan.estimator.optimizer import optimizer as optimizer_spec
from scaleplan.estimator.optimizer import slowest_step
from scaleplan.estimator.pipeline import (  # noqa: F401
    StagePeriods,
    bubble_fraction,
    pipeline_time,
    stage_periods,
)
from scaleplan.estimator.sources import OOR, Recorder
from scaleplan.estimator.tables import ANALYTIC, COMPOSED, EXTRAPOLATE_MODES, MEASURED, Tables

from scaleplan.profiles import ClusterProfile
from scaleplan.units import BYTES_PER_ELEMENT


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


@dataclass
class _Stages:
    """Per-layer totals and per-stage compute, seconds per micro-batch (arrays over plans)."""

    common_f: np.ndarray  # one layer's attention, SDPA, element-wise, TP and CP comm, forward
    common_b: np.ndarray  # the same, backward
    den_lf: np.ndarray    # one dense layer, forward
    den_lb: np.ndarray    # one dense layer, backward
    fw: np.ndarray        # one layer's framework kernels (fwd + bwd + recompute)
    L_stage: np.ndarray   # layers per stage, L / PP
    nd0: np.ndarray       # dense layers on the first stage
    t_stage0: np.ndarray  # the first stage's layers
    t_other: np.ndarray   # another stage's layers (0 where PP = 1)
    a2a0: np.ndarray      # the exposed all-to-all wire time inside t_stage0
    a2a_o: np.ndarray     # the exposed all-to-all wire time inside t_other
    t_cmp: np.ndarray     # the slowest stage's, max(t_stage0, t_other)
    n_m: np.ndarray | float  # MoE layers on the slowest stage (0.0 for a dense model)


class TimeModel(KernelModel):
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
        self.prof, self.tables, self.mode, self.disp, self.chi_c = profile, tables, extrapolate, dispatch, chi
        self.kernel_scale = float(kernel_scale)
        # placement (which group leaves the NVLink domain, its ranks per domain): the scale-up domain, a node
        # except where NVLink spans nodes (GB200 NVL72: 72 GPUs over 4-GPU trays)
        self.gpn = profile.scaleup_domain
        self.serial = bool(getattr(profile, "serial_dispatch", False))
        # the host time of the reference model's own ops (measured rows) replaces the Megatron law
        self.measured_host = self.serial or stack == "reference"
        # every framework kernel (counted by kappa, not costed individually) occupies the GPU at least
        # this long: the measured GPU-active time of the smallest chained kernel, else the analytic floor
        self.t_kernel_min = tables.t_kernel_min_s or an.KERNEL_FLOOR_S

    # -- kernels -------------------------------------------------------------------------------
    def evaluate(self, g: Geometry, lay: ParallelLayout, gbs: int, seqlen: int, optimizer: str,
                 tables=None) -> Evaluation:
        """Evaluate every plan of ``lay``; see the module docstring for the terms. Arrays of length P.
        ``tables``: what the lookups read (default: this model's tables); either way their view in the
        spec's precision (its GEMM / grouped / vocab rows, :meth:`Tables.view`)."""
        P = len(lay)
        rec = Recorder(P, self.mode)
        tb = (self.tables if tables is None else tables).view(g.precision)
        n_mb = lay.n_mb(gbs)
        ckc = lay.ckpt
        k = self.layer_kernels(tb, g, lay, seqlen, rec)
        s = self._stages(tb, g, k, lay, rec)
        t_disp, t_step_host, st = self._pipeline_terms(tb, g, k, s, lay, seqlen, rec)
        deg = degree_groups(g, lay)  # shared by the DP traffic, the optimizer step and the bias all-reduce
        t_dp, t_opt = self._dp_and_optimizer(tb, rec, g, lay, k, s, t_disp, t_step_host, optimizer, deg)
        vpp = np.asarray(lay.vpp, dtype=float)
        it = IterationTime(
            **layer_terms(k, s.fw, n_mb, s.L_stage, s.n_m, ckc, g.is_moe),
            dispatch_floor=n_mb * (st.period_disp - s.t_cmp),
            bubble=st.ramp_disp / vpp,
            vocab=n_mb * (st.period - st.period_disp) + (st.ramp - st.ramp_disp) / vpp,
            pp_p2p=self._pp_p2p(rec, g, k, lay, n_mb), dp_comm=t_dp,
            bias_sync=bias_sync_time(tb, self.prof, rec, g, lay, deg), optimizer=t_opt)
        if not self.serial:
            rec.mark("dispatch_floor", 0)
        rec.mark("bubble", rec.src.get("dispatch_floor", 0))
        t_an = it.total
        # the share of the predicted time whose term read a composed (out-of-range) lookup
        composed_share = sum(np.where(rec.src.get(name, 0) == COMPOSED, getattr(it, name), 0.0)
                             for name in TERMS) / t_an

        # eq:desync, with the placement features of Megatron's rank order (desync_features)
        ep_nodes, pp_hops, deep = desync_features(lay, self.gpn)
        pp_nodes = pp_hops + 1
        rc = recomputes_block(ckc)
        t_a2a_wire = n_mb * s.n_m * (k.a2a_f * (1 + rc) + k.a2a_b) if g.is_moe else np.zeros(P)
        chi = chi_sys(self.chi_c, t_a2a_wire, t_an, ep_nodes, pp_hops, deep)
        t_iter = chi * t_an
        mfu, mfu_val, hfu = self._utilization(g, lay, gbs, seqlen, t_iter)
        return Evaluation(lay, n_mb, it, rec.src, t_an, chi, t_iter, t_a2a_wire, ep_nodes.astype(int),
                          pp_nodes.astype(int), deep, mfu, mfu_val, hfu, rec.n_clamped, rec.oor, rec.warnings,
                          rec.notes, composed_share, rec.warned, rec.extrapolated)

    # -- evaluate's steps, in the order it runs them ---------------------------------------------
    def _framework_kernels(self, tb, rec: Recorder, ckc: np.ndarray) -> np.ndarray:
        """Seconds per layer and micro-batch (fwd + bwd + recompute) of the kernels kappa0 counts
        but :meth:`_kernels` does not cost; zero where measured host rows are used."""
        P = len(ckc)
        # framework kernels (permutation copies, casts, router bookkeeping, bias-adds...) counted in
        # kappa0 but not costed by _kernels: each occupies the GPU for at least t_kernel_min.
        # With measured host rows none is charged: on a CPU these ops are host work (in the dispatch
        # term); for the reference stack on a GPU, kappa0 counts Megatron's kernels, not the reference
        # model's, and the ops:* rows hold host seconds, not kernel counts (their op counts include views
        # that launch nothing); each small op's kernel is shorter than its launch, so the host term that
        # takes the max with the GPU time (stage_periods) already bounds what they add
        if self.measured_host:
            fw = np.zeros(P)
            rec.mark("framework_kernels", np.zeros(P, np.int8))
        else:
            n_fw = kernel_units(ckc) * np.maximum(self.disp.kappa0 / 4.0 - COSTED_KERNELS_PER_FWD, 0.0)
            fw = n_fw * self.t_kernel_min * self.kernel_scale
            rec.mark("framework_kernels", MEASURED if tb.t_kernel_min_s else ANALYTIC)
        return fw

    def _stages(self, tb, g: Geometry, k: LayerKernels, lay: ParallelLayout, rec: Recorder) -> _Stages:
        """Per-layer totals (fwd, bwd, recompute, framework kernels) and each pipeline stage's
        compute per micro-batch, with the all-to-all wire time the shared expert leaves exposed."""
        pp, ckc = lay.pp, lay.ckpt
        moe = g.is_moe
        # per-layer totals (shared expert overlapped with the routed all-to-all: max of the two)
        common_f = k.attn_f + k.sd_f + k.ew_f + k.tp_f + k.cp_f
        common_b = k.attn_b + k.sd_b + k.ew_b + k.tp_b + k.cp_b
        moe_lf = common_f + k.moe_f + np.maximum(k.sh_f, k.a2a_f)
        moe_lb = common_b + k.moe_b + np.maximum(k.sh_b, k.a2a_b)
        den_lf = common_f + k.dense_f
        den_lb = common_b + k.dense_b
        FULL, SUPER, SEL = CkptMode.FULL, CkptMode.SUPER_SELECTIVE, CkptMode.SELECTIVE
        rc_moe = np.select([ckc == FULL, ckc == SUPER, ckc == SEL],
                           [moe_lf, k.sd_f + k.ew_f + (k.perm if moe else 0.0), k.sd_f], 0.0)
        rc_den = np.select([ckc == FULL, ckc == SUPER, ckc == SEL], [den_lf, k.sd_f + k.ew_f, k.sd_f], 0.0)
        fw = self._framework_kernels(tb, rec, ckc)
        t_moe_layer = moe_lf + moe_lb + rc_moe + fw
        t_den_layer = den_lf + den_lb + rc_den + fw

        L_stage = g.L / pp
        nd0 = np.minimum(g.n_dense, L_stage)  # dense blocks sit on the first stage
        # the all-to-all wire time the shared expert does not cover, per MoE layer (fwd, bwd, recompute)
        rc1 = recomputes_block(ckc)
        a2a_x = (np.maximum(k.sh_f, k.a2a_f) - k.sh_f) * (1 + rc1) + np.maximum(k.sh_b, k.a2a_b) - k.sh_b
        if moe:
            t_stage0 = nd0 * t_den_layer + (L_stage - nd0) * t_moe_layer
            t_other = np.where(pp > 1, L_stage * t_moe_layer, 0.0)
            a2a0, a2a_o = (L_stage - nd0) * a2a_x, np.where(pp > 1, L_stage * a2a_x, 0.0)
        else:
            t_stage0 = L_stage * t_den_layer
            t_other = np.where(pp > 1, t_stage0, 0.0)
            a2a0 = a2a_o = np.zeros(len(pp))
        t_cmp = np.maximum(t_stage0, t_other)
        # the MoE layers of the slowest stage, whose compute the components attribute
        n_m = L_stage - np.where(t_stage0 >= t_other, nd0, 0.0) if moe else 0.0
        return _Stages(common_f, common_b, den_lf, den_lb, fw, L_stage, nd0, t_stage0, t_other, a2a0, a2a_o,
                       t_cmp, n_m)

    def _pipeline_terms(self, tb, g: Geometry, k: LayerKernels, s: _Stages, lay: ParallelLayout, seqlen: int,
                        rec: Recorder) -> tuple[np.ndarray, np.ndarray, StagePeriods]:
        """Host dispatch and the 1F1B stage periods (module docstring). Returns t_disp (seconds per stage
        and micro-batch), t_step_host (the optimizer step's host seconds) and the stage periods."""
        pp, ep, cp, mbs, ckc = lay.pp, lay.ep, lay.cp, lay.mbs, lay.ckpt
        moe = g.is_moe
        L_stage = s.L_stage
        # CPU dispatch per stage and micro-batch (kernels x gap + host); the GPU of each stage runs
        # its layers plus its vocabulary work, and t_mb = max(GPU, CPU) per stage (self-limiting)
        n_moe_stage = L_stage * (g.n_moe / g.L) if moe else 0.0
        t_disp = dispatch_time(self.disp, L_stage, k.E_loc if moe else 0.0, ckc, n_moe_stage, ep)
        t_step_host = np.zeros(len(pp))
        if self.measured_host:
            t_disp, t_step_host = measured_host_times(tb, rec, g, ckc, L_stage, s.nd0, t_disp, seqlen * mbs / cp)
        # full recompute of an MoE block re-runs its dispatcher's host sync at the start of the last block's
        # backward: the LM head's backward, issued just before, is exposed (pipeline.stage_periods)
        x_lb = k.t_last_b * recomputes_block(ckc) if moe and not self.serial else 0.0
        st = stage_periods(pp, s.t_stage0 - s.a2a0, s.t_other - s.a2a_o, k.t_first, k.t_last_f, k.t_last_b - x_lb,
                           t_disp, self.serial, s.a2a0, s.a2a_o, x_lb)
        return t_disp, t_step_host, st

    def _pp_p2p(self, rec: Recorder, g: Geometry, k: LayerKernels, lay: ParallelLayout,
                n_mb: np.ndarray) -> np.ndarray:
        """PP send/recv seconds per iteration (0 where PP = 1)."""
        pp, vpp = lay.pp, lay.vpp
        prof = self.prof
        b_el = BYTES_PER_ELEMENT.get(g.precision, 2)
        # PP send/recv of [T/TP, d] activations (fwd) and grads (bwd); charged at the inter-node cost
        # where every stage boundary leaves the node (one stage per node: ParallelLayout)
        p2p_inter = lay.ranks_per_node("pp", self.gpn) <= 1
        p2p_bytes = k.Tsp * g.d * b_el
        p2p_bw = np.where(p2p_inter, prof.scaleout_bandwidth, prof.scaleup_bandwidth)
        t_p2p = np.where(p2p_inter, P2P_LAT_INTER_S, P2P_LAT_INTRA_S) + p2p_bytes / np.maximum(p2p_bw, 1.0)
        rec.mark("pp_p2p", np.where(pp > 1, ANALYTIC, 0))
        # non-interleaved: the blocking exchanges on the 1F1B critical path, once per slot at PP = 2 and
        # twice from PP = 3 (exchanges.critical_exchanges); interleaved (VPP > 1, overlapped p2p): a
        # micro-batch crosses each of this rank's VPP chunk boundaries once forward, once backward
        n_x = np.where(vpp > 1, 2 * (vpp * n_mb + pp - 1), critical_exchanges(pp, n_mb))
        return np.where(pp > 1, n_x * t_p2p, 0.0)

    def _dp_and_optimizer(self, tb, rec: Recorder, g: Geometry, lay: ParallelLayout, k: LayerKernels, s: _Stages,
                          t_disp: np.ndarray, t_step_host: np.ndarray, optimizer: str,
                          deg: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """The exposed DP gradient/parameter traffic and the optimizer step, seconds per iteration;
        ``deg``: the plans' :func:`~scaleplan.estimator.layout.degree_groups`."""
        ckc = lay.ckpt
        moe = g.is_moe
        L_stage = s.L_stage
        # DP: distributed optimizer reduce-scatter (grads) + all-gather (params), bucketed. They hide
        # behind the last micro-batch's backward (and the first forward), on a later pipeline stage also
        # behind the 1F1B drain (comm.dp_stages), not behind the EP all-to-all: that
        # uses the same links (the NIC once either group leaves the node), so the window excludes its exposed part.
        # The window is the wall time of that pass, not its GPU time alone: a dispatch-bound pass lasts as
        # long as the host takes to issue it (its share of t_disp, in the checkpoint mode's kernel units:
        # forward 1, backward with its recompute the rest), and the NCCL stream runs meanwhile
        share_f = 1.0 / kernel_units(ckc)
        w_bwd = np.maximum(L_stage * (s.common_b + k.moe_b + k.sh_b if moe else s.den_lb), (1 - share_f) * t_disp)
        w_fwd = np.maximum(L_stage * (s.common_f + k.moe_f + k.sh_f if moe else s.den_lf), share_f * t_disp)
        t_dp = dp_comm_time(tb, self.prof, rec, g, lay, w_fwd, w_bwd, optimizer, deg)
        peak, hbm = self.prof.peak(g.precision), self.prof.hbm_bandwidth
        rec.mark("optimizer", ANALYTIC)
        t_opt = self.kernel_scale * slowest_step(optimizer_spec(optimizer), g, lay, peak, hbm, deg)
        # a CPU runs the step's ops on the host: they add; a GPU's host issues them while the device
        # runs the earlier ones: the slower of the two
        t_opt = t_opt + t_step_host if self.serial else np.maximum(t_opt, t_step_host)
        return t_dp, t_opt

    def _utilization(self, g: Geometry, lay: ParallelLayout, gbs: int, seqlen: int,
                     t_iter: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """eq:mfu's MFU, MFU in the validation sweeps' FLOP count, and HFU (fractions of peak)."""
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
        rec_flops = (recomputes_block(ckc) * 2.0 * g.n_act + recomputes_sdpa(ckc) * attn_score) * tokens
        hfu = (6.0 * g.n_act * tokens + rec_flops) / denom
        return mfu, mfu_val, hfu
