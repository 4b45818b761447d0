"""The 1F1B pipeline: bubble (eq:bubble), per-stage periods, the vocabulary stages
(sec:iteration-time-model). Pure functions of per-stage times; arrays over plans; seconds.

**Fill and drain run through the other stages (a departure from the paper's t_vocab).** With
per-micro-batch stage periods p_s (forward + backward), a 1F1B step lasts
(n_mb - 1) max_s p_s + sum_s p_s: the first micro-batch's forward crosses stages 0..PP-2, the
slowest stage then paces n_mb periods, and the last micro-batch's backward crosses the stages back.
This is exact when the last stage is the slowest and the first stage carries at most a light
embedding (tests/estimator/test_pipeline.py checks it against a discrete-event 1F1B schedule).
The paper's t_vocab adds t_last n_mb f_bubble = (PP-1) t_last "for the ramp", charging the LM-head
surplus on each of the PP-1 fill/drain slots, which the last stage does not run; in the
compute-bound case :func:`pipeline_time` is the paper's t_block (1 + f_bubble) + t_vocab minus
exactly (PP-1) t_last."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def bubble_fraction(pp, vpp, n_mb):
    """eq:bubble: f_bubble = (PP - 1) / (VPP n_mb) (array-friendly)."""
    return (np.asarray(pp, dtype=float) - 1) / (np.asarray(vpp, dtype=float) * np.asarray(n_mb, dtype=float))


@dataclass
class StagePeriods:
    period: np.ndarray        # 1F1B period: slowest stage's max(GPU, dispatch) + A2A + exposed LM head/CE
    period_disp: np.ndarray   # the same without the vocabulary work
    ramp: np.ndarray          # the other PP-1 stages' periods summed (0 for one stage): fill + drain
    ramp_disp: np.ndarray     # the same without the vocabulary work (the bubble of the layers alone)


def stage_periods(pp, t_first_layers, t_other_layers, t_first, t_last_fwd, t_last_bwd, t_disp, serial=False,
                  a2a_first=0.0, a2a_other=0.0, last_bwd_exposed=0.0) -> StagePeriods:
    """Per-micro-batch periods (seconds): the slowest stage's, and the other stages' summed (the
    fill and drain, :func:`pipeline_time`), first / middle / last stages considered.

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
    * ``last_bwd_exposed``: the part of the LM head + CE backward that no host work hides, added
      outside the max like the forward. Under full recompute the last block's backward begins by
      re-running its forward, whose token dispatcher syncs the host on the per-expert counts (the
      sync above) before the host has issued more than the block's attention and router: the
      host waits for the LM head's backward, which nothing overlapped (:meth:`TimeModel._pipeline_terms`).

    PP = 1: one stage runs the layers, the embedding and the LM head. ``serial``: the host dispatches
    on the cores that compute (a CPU device), so every term adds.
    """
    pp = np.asarray(pp)
    if serial:
        first = t_first_layers + t_first + t_disp + a2a_first
        mid = t_other_layers + t_disp + a2a_other
        last = mid + t_last_fwd + t_last_bwd
        one = first + t_last_fwd + t_last_bwd
        d0 = t_first_layers + t_disp + a2a_first
    else:
        first = np.maximum(t_first_layers + t_first, t_disp) + a2a_first
        mid = np.maximum(t_other_layers, t_disp) + a2a_other
        last = np.maximum(t_other_layers + t_last_bwd, t_disp) + a2a_other + t_last_fwd + last_bwd_exposed
        one = np.maximum(t_first_layers + t_first + t_last_bwd, t_disp) + a2a_first + t_last_fwd + last_bwd_exposed
        d0 = np.maximum(t_first_layers, t_disp) + a2a_first
    # middle stages run the layers alone; the last stage is never lighter than they are
    period = np.where(pp > 1, np.maximum(first, last), one)
    period_disp = np.where(pp > 1, np.maximum(d0, mid), d0)
    ramp = np.where(pp > 1, first + (pp - 2) * mid + last - period, 0.0)
    # without the vocabulary work the last stage runs as a middle one
    ramp_disp = np.where(pp > 1, d0 + (pp - 1) * mid - period_disp, 0.0)
    return StagePeriods(period, period_disp, ramp, ramp_disp)


def pipeline_time(n_mb, vpp, period, ramp):
    """1F1B wall of the pipelined part (seconds): n_mb periods of the slowest stage plus the fill
    and drain through the other stages, ``ramp`` (:class:`StagePeriods`), which VPP-way
    interleaving divides by VPP as it divides the bubble (eq:bubble)."""
    return np.asarray(n_mb, dtype=float) * period + ramp / np.asarray(vpp, dtype=float)
