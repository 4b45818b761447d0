"""``scaleplan plan``: the cluster, window and platform that reach a target, as one call (:func:`run_plan`).

The question a budget meeting asks is MOSAIC's inverse: not "which model for this cluster and window" but
"which cluster and window, on which GPU, for this loss (or this model on D tokens), and at what cost".
Per platform (a cluster profile, resolved with its own tables, never rescaled from another) and node count:

* target loss: the shortest window that reaches it and that window's MOSAIC optimum (geometry, tokens, layout,
  MFU, memory), :mod:`scaleplan.mosaic.inverse`; target model (a spec and --tokens): its best layout's window;
* cost = GPUs x days x 24 x price per GPU-hour; goodput eta_good(N_dev) (:mod:`scaleplan.mosaic.goodput`)
  stretches every window, more on a larger cluster;
* the cheapest point within the constraints (--max-days, --max-gpu-hours, --max-cost), the fastest, and the
  frontier between them, each with P(reaches target) and where it lies beyond what was measured
  (:mod:`scaleplan.mosaic.plan_points`); at --confidence q all of it at that quantile of the search's draws
  (:mod:`scaleplan.mosaic.plan_draws`), not at the point estimates;
* the forward question on the same plans: the lowest loss the budget reaches.

Never imports torch (a planner command).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scaleplan.errors import SpecError
from scaleplan.mosaic.goodput import Goodput
from scaleplan.mosaic.run import SearchRequest

#: H100 (p5), H200 (p5en), B200 (p6) and GB200 NVL72 (p6e) nodes, each with its own profile
DEFAULT_PLATFORMS = ("p5.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge", "p6e-gb200.36xlarge")
#: default node counts: powers of two from 8 GPUs up to this many (8 counts on an 8-GPU node)
DEFAULT_MAX_GPUS = 1024
MIN_GPUS = 8
PICKS = ("cheapest", "fastest", "PROFILE@NODES")


@dataclass(frozen=True)
class PlanRequest:
    """Every input of ``scaleplan plan``. ``search``: the grid, batch, law, calibration, draws and workers
    (:class:`~scaleplan.mosaic.run.SearchRequest`; its profile, nodes and days are not used). ``nodes``: node
    counts per platform (missing: powers of two from MIN_GPUS to ``max_gpus`` GPUs). A target is
    ``target_loss`` or ``spec`` + ``tokens``; without one, a deadline or budget asks the forward question only.
    ``prices``: USD per GPU-hour per platform (else the profile's default, else none). ``pick``: the point
    --emit/--emit-spec write (cheapest, fastest or PROFILE@NODES). ``confidence``: plan every window, loss and
    refusal at that quantile of the draws (:mod:`scaleplan.mosaic.plan_draws`; None: the point estimates)."""

    search: SearchRequest
    platforms: tuple[str, ...] = DEFAULT_PLATFORMS
    nodes: dict = field(default_factory=dict)
    max_gpus: int = DEFAULT_MAX_GPUS
    target_loss: float | None = None
    spec: Path | None = None
    tokens: float | None = None
    max_days: float | None = None
    max_gpu_hours: float | None = None
    max_cost: float | None = None
    prices: dict = field(default_factory=dict)
    goodput: Goodput = Goodput()
    pick: str = "cheapest"
    confidence: float | None = None
    emit: str | None = None
    emit_spec: Path | None = None
    html: Path | None = None


@dataclass
class PlanReport:
    """What ``scaleplan plan`` found: ``out`` is its JSON document; ``chosen`` the point it emits."""

    request: PlanRequest
    out: dict[str, Any]
    chosen: dict | None = None


def default_nodes(profile, max_gpus: int = DEFAULT_MAX_GPUS) -> tuple[int, ...]:
    """Powers of two n with MIN_GPUS <= n x gpus_per_node <= max_gpus (and n <= the profile's max_nodes)."""
    gpn, out, n = int(profile.gpus_per_node), [], 1
    while n * gpn <= max_gpus and n <= profile.max_nodes:
        if n * gpn >= MIN_GPUS:
            out.append(n)
        n *= 2
    return tuple(out)


def check_plan(r: PlanRequest) -> dict:
    """Raises SpecError naming the first bad option; returns the profiles by name (loaded once)."""
    from scaleplan.emit import check_emit
    from scaleplan.mosaic.run import check_request
    from scaleplan.profiles import load_profile

    check_request(r.search)
    check_emit(r.emit, r.search.optimizer, "--optimizer", {"--emit-spec": r.emit_spec, "--html": r.html})
    if not r.platforms or len(set(r.platforms)) != len(r.platforms):
        raise SpecError("--platforms", ",".join(r.platforms), "one or more distinct profiles, each once")
    profs = {p: load_profile(p) for p in r.platforms}
    for name, prof in profs.items():
        if prof.measure_peak:
            raise SpecError("--platforms", name, "GPU node types (cpu-local is this machine, one node)")
    _check_target(r)
    if r.confidence is not None and not (0.5 <= r.confidence < 1 and r.search.samples > 0):
        raise SpecError("--confidence", r.confidence, "a probability in [0.5, 1), with --samples > 0 (the draws it "
                        "is read from)")
    _check_nodes(r, profs)
    _check_prices(r)
    r.goodput.validate()
    if r.search.calibration_id is not None:
        raise SpecError("--calibration", r.search.calibration_id, "'none' or left out (the newest per profile): "
                        "an id belongs to one profile, a plan spans several")
    if r.pick not in ("cheapest", "fastest") and _parse_pick(r.pick, r) is None:
        raise SpecError("--pick", r.pick, f"cheapest, fastest or PROFILE@NODES of the request ({r.platforms[0]}@8)")
    return profs


def _check_target(r: PlanRequest) -> None:
    windows = (r.max_days, r.max_gpu_hours, r.max_cost)
    for flag, v in (("--target-loss", r.target_loss), ("--tokens", r.tokens), ("--max-days", r.max_days),
                    ("--max-gpu-hours", r.max_gpu_hours), ("--max-cost", r.max_cost)):
        if v is not None and not (np.isfinite(v) and v > 0):
            raise SpecError(flag, v, "a positive finite number")
    if (r.spec is None) != (r.tokens is None):
        raise SpecError("--spec/--tokens", (str(r.spec) if r.spec else None, r.tokens), "both (a model and its "
                        "token budget) or neither")
    if r.spec is not None and r.target_loss is not None:
        raise SpecError("--target-loss", r.target_loss, "one target: a loss, or a spec with --tokens")
    if r.target_loss is None and r.spec is None and all(w is None for w in windows):
        raise SpecError("target", None, "--target-loss L, or --spec FILE --tokens D, or a deadline/budget "
                        "(--max-days, --max-gpu-hours, --max-cost) for the best loss it buys")


def _check_nodes(r: PlanRequest, profs: dict) -> None:
    for name in r.nodes:
        if name not in profs:
            raise SpecError("--nodes", name, f"a platform of the request ({', '.join(r.platforms)})")
    for name, prof in profs.items():
        counts = r.nodes.get(name) or default_nodes(prof, r.max_gpus)
        if not counts:
            raise SpecError("--max-gpus", r.max_gpus, f"at least {max(MIN_GPUS, prof.gpus_per_node)} (one node "
                            f"count of {name})")
        for n in counts:
            if not (isinstance(n, (int, np.integer)) and 1 <= n <= prof.max_nodes):
                raise SpecError("--nodes", n, f"node counts 1 to {prof.max_nodes} of {name}")


def _check_prices(r: PlanRequest) -> None:
    for name, usd in r.prices.items():
        if name not in r.platforms:
            raise SpecError("--price", name, f"a platform of the request ({', '.join(r.platforms)})")
        if not (np.isfinite(usd) and 0 < usd <= 1e4):
            raise SpecError("--price", f"{name}={usd}", "USD per GPU-hour in (0, 10000]")
    if r.max_cost is not None:
        for name in r.platforms:
            if name not in r.prices and _profile_price(name) is None:
                raise SpecError("--price", name, "a price per GPU-hour for every platform when --max-cost is "
                                f"given ({name} has no default: --price {name}=USD)")


def _profile_price(name: str):
    from scaleplan.profiles import load_profile

    return load_profile(name).price


def prices_of(r: PlanRequest) -> dict[str, dict | None]:
    """Per platform: {usd_per_gpu_hour, source, date} from --price, else the profile's default, else None."""
    out = {}
    for name in r.platforms:
        if name in r.prices:
            out[name] = {"usd_per_gpu_hour": float(r.prices[name]), "source": "--price", "date": None}
        else:
            p = _profile_price(name)
            out[name] = None if p is None else {"usd_per_gpu_hour": p.usd_per_gpu_hour, "source": p.source,
                                                "date": p.date}
    return out


def _parse_pick(pick: str, r: PlanRequest) -> tuple[str, int] | None:
    name, _, n = pick.rpartition("@")
    if name not in r.platforms or not n.isdigit():
        return None
    return name, int(n)


def run_plan(r: PlanRequest) -> PlanReport:
    """The whole answer (module docstring). Raises SpecError for a bad request, and (one line naming the
    constraint that binds and the best loss reachable) for a target no platform reaches within the constraints."""
    from scaleplan.mosaic import plan_run

    from threadpoolctl import threadpool_limits

    t0 = time.perf_counter()
    profs = check_plan(r)
    # many small array operations, here and in the forked workers (which inherit the limit): a threaded BLAS only
    # adds its threads' spinning (9 of 31 CPU-seconds on the 4 x 8 benchmark, in the parent alone)
    with threadpool_limits(limits=1, user_api="blas"):
        ctx = plan_run.Context.build(r, profs)
        try:
            out = plan_run.answer(ctx)
        finally:
            ctx.bank.close()
    out["counts"] = {"geometries": len(ctx.bank.geoms), "platforms": len(r.platforms),
                     "node_counts": len(ctx.keys), "estimator_evaluations": ctx.bank.n_planned,
                     "elapsed_s": time.perf_counter() - t0}
    chosen = plan_run.chosen(out, r)
    plan_run.launch_outputs(ctx, out, chosen)
    return PlanReport(r, out, chosen)
