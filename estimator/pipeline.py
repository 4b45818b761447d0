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
from numpy.typing import ArrayLike


def bubble_fraction(pp: ArrayLike, vpp: ArrayLike, n_mb: ArrayLike) -> np.ndarray:
    """eq:bubble: f_bubble = (PP - 1) / (VPP n_mb) (array-friendly)."""
    return (np.asarray(pp, dtype=float) - 1) / (np.asarray(vpp, dtype=float) * np.asarray(n_mb, dtype=float))


@dataclass
class StagePeriods:
    period: np.ndarray        # 1F1B period: slowest stage's max(GPU, dispatch) + A2A + exposed LM head/CE
    period_disp: np.ndarray   # the same without the vocabulary work
    ramp: np.ndarray          # the other PP-1 stages' periods summed (0 for one stage): fill + drain
    ramp_disp: np.ndarray     # the same without the vocabulary work (the bubble of the layers alone)


@dataclass(frozen=True)
class StageWork:
    """One pipeline stage's work per micro-batch, seconds (arrays over plans): ``gpu`` its layers on the
    GPU without the exposed EP all-to-all, ``disp`` the host's time to launch them, ``a2a`` the exposed
    all-to-all wire time, which sits outside the dispatch max (:func:`stage_periods`)."""

    gpu: np.ndarray
    disp: np.ndarray
    a2a: np.ndarray | float = 0.0

    def period(self, serial: bool) -> np.ndarray:
        """The stage's vocabulary-free period: max(GPU, dispatch) + A2A (every term adds when ``serial``)."""
        return self.gpu + self.disp + self.a2a if serial else np.maximum(self.gpu, self.disp) + self.a2a


@dataclass(frozen=True)
class Middle:
    """The PP - 2 middle stages (``n`` of them, arrays over plans): the ones with the fewest and the most
    MoE blocks (``lo``, ``hi``: the slowest is one of them, the work being linear in the blocks) and the mean
    middle stage (``mean``: their periods' sum is n of its period where they are alike)."""

    n: np.ndarray
    lo: StageWork
    hi: StageWork
    mean: StageWork


@dataclass(frozen=True)
class Vocab:
    """The vocabulary work of the end stages per micro-batch, seconds: the embedding (first stage), the LM
    head + cross-entropy forward and backward (last stage), and the part of that backward no host work
    hides (``last_bwd_exposed``)."""

    t_first: np.ndarray | float = 0.0
    t_last_fwd: np.ndarray | float = 0.0
    t_last_bwd: np.ndarray | float = 0.0
    last_bwd_exposed: np.ndarray | float = 0.0


def stage_periods(pp: ArrayLike, first: StageWork, middle: Middle, last: StageWork, vocab: Vocab,
                  serial: bool = False) -> StagePeriods:
    """Per-micro-batch periods (seconds): the slowest stage's, and the other stages' summed (the
    fill and drain, :func:`pipeline_time`), first / middle / last stages considered.

    Per stage: t_mb = max(t_GPU, t_disp) + t_A2A + t_last_fwd (sec:iteration-time-model), where

    * the stage's GPU layer time excludes the exposed EP all-to-all (:class:`StageWork`). The all-to-all
      sits outside the dispatch max: Megatron's token dispatcher reads the per-expert token counts on the
      host before it can size the exchange (a device-to-host sync per MoE layer), so launch time already
      spent cannot hide the wire time.
    * the LM head + cross-entropy forward (last stage) is exposed: Megatron's loss function checks each
      micro-batch's loss for NaN/Inf on the host (rerun state machine, ``check_for_nan_in_loss_and_grad``),
      a device-to-host sync right after those kernels, so the host waits for them. Their backward is
      launched at once after the loss and runs while the host launches the layers' backward: it joins the
      GPU side of the max, as does the embedding (first stage).
    * ``vocab.last_bwd_exposed``: the part of the LM head + CE backward that no host work hides, added
      outside the max like the forward. Under full recompute the last block's backward begins by
      re-running its forward, whose token dispatcher syncs the host on the per-expert counts (the
      sync above) before the host has issued more than the block's attention and router: the
      host waits for the LM head's backward, which nothing overlapped.

    PP = 1: one stage (``first``) runs the layers, the embedding and the LM head. ``serial``: the host
    dispatches on the cores that compute (a CPU device), so every term adds.
    """
    pp = np.asarray(pp)
    v = vocab
    f_gpu = first.gpu + v.t_first
    d0, l0 = first.period(serial), last.period(serial)  # the end stages without their vocabulary work
    if serial:
        first_p = f_gpu + first.disp + first.a2a
        last_p = l0 + v.t_last_fwd + v.t_last_bwd
        one = first_p + v.t_last_fwd + v.t_last_bwd
    else:
        first_p = np.maximum(f_gpu, first.disp) + first.a2a
        last_p = (np.maximum(last.gpu + v.t_last_bwd, last.disp) + last.a2a + v.t_last_fwd
                  + v.last_bwd_exposed)
        one = np.maximum(f_gpu + v.t_last_bwd, first.disp) + first.a2a + v.t_last_fwd + v.last_bwd_exposed
    has_mid = np.asarray(middle.n) > 0
    mid_max = np.where(has_mid, np.maximum(middle.lo.period(serial), middle.hi.period(serial)), 0.0)
    mid_p = middle.mean.period(serial)
    mid_sum = np.where(has_mid, middle.n * mid_p, 0.0)
    period = np.where(pp > 1, np.maximum(np.maximum(first_p, last_p), mid_max), one)
    period_disp = np.where(pp > 1, np.maximum(np.maximum(d0, l0), mid_max), d0)
    ramp = np.where(pp > 1, first_p + mid_sum + last_p - period, 0.0)
    # the stages after the first without their vocabulary work: PP - 1 alike ones where the split is even
    after = np.where(mid_p == l0, (pp - 1) * l0, mid_sum + l0)
    ramp_disp = np.where(pp > 1, d0 + after - period_disp, 0.0)
    return StagePeriods(period, period_disp, ramp, ramp_disp)


def pipeline_time(n_mb: ArrayLike, vpp: ArrayLike, period: ArrayLike, ramp: ArrayLike) -> np.ndarray:
    """1F1B wall of the pipelined part (seconds): n_mb periods of the slowest stage plus the fill
    and drain through the other stages, ``ramp`` (:class:`StagePeriods`), which VPP-way
    interleaving divides by VPP as it divides the bubble (eq:bubble)."""
    return np.asarray(n_mb, dtype=float) * period + ramp / np.asarray(vpp, dtype=float)
