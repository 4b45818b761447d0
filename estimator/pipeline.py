"""The 1F1B pipeline: bubble (eq:bubble), per-stage periods, the vocabulary stages
(sec:iteration-time-model). Pure functions of per-stage times; arrays over plans; seconds.

**Every fill and drain slot lasts a pacing period (the paper's form; fitted, no mechanism found).** With
per-micro-batch stage periods p_s (forward + backward) and the slowest p = max_s p_s, the step's pipelined
part lasts (n_mb + (PP - 1) / VPP) p: eq:bubble's t_bubble = f_bubble t_block with t_block = n_mb p, the
LM head and loss of the last stage inside p, which is what the paper's t_vocab ramp term
t_last n_mb f_bubble adds. A 1F1B schedule with fixed op times runs the fill and drain at the other
stages' own periods instead, (n_mb - 1) p + sum_s p_s (estimator/exchanges.py's discrete-event schedule
of Megatron's blocking exchanges; no stall beyond it), less by (PP - 1) times the last stage's LM head
surplus. The measurements side with the paper: on the 18B sweep at PP 16 (EP 8, three micro-batch
sizes) every slot, fill and drain included, grows by 129-140 ms per sample (benchmarks/deep_pipeline.py),
the pacing stage's slope (ours: 136 ms, its layers and LM head), not the other stages' (68 ms, their
layers). No cost in Megatron-Core's schedule code (the exchanges' device synchronize, the loss's and the
token dispatcher's host syncs, the warm-up order) reproduces it with fixed op times, so the form is a fit
to the runs, labelled so in docs/accuracy.md; the measurement that decides it is one rank's trace: the
first micro-batch's round trip on stage s in steady periods, PP - s - 1 + f/p under this form and less
at the other stages' periods (``scaleplan calibrate trace``, calibrate/trace_pipeline.py).
"""
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
    ramp: np.ndarray          # fill + drain: PP - 1 pacing periods (0 for one stage)
    ramp_disp: np.ndarray     # the same without the vocabulary work (the bubble of the layers alone)


@dataclass(frozen=True)
class StageWork:
    """One pipeline stage's work per micro-batch, seconds (arrays over plans): ``gpu`` its layers on the
    GPU without the exposed EP all-to-all, ``disp`` the host's time to launch them, ``a2a`` the exposed
    all-to-all wire time, which sits outside the dispatch max (:func:`stage_periods`); ``gpu_f`` the
    forward pass's part of ``gpu`` and ``share_f`` the forward's share of ``disp`` (its kernel units,
    estimator/ckpt.py), taken apart where ``split`` (default: the max over the whole micro-batch)."""

    gpu: np.ndarray
    disp: np.ndarray
    a2a: np.ndarray | float = 0.0
    gpu_f: np.ndarray | float = 0.0
    share_f: np.ndarray | float = 0.0
    split: np.ndarray | bool = False

    def overlapped(self, extra_f: ArrayLike = 0.0, extra_b: ArrayLike = 0.0) -> np.ndarray:
        """max(GPU, dispatch) of the forward pass plus that of the backward pass (seconds) where the host
        waits for the device between the two (``split``; :func:`stage_periods`), else of the micro-batch as a
        whole; ``extra_f`` / ``extra_b`` GPU seconds join each pass's GPU side. Written as the whole
        micro-batch's max plus what splitting adds: where one pass is host-bound and the other GPU-bound, the
        smaller of the one's host excess and the other's GPU excess (zero, exactly, where both lean alike)."""
        gpu_f = self.gpu_f + extra_f
        gpu_b = self.gpu - self.gpu_f + extra_b
        host_f = self.share_f * self.disp
        host_b = self.disp - host_f
        whole = np.maximum(self.gpu + extra_f + extra_b, self.disp)
        added = (np.minimum(np.maximum(host_f - gpu_f, 0.0), np.maximum(gpu_b - host_b, 0.0))
                 + np.minimum(np.maximum(gpu_f - host_f, 0.0), np.maximum(host_b - gpu_b, 0.0)))
        return whole + np.where(self.split, added, 0.0)

    def period(self, serial: bool) -> np.ndarray:
        """The stage's vocabulary-free period: max(GPU, dispatch) per pass + A2A (every term adds when ``serial``)."""
        return self.gpu + self.disp + self.a2a if serial else self.overlapped() + self.a2a


@dataclass(frozen=True)
class Middle:
    """The PP - 2 middle stages (``n`` of them, arrays over plans): the ones with the fewest and the most
    MoE blocks (``lo``, ``hi``: the slowest is one of them, the work being linear in the blocks) and the mean
    middle stage (``mean``: their periods' sum is n of its period where they are alike, what a fill and drain
    at the stages' own periods would add up; benchmarks/pipeline_mechanisms.py compares that form)."""

    n: np.ndarray
    lo: StageWork
    hi: StageWork
    mean: StageWork


@dataclass(frozen=True)
class Vocab:
    """The vocabulary work of the end stages per micro-batch, seconds: the embedding (first stage), the LM
    head + cross-entropy forward and backward (last stage), and the part of that backward no host work
    hides (``last_bwd_exposed``). ``loss_sync``: the host reads each micro-batch's loss (the stack's NaN check,
    :func:`stage_periods`), so the forward is exposed; else it joins the forward pass's GPU side."""

    t_first: np.ndarray | float = 0.0
    t_last_fwd: np.ndarray | float = 0.0
    t_last_bwd: np.ndarray | float = 0.0
    last_bwd_exposed: np.ndarray | float = 0.0
    loss_sync: bool = True


def stage_periods(pp: ArrayLike, first: StageWork, middle: Middle, last: StageWork, vocab: Vocab,
                  serial: bool = False) -> StagePeriods:
    """Per-micro-batch periods (seconds): the slowest stage's, first / middle / last stages considered,
    and the fill and drain, PP - 1 of them (:func:`pipeline_time`; module docstring).

    Per stage: t_mb = max(t_GPU, t_disp) + t_A2A + t_last_fwd (sec:iteration-time-model), the max taken
    per pass (forward, then backward with its recompute; :meth:`StageWork.overlapped`), where

    * the host waits for the device between a micro-batch's forward and backward pass, so neither pass's
      launch time hides under the other's kernels: with PP > 1 each 1F1B exchange ends in
      ``torch.cuda.synchronize()`` (Megatron-Core p2p_communication._communicate, under ``batch_p2p_comm``
      and ``batch_p2p_sync``, both on by default), and on the last stage (and at PP = 1) the loss's NaN
      check reads the loss on the host (below). An MoE forward also syncs the host at each MoE block
      (below), so the next forward's launches cannot run under a backward's kernels either. A stage whose
      forward is host-bound and backward device-bound (CUDA graphs or FP8 shift the two) takes the host's
      forward plus the device's backward. A dense model keeps the max over the micro-batch where nothing
      separates the passes: interleaved (VPP > 1, ``overlap_p2p_comm``: no synchronize) and at PP = 1, where
      the loss's sync follows the forward but the next forward's launches run under the backward's kernels.
    * the stage's GPU layer time excludes the exposed EP all-to-all (:class:`StageWork`). The all-to-all
      sits outside the dispatch max: Megatron's token dispatcher reads the per-expert token counts on the
      host before it can size the exchange (a device-to-host sync per MoE layer), so launch time already
      spent cannot hide the wire time.
    * the LM head + cross-entropy forward (last stage) is exposed: Megatron's loss function checks each
      micro-batch's loss for NaN/Inf on the host (rerun state machine, ``check_for_nan_in_loss_and_grad``),
      a device-to-host sync right after those kernels, so the host waits for them. A stack without that check
      (``stack.nan_check`` false: Megatron-Bridge's performance recipes) runs them under the backward's launches:
      they join the forward pass's GPU side (``vocab.loss_sync``). Their backward is
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
    first_p, last_p, one = end_periods(first, last, vocab, serial)
    d0, l0 = first.period(serial), last.period(serial)  # the end stages without their vocabulary work
    has_mid = np.asarray(middle.n) > 0
    mid_max = np.where(has_mid, np.maximum(middle.lo.period(serial), middle.hi.period(serial)), 0.0)
    period = np.where(pp > 1, np.maximum(np.maximum(first_p, last_p), mid_max), one)
    period_disp = np.where(pp > 1, np.maximum(np.maximum(d0, l0), mid_max), d0)
    # every fill and drain slot a pacing period (module docstring)
    hops = np.maximum(pp - 1, 0)
    return StagePeriods(period, period_disp, hops * period, hops * period_disp)


def end_periods(first: StageWork, last: StageWork, vocab: Vocab,
                serial: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first stage's, last stage's, a single stage's (PP = 1)) period per micro-batch, seconds, with their
    vocabulary work: the embedding on the first stage, the LM head and loss on the last (:func:`stage_periods`'
    rules)."""
    v = vocab
    f_gpu = first.gpu + v.t_first
    if serial:
        first_p = f_gpu + first.disp + first.a2a
        return first_p, last.period(serial) + v.t_last_fwd + v.t_last_bwd, first_p + v.t_last_fwd + v.t_last_bwd
    first_p = first.overlapped(v.t_first) + first.a2a
    hidden_f = 0.0 if v.loss_sync else v.t_last_fwd  # the LM head's forward under the host's launches, or after them
    exposed_f = v.t_last_fwd - hidden_f
    last_p = last.overlapped(hidden_f, v.t_last_bwd) + last.a2a + exposed_f + v.last_bwd_exposed
    one = first.overlapped(v.t_first + hidden_f, v.t_last_bwd) + first.a2a + exposed_f + v.last_bwd_exposed
    return first_p, last_p, one


def pipeline_time(n_mb: ArrayLike, vpp: ArrayLike, period: ArrayLike, ramp: ArrayLike) -> np.ndarray:
    """1F1B wall of the pipelined part (seconds): n_mb periods of the slowest stage plus the fill
    and drain, ``ramp`` (:class:`StagePeriods`), which VPP-way interleaving divides by VPP as it divides
    the bubble (eq:bubble)."""
    return np.asarray(n_mb, dtype=float) * period + ramp / np.asarray(vpp, dtype=float)
