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
(num_gemms = E/EP, tokens_per_expert = EP T_seq B_micro K / E) (tests/estimator/test_model.py).

Then, per pipeline stage and micro-batch, t_mb = max(t_GPU, t_disp) with t_disp = L_stage
kappa(E_loc) t_gap + t_host (sec:iteration-time-model). The GPU side of each stage includes its
vocabulary work (embedding on the first, LM head + cross-entropy on the last stage), because that
GPU work overlaps the CPU's launching like any other kernel; the 1F1B period is the slowest stage's
max, the bubble (eq:bubble) f_bubble = (PP-1)/(VPP n_mb) applies to it, and the lighter vocabulary
surplus is paid once on the ramp. In the compute-bound case this reduces exactly to the paper's
t_block (1 + f_bubble) + t_vocab with t_vocab = (n_mb-1) max(t_first, t_last) + t_first + t_last
+ t_last n_mb f_bubble (tests/estimator/test_pipeline.py). Then PP send/recv, the DP gradient
reduce-scatter and parameter all-gather of the distributed optimizer with the overlap 1F1B allows,
the optimizer step, and t_iter = chi_sys t_analytic (eq:cal-iter, eq:desync).

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
("framework_kernels").

**Vocabulary term for PP = 1.** The paper's t_vocab = (n_mb-1) max(t_first, t_last) + t_first
+ t_last assumes the embedding and the LM head sit on different stages. With one stage both run
on the same GPU for every micro-batch, so t_vocab = n_mb (t_first + t_last) there.

Units: seconds, bytes, FLOP/s. Arrays: one element per plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scaleplan.estimator import analytic as an
from scaleplan.estimator.geom import Geometry, padded_vocab
from scaleplan.estimator.shapes import rank_shapes
from scaleplan.estimator.tables import (
    ANALYTIC,
    CLAMPED,
    COMPOSED,
    EXTRAPOLATE_MODES,
    INTERPOLATED,
    MEASURED,
    LookupResult,
    Tables,
    compose_rule,
)

from scaleplan.profiles import ClusterProfile
from scaleplan.units import BYTES_PER_ELEMENT

CKPT_CODES = {"none": 0, "selective": 1, "super-selective": 2, "full": 3}
CKPT_NAMES = {v: k for k, v in CKPT_CODES.items()}

# Kernel-count law kappa(E_loc) = kappa0 + kappa1 E_loc per transformer layer and micro-batch
# (forward + backward + full recompute). Defaults: GPU kernel counts read from rank-0 profiler
# traces of the Megatron-Core MoE stack (dmlc/ScalePlan dlcalc/utils/kernel_launch.py notes
# ~759 kernels/layer-mb at E_loc=16 and ~1576 at E_loc=128): two counted points, not an MFU fit.
KAPPA0_DEFAULT = 642.0
KAPPA1_DEFAULT = 7.29
# Share of those kernels issued per checkpoint mode, in forward-pass units: forward 1, backward 2,
# full recompute +1 forward; selective re-runs attention only, super-selective also norms/activations.
_KERNEL_UNITS = np.array([3.0, 3.1, 3.3, 4.0])
T_GAP_DEFAULT_S = 15e-6   # launch-bound torch eager op on a modern host (dispatch table when present)
T_HOST_DEFAULT_S = 0.0    # fixed per-micro-batch host time; only a measured/calibrated value is used
# Kernels per layer-micro-batch (forward units) whose time the model costs one by one: QKV, O, SDPA,
# 2 norms, 2 residual adds, RoPE q/k, gate, router GEMM, top-k, permute, unpermute, SwiGLU, shared
# expert (3), all-to-all (2) - about 20 per forward; the grouped GEMMs are costed per expert.
COSTED_KERNELS_PER_FWD = 20.0

# Megatron distributed-data-parallel bucket: max(40M, 1M x DP) parameters (DistributedDataParallelConfig)
DDP_BUCKET_PARAMS = 40_000_000
# NeMo's bf16-mixed plugin (the paper's stack) sets grad_reduce_in_fp32=True: gradients are
# reduce-scattered in fp32; the distributed optimizer all-gathers bf16 parameters
GRAD_BYTES_COMM, PARAM_BYTES_COMM = 4, 2
P2P_LAT_INTRA_S, P2P_LAT_INTER_S = 10e-6, 25e-6
# optimizers that orthogonalise whole weight matrices (Newton-Schulz): no distributed optimizer
ORTHO_OPTIMIZERS = ("muon", "scion")


def dp_buckets(g: Geometry, tp, cp, pp, dp, ep, etp, gpn: int):
    """The distributed optimizer's two gradient groups on the heaviest stage, as
    ``[(params, group, layout, inter_node, n_buckets)]`` (arrays or scalars, parameters per rank).

    Dense grads (attention, dense and shared MLPs, router, embedding or LM head): over the DP x CP
    group of contiguous ranks. Expert grads: over EDP = TP CP DP / (EP ETP) strided ranks, which
    leave the node once TP CP EP fills it. Megatron buckets max(40M, 1M x group) parameters.
    """
    L_stage = g.L / pp
    dense_p = (L_stage * g.attn_params + np.minimum(g.n_dense, L_stage) * g.dense_mlp_params
               + np.maximum(L_stage - g.n_dense, 0) * g.moe_dense_params) / tp
    dense_p = dense_p + g.vocab * g.d / tp  # embedding (first) or LM head (last): the heavier stage
    exp_p = np.maximum(L_stage - np.where(pp > 1, 0, g.n_dense), 0) * g.expert_params / (ep * etp)
    out = []
    for params, group, layout, inter in ((dense_p, dp * cp, "contiguous", tp * cp * dp > gpn),
                                         (exp_p, tp * cp * dp / (ep * etp), "strided", tp * cp * ep >= gpn)):
        nb = np.maximum(np.ceil(params / np.maximum(DDP_BUCKET_PARAMS, 1e6 * group)), 1)
        out.append((params, group, layout, inter, nb))
    return out


def bias_sync(g: Geometry, tp, cp, pp, dp, gpn: int):
    """The loss-free balancing bias update (eq:bias-update): Megatron-Core stacks the fp32 token counts
    per expert of every MoE layer on the stage and all-reduces them once per step over the TP x CP x DP
    group (``_update_router_expert_bias`` in finalize_model_grads): (1 all-reduce where the stage has
    MoE layers, group, inter_node, bytes = MoE layers on the stage x E x 4)."""
    n_layers = np.ceil(g.n_moe / np.asarray(pp, dtype=float))  # 0 for a dense model
    group = tp * cp * dp
    return np.minimum(n_layers, 1.0), group, group > gpn, 4 * g.E * n_layers


@dataclass
class DispatchLaw:
    """t_disp = L_stage kappa(E_loc) t_gap + n_moe_stage [EP>1] t_ep_host + t_host (seconds, per
    micro-batch and stage, full-recompute units). t_ep_host is the host-side token permute and
    all-to-all machinery around each MoE layer under EP, which the kernel count does not capture
    (an EP=8 layer launches fewer expert kernels than EP=1 yet takes longer on the host); it is a
    departure from the paper's two-term law, kept explicit so a calibration can set it to 0."""

    kappa0: float = KAPPA0_DEFAULT
    kappa1: float = KAPPA1_DEFAULT
    t_gap_s: float = T_GAP_DEFAULT_S
    t_host_s: float = T_HOST_DEFAULT_S
    source: str = "default"
    t_ep_host_s: float = 0.0


@dataclass
class ChiCoefficients:
    """eq:desync coefficients plus a level term: chi = 1 + c_level + c_a2a (t_A2A / t) [EP spans nodes]
    + c_pp (inter-node PP hops) + c_ovl [deep pipeline in one node] (see :func:`desync_features`).
    c_level is what every run of the stack pays beyond the microbenchmarks (allocator, GC, launch
    jitter, input pipeline: paper app:training-stack); fitted only where observed runs identify it."""

    c_a2a: float = 0.0
    c_pp: float = 0.0
    c_ovl: float = 0.0
    calibration_id: int | None = None
    c_level: float = 0.0


def desync_features(tp, cp, pp, dp, ep, gpn: int):
    """eq:desync's placement features from Megatron-Core's default rank order (tp fastest, then cp,
    then ep inside dp, pp outermost), arrays over plans:

    * ep_nodes: nodes one EP group spans; EP ranks are TP CP apart: ceil(EP TP CP / gpn);
    * pp_hops: inter-node hops along the pipeline. Consecutive stages are TP CP DP ranks apart, so
      once TP CP DP fills a node every stage boundary leaves the node (PP - 1 hops); otherwise the
      pipeline covers ceil(PP TP CP DP / gpn) nodes. (eq:desync's N_node^PP - 1 = ceil(PP/gpn) - 1
      assumes stages are adjacent ranks, which Megatron's order never makes them unless TP CP DP = 1.)
    * deep: a pipeline of >= gpn stages inside one node (only when TP CP DP = 1).
    """
    tp, cp, pp, dp, ep = (np.asarray(x, dtype=float) for x in (tp, cp, pp, dp, ep))
    stride = tp * cp * dp
    ep_nodes = np.ceil(ep * tp * cp / gpn)
    pp_nodes = np.where(stride >= gpn, pp, np.ceil(pp * stride / gpn))
    pp_hops = np.where(pp > 1, pp_nodes - 1, 0.0)
    deep = (pp >= gpn) & (pp_nodes == 1) & (pp > 1)
    return ep_nodes, pp_hops, deep


@dataclass
class Plans:
    """Execution plans as parallel integer arrays (one element per plan)."""

    tp: np.ndarray
    cp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    vpp: np.ndarray
    mbs: np.ndarray
    ckpt: np.ndarray  # codes, CKPT_CODES

    def __len__(self) -> int:
        return len(self.tp)

    def take(self, idx) -> Plans:
        return Plans(*(getattr(self, f)[idx] for f in ("tp", "cp", "pp", "dp", "ep", "etp", "vpp", "mbs", "ckpt")))

    def layout(self, i: int) -> dict:
        return {"tp": int(self.tp[i]), "cp": int(self.cp[i]), "pp": int(self.pp[i]), "dp": int(self.dp[i]),
                "ep": int(self.ep[i]), "etp": int(self.etp[i]), "vpp": int(self.vpp[i]), "mbs": int(self.mbs[i]),
                "ckpt": CKPT_NAMES[int(self.ckpt[i])]}


@dataclass
class OOR:
    """First out-of-range lookup per plan (reason string and the numbers for the error message)."""

    reason: np.ndarray  # object: None or "out_of_range:<table>.<axis>"
    table: np.ndarray
    axis: np.ndarray
    value: np.ndarray
    lo: np.ndarray
    hi: np.ndarray


@dataclass
class Evaluation:
    """Per-plan results (arrays of length P)."""

    plans: Plans
    n_mb: np.ndarray
    components: dict[str, np.ndarray]   # seconds per iteration, summing to t_analytic
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


def bubble_fraction(pp, vpp, n_mb):
    """eq:bubble: f_bubble = (PP - 1) / (VPP n_mb) (array-friendly)."""
    return (np.asarray(pp, dtype=float) - 1) / (np.asarray(vpp, dtype=float) * np.asarray(n_mb, dtype=float))


def vocab_stage_time(n_mb, pp, vpp, t_first, t_last):
    """The paper's vocabulary-stage term (sec:iteration-time-model) for a compute-bound pipeline:

    t_vocab = (n_mb - 1) max(t_first, t_last) + t_first + t_last + t_last n_mb f_bubble  (PP > 1);
    with one stage the embedding and the LM head run on the same GPU: t_vocab = n_mb (t_first + t_last).
    """
    n_mb, pp = np.asarray(n_mb, dtype=float), np.asarray(pp, dtype=float)
    f = bubble_fraction(pp, vpp, n_mb)
    return np.where(pp > 1, (n_mb - 1) * np.maximum(t_first, t_last) + t_first + t_last + t_last * n_mb * f,
                    n_mb * (t_first + t_last))


@dataclass
class StagePeriods:
    period: np.ndarray        # 1F1B period: slowest stage's max(GPU, dispatch) + A2A + exposed LM head/CE
    period_disp: np.ndarray   # the same without the vocabulary work


def stage_periods(pp, t_first_layers, t_other_layers, t_first, t_last_fwd, t_last_bwd, t_disp, serial=False,
                  a2a_first=0.0, a2a_other=0.0) -> StagePeriods:
    """Per-micro-batch period of the slowest stage, first / middle / last stages considered (seconds).

    Per stage: t_mb = max(t_GPU, t_disp) + t_A2A + t_last_fwd (sec:iteration-time-model), where

    * ``t_first_layers`` / ``t_other_layers``: the stage's GPU layer time *without* the exposed EP
      all-to-all, passed separately (``a2a_first`` / ``a2a_other``). The all-to-all sits outside the
      dispatch max: Megatron's token dispatcher reads the per-expert token counts on the host before
      it can size the exchange (a device-to-host sync per MoE layer), so launch time already spent
      cannot hide the wire time.
    * the LM head + cross-entropy forward ``t_last_fwd`` (last stage) is exposed: Megatron's loss
      function checks each micro-batch's loss for NaN/Inf on the host (rerun state machine,
      ``check_for_nan_in_loss_and_grad``), a device-to-host sync right after those kernels, so the host
      waits for them. Their backward ``t_last_bwd`` is launched at once after the loss and runs while
      the host launches the layers' backward: it joins the GPU side of the max, as does the
      embedding ``t_first`` (first stage).

    PP = 1: one stage runs the layers, the embedding and the LM head. ``serial``: the host dispatches
    on the cores that compute (a CPU device), so every term adds.
    """
    pp = np.asarray(pp)
    if serial:
        l0 = t_first_layers + t_first + t_disp + a2a_first
        lo = t_other_layers + t_disp + a2a_other
        last = t_last_fwd + t_last_bwd
        one = l0 + last
        period = np.where(pp > 1, np.maximum(l0, lo + last), one)
        d0 = t_first_layers + t_disp + a2a_first
        period_disp = np.where(pp > 1, np.maximum(d0, t_other_layers + t_disp + a2a_other), d0)
        return StagePeriods(period, period_disp)
    l0 = np.maximum(t_first_layers + t_first, t_disp) + a2a_first
    lo = np.maximum(t_other_layers + t_last_bwd, t_disp) + a2a_other + t_last_fwd
    one = np.maximum(t_first_layers + t_first + t_last_bwd, t_disp) + a2a_first + t_last_fwd
    period = np.where(pp > 1, np.maximum(l0, lo), one)
    d0 = np.maximum(t_first_layers, t_disp) + a2a_first
    period_disp = np.where(pp > 1, np.maximum(d0, np.maximum(t_other_layers, t_disp) + a2a_other), d0)
    return StagePeriods(period, period_disp)


def pipeline_time(n_mb, pp, vpp, period, t_first, t_last):
    """1F1B wall of the pipelined part: (n_mb + (PP-1)/VPP) periods, plus the lighter of the two
    vocabulary surpluses once on the fill/drain ramp (PP > 1). In the compute-bound case with the
    last stage slowest this equals n_mb t_layers (1 + f_bubble) + the paper's t_vocab."""
    n_mb, pp = np.asarray(n_mb, dtype=float), np.asarray(pp, dtype=float)
    ramp = np.where(pp > 1, np.minimum(t_first, t_last), 0.0)
    return n_mb * period * (1 + bubble_fraction(pp, vpp, n_mb)) + ramp


class _Recorder:
    """Collects source codes, clamp counts and out-of-range reasons while the model looks up tables.

    ``mode`` (the estimator's ``extrapolate``): "compose" replaces an out-of-range lookup by its
    table's composition rule (tables.COMPOSE_RULES, labelled "composed", the rule in the warnings);
    "clamp" by the edge value (labelled "clamped", counted); "error" records the first
    out-of-range lookup per plan, which makes the plan infeasible.
    """

    def __init__(self, P: int, mode: str):
        self.P, self.mode = P, mode
        self.src: dict[str, np.ndarray] = {}
        self.n_clamped = np.zeros(P, dtype=np.int64)
        self.has_oor = np.zeros(P, dtype=bool)
        self.oor = OOR(*(np.full(P, None, dtype=object) for _ in range(3)), np.zeros(P), np.zeros(P), np.zeros(P))
        self.warnings: list[str] = []
        self.notes: dict[str, np.ndarray] = {}  # message -> plans it applies to

    def note(self, msg: str, where=True) -> None:
        """A per-plan note (shown in the warnings of the plans in ``where``)."""
        where = np.broadcast_to(np.asarray(where, dtype=bool), (self.P,))
        cur = self.notes.get(msg)
        self.notes[msg] = where.copy() if cur is None else (cur | where)

    def mark(self, comp: str, code) -> None:
        code = np.asarray(code, dtype=np.int8)
        cur = self.src.get(comp)
        self.src[comp] = np.broadcast_to(code, (self.P,)).copy() if cur is None else np.maximum(cur, code)

    def absorb(self, other: _Recorder, inv: np.ndarray) -> None:
        """Take over the records of a recorder over distinct tuples (``inv`` maps plans to them)."""
        for k, v in other.src.items():
            self.mark(k, v[inv])
        self.n_clamped += other.n_clamped[inv]
        self.has_oor |= other.has_oor[inv]
        for f in ("reason", "table", "axis", "value", "lo", "hi"):
            setattr(self.oor, f, getattr(other.oor, f)[inv])
        for msg, where in other.notes.items():
            self.note(msg, where[inv])
        self.warnings.extend(w for w in other.warnings if w not in self.warnings)

    def use(self, comp: str, res: LookupResult, active=True) -> np.ndarray:
        """Record one lookup for component ``comp`` (``active``: plans where it really happens)."""
        P = self.P
        all_active = active is True
        active = _vec(np.asarray(active, dtype=bool), P)
        t, ax, code = _vec(res.t, P), _vec(res.oor_axis, P), _vec(res.code, P)
        bad = ax >= 0
        if not all_active:
            bad &= active
        if bad.any():
            if self.mode == "compose":
                code = np.where(bad, COMPOSED, code)
                t = np.where(bad, _vec(res.t if res.t_composed is None else res.t_composed, P), t)
                self.note(f"{comp} composed beyond the measured {res.table} range: {compose_rule(res.table)[1]}",
                          bad)
            elif self.mode == "clamp":
                code = np.where(bad, CLAMPED, code)
                self.n_clamped += bad
            else:
                new = bad & ~self.has_oor
                if new.any():
                    self.has_oor |= new
                    for a in np.unique(ax[new]):
                        sel = new & (ax == a)
                        self.oor.reason[sel] = f"out_of_range:{res.table.split('[')[0]}.{res.axes[a]}"
                        self.oor.table[sel] = res.table
                        self.oor.axis[sel] = res.axes[a]
                    self.oor.value[new] = _vec(res.oor_value, P)[new]
                    self.oor.lo[new] = _vec(res.lo, P)[new]
                    self.oor.hi[new] = _vec(res.hi, P)[new]
        if all_active:
            self.mark(comp, code)
            return t
        self.mark(comp, np.where(active, code, 0))
        return np.where(active, t, 0.0)


def _vec(x, P):
    """``x`` as an array of shape (P,) (a view when it already is one; the plan arrays are never written)."""
    if isinstance(x, np.ndarray) and x.shape == (P,):
        return x
    return np.broadcast_to(x, (P,))


def _arr(x, P):
    return np.broadcast_to(np.asarray(x, dtype=float), (P,)).copy()


class TimeModel:
    """Evaluate eq:mfu for arrays of plans of one geometry on one profile.

    Args:
        profile: the hardware profile (peaks, HBM bandwidth, link bandwidths, GPUs per node).
        tables: measured tables (components without a table fall back to :mod:`analytic`).
        extrapolate: "compose" | "error" | "clamp": what an out-of-range lookup becomes (:class:`_Recorder`).
        dispatch: the dispatch law (kappa0, kappa1, t_gap, t_host).
        chi: eq:desync coefficients (zeros: chi_sys = 1).
        kernel_scale: multiplies every device-kernel time (GEMM, grouped GEMM, SDPA, router,
            element-wise, vocabulary, optimizer, framework kernels), never collectives or host time:
            an isolated microbenchmark runs with warm caches that a real step does not give it. 1
            unless ``calibrate fit --kind dispatch --from-runs`` fitted it (calibrate/run_scales.py).
    """

    def __init__(self, profile: ClusterProfile, tables: Tables, extrapolate: str, dispatch: DispatchLaw,
                 chi: ChiCoefficients, kernel_scale: float = 1.0):
        if extrapolate not in EXTRAPOLATE_MODES:
            raise ValueError(f"extrapolate: got {extrapolate!r}; one of {', '.join(EXTRAPOLATE_MODES)}")
        self.prof, self.tb, self.mode, self.disp, self.chi_c = profile, tables, extrapolate, dispatch, chi
        self.kernel_scale = float(kernel_scale)
        self._tb_base = tables
        self.gpn = profile.gpus_per_node
        self.serial = bool(getattr(profile, "serial_dispatch", False))
        # every framework kernel (counted by kappa, not costed individually) occupies the GPU at least
        # this long: the measured GPU-active time of the smallest chained kernel, else the analytic floor
        self.t_kernel_min = tables.t_kernel_min_s or an.KERNEL_FLOOR_S

    # -- kernels -------------------------------------------------------------------------------
    def _gemm(self, rec, comp, m, n, k, peak, active=True):
        """Forward GEMM time; returns (fwd, bwd) where bwd = dgrad (m,k,n) + wgrad (k,n,m)."""
        if self.tb.gemm is None:
            rec.mark(comp, ANALYTIC)
            f = an.gemm_time(m, n, k, peak, self.prof.hbm_bandwidth)
            b = an.gemm_time(m, k, n, peak, self.prof.hbm_bandwidth) + an.gemm_time(k, n, m, peak, self.prof.hbm_bandwidth)
            return np.where(active, f, 0.0), np.where(active, b, 0.0)
        f = rec.use(comp, self.tb.gemm.lookup(m, n, k), active)
        b = rec.use(comp, self.tb.gemm.lookup(m, k, n), active) + rec.use(comp, self.tb.gemm.lookup(k, n, m), active)
        return f, b

    def _experts(self, rec, g: Geometry, E_loc, tile, etp, peak, hbm):
        """Routed-expert GEMMs (fc1 + fc2) of one MoE layer per micro-batch: (fwd, bwd) seconds.

        Per expert shape (d, d_expert / ETP), in order of preference:

        1. the grouped-GEMM table of that exact shape, keyed (num_gemms = E_loc, tokens_per_expert = tile);
        2. the shape is not in the grouped table but the profile has a dense GEMM table: the expert MLP
           as a loop over the E_loc local experts of measured dense GEMMs, fc1 [tile, d] x [d, w1 f]
           and fc2 [tile, f] x [f, d] (w1 = 2 with GLU), backward = dgrad + wgrad of each (as
           :meth:`_gemm`). This is one of the implementations the grouped bench measures ("loop"; the
           recorded B200 rows are TE GroupedLinear, itself a sequence of cuBLAS GEMMs), so it is
           physically grounded at every shape the dense grid covers; lookups are range-checked like
           any GEMM (``out_of_range:gemm.<axis>``) and, where the profile has a grouped table at all,
           against the grouped kernel's measured (num_gemms, tokens_per_expert) envelope
           (``out_of_range:grouped_gemm.<axis>``): the loop stands in for the grouped kernel, whose
           behaviour outside that envelope (per-group host cost, stream overlap) the profile has no
           evidence of, and an unmeasured shape must not get a wider envelope than a measured one
           (else measuring a shape would remove plans). Labelled "interpolated" with a note.
           Not chosen: interpolating between measured grouped shapes in log (hidden, ffn). The recorded
           shapes are 7 scattered points, not a grid, and most ladder shapes (d = 512 q > 6144 for
           q >= 14, d_expert > 3840 for G <= 2) lie outside their hull, so it would cover few shapes
           and blend kernels tuned for other shapes; the dense grid holds the exact shape. At the
           measured shapes the loop agrees with the grouped rows within ~1.5x in the compute-bound
           regime (tests/estimator/test_expert_fallback.py);
        3. neither table: the analytic roofline (labelled "analytic").
        """
        P = rec.P
        ex_f, ex_b = np.zeros(P), np.zeros(P)
        w1 = 2 if g.glu else 1
        for e in np.unique(etp):  # one grouped table per expert shape (d, d_expert / ETP)
            sel = etp == e
            f_loc = int(round(g.dexp / e))
            tabf, tabb = self.tb.grouped.get(("fwd", g.d, f_loc)), self.tb.grouped.get(("bwd", g.d, f_loc))
            if tabf is not None and tabb is not None:
                ex_f += rec.use("experts", tabf.lookup(E_loc, tile), sel)
                ex_b += rec.use("experts", tabb.lookup(E_loc, tile), sel)
            elif self.tb.gemm is not None:
                self._grouped_envelope(rec, E_loc, tile, sel)
                f1, b1 = self._gemm(rec, "experts", tile, w1 * f_loc, g.d, peak, sel)
                f2, b2 = self._gemm(rec, "experts", tile, g.d, f_loc, peak, sel)
                ex_f += E_loc * (f1 + f2)
                ex_b += E_loc * (b1 + b2)
                rec.mark("experts", np.where(sel, INTERPOLATED, 0))
                rec.note(f"experts from dense GEMM table (shape {g.d}x{f_loc} not in grouped table)", sel)
            else:
                rec.mark("experts", np.where(sel, ANALYTIC, 0))
                fa = an.grouped_gemm_time(E_loc, tile, g.d, f_loc, peak, hbm, g.glu)
                ex_f += np.where(sel, fa, 0.0)
                ex_b += np.where(sel, 2 * fa, 0.0)
        return ex_f, ex_b

    def _grouped_envelope(self, rec, E_loc, tile, sel):
        """Range-check (num_gemms, tokens_per_expert) of the dense-loop fallback against the envelope
        the grouped tables measure (union over shapes); records out_of_range:grouped_gemm.<axis>."""
        if not self.tb.grouped:
            return
        tabs = list(self.tb.grouped.values())
        lo = np.min([t.lo for t in tabs], axis=0)
        hi = np.max([t.hi for t in tabs], axis=0)
        P = rec.P
        cs = [np.broadcast_to(np.asarray(E_loc, dtype=float), (P,)), np.broadcast_to(np.asarray(tile, dtype=float), (P,))]
        ax = np.full(P, -1, dtype=np.int16)
        val, l, h = np.zeros(P), np.full(P, np.nan), np.full(P, np.nan)
        for i, c in enumerate(cs):
            bad = ((c < lo[i] * (1 - 1e-9)) | (c > hi[i] * (1 + 1e-9))) & (ax < 0)
            ax[bad], val[bad], l[bad], h[bad] = i, c[bad], lo[i], hi[i]
        res = LookupResult("grouped_gemm", ("num_gemms", "tokens_per_expert"), np.zeros(P),
                           np.full(P, INTERPOLATED, dtype=np.int8), ax, val, l, h)
        rec.use("experts", res, sel)

    def _collective(self, rec, comp, coll, n, size, inter, layout="contiguous", active=True, per_node=None,
                    small_analytic=False):
        """Collective time from the table of the regime; analytic ring formula where unmeasured.

        Group sizes outside the measured set of the regime use busbw invariance: nccl-tests busbw
        of ring algorithms does not depend on the group size once the bottleneck link is fixed, so
        t(n, S) = t(n_ref, S') with S' chosen to keep the per-link bytes (labelled "analytic").

        Inter-node all-to-all (``per_node`` = ranks of the group per node given) is not a ring: each
        rank sends S/n to every peer directly, the bytes to the m peers on its own node stay on NVLink
        and the rest, S (n - m) / n, crosses the rank's NIC, which is the bottleneck. So the invariant
        is the inter-node bytes per rank: S' (n_ref - m_ref) / n_ref = S (n - m) / n, with m_ref = the
        GPUs per node (the table's contiguous groups fill whole nodes). Busbw invariance would keep
        S (n - 1) / n instead and under-count a 128-rank all-to-all by (120/128) / (24/32) = 1.25x
        against a 32-rank measurement on 8-GPU nodes.
        """
        P = rec.P
        n = _arr(n, P)
        size = _arr(size, P)
        inter = np.broadcast_to(np.asarray(inter, dtype=bool), (P,))
        active = np.broadcast_to(np.asarray(active, dtype=bool), (P,)) & (n > 1)
        out = np.zeros(P)
        bw = np.where(inter, self.prof.scaleout_bandwidth, self.prof.scaleup_bandwidth)
        ana = an.collective_time(coll, n, size, np.maximum(bw, 1.0), inter)
        for flag in (False, True):
            sel = active & (inter == flag)
            if not sel.any():
                continue
            tab = self.tb.collectives.get((coll, layout, flag))
            if tab is None and layout == "strided":
                tab = self.tb.collectives.get((coll, "contiguous", flag))
            if tab is None:
                out[sel] = ana[sel]
                rec.mark(comp, np.where(sel, ANALYTIC, 0))
                continue
            g_lo, g_hi = tab.groups[0], tab.groups[-1]
            nref = np.clip(n, g_lo, g_hi)
            if flag and coll == "all_to_all" and per_node is not None:
                m = np.minimum(np.broadcast_to(np.asarray(per_node, dtype=float), (P,)), n)
                m_ref = np.minimum(float(self.gpn), nref)
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
            off_grid = sel & ((n < g_lo) | (n > g_hi))
            if off_grid.any():
                rec.mark(comp, np.where(off_grid, ANALYTIC, 0))
                how = "inter-node bytes per rank" if (flag and coll == "all_to_all" and per_node is not None) \
                    else "busbw"
                msg = (f"{comp}: {coll} group sizes outside the measured {int(g_lo)}..{int(g_hi)} "
                       f"({layout}, {'inter' if flag else 'intra'}-node) use {how} invariance (labelled analytic)")
                if msg not in rec.warnings:
                    rec.warnings.append(msg)
        return out

    # -- the model -----------------------------------------------------------------------------
    def _kernels(self, g: Geometry, kp: Plans, seqlen: int, rec: _Recorder) -> dict[str, np.ndarray]:
        """Per-layer, per-micro-batch forward/backward times that depend only on (TP, CP, EP, ETP,
        B_micro): evaluated once per distinct tuple and broadcast to the plans sharing it."""
        prof = self.prof
        peak = prof.peak(g.precision)
        hbm = prof.hbm_bandwidth
        tp, cp, ep, etp, mbs = (getattr(kp, f).astype(float) for f in ("tp", "cp", "ep", "etp", "mbs"))
        sh = rank_shapes(g, tp, cp, ep, etp, mbs, seqlen)  # the same shapes bench plan measures
        b_el, T, Tsp, kv_loc = sh.b_el, sh.T, sh.Tsp, sh.kv_loc
        moe = g.is_moe
        P = len(tp)

        # attention projections (gate folded into the QKV GEMM: same input, n_q extra columns)
        f_qkv, b_qkv = self._gemm(rec, "attn_proj", T, sh.n_qkv, g.d, peak)
        f_o, b_o = self._gemm(rec, "attn_proj", T, g.d, sh.n_attn_out, peak)
        attn_f, attn_b = f_qkv + f_o, b_qkv + b_o

        # SDPA on TP-sharded heads; CP: each rank computes 1/CP of the (load-balanced) causal work
        if self.tb.sdpa:
            sd_f = rec.use("sdpa", self.tb.sdpa["fwd"].lookup(seqlen, mbs, g.nq / tp, g.hd)) / cp
            sd_b = rec.use("sdpa", self.tb.sdpa["bwd"].lookup(seqlen, mbs, g.nq / tp, g.hd)) / cp
        else:
            rec.mark("sdpa", ANALYTIC)
            sd_f = an.sdpa_fwd_time(seqlen, mbs, g.nq / tp, g.hd, peak, hbm) / cp
            sd_b = an.SDPA_BWD_OVER_FWD * sd_f

        # element-wise: 2 norms, 2 residual adds, RoPE on q/k, gate sigmoid*mul
        ew_f, ew_b = self._elementwise(rec, g, T, Tsp, (g.nq / tp + kv_loc) * g.hd, b_el, hbm)
        if g.gate:  # the head gate has no table: bytes through HBM
            gate = an.memory_time(b_el * T * g.nq * g.hd / tp * 3, hbm)
            ew_f, ew_b = ew_f + gate, ew_b + 2 * gate

        # dense MLP (first block(s)) and the MoE block
        w1 = 2 if g.glu else 1
        dm_f1, dm_b1 = self._gemm(rec, "dense_mlp", T, w1 * g.dff / tp, g.d, peak, active=g.n_dense > 0)
        dm_f2, dm_b2 = self._gemm(rec, "dense_mlp", T, g.d, g.dff / tp, peak, active=g.n_dense > 0)
        act_dense = an.memory_time(b_el * T * g.dff / tp * 3, hbm)
        dense_f, dense_b = dm_f1 + dm_f2 + act_dense, dm_b1 + dm_b2 + 2 * act_dense

        z = np.zeros(P)
        rg_f = rg_b = tk_f = tk_b = perm = ex_f = ex_b = z
        moe_f = moe_b = a2a_f = a2a_b = sh_f = sh_b = z
        E_loc = np.ones(P)
        if moe:
            E_loc, R, tile = sh.E_loc, sh.R, sh.tile    # balanced routing; EP tile correction
            # router GEMM (fp32 island costed as bf16 GEMM: d x E is tiny) + top-k
            rg_f, rg_b = self._gemm(rec, "router", Tsp, g.E, g.d, peak)
            if self.tb.topk:
                tk_f = rec.use("router", self.tb.topk["fwd"].lookup(Tsp, g.E, g.K))
                tk_b = rec.use("router", self.tb.topk["bwd"].lookup(Tsp, g.E, g.K)) if "bwd" in self.tb.topk \
                    else tk_f
            else:
                rec.mark("router", ANALYTIC)
                tk_f = an.memory_time(4.0 * Tsp * g.E * 3, hbm)
                tk_b = tk_f
            perm = an.memory_time(b_el * (Tsp + R) * g.d * 2 * 2, hbm)   # permute + unpermute
            rec.mark("permute", ANALYTIC)
            ffn_loc = sh.ffn_loc
            ex_f, ex_b = self._experts(rec, g, E_loc, tile, etp, peak, hbm)
            ex_act = an.memory_time(b_el * R * ffn_loc * 3, hbm)        # SwiGLU on routed rows
            ex_f, ex_b = ex_f + ex_act, ex_b + 2 * ex_act
            if g.dsh:
                s1f, s1b = self._gemm(rec, "shared_expert", T, w1 * g.dsh / tp, g.d, peak)
                s2f, s2b = self._gemm(rec, "shared_expert", T, g.d, g.dsh / tp, peak)
                s_act = an.memory_time(b_el * T * g.dsh / tp * 3, hbm)
                sh_f, sh_b = s1f + s2f + s_act, s1b + s2b + 2 * s_act
            # EP all-to-all: dispatch + combine per pass; per-rank buffer R*d*bytes
            span = tp * cp * ep
            # EP ranks are TP*CP apart: gpn / (TP CP) of them share a node
            a2a_one = self._collective(rec, "ep_a2a", "all_to_all", ep, sh.a2a_bytes, span > self.gpn,
                                       active=ep > 1, per_node=np.maximum(self.gpn / (tp * cp), 1.0))
            a2a_f, a2a_b = 2 * a2a_one, 2 * a2a_one
            moe_f = rg_f + tk_f + perm + ex_f
            moe_b = rg_b + tk_b + perm + ex_b

        # TP (sequence parallel): 2 all-gathers + 2 reduce-scatters of the full [T, d] per pass
        tp_inter = tp > self.gpn
        tp_one = self._collective(rec, "tp_comm", "all_gather", tp, T * g.d * b_el, tp_inter) + \
            self._collective(rec, "tp_comm", "reduce_scatter", tp, T * g.d * b_el, tp_inter)
        tp_f = tp_b = 2 * tp_one
        t_first, t_last_f, t_last_b = self._vocab(rec, g, T, tp, peak, hbm, b_el)
        ks = self.kernel_scale
        if ks != 1.0:  # fitted for serial-dispatch (CPU) profiles only (calibrate/run_scales.py)
            (attn_f, attn_b, sd_f, sd_b, ew_f, ew_b, dense_f, dense_b, moe_f, moe_b, sh_f, sh_b, rg_f, rg_b, tk_f, tk_b,
             perm, ex_f, ex_b, t_first, t_last_f, t_last_b) = (ks * x for x in (
                attn_f, attn_b, sd_f, sd_b, ew_f, ew_b, dense_f, dense_b, moe_f, moe_b, sh_f, sh_b, rg_f, rg_b, tk_f,
                tk_b, perm, ex_f, ex_b, t_first, t_last_f, t_last_b))
        t_last = t_last_f + t_last_b

        # CP: all-gather K,V forward; all-gather + reduce-scatter of dK,dV backward
        kv_bytes = seqlen * mbs * 2 * kv_loc * g.hd * b_el
        cp_inter = tp * cp > self.gpn
        # TE's ring attention exchanges K/V blocks peer to peer while it computes on the previous
        # block: only the part of the exchange longer than the attention itself is exposed
        cp_f = np.maximum(self._collective(rec, "cp_comm", "all_gather", cp, kv_bytes, cp_inter) - sd_f, 0.0)
        cp_b = np.maximum(cp_f + self._collective(rec, "cp_comm", "reduce_scatter", cp, kv_bytes, cp_inter)
                          - sd_b, 0.0)
        names = ("attn_f", "attn_b", "sd_f", "sd_b", "ew_f", "ew_b", "dense_f", "dense_b", "moe_f", "moe_b", "a2a_f",
                 "a2a_b", "sh_f", "sh_b", "E_loc", "rg_f", "rg_b", "tk_f", "tk_b", "perm", "ex_f", "ex_b",
                 "tp_f", "tp_b", "cp_f", "cp_b", "t_first", "t_last", "t_last_f", "t_last_b", "T", "Tsp")
        loc = locals()
        return {k: np.broadcast_to(np.asarray(loc[k], dtype=float), (P,)) for k in names}

    def evaluate(self, g: Geometry, pl: Plans, gbs: int, seqlen: int, optimizer: str) -> Evaluation:
        """Evaluate every plan of ``pl``; see the module docstring for the terms. Arrays of length P."""
        P = len(pl)
        rec = _Recorder(P, self.mode)
        self.tb = self._tb_base.view(g.precision)  # the spec's precision's GEMM/grouped/vocab rows
        prof = self.prof
        peak = prof.peak(g.precision)
        hbm = prof.hbm_bandwidth
        b_el = BYTES_PER_ELEMENT.get(g.precision, 2)
        tp, cp, pp, dp, ep, etp, vpp, mbs = (getattr(pl, f).astype(float) for f in
                                             ("tp", "cp", "pp", "dp", "ep", "etp", "vpp", "mbs"))
        ckc = pl.ckpt
        n_mb = gbs / (dp * mbs)
        moe = g.is_moe
        # kernel times depend on (TP, CP, EP, ETP, B_micro) only: evaluate each distinct tuple once
        code = (((pl.tp * 4096 + pl.cp) * 4096 + pl.ep) * 64 + pl.etp) * 4096 + pl.mbs
        _, first, inv = np.unique(code, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        rec_u = _Recorder(len(first), self.mode)
        K = {k: v[inv] for k, v in self._kernels(g, pl.take(first), seqlen, rec_u).items()}
        rec.absorb(rec_u, inv)
        (attn_f, attn_b, sd_f, sd_b, ew_f, ew_b, dense_f, dense_b, moe_f, moe_b, a2a_f, a2a_b, sh_f, sh_b, E_loc,
         rg_f, rg_b, tk_f, tk_b, perm, ex_f, ex_b, tp_f, tp_b, cp_f, cp_b, t_first, t_last, t_last_f, t_last_b, T,
         Tsp) = (
            K[k] for k in ("attn_f", "attn_b", "sd_f", "sd_b", "ew_f", "ew_b", "dense_f", "dense_b", "moe_f", "moe_b",
                           "a2a_f", "a2a_b", "sh_f", "sh_b", "E_loc", "rg_f", "rg_b", "tk_f", "tk_b", "perm",
                           "ex_f", "ex_b", "tp_f", "tp_b", "cp_f", "cp_b", "t_first", "t_last", "t_last_f",
                           "t_last_b", "T", "Tsp"))

        # per-layer totals (shared expert overlapped with the routed all-to-all: max of the two)
        common_f = attn_f + sd_f + ew_f + tp_f + cp_f
        common_b = attn_b + sd_b + ew_b + tp_b + cp_b
        moe_lf = common_f + moe_f + np.maximum(sh_f, a2a_f)
        moe_lb = common_b + moe_b + np.maximum(sh_b, a2a_b)
        den_lf = common_f + dense_f
        den_lb = common_b + dense_b
        rc_moe = np.select([ckc == 3, ckc == 2, ckc == 1],
                           [moe_lf, sd_f + ew_f + (perm if moe else 0.0), sd_f], 0.0)
        rc_den = np.select([ckc == 3, ckc == 2, ckc == 1], [den_lf, sd_f + ew_f, sd_f], 0.0)
        # framework kernels (permutation copies, casts, router bookkeeping, bias-adds...) counted in
        # kappa0 but not costed above: each occupies the GPU for at least t_kernel_min
        units = _KERNEL_UNITS[ckc]
        n_fw = units * np.maximum(self.disp.kappa0 / 4.0 - COSTED_KERNELS_PER_FWD, 0.0)
        fw = n_fw * self.t_kernel_min * self.kernel_scale
        rec.mark("framework_kernels", MEASURED if self.tb.t_kernel_min_s else ANALYTIC)
        if self.serial:  # on a CPU these ops are host work: their time is in the dispatch term
            fw = np.zeros(P)
            rec.mark("framework_kernels", np.zeros(P, np.int8))
        t_moe_layer = moe_lf + moe_lb + rc_moe + fw
        t_den_layer = den_lf + den_lb + rc_den + fw

        L_stage = g.L / pp
        nd0 = np.minimum(g.n_dense, L_stage)  # dense blocks sit on the first stage
        # the all-to-all wire time the shared expert does not cover, per MoE layer (fwd, bwd, recompute)
        rc1 = np.where(ckc == 3, 1.0, 0.0)
        a2a_x = (np.maximum(sh_f, a2a_f) - sh_f) * (1 + rc1) + np.maximum(sh_b, a2a_b) - sh_b
        if moe:
            t_stage0 = nd0 * t_den_layer + (L_stage - nd0) * t_moe_layer
            t_other = np.where(pp > 1, L_stage * t_moe_layer, 0.0)
            a2a0, a2a_o = (L_stage - nd0) * a2a_x, np.where(pp > 1, L_stage * a2a_x, 0.0)
        else:
            t_stage0 = L_stage * t_den_layer
            t_other = np.where(pp > 1, t_stage0, 0.0)
            a2a0 = a2a_o = np.zeros(P)
        t_cmp = np.maximum(t_stage0, t_other)

        # CPU dispatch per stage and micro-batch (kernels x gap + host); the GPU of each stage runs
        # its layers plus its vocabulary work, and t_mb = max(GPU, CPU) per stage (self-limiting)
        kappa = (self.disp.kappa0 + self.disp.kappa1 * (E_loc if moe else 0.0)) * _KERNEL_UNITS[ckc] / 4.0
        n_moe_stage = L_stage * (g.n_moe / g.L) if moe else 0.0
        t_ep_host = np.where(ep > 1, n_moe_stage * self.disp.t_ep_host_s * _KERNEL_UNITS[ckc] / 4.0, 0.0)
        t_disp = L_stage * kappa * self.disp.t_gap_s + t_ep_host + self.disp.t_host_s
        t_step_host = np.zeros(P)
        if self.serial:
            t_disp, t_step_host = self._serial_host(rec, g, ckc, L_stage, nd0, t_disp, seqlen * mbs / cp)
        st = stage_periods(pp, t_stage0 - a2a0, t_other - a2a_o, t_first, t_last_f, t_last_b, t_disp, self.serial,
                           a2a0, a2a_o)
        f_bub = bubble_fraction(pp, vpp, n_mb)
        t_pipe = pipeline_time(n_mb, pp, vpp, st.period, t_first, t_last)
        t_bubble = f_bub * n_mb * st.period_disp
        t_vocab = t_pipe - n_mb * st.period_disp - t_bubble

        # PP send/recv of [T/TP, d] activations (fwd) and grads (bwd); neighbours are TP*CP*DP ranks apart
        p2p_inter = tp * cp * dp >= self.gpn
        p2p_bytes = Tsp * g.d * b_el
        p2p_bw = np.where(p2p_inter, prof.scaleout_bandwidth, prof.scaleup_bandwidth)
        t_p2p = np.where(p2p_inter, P2P_LAT_INTER_S, P2P_LAT_INTRA_S) + p2p_bytes / np.maximum(p2p_bw, 1.0)
        rec.mark("pp_p2p", np.where(pp > 1, ANALYTIC, 0))
        # a micro-batch crosses each of this rank's VPP chunk boundaries once forward, once backward
        t_pp = np.where(pp > 1, 2 * (vpp * n_mb + pp - 1) * t_p2p, 0.0)

        # DP: distributed optimizer reduce-scatter (grads) + all-gather (params), bucketed. They hide
        # behind the last micro-batch's compute, not behind the EP all-to-all: that uses the same
        # links (the NIC once either group leaves the node), so the window excludes its exposed part
        w_bwd = L_stage * (common_b + moe_b + sh_b if moe else den_lb)
        w_fwd = L_stage * (common_f + moe_f + sh_f if moe else den_lf)
        t_dp = self._dp_comm(rec, g, pl, tp, cp, pp, dp, ep, etp, w_fwd, w_bwd, optimizer)
        t_opt = self.kernel_scale * self._optimizer(rec, g, tp, cp, pp, dp, ep, etp, optimizer, peak, hbm) \
            + t_step_host

        comps = {
            "attn_proj": n_mb * L_stage * (attn_f + attn_b + np.where(ckc == 3, attn_f, 0.0)),
            "sdpa": n_mb * L_stage * (sd_f + sd_b + np.where(ckc >= 1, sd_f, 0.0)),
        }
        # the remaining compute of the slowest stage, attributed by component (fwd + bwd + recompute)
        rc = np.where(ckc == 3, 1.0, 0.0)
        if moe:
            n_m = L_stage - np.where(t_stage0 >= t_other, nd0, 0.0)
            n_d = L_stage - n_m
            comps["experts"] = n_mb * n_m * (ex_f * (1 + rc) + ex_b)
            comps["router"] = n_mb * n_m * ((rg_f + tk_f) * (1 + rc) + rg_b + tk_b)
            comps["permute"] = n_mb * n_m * perm * (2 + np.where(ckc >= 2, 1.0, 0.0))
            comps["shared_expert"] = n_mb * n_m * (sh_f * (1 + rc) + sh_b)
            comps["ep_a2a"] = n_mb * n_m * (np.maximum(a2a_f - sh_f, 0) * (1 + rc) + np.maximum(a2a_b - sh_b, 0))
            comps["dense_mlp"] = n_mb * n_d * (dense_f * (1 + rc) + dense_b)
        else:  # the same keys for every model, so consumers see one schema
            n_m, n_d = 0.0, L_stage
            for k in ("experts", "router", "permute", "shared_expert", "ep_a2a"):
                comps[k] = np.zeros(P)
            comps["dense_mlp"] = n_mb * L_stage * (dense_f * (1 + rc) + dense_b)
        comps["elementwise"] = n_mb * L_stage * (ew_f * (1 + np.where(ckc >= 2, 1.0, 0.0)) + ew_b)
        comps["framework_kernels"] = n_mb * L_stage * fw
        comps["tp_comm"] = n_mb * L_stage * (tp_f * (1 + rc) + tp_b)
        comps["cp_comm"] = n_mb * L_stage * (cp_f * (1 + rc) + cp_b)
        # make the per-component split add up exactly to n_mb * t_cmp (slowest stage)
        split = sum(comps.values())
        scale = np.where(split > 0, n_mb * t_cmp / np.where(split > 0, split, 1.0), 1.0)
        for k in comps:
            comps[k] = comps[k] * scale
        comps["dispatch_floor"] = n_mb * (st.period_disp - t_cmp)
        comps["bubble"] = t_bubble
        comps["vocab"] = t_vocab
        comps["pp_p2p"] = t_pp
        comps["dp_comm"] = t_dp
        comps["bias_sync"] = self._bias_sync(rec, g, tp, cp, pp, dp)
        comps["optimizer"] = t_opt
        if not self.serial:
            rec.mark("dispatch_floor", 0)
        rec.mark("bubble", rec.src.get("dispatch_floor", 0))
        t_an = sum(comps.values())
        # the share of the predicted time whose component read a composed (out-of-range) lookup
        composed_share = sum(np.where(rec.src.get(k, 0) == COMPOSED, v, 0.0) for k, v in comps.items()) / t_an

        # eq:desync, with the placement features of Megatron's rank order (desync_features)
        ep_nodes, pp_hops, deep = desync_features(tp, cp, pp, dp, ep, self.gpn)
        pp_nodes = pp_hops + 1
        t_a2a_wire = n_mb * n_m * (a2a_f * (1 + rc) + a2a_b) if moe else np.zeros(P)
        c = self.chi_c
        chi = (1.0 + c.c_level + c.c_a2a * (t_a2a_wire / t_an) * (ep_nodes > 1) + c.c_pp * pp_hops
               + c.c_ovl * deep)
        t_iter = chi * t_an

        tokens = gbs * seqlen
        denom = t_iter * prof.peak(g.precision) * (tp * cp * pp * dp)
        # eq:mfu: N(Z) = N_act, the non-embedding parameters active per token (the paper's N_act of
        # tab:scale-ladder and C_model = 6 N_act D); recomputation earns no credit (HFU adds it)
        mfu = 6.0 * g.n_act * tokens / denom
        mfu_val = 6.0 * g.n_mfu_validation * tokens / denom
        # HFU: add the recomputed forward FLOPs (full: the transformer blocks' 2 N_act per token;
        # selective / super-selective: the causal attention-score FLOPs)
        attn_score = 2.0 * seqlen * g.nq * g.hd * g.L  # per token, causal fwd QK^T + PV
        rec_flops = np.select([ckc == 3, ckc >= 1], [2.0 * g.n_act + attn_score, attn_score], 0.0) * tokens
        hfu = (6.0 * g.n_act * tokens + rec_flops) / denom
        return Evaluation(pl, n_mb, comps, rec.src, t_an, chi, t_iter, t_a2a_wire, ep_nodes.astype(int),
                          pp_nodes.astype(int), deep, mfu, mfu_val, hfu, rec.n_clamped, rec.oor, rec.warnings,
                          rec.notes, composed_share)

    def _serial_host(self, rec, g, ckc, L_stage, nd0, t_law, T):
        """Host seconds on a serial-dispatch device: (per micro-batch and stage, per step).

        Per micro-batch: n_moe_stage t_moe(ckpt) + n_dense_stage t_dense(ckpt) + t_microbatch(ckpt),
        the measured host time of the reference model's ops (dispatch rows ``ops:*``: op count kappa
        x seconds per op, bench/suites/model_ops.py); per step the optimizer's ops (step_moe,
        step_dense, step). A checkpoint mode without rows keeps the kernel-count law ``t_law``
        (labelled analytic). The first stage (dense blocks, embedding) is the one costed.
        """
        P = rec.P
        tb, prec = self.tb, g.precision
        E = int(g.E) if g.is_moe else 1
        n_moe = (L_stage - nd0) if g.is_moe else np.zeros(P)
        n_den = nd0 if g.is_moe else L_stage * np.ones(P)
        t_mb = np.array(t_law, dtype=float, copy=True).reshape(-1) * np.ones(P)
        src = np.full(P, ANALYTIC, dtype=np.int8)

        def part(name, ck):
            return tb.host_time(name, ck, prec, T, g.d, E)

        for code, ck in CKPT_NAMES.items():
            sel = ckc == code
            if not sel.any():
                continue
            den, mb, mo = part("dense", ck), part("microbatch", ck), part("moe", ck) if g.is_moe else 0.0
            if den is None or mb is None or mo is None:
                continue
            t_mb = np.where(sel, n_den * den + mb + n_moe * mo, t_mb)
            src[sel] = MEASURED
        rec.mark("dispatch_floor", src)
        # per step: the optimizer's ops; a part without a row issues none (the bench stores a part
        # that counts 0 ops, e.g. the per-layer master copies of an fp32 model, as UNSUPPORTED)
        st = {k: (v if v is not None else 0.0) for k in ("step_dense", "step", "step_moe")
              for v in [part(k, "")]}
        step = ((g.L - g.n_moe) * st["step_dense"] + st["step"] + g.n_moe * st["step_moe"]) * L_stage / g.L
        return t_mb, step

    # (op, tokens is the sequence-parallel shard?, count per layer and pass, analytic bytes factor)
    _EW_OPS = (("rmsnorm", True, 2, 2.0), ("residual_add", True, 2, 3.0), ("rope", False, 1, 2.0))

    def _elementwise(self, rec, g, T, Tsp, rope_width, b_el, hbm):
        """Per layer and micro-batch (fwd, bwd) seconds of the 2 RMSNorms and 2 residual adds on the
        sequence-parallel shard [T/TP, d] and RoPE on the local q/k heads [T, (n_q/TP + kv_loc) hd]:
        the element-wise table (bench/suites/elementwise.py) where it has the op, else the bytes
        through HBM (read + write; backward twice the forward), labelled analytic."""
        f = np.zeros(np.shape(T))
        b = np.zeros(np.shape(T))
        for op, sp, n, passes in self._EW_OPS:
            rows, width = (Tsp, g.d) if sp else (T, rope_width)
            tf, tb = self.tb.elementwise.get((op, "fwd")), self.tb.elementwise.get((op, "bwd"))
            if tf is not None:
                of = rec.use("elementwise", tf.lookup(rows, width))
                ob = rec.use("elementwise", tb.lookup(rows, width)) if tb is not None else 2 * of
            else:
                rec.mark("elementwise", ANALYTIC)
                of = an.memory_time(b_el * rows * width * passes, hbm)
                ob = 2 * of
            f, b = f + n * of, b + n * ob
        return f, b

    def _vocab(self, rec, g, T, tp, peak, hbm, b_el):
        """(t_first, t_last_fwd, t_last_bwd) per micro-batch: embedding gather/scatter; LM head GEMM +
        cross-entropy, forward and backward apart (the forward is exposed, :func:`stage_periods`).

        The vocab table has one vocab size V_t (Megatron-padded). Both kernels do work proportional
        to the logit count, so a TP-sharded padded vocab V_loc = pad(V, TP)/TP is looked up at the
        logit-equivalent token count T V_loc / V_t (in range or reported out of range like any axis).
        """
        V_loc = padded_vocab(g.vocab, tp.astype(np.int64)) / tp
        t_first = an.memory_time(b_el * T * g.d * 2 + 4.0 * T * g.d * 2, hbm)  # gather fwd, fp32 scatter-add bwd
        if self.tb.vocab and self.tb.vocab_size:
            teq = T * V_loc / self.tb.vocab_size
            t_last = {"fwd": np.zeros_like(T), "bwd": np.zeros_like(T)}
            for op in ("lm_head_gemm", "cross_entropy"):
                for dirn in ("fwd", "bwd"):
                    tab = self.tb.vocab.get((op, dirn))
                    if tab is not None:
                        t_last[dirn] = t_last[dirn] + rec.use("vocab", tab.lookup(teq, g.d))
            return t_first, t_last["fwd"], t_last["bwd"]
        else:
            rec.mark("vocab", ANALYTIC)
            f, b = self._gemm(rec, "vocab", T, V_loc, g.d, peak)
            ce = an.memory_time(4.0 * T * V_loc * 3, hbm)
            rec.mark("vocab", ANALYTIC)
            return t_first, f + ce, b + ce

    def _dp_comm(self, rec, g, pl, tp, cp, pp, dp, ep, etp, w_fwd, w_bwd, optimizer="adamw"):
        """Exposed data-parallel traffic per iteration (seconds, shape (P,)); groups and buckets:
        :func:`dp_buckets`.

        adam/adamw/sgd run Megatron's distributed optimizer (ZeRO-1): a bucketed fp32 gradient
        reduce-scatter overlapped with the last micro-batch's backward and a bf16 parameter all-gather
        overlapped with the next first forward; the last bucket of each is always exposed.
        muon/scion (:data:`ORTHO_OPTIMIZERS`) run Megatron-Core's layer-wise distributed optimizer: DDP
        all-reduces the fp32 gradients bucket by bucket during the backward (overlapped like the
        reduce-scatter), and after the step the owners broadcast the updated bf16 parameters, which
        nothing overlaps.
        On a serial-dispatch profile (a CPU) nothing overlaps: the collective runs on the computing cores.
        """
        out = np.zeros(len(pl))
        ortho = optimizer in ORTHO_OPTIMIZERS
        for params, group, layout, inter, nb in dp_buckets(g, tp, cp, pp, dp, ep, etp, self.gpn):
            per_bucket = params / nb
            act = (group > 1) & (params > 0)
            red = "all_reduce" if ortho else "reduce_scatter"
            rs = nb * self._collective(rec, "dp_comm", red, group, per_bucket * GRAD_BYTES_COMM, inter, layout, act)
            ag = nb * self._collective(rec, "dp_comm", "all_gather", group, per_bucket * PARAM_BYTES_COMM,
                                       inter, layout, act)
            if self.serial:
                out += rs + ag
            else:
                out += np.maximum(rs - w_bwd, rs / nb) + (ag if ortho else np.maximum(ag - w_fwd, ag / nb))
        return out

    def _bias_sync(self, rec, g, tp, cp, pp, dp):
        """The expert-bias token-count all-reduce of one step (:func:`bias_sync`), exposed: it runs
        between the backward and the optimizer step. A few kB: below a GPU table's measured sizes this
        is the analytic latency-bound ring time (labelled analytic)."""
        n_layers, group, inter, size = bias_sync(g, tp, cp, pp, dp, self.gpn)
        act = (n_layers > 0) & (group > 1)
        return n_layers * self._collective(rec, "bias_sync", "all_reduce", group, size, inter, "contiguous", act,
                                           small_analytic=True)

    def _optimizer(self, rec, g, tp, cp, pp, dp, ep, etp, optimizer, peak, hbm):
        """Optimizer step of one rank (seconds, shape (P,)): bandwidth / FLOP roofline.

        adam/adamw: read fp32 master, m, v and the grad, write master, m, v and the bf16 param
        (30 bytes/param), on this rank's distributed-optimizer shard (1/(DP CP) of the dense and
        1/EDP of the expert parameters). sgd (momentum): 18 bytes/param, sharded the same way.
        muon/scion: momentum update (18 bytes/param) plus 5 Newton-Schulz iterations per weight
        matrix, ~5 (4 m^2 n + 2 m^3) FLOPs for an m x n matrix (m <= n), at half the GEMM peak.
        Megatron-Core runs them under its layer-wise distributed optimizer
        (``LayerWiseDistributedOptimizer``: each DP rank owns whole weight matrices, orthogonalises
        only those and all-gathers the updated parameters), so the step is sharded over DP like
        Adam's, at matrix granularity.
        """
        rec.mark("optimizer", ANALYTIC)
        L_stage = g.L / pp
        ortho = optimizer in ORTHO_OPTIMIZERS
        dense_rep = dp * cp                                    # ranks sharing one dense shard's step
        exp_rep = np.maximum(tp * cp * dp / (ep * etp), 1)
        dense = (L_stage * g.attn_params + g.n_dense * g.dense_mlp_params / pp
                 + (g.n_moe / pp) * g.moe_dense_params + g.vocab * g.d) / (tp * dense_rep)
        experts = (g.n_moe / pp) * g.expert_params / (ep * etp) / exp_rep
        per = {"adam": 30.0, "adamw": 30.0, "sgd": 18.0, "muon": 18.0, "scion": 18.0}.get(optimizer, 30.0)
        t = an.memory_time(per * (dense + experts), hbm)
        if ortho:
            def ns(m, n):
                m, n = min(m, n), max(m, n)
                return 5.0 * (4.0 * m * m * n + 2.0 * m ** 3)
            attn = ns(g.d, g.nq * g.hd) * 2 + ns(g.d, g.nkv * g.hd) * 2
            exp_m = ns(g.d, g.dexp) * 3
            fl_dense = L_stage * attn / tp
            fl_exp = (g.n_moe / pp) * g.E * exp_m / (ep * etp)
            t = t + (fl_dense + fl_exp) / (0.5 * peak)
        return t
