"""Per-rank delays coupled through the EP all-to-all and the 1F1B stage exchanges (eq:desync).

The hypothesis checked here: the EP ranks of one pipeline stage belong to EP different data-parallel
replicas (Megatron-Core's rank order folds EP into DP), so every MoE layer's dispatch and combine
all-to-all is a rendezvous of EP pipelines, and every stage waits for its neighbour's activation or
gradient; a random delay anywhere in the EP x PP block of ranks should then propagate, costing more
with EP (the slowest of EP ranks), with PP (the path length) and with the rendezvous per 1F1B slot,
and nothing at EP = 1 beyond 1F1B's own coupling: the shape of the 700M sweep's excess.

:func:`simulate_coupled` runs that block: EP pipelines of P stages in Megatron's non-interleaved
1F1B order (:func:`jitter.schedule`; VPP = 1 only), every op cut into K segments that each end in
the stage's EP rendezvous (forward 2 all-to-alls per MoE layer; backward under full recompute 4:
the recomputed forward's and the backward's). Seconds per segment are the caller's.

**Reduction (exact, tested).** An op starts when the stage's previous op and its neighbour's op
have ended; both ended in a rendezvous, so all EP ranks of a stage start it together and end it
together: the block behaves like one 1F1B pipeline whose op delay is the sum over its K segments of
the slowest of EP ranks' delays. With i.i.d. exponential delays of scale sigma, the slowest of EP is
sum_i Exp(sigma / i) (Renyi), so an op's delay is sum_{i <= EP} Gamma(K, sigma / i): mean
K sigma H_EP, variance K sigma^2 sum 1/i^2 (only 1.25, 1.42, 1.53 times EP = 1's at EP = 2, 4, 8).

**What that gives** (seconds of step beyond every rank's own mean delay, per unit delay; small-delay
limit, :func:`stall_exponential`, :func:`stall_rare`):

* exponential delays (sigma per segment): ~ (n_mb + P - 1)(K_f + K_b)(H_EP - 1) (exact at P = 1,
  :func:`mean_excess`) plus 1F1B's own jitter term, which grows with P but hardly with EP. At the
  validation sweeps' fixed global batch n_mb (L / P) is constant, so the first part is an EP level
  independent of PP (the shape of the dispatch law's per-MoE-layer EP host term, t_ep_host) and the
  second is the plain-jitter shape that estimator/jitter.py already ruled out (cost at EP = 1).
* rare long stalls (probability q per rank and segment, length D; per unit q D): every rank's
  stall on a zero-slack op delays the whole block, so the excess is EP x (the K-weighted count of
  critical ops over all P stages) - the rank's own: about EP x PP x n_mb(PP = 1) (K_f + K_b) - own,
  an EP x PP product that grows with the MoE layers per stage.

Not in the time model (why: docs/accuracy.md, "Tried and not kept"). Its input is measurable: the
spread across ranks of one MoE layer's forward / backward time in a trace (sigma), or the rate and length
of a rank's host stalls (q, D).
"""
from __future__ import annotations

import numpy as np
from scaleplan.estimator.jitter import schedule, simulate

K_FWD_PER_MOE = 2  # EP rendezvous per MoE layer in a forward: dispatch and combine all-to-all
K_BWD_PER_MOE = 4  # in a backward under full recompute: the recomputed forward's 2 and the backward's 2


def simulate_coupled(fwd: np.ndarray, bwd: np.ndarray) -> np.ndarray:
    """Step times of EP pipelines coupled by per-segment EP rendezvous: ``fwd`` of shape (samples, EP,
    P, N, K_f) and ``bwd`` of shape (samples, EP, P, N, K_b), seconds of segment k of the forward /
    backward of micro-batch m on pipeline e's stage s; each segment ends when the slowest of the
    stage's EP ranks has done it. A forward waits for the previous stage's forward of its micro-batch
    in its own pipeline, a backward for the next stage's backward; each stage runs :func:`jitter.schedule`'s
    order. Returns the makespan per sample (seconds), shape (samples,).

    Raises:
        ValueError: ``fwd`` and ``bwd`` disagree on (samples, EP, P, N)."""
    if fwd.shape[:4] != bwd.shape[:4]:
        raise ValueError(f"fwd / bwd shapes: got {fwd.shape} and {bwd.shape}; (samples, EP, P, N) must agree")
    k, e, p, n = fwd.shape[:4]
    ends = {"F": np.full((k, e, p, n), np.nan), "B": np.full((k, e, p, n), np.nan)}
    segs = {"F": fwd, "B": bwd}
    clock = np.zeros((k, e, p))
    order, pos = schedule(p, n), [0] * p
    remaining = 2 * p * n
    while remaining:
        before = remaining
        for s in range(p):
            while pos[s] < len(order[s]):
                kind, m = order[s][pos[s]]
                if kind == "F":
                    dep = ends["F"][:, :, s - 1, m] if s > 0 else np.zeros((k, e))
                else:
                    dep = ends["B"][:, :, s + 1, m] if s < p - 1 else ends["F"][:, :, s, m]
                if np.isnan(dep).any():
                    break
                t = np.maximum(clock[:, :, s], dep)
                for j in range(segs[kind].shape[4]):  # each segment ends in the stage's EP rendezvous
                    t = np.broadcast_to((t + segs[kind][:, :, s, m, j]).max(axis=1, keepdims=True), (k, e))
                ends[kind][:, :, s, m] = clock[:, :, s] = t
                pos[s] += 1
                remaining -= 1
        if remaining == before:
            raise RuntimeError("1F1B schedule deadlocked")  # cannot happen for a valid order
    return clock.max(axis=(1, 2))


def op_delays(rng: np.random.Generator, ep: int, k_seg: int, shape: tuple, sigma: float) -> np.ndarray:
    """Delay of one op of the reduced pipeline (module docstring): the sum over ``k_seg`` segments of
    the slowest of ``ep`` i.i.d. exponential delays of scale ``sigma`` (seconds), drawn as
    sum_{i <= ep} Gamma(k_seg, sigma / i). Shape ``shape``."""
    return sum(rng.gamma(k_seg, sigma / i, shape) for i in range(1, ep + 1))


def _ops(n_moe: int) -> tuple[int, int]:
    return K_FWD_PER_MOE * n_moe, K_BWD_PER_MOE * n_moe


def mean_excess(ep: int, p: int, n: int, n_moe: int) -> float:
    """(n + P - 1)(K_f + K_b)(H_EP - 1): the step's excess per unit sigma from the slowest of EP alone
    (exponential delays; exact at P = 1, a lower bound beyond). ``n_moe`` MoE layers per stage."""
    kf, kb = _ops(n_moe)
    return (n + p - 1) * (kf + kb) * (float(np.sum(1.0 / np.arange(1, ep + 1))) - 1.0)


def stall_exponential(ep: int, p: int, n: int, n_moe: int, t_f: float = 1.0, t_b: float = 3.0,
                      samples: int = 400, seed: int = 0) -> float:
    """Expected step excess per unit sigma (a count of segments) of exponential per-segment delays,
    beyond each rank's own mean delay on the (n + P - 1)-slot path: Monte Carlo on the reduced
    pipeline, op times ``t_f``, ``t_b`` (units of sigma x 1000: the small-delay limit)."""
    rng, scale = np.random.default_rng(seed), 1e-3
    kf, kb = _ops(n_moe)
    f = t_f + op_delays(rng, ep, kf, (samples, p, n), scale)
    b = t_b + op_delays(rng, ep, kb, (samples, p, n), scale)
    ex = float(simulate(f, b).mean()) - (n + p - 1) * (t_f + t_b)
    return ex / scale - (n + p - 1) * (kf + kb)


def stall_rare(ep: int, p: int, n: int, n_moe: int, t_f: float = 1.0, t_b: float = 3.0) -> float:
    """Expected step excess per unit q D of rare stalls (probability q per rank and segment, length D,
    q -> 0), beyond the rank's own: EP x sum over ops of K_op x (the step's lengthening per second
    added to that op alone, 1 on zero-slack ops) - (n + P - 1)(K_f + K_b). Every op's perturbation is
    one sample of :func:`jitter.simulate`; op times ``t_f``, ``t_b`` (seconds, any unit)."""
    kf, kb = _ops(n_moe)
    d = 1e-6 * min(t_f, t_b)
    f = np.full((2 * p * n, p, n), t_f)
    b = np.full((2 * p * n, p, n), t_b)
    idx = np.arange(p * n)
    f[idx, idx // n, idx % n] += d
    b[p * n + idx, idx // n, idx % n] += d
    crit = (simulate(f, b) - (n + p - 1) * (t_f + t_b)) / d
    k_op = np.repeat([kf, kb], p * n)
    return float(ep * np.sum(k_op * crit) - (n + p - 1) * (kf + kb))
