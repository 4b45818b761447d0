"""Best plans per (platform, node count, geometry), each computed once and only where an answer needs it.

A geometry's best plan (eq:best-layout: the feasible plan of highest MFU) depends on the platform, the node
count and the batch, never on the window, the goodput or the target (search.py, step 2): ``scaleplan plan``
asks it once per (platform, nodes, geometry) and reuses it for every window, target and budget. Which
geometries it asks for is the planner's business (:mod:`scaleplan.mosaic.inverse`: only those a bound cannot
rule out); the bank plans them, in forked worker processes when there are several (the estimators, loaded
once here, are inherited), and counts every geometry it plans (``n_planned``: the estimator evaluations of
the answer, the unit of its cost).

Never imports torch.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from scaleplan.estimator.layout import FIELDS as LAYOUT_FIELDS
from scaleplan.estimator.layout import SPLIT_FIELDS
from scaleplan.mosaic.search import CHUNK, EVIDENCE_COLUMNS, Envelope, plan_table

#: plan_table's columns (a platform and node count with nothing planned yet has them, all empty)
PLAN_COLUMNS = ("plan_ok", "tokens_per_s", "mfu_plan", "composed_share", "mem_gb", *LAYOUT_FIELDS, *SPLIT_FIELDS,
                "ep_nodes", "analytic", *EVIDENCE_COLUMNS)

_BANK: PlanBank | None = None  # inherited by forked workers


@dataclass
class PlanBank:
    """Plans of the geometries ``geoms`` of ``grid`` for each platform of ``ests`` (profile name -> Estimator),
    under ``constraints`` and the batch of ``env`` (its nodes and days are not used)."""

    ests: dict
    grid: object
    geoms: pd.DataFrame
    env: Envelope
    constraints: object
    workers: int = 1
    n_planned: int = 0
    _parts: dict = field(default_factory=dict)   # (name, nodes) -> list of planned frames (index: geometry)
    _done: dict = field(default_factory=dict)    # (name, nodes) -> bool mask over geoms
    _full: dict = field(default_factory=dict)    # (name, nodes) -> the assembled frame (until new parts come)
    _pool: object = None

    def gpus_per_node(self, name: str) -> int:
        return int(self.ests[name].profile.gpus_per_node)

    def done(self, name: str, nodes: int) -> np.ndarray:
        """Which geometries have been planned on ``nodes`` nodes of ``name`` (bool mask over geoms)."""
        return self._done.setdefault((name, nodes), np.zeros(len(self.geoms), bool))

    def plans(self, name: str, nodes: int) -> pd.DataFrame:
        """The plan columns of :func:`~scaleplan.mosaic.search.plan_table`, one row per geometry (aligned with
        geoms); a geometry not planned yet reads as without a plan (plan_ok False)."""
        key = (name, nodes)
        if key not in self._full:
            parts = self._parts.get(key) or [_empty(self.geoms.index[:0])]
            df = pd.concat(parts).reindex(self.geoms.index)
            df["plan_ok"] = df["plan_ok"].fillna(False).astype(bool)
            self._full[key] = df
        return self._full[key]

    def ensure(self, wants: dict[tuple[str, int], np.ndarray]) -> None:
        """Plan every geometry index of ``wants[(name, nodes)]`` not planned yet (all keys at once, over the
        workers). One worker task per cluster size (GPU count), its platforms one after another: a worker then
        enumerates each plan set once for all platforms (``enumerate_plans`` memoises per GPU count), and the
        largest clusters, whose plans take longest, go first."""
        groups: dict[int, list] = {}
        for (name, nodes), idx in wants.items():
            idx = np.asarray(idx, dtype=int)
            todo = idx[~self.done(name, nodes)[idx]]
            for lo in range(0, len(todo), CHUNK):
                groups.setdefault(nodes * self.gpus_per_node(name), []).append((name, nodes, todo[lo:lo + CHUNK]))
        tasks = [groups[n] for n in sorted(groups, reverse=True)]
        for part_list in self._run(tasks):
            for name, nodes, idx, part in part_list:
                part.index = self.geoms.index[idx]
                self._parts.setdefault((name, nodes), []).append(part)
                self.done(name, nodes)[idx] = True
                self._full.pop((name, nodes), None)
                self.n_planned += len(idx)

    def _run(self, tasks: list[list]):
        if self.workers <= 1 or len(tasks) == 1:
            return [_plan_parts(t, self) for t in tasks]
        return list(self._workers().imap_unordered(_plan_parts, tasks))

    def _workers(self):
        global _BANK
        if self._pool is None:
            import multiprocessing as mp

            from scaleplan.mosaic.evidence import errors_for

            for est in self.ests.values():  # the rule errors once, here, not in every worker (plan_table needs them)
                errors_for(est)
            _BANK = self
            gc.freeze()  # the parent's objects out of the collector's reach: no copy-on-write of every page
            try:
                self._pool = mp.get_context("fork").Pool(self.workers)
            finally:
                _BANK = None
                gc.unfreeze()
        return self._pool

    def close(self) -> None:
        """Stop the workers (a later :meth:`ensure` forks new ones)."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None


def _empty(index) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=bool if c == "plan_ok" else float) for c in PLAN_COLUMNS}, index=index)


def _plan_parts(tasks: list[tuple], bank: PlanBank | None = None) -> list[tuple]:
    """:func:`_plan_part` of each task, in order (one worker task: one cluster size's platforms)."""
    return [_plan_part(t, bank or _BANK) for t in tasks]


def _plan_part(task: tuple, bank: PlanBank | None = None):
    """One task's plans: ``(name, nodes, geometry indices)`` -> (name, nodes, indices, plan_table frame)."""
    bank = bank or _BANK
    name, nodes, idx = task
    est = bank.ests[name]
    env = Envelope(nodes=nodes, days=1.0, gbs=bank.env.gbs, seqlen=bank.env.seqlen, optimizer=bank.env.optimizer)
    part = plan_table(est, bank.geoms.iloc[idx], bank.grid, nodes * int(est.profile.gpus_per_node), env,
                      bank.constraints)
    return name, nodes, idx, part
