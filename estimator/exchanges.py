"""Megatron-Core's blocking pipeline exchanges in non-interleaved 1F1B: how many lie on the step's
critical path. Seconds; pure functions.

The schedule (``forward_backward_pipelining_without_interleaving``) moves activations and gradients
with ``p2p_communication``: recv_forward / send_forward around each warm-up forward,
send_forward_recv_backward after each steady forward, send_backward_recv_forward (send_backward on
the last one) after each steady backward, recv_backward / send_backward around each cool-down
backward. A call whose peer does not exist (the first stage's previous, the last stage's next) is
skipped. With ``batch_p2p_comm`` (the non-interleaved default) each call is one
``batch_isend_irecv`` that the caller waits on, followed by ``torch.cuda.synchronize()``
(``batch_p2p_sync``, default on): the call returns only once both peers have posted it and the
device has drained, a rendezvous of the two stages' hosts.

What that costs. With equal, fixed stage times the rendezvous adds nothing beyond the classic
(n_mb + PP - 1)(t_F + t_B) (:func:`simulate` checks it); what it puts on the critical path is each
exchange's own fixed time (wire, latency, the device drain of the sync): once per 1F1B slot at
PP = 2, where both stages are an end stage with one neighbour, and twice per slot from PP = 3 on,
where a middle stage meets each neighbour once per slot and every meeting waits for both sides:

    n_x = 0 (PP = 1),  n_mb + 1 (PP = 2),  2 (n_mb + PP) - 5 + [n_mb = 1] (PP >= 3)

(:func:`critical_exchanges`; ``tests/estimator/test_exchanges.py`` checks it against :func:`simulate`).
The paper's count, two per micro-batch and stage boundary for every PP > 1, charges PP = 2 twice.

What it does not explain (the 700M sweep's slow PP = 4 slots): docs/accuracy.md, "Tried and not kept".
"""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def stage_calls(s: int, p: int, n: int, t_f: float, t_b: float) -> list[tuple[str, object]]:
    """Stage ``s``'s ops in Megatron's order: ("C", seconds) compute, ("X", [(kind, peer)]) one
    blocking exchange ("send"/"recv" with stage ``peer``); calls without a peer are skipped."""
    w = min(p - s - 1, n)
    rf = [("recv", s - 1)] if s > 0 else []
    sf = [("send", s + 1)] if s < p - 1 else []
    rb = [("recv", s + 1)] if s < p - 1 else []
    sb = [("send", s - 1)] if s > 0 else []
    ops: list[tuple[str, object]] = []

    def x(*parts):  # one p2p call: skipped where none of its peers exists
        calls = [c for part in parts for c in part]
        if calls:
            ops.append(("X", calls))

    for _ in range(w):  # warm-up forwards
        x(rf)
        ops.append(("C", t_f))
        x(sf)
    if n > w:
        x(rf)
    for i in range(n - w):  # steady 1F1B: the last backward sends without receiving
        ops.append(("C", t_f))
        x(sf, rb)
        ops.append(("C", t_b))
        x(sb, rf if i < n - w - 1 else [])
    for _ in range(w):  # cool-down backwards
        x(rb)
        ops.append(("C", t_b))
        x(sb)
    return ops


def simulate(p: int, n: int, t_f: float, t_b: float, t_x: float = 0.0) -> float:
    """Step of Megatron's 1F1B with blocking exchanges (seconds): each stage runs :func:`stage_calls`;
    the k-th send from a to b meets the k-th receive on b from a; an exchange call returns ``t_x``
    after the last of its sends and receives has been posted by both sides."""
    ops = [stage_calls(s, p, n, t_f, t_b) for s in range(p)]
    pos, clock = [0] * p, [0.0] * p
    posted: dict[tuple[int, int, int, str], float] = {}
    count: dict[tuple[int, int, str], int] = {}
    mine: list[list | None] = [None] * p
    while any(pos[s] < len(ops[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while pos[s] < len(ops[s]):
                kind, what = ops[s][pos[s]]
                if kind == "C":
                    clock[s] += what
                elif mine[s] is None:  # post this call's sends and receives
                    mine[s] = []
                    for k, peer in what:
                        src, dst = (s, peer) if k == "send" else (peer, s)
                        i = count.get((src, dst, k), 0)
                        count[(src, dst, k)] = i + 1
                        posted[(src, dst, i, k)] = clock[s]
                        mine[s].append((src, dst, i))
                    moved = True
                    continue
                elif all((a, b, i, "send") in posted and (a, b, i, "recv") in posted for a, b, i in mine[s]):
                    clock[s] = max(max(posted[(a, b, i, "send")], posted[(a, b, i, "recv")])
                                   for a, b, i in mine[s]) + t_x
                    mine[s] = None
                else:
                    break
                pos[s] += 1
                moved = True
        if not moved:
            raise RuntimeError("1F1B exchanges deadlocked")  # cannot happen for Megatron's order
    return max(clock)


def critical_exchanges(pp: ArrayLike, n_mb: ArrayLike) -> np.ndarray:
    """Blocking exchanges on the critical path of one non-interleaved 1F1B step (arrays): 0 at
    PP = 1, n_mb + 1 at PP = 2, 2 (n_mb + PP) - 5 + [n_mb = 1] from PP = 3 (module docstring)."""
    pp = np.asarray(pp, dtype=float)
    n = np.asarray(n_mb, dtype=float)
    deep = 2 * (n + pp) - 5 + (n == 1)
    return np.where(pp <= 1, 0.0, np.where(pp == 2, n + 1, deep))
