"""Goodput eta_good(N_dev): the share of the allocated wall-clock spent training (eq:deliverable-flops, eq:Dstar).

The paper holds eta_good = 1 (tab:results-envelope: "Goodput 1.0") and names what it stands for: time spent
checkpointing, recovering from failures or waiting on input. It writes eta_good(N_dev) because the loss
grows with the cluster: failures are independent per GPU, so N_dev GPUs fail lambda = N_dev r times an hour
(r per GPU-hour), and a cluster twice as large fails twice as often.

First-order model (Young 1974, "A first order approximation to the optimum checkpoint interval"; Daly 2006):
a checkpoint every tau hours stalls training delta hours; a failure costs the restart R (detect, reschedule,
reload the checkpoint) and, on average, the half interval of work since the last checkpoint. Per hour of
wall-clock the job loses delta / tau + lambda (R + tau / 2), so

    eta_good(N_dev) = max(0, 1 - delta / tau - N_dev r (R + tau / 2)).

tau is given, or Young's optimum tau* = sqrt(2 delta / lambda), which minimises the loss:
eta_good = 1 - sqrt(2 delta N_dev r) - N_dev r R. Units: seconds in, a fraction out.

Defaults and their source:
* r = 419 / (16,384 GPUs x 54 days x 24 h) = 1.97e-5 failures per GPU-hour: the unexpected interruptions of
  Llama 3 405B's pre-training (Llama Team, "The Llama 3 Herd of Models", arXiv:2407.21783, sec. 3.3.4: 466 job
  interruptions in a 54-day snapshot on 16,384 H100 GPUs, 47 of them planned maintenance, 419 unexpected).
* R = 10 minutes, delta = 10 s (an asynchronous checkpoint's stall): that report gives neither; these make the
  model give its ">90% effective training time" at its own scale (16,384 GPUs, Young's tau: 0.904).
Set your own (``scaleplan plan --failure-rate/--restart-min/--ckpt-save-s/--ckpt-interval-min``).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from scaleplan.errors import SpecError

#: Llama 3 405B pre-training: 419 unexpected interruptions, 16,384 H100 GPUs, 54 days (module docstring)
LLAMA3_FAILURES_PER_GPU_HOUR = 419 / (16_384 * 54 * 24)
RESTART_S = 600.0
CKPT_SAVE_S = 10.0
SOURCE = ("failures per GPU-hour: Llama 3 405B pre-training, 419 unexpected interruptions on 16,384 H100 GPUs "
          "in 54 days (arXiv:2407.21783 sec. 3.3.4); restart 10 min and checkpoint stall 10 s: assumed, so that "
          "the model gives that run's reported >90% effective training time at its scale (0.904)")


@dataclass(frozen=True)
class Goodput:
    """eta_good as a function of the GPU count (module docstring). ``ckpt_interval_s`` None: Young's optimum.
    ``fixed``: a constant eta_good instead of the model (``search --goodput``'s meaning)."""

    failures_per_gpu_hour: float = LLAMA3_FAILURES_PER_GPU_HOUR
    restart_s: float = RESTART_S
    ckpt_save_s: float = CKPT_SAVE_S
    ckpt_interval_s: float | None = None
    fixed: float | None = None

    def validate(self) -> None:
        """Raises SpecError naming the option whose value is out of range."""
        checks = (("--failure-rate", self.failures_per_gpu_hour, 0.0, 1.0, "failures per GPU-hour in [0, 1]"),
                  ("--restart-min", self.restart_s, 0.0, 30 * 86400.0, "minutes in [0, 43200]"),
                  ("--ckpt-save-s", self.ckpt_save_s, 0.0, 86400.0, "seconds in [0, 86400]"))
        for flag, v, lo, hi, allowed in checks:
            if not (math.isfinite(v) and lo <= v <= hi):
                raise SpecError(flag, v / 60 if flag == "--restart-min" else v, allowed)
        tau = self.ckpt_interval_s
        if tau is not None and not (math.isfinite(tau) and 0 < tau <= 30 * 86400):
            raise SpecError("--ckpt-interval-min", tau / 60, "minutes in (0, 43200]")
        if self.fixed is not None and not (math.isfinite(self.fixed) and 0 < self.fixed <= 1):
            raise SpecError("--goodput", self.fixed, "a fraction in (0, 1]")

    def interval_s(self, n_dev):
        """Checkpoint interval tau (seconds) on ``n_dev`` GPUs (array): given, or Young's optimum
        sqrt(2 delta / lambda) (inf without failures; 0 for a stall-free checkpoint)."""
        n = np.asarray(n_dev, dtype=float)
        if self.ckpt_interval_s is not None:
            return np.full_like(n, float(self.ckpt_interval_s))
        lam = n * self.failures_per_gpu_hour / 3600.0  # failures per second
        with np.errstate(divide="ignore"):
            return np.where(lam > 0, np.sqrt(2.0 * self.ckpt_save_s / np.maximum(lam, 1e-300)), np.inf)

    def eta(self, n_dev):
        """eta_good on ``n_dev`` GPUs (float for a scalar, else an array), in [0, 1]."""
        n = np.asarray(n_dev, dtype=float)
        if self.fixed is not None:
            out = np.full_like(n, float(self.fixed))
        else:
            tau = self.interval_s(n)
            lam = n * self.failures_per_gpu_hour / 3600.0
            finite = np.isfinite(tau) & (tau > 0)
            save = np.where(finite, self.ckpt_save_s / np.where(finite, tau, 1.0), 0.0)
            # an infinite tau only where lambda = 0 (nothing lost); tau = 0 only where delta = 0
            lost = lam * (self.restart_s + np.where(np.isfinite(tau), tau, 0.0) / 2.0)
            out = np.clip(1.0 - save - lost, 0.0, 1.0)
        return float(out) if out.ndim == 0 else out

    def describe(self) -> dict:
        """The model, its inputs and where the defaults come from (the plan JSON's ``goodput``)."""
        d = asdict(self)
        if self.fixed is not None:
            return {"model": "fixed (--goodput)", **d}
        return {"model": "eta = 1 - delta/tau - N_dev r (R + tau/2); tau = Young's sqrt(2 delta / (N_dev r)) "
                         "unless given", **d, "source": SOURCE}
