"""MOSAIC: the loss-optimal MoE geometry, token budget and execution plan for a cluster and window.

Solves eq:hw-minlp exactly by enumeration (app:hw-optimization, "Algorithmic consequence"):

1. enumerate the realizable ladder geometries Z (sec:geometry-ladder; :mod:`scaleplan.mosaic.ladder`);
2. for each, the inner max of eq:c-flops / eq:best-layout: the estimator's best feasible plan
   (max MFU under the memory cap; ``Estimator.best_plans``, the plans of a batch of geometries evaluated
   as one set of arrays);
3. eliminate D in closed form (eq:Dstar): D* = F_peak N_dev T_train MFU eta_good / (6 N_act), computed as
   tokens/s of that plan x T_train x eta_good, which does not depend on how MFU counts parameters; keep
   TPP = D/N_act within [tpp_min, tpp_max] (below tpp_min the geometry is infeasible in this window,
   above tpp_max D is capped, sec:minlp-implementation);
4. score with the joint law (eq:joint-law) and take the argmin.

Steps 3-4 run over all geometries at once as numpy arrays. Step 2 does not depend on the window T_train or
the goodput, so a sweep over days reuses it; a sweep over node counts re-runs it per count.
Units: seconds, FLOP, FLOP/s, tokens, parameters (raw counts).
"""
from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from scaleplan.errors import SpecError
from scaleplan.mosaic.evidence import errors_for, plan_evidence
from scaleplan.mosaic.ladder import LadderGrid, enumerate_geometries, geometry_model
from scaleplan.mosaic.law import PAPER_JOINT_LAW, PAPER_SUPPORT, JointLaw, LawSupport
from scaleplan.mosaic.uncertainty import candidate_fields
from scaleplan.estimator.layout import FIELDS as LAYOUT_FIELDS
from scaleplan.estimator.layout import SPLIT_FIELDS

SECONDS_PER_DAY = 86400.0
EVIDENCE_COLUMNS = ("analytic_share", "extrapolated_share", "evidence_sigma", "extrapolated_collectives",
                    "unmeasured_kernel_share")
PAPER_TPP = (40.0, 150.0)


@dataclass(frozen=True)
class Envelope:
    """Hardware and batch envelope (tab:results-envelope): nodes of a profile for ``days``."""

    nodes: int
    days: float
    goodput: float = 1.0
    gbs: int = 1024
    seqlen: int = 2048
    optimizer: str = "adamw"
    tpp_min: float = PAPER_TPP[0]
    tpp_max: float = PAPER_TPP[1]

    def validate(self) -> None:
        """Raises SpecError on a non-positive or inconsistent input."""
        for name, v in (("--nodes", self.nodes), ("--days", self.days), ("--gbs", self.gbs),
                        ("--seqlen", self.seqlen)):
            if not v > 0:
                raise SpecError(name, v, "a positive number")
        if not 0 < self.goodput <= 1:
            raise SpecError("--goodput", self.goodput, "a fraction in (0, 1]")
        if not 0 < self.tpp_min <= self.tpp_max:
            raise SpecError("--tpp-min/--tpp-max", (self.tpp_min, self.tpp_max), "0 < tpp_min <= tpp_max")


def _plan_rows(est, models: list, n_devices: int, env: Envelope, constraints, errors) -> list[dict]:
    """plan_table's rows of ``models``: their best plans evaluated as one batch (``Estimator.best_plans``);
    ``errors``: the rule errors of the estimator's tables (mosaic.evidence.errors_for)."""
    return [_plan_row(res, errors) for res in est.best_plans(models, n_devices, env.gbs, env.seqlen, env.optimizer,
                                                             constraints)]


def _plan_row(res, errors) -> dict:
    if res is None:
        return {"plan_ok": False}
    lay = res.layout
    return {"plan_ok": True, "tokens_per_s": res.tokens_per_s, "mfu_plan": res.mfu,
            "composed_share": res.composed_share, "mem_gb": res.mem_per_device_gb, **{k: lay[k] for k in LAYOUT_FIELDS},
            **{k: lay.get(k, 0) for k in SPLIT_FIELDS},
            "ep_nodes": int((getattr(res, "chi_inputs", None) or {}).get("ep_nodes", 1)),
            "analytic": ",".join(sorted(k for k, v in res.sources.items() if v == "analytic")), **plan_evidence(res, errors)}


#: geometries per batch of Estimator.best_plans (bounds the memory: their plans are evaluated at once)
CHUNK = 256
_FORK_STATE: tuple | None = None  # (est, errors), inherited by forked workers


def _plan_chunk(task: tuple) -> list[dict]:
    est, errors = _FORK_STATE
    models, n_devices, env, constraints = task
    return _plan_rows(est, models, n_devices, env, constraints, errors)


class PlanPool:
    """Forked workers for :func:`plan_table`, started at the first batch they are given and kept for every
    pass of one search over one estimator (the main pass and the edge extension's): each new worker faults
    its arrays' pages in and warms its caches afresh (about 0.3 s of CPU a worker on the paper grid). The
    workers inherit the estimator and its rule errors; a batch's models and envelope travel with it."""

    def __init__(self, est, workers: int):
        self.est, self.workers, self._pool = est, workers, None

    def imap(self, tasks: list[tuple]):
        """Each task's rows (:func:`_plan_chunk`), in order."""
        global _FORK_STATE
        if self._pool is None:
            import multiprocessing as mp

            _FORK_STATE = (self.est, errors_for(self.est))  # measured once, here, before the workers fork
            # the parent's objects out of the collector's reach: a worker's collections would otherwise write
            # to (and so copy) every page that holds one
            gc.freeze()
            try:
                self._pool = mp.get_context("fork").Pool(self.workers)
            finally:
                _FORK_STATE = None
                gc.unfreeze()
        return self._pool.imap(_plan_chunk, tasks)

    def close(self) -> None:
        """Stop the workers (a later batch starts new ones)."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None


#: arrays up to this size come from (and return to) the heap, which keeps this much freed at its top
_HEAP_REUSE_BYTES = 64 << 20


def _reuse_freed_memory() -> None:
    """Have glibc serve the plan arrays (up to 64 MiB each) from the heap and keep freed ones for reuse. By
    default a block over its (adaptive, <= 32 MiB) threshold is mapped and unmapped on every allocation, and
    the heap top is returned to the kernel as it shrinks: each batch faulted its arrays' pages in afresh
    (paper grid: 660K page faults, 1.5 s system time in 7 s of CPU; 440K with this). Only the process's
    allocator settings change, never a number; elsewhere than glibc it does nothing."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(-1, 2 * _HEAP_REUSE_BYTES)  # M_TRIM_THRESHOLD
    mallopt(-3, _HEAP_REUSE_BYTES)  # M_MMAP_THRESHOLD


def default_workers() -> int:
    """Worker processes for the plan search: the usable CPUs (at most 8); 1 where fork is unavailable."""
    import multiprocessing as mp

    from scaleplan.profiles import usable_cpus

    if "fork" not in mp.get_all_start_methods():
        return 1
    return max(1, min(8, usable_cpus()))


def plan_table(est, geoms: pd.DataFrame, grid: LadderGrid, n_devices: int, env: Envelope, constraints=None,
               on_step: Callable[[int], None] | None = None, workers: int = 1,
               pool: PlanPool | None = None) -> pd.DataFrame:
    """Best feasible plan per geometry (eq:best-layout). One row per geometry, aligned with ``geoms``.

    The geometries are evaluated in batches of up to ``CHUNK`` (``Estimator.best_plans``: one evaluation
    per batch); they are independent, so with ``workers`` > 1 the batches are split over forked processes
    that inherit the estimator (its tables are loaded once, in this process): ``pool``'s, kept by the caller
    for its next call, else workers of this call's own. ``on_step(n)`` reports progress, one batch at a time.
    Columns: plan_ok, tokens_per_s, mfu_plan (non-embedding N_act, eq:mfu), composed_share (fraction of
    the plan's predicted time read from lookups composed beyond the measured tables), mem_gb,
    tp, cp, pp, ep, dp, mbs, ckpt, ep_nodes (nodes one EP group spans), analytic (comma-joined analytic
    components), analytic_share,
    extrapolated_share, evidence_sigma, extrapolated_collectives (:func:`scaleplan.mosaic.evidence.plan_evidence`).
    """
    from scaleplan.estimator import PlanConstraints

    constraints = constraints or PlanConstraints()
    _reuse_freed_memory()
    models = [geometry_model(r, grid) for r in geoms.itertuples(index=False)]
    step = on_step or (lambda n: None)
    rows: list[dict] = []
    # four batches per worker: the workers take the next batch when done, which balances geometries of
    # different plan counts, at little per-batch cost
    size = max(1, min(CHUNK, -(-len(models) // (4 * workers)))) if workers > 1 else CHUNK
    chunks = [(i, min(i + size, len(models))) for i in range(0, len(models), size)]
    if workers > 1 and len(chunks) > 1:
        own = pool is None or pool.est is not est
        pool = PlanPool(est, workers) if own else pool
        try:
            tasks = [(models[lo:hi], n_devices, env, constraints) for lo, hi in chunks]
            for (lo, hi), part in zip(chunks, pool.imap(tasks)):
                rows.extend(part)
                step(hi - lo)
        finally:
            if own:
                pool.close()
    else:
        errors = errors_for(est)
        for lo, hi in chunks:
            rows.extend(_plan_rows(est, models[lo:hi], n_devices, env, constraints, errors))
            step(hi - lo)
    cols = ["plan_ok", "tokens_per_s", "mfu_plan", "composed_share", "mem_gb", *LAYOUT_FIELDS, *SPLIT_FIELDS, "ep_nodes",
            "analytic", *EVIDENCE_COLUMNS]
    ints = {k: "Int64" for k in (*LAYOUT_FIELDS, *SPLIT_FIELDS) if k != "ckpt"}
    return pd.DataFrame(rows, columns=cols).astype({"plan_ok": bool, "ep_nodes": "Int64", **ints})


def score(geoms: pd.DataFrame, plans: pd.DataFrame, env: Envelope, peak_flops: float, n_devices: int,
          law: JointLaw = PAPER_JOINT_LAW, support: LawSupport = PAPER_SUPPORT) -> pd.DataFrame:
    """Token budget (eq:Dstar, TPP-limited), loss (eq:joint-law) and C_model for every geometry at once.

    Adds columns d_star, d_tokens, tpp, tpp_capped, c_model, loss, feasible, why (None, "no_plan", "tpp_min"),
    extrap_s, extrap_tpp (the candidate lies beyond the law's data support on S / on TPP).
    """
    df = pd.concat([geoms.reset_index(drop=True), plans.reset_index(drop=True)], axis=1)
    t_train = env.days * SECONDS_PER_DAY
    tps = df["tokens_per_s"].to_numpy(dtype=float)
    n_act = df["n_act"].to_numpy(dtype=float)
    d_star = tps * t_train * env.goodput                     # = C_peak MFU eta / (6 N_act) (eq:Dstar)
    ok_plan = df["plan_ok"].to_numpy(dtype=bool)
    enough = d_star >= env.tpp_min * n_act
    d = np.minimum(d_star, env.tpp_max * n_act)
    df["d_star"] = d_star
    df["d_tokens"] = d
    df["tpp"] = d / n_act
    df["tpp_capped"] = d_star > env.tpp_max * n_act
    df["c_model"] = 6.0 * n_act * d
    df["c_peak"] = peak_flops * n_devices * t_train
    with np.errstate(invalid="ignore"):
        df["loss"] = law(df["n_tot"].to_numpy(), df["s"].to_numpy(), d, df["g"].to_numpy())
    df["feasible"] = ok_plan & enough
    df["why"] = np.where(~ok_plan, "no_plan", np.where(~enough, "tpp_min", None))
    s = df["s"].to_numpy()
    df["extrap_s"] = (s < support.s_min) | (s > support.s_max)
    with np.errstate(invalid="ignore"):
        df["extrap_tpp"] = ok_plan & ((df["tpp"] < support.tpp_min) | (df["tpp"] > support.tpp_max))
    return df


def extrapolated(r) -> list[str]:
    """The axes ("S", "TPP") on which a scored row lies beyond the law's data support."""
    return [ax for ax, col in (("S", "extrap_s"), ("TPP", "extrap_tpp")) if bool(r.get(col, False))]


def row_json(r) -> dict:
    """One candidate in the JSON shape of the search (``best`` / ``top`` objects)."""
    return {"q": int(r["q"]), "n_layers": int(r["n_layers"]), "n_experts": int(r["n_experts"]),
            "topk": int(r["topk"]), "g": int(r["g"]), "n_act": float(r["n_act"]), "n_tot": float(r["n_tot"]),
            "s": float(r["s"]), "tpp": float(r["tpp"]), "d_tokens": float(r["d_tokens"]),
            "c_model": float(r["c_model"]), "mfu": float(r["mfu_plan"]),
            "composed_share": float(r["composed_share"]), "loss": float(r["loss"]),
            "tpp_capped": bool(r["tpp_capped"]), "tokens_per_s": float(r["tokens_per_s"]),
            "mem_per_device_gb": float(r["mem_gb"]),
            "layout": {**{k: (str(r[k]) if k == "ckpt" else int(r[k])) for k in LAYOUT_FIELDS},
                       **{k: int(r[k]) for k in SPLIT_FIELDS if k in r and r[k] > 0}},
            "extrapolated": extrapolated(r), **_evidence_json(r), **_reach_json(r),
            **(candidate_fields(r) if "p_optimal" in r else {})}


def _reach_json(r) -> dict:
    """A row's distance from what was measured (mosaic.evidence.reach), where the search computed it."""
    if "beyond" not in r:
        return {}
    return {"beyond": [x for x in str(r["beyond"] or "").split(", ") if x],
            "perf_doublings": float(r["perf_doublings"]), "law_doublings": float(r["law_doublings"])}


def _evidence_json(r) -> dict:
    """A row's evidence (mosaic.evidence): shares, sigma, and its own analytic / extrapolated components."""
    if "evidence_sigma" not in r:
        return {}
    split = lambda v: [x for x in str(v or "").split(",") if x]  # noqa: E731
    extra = split(r.get("extrapolated_collectives"))
    return {"analytic_share": float(r["analytic_share"]), "extrapolated_share": float(r["extrapolated_share"]),
            "evidence_sigma": float(r["evidence_sigma"]), "analytic_components": split(r.get("analytic")),
            "unmeasured_kernel_share": float(r["unmeasured_kernel_share"]),
            "extrapolated_collectives": extra}


@dataclass
class SearchResult:
    """The enumeration's outcome: all scored candidates, the optimum and the counts."""

    table: pd.DataFrame
    n_grid: int
    elapsed_s: float
    c_peak: float
    n_devices: int
    analytic_components: list[str] = field(default_factory=list)

    @property
    def frontier(self) -> pd.DataFrame:
        """Feasible candidates sorted by predicted loss (ties: more C_model first)."""
        f = self.table[self.table.feasible]
        return f.sort_values(["loss", "c_model"], ascending=[True, False], kind="stable")

    @property
    def best(self):
        f = self.frontier
        return None if f.empty else f.iloc[0]

    def to_json(self, top: int) -> dict:
        f = self.frontier
        t = self.table
        return {"best": None if f.empty else row_json(f.iloc[0]),
                "top": [row_json(r) for _, r in f.head(top).iterrows()],
                "n_candidates": len(t), "n_feasible": int(t.feasible.sum()), "n_grid": self.n_grid,
                "n_no_plan": int((t.why == "no_plan").sum()), "n_below_tpp_min": int((t.why == "tpp_min").sum()),
                "c_peak": self.c_peak, "n_devices": self.n_devices, "elapsed_s": self.elapsed_s,
                "analytic_components": self.analytic_components}


def _analytic(plans: pd.DataFrame) -> list[str]:
    s = set()
    for a in plans["analytic"].dropna():
        s.update(x for x in str(a).split(",") if x)
    return sorted(s)


class Mosaic:
    """The search over one profile.

    Plans are cached per (devices, gbs, seqlen, optimizer, constraints): everything the inner max of
    eq:c-flops depends on. They do not depend on the window or the goodput, so a days sweep reuses them.
    """

    def __init__(self, est, grid: LadderGrid, law: JointLaw = PAPER_JOINT_LAW, constraints=None,
                 progress: bool = False, workers: int = 1, support: LawSupport = PAPER_SUPPORT):
        self.est, self.grid, self.law, self.constraints, self.progress = est, grid, law, constraints, progress
        self.support = support
        self.workers = workers
        self.geoms = enumerate_geometries(grid)
        self._plans: dict[tuple, pd.DataFrame] = {}
        # workers kept across plan searches (and shared with the extended Mosaic) where the caller opens
        # them (:meth:`keep_workers`) and closes them; else each plan search forks its own
        self.pool: PlanPool | None = None

    def keep_workers(self) -> None:
        """Keep the plan workers from one plan search to the next (until :meth:`close`)."""
        if self.workers > 1 and self.pool is None:
            self.pool = PlanPool(self.est, self.workers)

    def close(self) -> None:
        """Stop the kept plan workers."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    @property
    def gpus_per_node(self) -> int:
        return int(self.est.profile.gpus_per_node)

    def plan_key(self, nodes: int, env: Envelope) -> tuple:
        """The cache key of :meth:`plans`: every input of ``Estimator.best_plan`` that can change."""
        return (nodes * self.gpus_per_node, env.gbs, env.seqlen, env.optimizer, self.constraints)

    def plans(self, nodes: int, env: Envelope) -> pd.DataFrame:
        """Best plan per geometry (:func:`plan_table`) on ``nodes`` nodes for env's batch and optimizer."""
        key = self.plan_key(nodes, env)
        if key not in self._plans:
            self._plans[key] = self._run_plans(key[0], env)
        return self._plans[key]

    def _run_plans(self, n_dev: int, env: Envelope, geoms: pd.DataFrame | None = None,
                   constraints=None) -> pd.DataFrame:
        """plan_table over ``geoms`` (default: the grid's) under ``constraints`` (default: the Mosaic's)."""
        from threadpoolctl import threadpool_limits

        from scaleplan.progress import transient_bar as bar

        # the plan search is many small array operations: a threaded BLAS only adds wake-up overhead
        with threadpool_limits(limits=1, user_api="blas"), \
                bar(disable=not (self.progress and sys.stderr.isatty())) as p:
            geoms = self.geoms if geoms is None else geoms
            task = p.add_task(f"best plans on {n_dev} devices", total=len(geoms))
            return plan_table(self.est, geoms, self.grid, n_dev, env, constraints or self.constraints,
                              on_step=lambda n: p.advance(task, n), workers=self.workers, pool=self.pool)

    def extended(self, grid: LadderGrid, constraints, envs: list[Envelope]) -> Mosaic:
        """A Mosaic over ``grid`` and ``constraints`` (a superset of this one's: more axis values, more
        micro-batch sizes) whose plans for ``envs`` reuse this one's: only the new geometries, and the added
        micro-batch sizes on every geometry, are planned (:func:`scaleplan.mosaic.edges.merged_plans`)."""
        from scaleplan.mosaic.edges import merged_plans

        from scaleplan.estimator import PlanConstraints

        base = self.constraints or PlanConstraints()
        m = Mosaic(self.est, grid, self.law, constraints, self.progress, self.workers, self.support)
        m.pool = self.pool
        added = tuple(sorted(set(constraints.mbs) - set(base.mbs)))
        for env in envs:
            n_dev = env.nodes * self.gpus_per_node
            extra = None
            if added:
                only_new = replace(base, mbs=added)
                extra = lambda g, e=env, n=n_dev, c=only_new: m._run_plans(n, e, g, c)  # noqa: E731
            m._plans[m.plan_key(env.nodes, env)] = merged_plans(
                self.geoms, self.plans(env.nodes, env), m.geoms,
                lambda g, e=env, n=n_dev: m._run_plans(n, e, g, base), extra)
        return m

    def run(self, env: Envelope) -> SearchResult:
        """Enumerate, plan, eliminate D and score: the exact optimum of eq:hw-minlp over the grid."""
        env.validate()
        t0 = time.perf_counter()
        plans = self.plans(env.nodes, env)
        n_dev = env.nodes * self.gpus_per_node
        peak = self.est.profile.peak("bf16")
        table = score(self.geoms, plans, env, peak, n_dev, self.law, self.support)
        return SearchResult(table=table, n_grid=self.grid.n_combinations, elapsed_s=time.perf_counter() - t0,
                            c_peak=peak * n_dev * env.days * SECONDS_PER_DAY, n_devices=n_dev,
                            analytic_components=_analytic(plans))


def sweep_row(res: SearchResult, env: Envelope) -> dict:
    """One budget of a sweep: the optimum and the best candidate per G (fig:gpuhours)."""
    f = res.frontier
    per_g = {int(g): row_json(grp.iloc[0]) for g, grp in f.groupby("g", sort=True)}
    return {"nodes": env.nodes, "days": env.days, "c_peak": res.c_peak,
            "gpu_hours": res.n_devices * env.days * 24.0,
            "best": None if f.empty else row_json(f.iloc[0]), "best_per_g": per_g,
            "n_feasible": int(res.table.feasible.sum())}
