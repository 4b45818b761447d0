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
                 table_t_host_s: float | None, calibration: Any = None) -> tuple[DispatchLaw,
                 dict[str, float]]:
    """The dispatch law a prediction uses, and the runtime scales (:data:`RUNTIME_SCALES`, 1 unless set).

    Precedence, lowest first: the module defaults; the profile's trace-derived law (``profile_law``, a
    profile's ``dispatch`` block or None); the profile's measured dispatch rows (their isolated-chain gap
    ``table_t_gap_s`` only where the profile has no block-level gap; their ``table_t_host_s`` always);
    a 'dispatch' calibration row (``calibration``: .id and .coefficients; each coefficient it carries
    replaces the one below, and it carries the runtime scales). Explicit scales given to the Estimator
    override the calibration's (applied by the caller). Seconds."""
    law = DispatchLaw()
    if profile_law is not None:
        p = profile_law
        law = DispatchLaw(p.kappa0, p.kappa1, p.t_gap_s, p.t_host_s, f"profile ({p.source})", p.t_ep_host_s)
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


def dispatch_time(law: DispatchLaw, L_stage: ArrayLike, E_loc: ArrayLike, ckc: ArrayLike,
                  n_moe_stage: ArrayLike, ep: ArrayLike, extra_kernels: ArrayLike = 0.0) -> np.ndarray:
    """Host seconds to launch one micro-batch of one stage (arrays over plans): (L_stage kappa(E_loc) +
    extra_kernels) t_gap + n_moe_stage [EP > 1] t_ep_host + t_host, in the checkpoint mode's kernel units.
    ``extra_kernels``: what the plans' training stack launches beyond the stack the law was counted on, per
    stage and micro-batch in full-recompute units (estimator/kernel_counts.py)."""
    units = full_recompute_units(ckc)
    kappa = (L_stage * law.kappa(E_loc) + extra_kernels) * units
    t_ep_host = np.where(ep > 1, n_moe_stage * law.t_ep_host_s * units, 0.0)
    return kappa * law.t_gap_s + t_ep_host + law.t_host_s
