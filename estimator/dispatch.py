"""The CPU dispatch law (sec:iteration-time-model): t_disp = L_stage kappa(E_loc) t_gap + t_host,
plus the per-MoE-layer host cost of the EP token path. Constants, the law, and the precedence of
its sources (defaults < profile < measured dispatch rows < calibration): :func:`law_in_force`. The law counts Megatron-Core's kernels: on a
serial-dispatch (CPU) profile, and for ``stack="reference"`` (scaleplan's own reference model) on any
profile, the measured host seconds of that model's ops (dispatch rows ``ops:*``) take precedence
over the whole law for each checkpoint mode they cover
(:func:`scaleplan.estimator.compute.measured_host_times`); a 'dispatch' calibration's
host_scale still scales them. Seconds."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike
from scaleplan.estimator.ckpt import CkptMode, full_recompute_units, kernel_units

if TYPE_CHECKING:
    from scaleplan.profiles import DispatchDefaults

# Kernel-count law kappa(E_loc) = kappa0 + kappa1 E_loc per transformer layer and micro-batch
# (forward + backward + full recompute). Defaults: GPU kernel counts read from rank-0 profiler
# traces of the Megatron-Core MoE stack (dmlc/ScalePlan dlcalc/utils/kernel_launch.py notes
# ~759 kernels/layer-mb at E_loc=16 and ~1576 at E_loc=128): two counted points, not an MFU fit.
KAPPA0_DEFAULT = 642.0
KAPPA1_DEFAULT = 7.29
# Share of those kernels issued per checkpoint mode, in forward-pass units: forward 1, backward 2,
# full recompute +1 forward; selective re-runs attention only, super-selective also norms/activations.
KERNEL_UNITS = kernel_units(list(CkptMode))  # per mode code: estimator/ckpt.py
T_GAP_DEFAULT_S = 15e-6   # launch-bound torch eager op on a modern host (dispatch table when present)
T_HOST_DEFAULT_S = 0.0    # fixed per-micro-batch host time; only a measured/calibrated value is used
# Kernels per layer-micro-batch (forward units) whose time the model costs one by one: QKV, O, SDPA,
# 2 norms, 2 residual adds, RoPE q/k, gate, router GEMM, top-k, permute, unpermute, SwiGLU, shared
# expert (3), all-to-all (2) - about 20 per forward; the grouped GEMMs are costed per expert.
COSTED_KERNELS_PER_FWD = 20.0
# The software stack whose host dispatch a prediction is for: "megatron" (the kernel-count law above
# on a GPU) or "reference" (scaleplan's own reference model, scaleplan/reference/model.py: its op
# counts and host seconds per op measured by the dispatch suite's ops:* modes, on CPU and GPU).
STACKS = ("megatron", "reference")


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
    # the training stack kappa was counted on (a Stack.key): the paper's for the defaults and the profiles'
    # trace-derived laws; a calibration fitted on a stack's own traces counts that stack's kernels
    kappa_stack: str = "megatron"

    def kappa(self, E_loc: ArrayLike) -> np.ndarray:
        """kappa(E_loc) = kappa0 + kappa1 E_loc: kernels per layer and micro-batch, full-recompute units."""
        return self.kappa0 + self.kappa1 * E_loc


RUNTIME_SCALES = ("host_scale", "kernel_scale", "ep_host_scale")  # carried by a 'dispatch' calibration


def law_in_force(profile_law: DispatchDefaults | None, table_t_gap_s: float | None,
                 table_t_host_s: float | None, calibration: Any = None,
                 host_ratio: float | None = None) -> tuple[DispatchLaw, dict[str, float]]:
    """The dispatch law a prediction uses, and the runtime scales (:data:`RUNTIME_SCALES`, 1 unless set).

    Precedence, lowest first: the module defaults; the profile's trace-derived law (``profile_law``, a
    profile's ``dispatch`` block or None), its host terms (t_gap, t_ep_host, t_host) times ``host_ratio`` where
    the law is another host's (:func:`lent_host_ratio`); the profile's measured dispatch rows (their
    isolated-chain gap ``table_t_gap_s`` only where the profile has no block-level gap; their ``table_t_host_s``
    always); a 'dispatch' calibration row (``calibration``: .id and .coefficients; each coefficient it carries
    replaces the one below, and it carries the runtime scales). Explicit scales given to the Estimator
    override the calibration's (applied by the caller). Seconds."""
    law = DispatchLaw()
    if profile_law is not None:
        p, r = profile_law, host_ratio or 1.0
        source = f"profile ({p.source})" + (f" x {r:.2f}, this host's measured launch gap over the lender's"
                                            if host_ratio else "")
        law = DispatchLaw(p.kappa0, p.kappa1, p.t_gap_s * r, p.t_host_s * r, source, p.t_ep_host_s * r)
    elif table_t_gap_s:
        law.t_gap_s, law.source = table_t_gap_s, "dispatch table"
    if table_t_host_s:
        law.t_host_s = table_t_host_s
    scales = dict.fromkeys(RUNTIME_SCALES, 1.0)
    if calibration is None:
        return law, scales
    co = calibration.coefficients
    law = DispatchLaw(float(co.get("kappa0", law.kappa0)), float(co.get("kappa1", law.kappa1)),
                      float(co.get("t_gap_s", law.t_gap_s)), float(co.get("t_host_s", law.t_host_s)),
                      f"calibration {calibration.id}", float(co.get("t_ep_host_s", law.t_ep_host_s)),
                      str(getattr(calibration, "stack", law.kappa_stack)) if co.get("kappa_from_traces")
                      else law.kappa_stack)
    return law, {k: float(co.get(k, 1.0)) for k in RUNTIME_SCALES}


def lent_host_ratio(t_gap_s: float | None, lender_t_gap_s: float | None) -> float | None:
    """The factor a law traced on another host (a profile's ``dispatch_from``) takes for this one: this host's
    isolated-chain launch gap over the lender's, both measured by ``scaleplan bench run --suite dispatch``
    (estimator/table_build._build_dispatch); None unless both are. The traced gap is a multiple of the chain gap
    (p6-b200, the one host measured both ways: 27 us traced, 15.9 us chain) taken here as the stack's, the same on
    both hosts, so the ratio of chain gaps carries the lender's traced law to this host."""
    return t_gap_s / lender_t_gap_s if t_gap_s and lender_t_gap_s else None


def dispatch_time(law: DispatchLaw, L_stage: ArrayLike, E_loc: ArrayLike, ckc: ArrayLike,
                  n_moe_stage: ArrayLike, ep: ArrayLike, extra_kernels: ArrayLike = 0.0,
                  units: ArrayLike | None = None, ep_host_s: ArrayLike | None = None) -> np.ndarray:
    """Host seconds to launch one micro-batch of one stage (arrays over plans): (L_stage kappa(E_loc) +
    extra_kernels) t_gap + n_moe_stage [EP > 1] t_ep_host + t_host, in the checkpoint mode's kernel units.
    ``extra_kernels``: what the plans' training stack launches beyond the stack the law was counted on, per
    stage and micro-batch in full-recompute units (estimator/kernel_counts.py). ``units``: the plans' kernel
    units as a share of full recompute's (default: the mode codes' own; a stack's recompute modules change
    them). ``ep_host_s``: seconds per MoE layer and micro-batch of the plans' token dispatcher on the host
    (default: the law's t_ep_host in those units; :func:`ep_host_time`)."""
    units = full_recompute_units(ckc) if units is None else units
    kappa = (L_stage * law.kappa(E_loc) + extra_kernels) * units
    per_layer = law.t_ep_host_s * units if ep_host_s is None else ep_host_s
    t_ep_host = np.where(ep > 1, n_moe_stage * per_layer, 0.0)
    return kappa * law.t_gap_s + t_ep_host + law.t_host_s


# Share of the step a plan's dispatch floor must reach before its untraced host cost is worth a warning: below a
# tenth, even halving the per-kernel host cost moves the step by under 5%.
UNTRACED_HOST_SHARE = 0.1


def host_untimed(law: DispatchLaw, stack_key: str, host_scaled: bool) -> bool:
    """True where a plan's host seconds on training stack ``stack_key`` rest on a per-kernel cost nobody measured on
    that stack: the law's t_gap was traced on ``law.kappa_stack``, and no host scale (``host_scaled``: a calibration
    of this stack's runs, or one given) corrects it."""
    return stack_key != law.kappa_stack and not host_scaled


def untraced_host_note(law: DispatchLaw, stack_key: str, share: float, host_scaled: bool,
                       device_only_s: float | None = None) -> str | None:
    """The warning of a host-bound plan (``share``: its dispatch floor over its step time) on a stack whose host is
    untimed (:func:`host_untimed`), with ``device_only_s``, the plan's step in seconds at no host cost (the GPU's
    work alone: what the step falls to if that stack's host keeps ahead of the device), where given. None where the
    law is this stack's own, a scale applies, or the floor is under :data:`UNTRACED_HOST_SHARE` of the step."""
    if not host_untimed(law, stack_key, host_scaled) or not share >= UNTRACED_HOST_SHARE:
        return None
    alone = "" if device_only_s is None else f"; at no host cost the step is {device_only_s:.3g} s, the GPU's work alone"
    return (f"dispatch_floor: {share:.0%} of the step is host launch time beyond the GPU's work, at the per-kernel "
            f"host cost traced on the {law.kappa_stack} stack ({law.source}); this stack's ({stack_key}) host is "
            f"untimed{alone}: one traced step (`scaleplan calibrate trace`) or its runs (`scaleplan calibrate fit "
            f"--kind dispatch --from-runs --stack {stack_key}`) set it")


# host syncs per MoE layer and forward pass of each token dispatcher, read from the code (none in the backward:
# its exchanges reuse the forward's split sizes or handle):
# * alltoall: token_dispatcher.py MoEAlltoAllTokenDispatcher: the per-expert counts are all-gathered over TP x EP,
#   copied to the host on a side stream and waited for (_maybe_dtoh_and_synchronize, d2h_event.synchronize)
#   before the all-to-alls that need them as split sizes;
# * allgather: MoEAllGatherTokenDispatcher.dispatch_postprocess: tokens_per_expert.cpu();
# * deepep (deep_ep v1.2.1 deep_ep.cpp intranode/internode_dispatch): the host spins on the received-token
#   count the notify kernel writes to mapped memory (not in cached mode, the backward's);
# * hybridep (hybrid-ep csrc/hybrid_ep/executor/executor.cu metadata_preprocessing_core): cudaStreamSynchronize
#   to read the permuted-token count from pinned memory, unless Megatron-Core passes it
#   (fused_a2a.HybridEPDispatch: non_blocking when drop-and-pad sizes the permuted rows on the host).
HOST_SYNCS = {"alltoall": 1, "allgather": 1, "deepep": 1, "hybridep": 1}


def ep_host_time(law: DispatchLaw, law_dispatcher: str, dispatcher: str, units: ArrayLike,
                 forward_passes: ArrayLike, drop_pad: bool = False, stock: bool = False) -> np.ndarray:
    """Host seconds per MoE layer and micro-batch of ``dispatcher``'s token path beyond its kernels (arrays over
    plans). The law's t_ep_host was read from traces of ``law_dispatcher``'s path on the law's stack (the
    profiles': the paper's all-to-all dispatcher, kernel_launch.py's "token-permute and all-to-all host work", a
    residual of its 700M runs' traces): that path pays it in the plans' kernel ``units``. Stock Megatron-Core
    (``stock``: kernel_counts.counted_as_stock) runs its all-to-all path as kernels the count holds (the counts'
    all-gather, the permutation, one all_to_all_single per exchange, the chunk sorts) and one host sync on the
    split sizes (token_dispatcher.py _maybe_dtoh_and_synchronize); the fused DeepEP and HybridEP dispatchers and
    the all-gather one likewise run single C++ calls or collectives. Each of these keeps only its host syncs
    (:data:`HOST_SYNCS`): each costs one launch gap t_gap, the stream left empty until the host issues the next
    kernel, once per forward pass (``forward_passes``: 1, or 2 where the MoE forward is re-run). HybridEP with
    ``drop_pad`` has no sync. A law traced on a fused dispatcher keeps its term for every dispatcher."""
    units = np.asarray(units, dtype=float)
    if law_dispatcher != "alltoall" or (dispatcher == "alltoall" and not stock):
        return law.t_ep_host_s * units
    syncs = 0 if (dispatcher == "hybridep" and drop_pad) else HOST_SYNCS[dispatcher]
    return syncs * law.t_gap_s * np.asarray(forward_passes, dtype=float) + 0.0 * units
