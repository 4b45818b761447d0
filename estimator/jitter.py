"""Per-stage jitter through a 1F1B pipeline: a discrete-event schedule and its closed form (issue 27).

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

What it says about the measured sweeps: the cost per micro-batch is largest *from one stage to two*
(0 -> 0.74 sigma) and grows slowly after (x1.9 to P = 4, x1.3 to P = 8). The 700M sweep shows the
opposite (PP 1 -> 2 about free, 2 -> 4 +26-40%), so stage jitter is not what makes its PP = 4
layouts slow; for deep pipelines at r_fill ~ 1 the fill/drain intercept (negative: fewer stages
couple during the ramps) makes it smaller still. Its input, sigma, is measurable (the spread of one
stage's per-micro-batch forward + backward in a trace); none is published for these runs, so the
term is not in the time model (estimator/pipeline.py).

Nor is host synchronisation at the stage boundaries (estimator/exchanges.py): Megatron's blocking
p2p calls and ``batch_p2p_sync`` make every exchange a rendezvous of two stages' hosts, which with
fixed stage times costs only the exchanges' own time (once per slot at PP = 2, twice from PP = 3).
What the 700M sweep says instead: its EP = 1 layouts pipeline at no cost beyond the layers (step =
(n_mb + PP - 1)(26 ms + 48 ms x 16/PP) + 38 ms x 16/PP, within 1.1% at PP 1, 2, 4 and 8), while with
EP > 1 a PP >= 4 slot is 40-70 ms longer than the layers explain. A mechanism must therefore couple
the EP all-to-all with the pipeline. Per-rank delays that every MoE layer's EP rendezvous and every
stage exchange propagate were checked in estimator/jitter_ep.py: the EP ranks of a stage move
together, so the block is this module's pipeline with the slowest of EP per segment; exponential
delays give an EP level with 1F1B's own P shape, rare long stalls an EP x PP product that charges
the 5.4B's PP = 4 layouts twice the 700M's (docs/accuracy.md has the leave-one-sweep-out figures).
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
