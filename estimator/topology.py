"""Collectives on more ranks than any table measured (64-512 ranks from 8-32), from the measured ones by the
topology NCCL runs them on (sec:microbenchmarks, "NCCL collectives"; docs/architecture.md).

Busbw invariance alone (estimator/comm.py) keeps the bytes each link carries, which is right for the
bandwidth part of a ring: every rank still sends (n - 1) / n of the buffer through its own NIC (rails: one NIC
per GPU, rank i of each node on rail i). It leaves out that a ring of n ranks takes n - 1 steps (a
reduce-scatter or an all-gather; an all-reduce twice as many), each paced by the slowest link, an
inter-node hop once the group leaves the node: the latency of a ring grows linearly with n. The recorded B200
tables show it: at the smallest message (4 MB) an inter-node reduce-scatter takes 0.213 ms on 16 ranks and
0.374 ms on 32, 13.6 and 11.7 us per ring step, while at 2 GB both groups reach the same 360 GB/s of bus
bandwidth. NCCL runs an all-reduce as a double binary tree where that is faster: its latency grows with
log2 of the ranks. An all-to-all's n - 1 peer exchanges each pay a message's latency too.

The two do not add: a ring pipelines its chunks, so the steps' latency hides behind the transfer once a chunk
takes longer than a hop (the recorded 16- and 32-rank reduce-scatters take 0.482 and 0.495 ms at 128 MB).
So beyond the largest measured group n_ref: t(n, S) = max(t_table(n_ref, S'), L(n)), S' the busbw-invariant
message (comm.py), L(n) the latency floor on n ranks: the measured floor (the curve's smallest message) plus
alpha per added step (:func:`latency_floor`), alpha the growth between the two largest measured groups
(:func:`step_latency`; where it is not identified, invariance alone), the ring's steps, or for an all-reduce
the fewer of the ring's and the tree's (the algorithm is returned). Its hold-out on the recorded tables (the
32-rank curves from the 16-rank ones): docs/accuracy.md and tests/estimator/test_topology.py. (The
16-rank all-reduce is no ring: 646 GB/s of bus bandwidth at 2 GB, above its reduce-scatter's 362; NCCL's
two-node algorithm. An all-reduce is bounded by a reduce-scatter plus an all-gather, compose.py.)

Seconds; sizes in bytes per rank; ranks counted as a group size n.
"""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

RING, TREE = "ring", "tree"


def ring_steps(coll: str, n: ArrayLike) -> np.ndarray:
    """Latency-bound steps of ``coll`` on ``n`` ranks: n - 1 for a reduce-scatter, an all-gather and an
    all-to-all (its peer exchanges), 2 (n - 1) for a ring all-reduce (a reduce-scatter then an all-gather)."""
    n = np.asarray(n, dtype=float)
    return (2.0 if coll == "all_reduce" else 1.0) * np.maximum(n - 1.0, 0.0)


def tree_steps(n: ArrayLike) -> np.ndarray:
    """An all-reduce on a double binary tree: up and down its depth, 2 log2 n steps."""
    return 2.0 * np.log2(np.maximum(np.asarray(n, dtype=float), 1.0))


def step_latency(groups: ArrayLike, sizes: ArrayLike, times: ArrayLike, coll: str) -> float | None:
    """Seconds per ring step of one collective regime, from its measured curves (``groups``: group sizes,
    ascending; ``sizes`` / ``times``: each group's message bytes and seconds, ascending): the growth of the
    smallest message common to the two largest groups per added step. None where it is not identified (one
    group, no common message, or no growth: the recorded strided all-gather is faster on 4 ranks than on 2
    at 4 MB), and busbw invariance stays alone."""
    if len(groups) < 2:
        return None
    (g1, s1, t1), (g2, s2, t2) = ((float(groups[i]), np.asarray(sizes[i]), np.asarray(times[i])) for i in (-2, -1))
    common = set(s1.tolist()) & set(s2.tolist())  # not np.intersect1d: lookup_points.on_grid says why
    if not common:
        return None
    s = min(common)
    dt = float(t2[s2 == s][0] - t1[s1 == s][0])
    ds = float(ring_steps(coll, g2) - ring_steps(coll, g1))
    return dt / ds if dt > 0 and ds > 0 else None


def latency_floor(coll: str, n: ArrayLike, n_ref: ArrayLike, floor_ref: ArrayLike,
                  alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, algorithm): the latency-bound time of ``coll`` on ``n`` ranks, the measured ``floor_ref``
    on ``n_ref`` (its smallest message's time) plus alpha per added step, ring steps or for an all-reduce the
    tree's where they are fewer (its algorithm then "tree"); arrays broadcast. n <= n_ref keeps the floor."""
    n, n_ref, floor_ref = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (n, n_ref, floor_ref)))
    ring = alpha * np.maximum(ring_steps(coll, n) - ring_steps(coll, n_ref), 0.0)
    if coll != "all_reduce":
        return floor_ref + ring, np.full(n.shape, RING)
    tree = alpha * np.maximum(tree_steps(n) - tree_steps(n_ref), 0.0)
    return floor_ref + np.minimum(ring, tree), np.where(tree < ring, TREE, RING)
