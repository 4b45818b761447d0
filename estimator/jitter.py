"""Per-stage jitter through a 1F1B pipeline: a discrete-event schedule and its closed form.

A stage's forward or backward of one micro-batch does not take a fixed time: host stalls (garbage
collection, allocator, Python, interrupts) and launch jitter add a random, one-sided delay. In 1F1B
every stage waits for its neighbour's activation (forward) or gradient (backward), so a delay on
one stage stalls the others: the step is the *longest* path through the schedule's dependency
graph, not the sum of mean times. With one stage there is one path (the delays add, mean for mean);
with P stages the step picks the slowest of many paths.

``simulate`` runs Megatron's non-interleaved 1F1B (warm-up forwards min(P - s - 1, N) on stage s,
then one forward one backward, then the cool-down backwards) with per-op durations drawn by the
caller, over many independent steps at once (numpy, vectorised over samples).

Closed form (``rate``, ``mean_field_rate``). In steady 1F1B a micro-batch's forward crosses every
stage downwards and its backward every stage upwards, and each stage alternates the two, so a delay
anywhere reaches every stage within a slot: the step grows *linearly* in N by sigma gamma(P) per
micro-batch (the DES: 0.74, 1.40, 1.77, 2.01 sigma for P = 2, 4, 8, 16 with exponential delays),
not by the sqrt(N) of a plain grid. Two stages rendezvous every slot, so gamma(2) is exact in mean
field: the slot lasts the longer of the two stages' forward + backward delays, E[max of two
Gamma(2, sigma)] - 2 sigma = 3/4 sigma. For P stages the mean-field value E[max of P Gamma(2)] - 2 is
an upper bound (a delay needs up to a slot per stage to reach the far end, so not all P rendezvous
at once): 0.75, 1.55, 2.36, 3.18 sigma. tests/estimator/test_jitter.py checks both against
``simulate``.

Not in the time model (estimator/pipeline.py): what its shape says about the measured sweeps, and why
neither it nor the coupled form of estimator/jitter_ep.py is kept, is in docs/accuracy.md ("Tried and not
kept"). Its input, sigma, is measurable: the spread of one stage's per-micro-batch forward + backward in a
trace.
"""
from __future__ import annotations

import numpy as np


def schedule(p: int, n: int) -> list[list[tuple[str, int]]]:
    """Megatron's non-interleaved 1F1B order per stage: [("F"|"B", micro-batch), ...] for stages 0..p-1."""
    out = []
    for s in range(p):
        w = min(p - s - 1, n)
        ops = [("F", m) for m in range(w)]
        for i in range(n - w):
            ops += [("F", w + i), ("B", i)]
        ops += [("B", m) for m in range(n - w, n)]
        out.append(ops)
    return out


def simulate(fwd: np.ndarray, bwd: np.ndarray) -> np.ndarray:
    """Step times of 1F1B runs: ``fwd``, ``bwd`` of shape (samples, P, N), seconds per op (stage s,
    micro-batch m). A forward waits for the previous stage's forward of its micro-batch, a backward
    for the next stage's backward; each stage runs its ops in :func:`schedule` order. Returns the
    makespan per sample, shape (samples,). p2p and host sync are part of the op times."""
    k, p, n = fwd.shape
    f_end = np.full((k, p, n), np.nan)
    b_end = np.full((k, p, n), np.nan)
    order = schedule(p, n)
    pos = [0] * p
    clock = np.zeros((k, p))
    remaining = sum(len(o) for o in order)
    while remaining:
        progressed = False
        for s in range(p):  # run every op whose dependency is done, stage by stage
            while pos[s] < len(order[s]):
                kind, m = order[s][pos[s]]
                if kind == "F":
                    dep = f_end[:, s - 1, m] if s > 0 else np.zeros(k)
                else:
                    dep = b_end[:, s + 1, m] if s < p - 1 else f_end[:, s, m]
                if np.isnan(dep).any():
                    break
                end = np.maximum(clock[:, s], dep) + (fwd if kind == "F" else bwd)[:, s, m]
                (f_end if kind == "F" else b_end)[:, s, m] = end
                clock[:, s] = end
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("1F1B schedule deadlocked")  # cannot happen for a valid order
    return clock.max(axis=1)


def deterministic(p: int, n: int, t_f: float, t_b: float) -> float:
    """The step without jitter, equal stages: (N + P - 1) (t_f + t_b) seconds."""
    return (n + p - 1) * (t_f + t_b)


def mean_field_rate(p: int, sigma: float, samples: int = 200_000, seed: int = 0) -> float:
    """Upper bound on the steady-state lengthening per micro-batch (seconds) by i.i.d. exponential
    per-op delays of sd ``sigma``: E[max over the P stages of one slot's forward + backward delay]
    (Gamma(2, sigma) each) minus its mean 2 sigma; exact for P = 2 (3/4 sigma), 0 for P = 1.
    Monte Carlo over ``samples`` slots (the maximum of P Gamma variables has no simpler form)."""
    if p <= 1:
        return 0.0
    if p == 2:
        return 0.75 * sigma
    g = np.random.default_rng(seed).gamma(2.0, 1.0, size=(samples, p))
    return sigma * (float(g.max(axis=1).mean()) - 2.0)
