"""The 1F1B pipeline: bubble (eq:bubble), per-stage periods, the vocabulary stages
(sec:iteration-time-model). Pure functions of per-stage times; arrays over plans; seconds."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
