"""The whole search as one call: a :class:`SearchRequest` in, a :class:`SearchReport` out (:func:`run_search`).

``scaleplan search`` parses its options into a request, calls :func:`run_search` and prints the report; the
report's ``out`` is the command's JSON document. Everything between (checks of the request, the estimator,
the MOSAIC enumeration per budget, the --samples draws, the by-sparsity and measured-only views, the CSV,
the plot and the launchable outputs) happens here. Never imports torch (a planner command).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scaleplan.errors import SpecError
from scaleplan.units import MEM_FRACTION, SEARCH_MBS  # the headroom and micro-batch sizes of layouts and search alike

if TYPE_CHECKING:
    from scaleplan.stack import Stack


@dataclass(frozen=True)
class SearchRequest:
    """Every input of a search (the options of ``scaleplan search``, already parsed into numbers); the
    defaults are the paper's envelope (tab:results-envelope, sec:minlp-implementation) and the CLI's.

    ``nodes`` and ``days``: one value each, or a list for at most one of them (a 1-D budget sweep).
    Grid: ladder seeds ``q`` (L = 4q, d = 512q), ``experts``, ``topk``, ``g``, the sparsity guard
    [s_min, s_max] (s_max None: no cap) and the TPP window [tpp_min, tpp_max]. Plans: ``mbs``, ``ckpt``
    (checkpointing mode names), ``mem_fraction`` of HBM. ``calibration_id`` / ``use_calibration`` as
    :func:`scaleplan.report.provenance.calibration_option` returns them. Output files are None when not asked.
    """

    profile: str
    nodes: tuple[int, ...]
    days: tuple[float, ...]
    q: tuple[int, ...] = (8, 10, 12, 14, 16, 18)
    experts: tuple[int, ...] = (4, 6, 8, 16, 24, 32, 48, 96, 128, 192, 256, 384, 512)
    topk: tuple[int, ...] = (1, 2, 4, 6, 8)
    g: tuple[int, ...] = (1, 2, 4, 8)
    mbs: tuple[int, ...] = SEARCH_MBS
    fold_experts: bool = False  # also the expert meshes folded over TP and CP (PlanConstraints.fold_experts)
    uneven_stages: bool = False  # also the uneven pipeline splits (PlanConstraints.uneven_stages)
    ckpt: tuple[str, ...] | None = None  # None: every checkpointing mode (scaleplan.specs.CKPT_MODES)
    goodput: float = 1.0
    gbs: int = 1024
    seqlen: int = 2048
    s_min: float = 0.7
    s_max: float | None = None
    tpp_min: float = 40.0
    tpp_max: float = 150.0
    vocab: int = 257_536
    kv_heads: int = 8
    top: int = 10
    samples: int = 200
    seed: int = 0
    robust: float | None = None  # recommend at this loss quantile over the draws (None: the mean)
    by_sparsity: bool = False
    prescription: float | None = None
    s_step: float = 0.005
    compare_measured: bool = False
    optimizer: str = "adamw"
    extrapolate: str = "compose"
    law_name: str | None = None
    workers: int = 0
    mem_fraction: float = MEM_FRACTION
    calibration_id: int | None = None
    use_calibration: bool = True
    db_url: str | None = None
    csv: Path | None = None
    plot: Path | None = None
    emit: str | None = None
    emit_spec: Path | None = None
    html: Path | None = None
    progress: bool = True
    extend_edges: bool = True
    stack: Stack | None = None  # the training stack the plans run on (None: the paper's; scaleplan.stack)


@dataclass
class SearchReport:
    """What a search found. ``out``: the JSON document of ``scaleplan search --json`` (best, top, counts, law,
    profile, and per option: samples/near_ties/verdicts, sweep, by_sparsity, measured_only, provenance,
    megatron_args, emitted_spec, html). ``results``: (Envelope, SearchResult) per budget, the first in full."""

    request: SearchRequest
    out: dict[str, Any]
    results: list = field(default_factory=list)

    @property
    def envelope(self):
        """The first budget's Envelope (a sweep reports it in full)."""
        return self.results[0][0]

    @property
    def result(self):
        """The first budget's SearchResult."""
        return self.results[0][1]


def check_request(r: SearchRequest) -> None:
    """Raises SpecError naming the first option of ``r`` that is out of range or inconsistent."""
    from scaleplan.specs import OPTIMIZERS

    if len(r.nodes) > 1 and len(r.days) > 1:
        raise SpecError("--nodes/--days", f"{','.join(map(str, r.nodes))} / {','.join(f'{d:g}' for d in r.days)}",
                        "a list for at most one of them (a 1-D sweep)")
    if r.optimizer not in OPTIMIZERS:
        raise SpecError("--optimizer", r.optimizer, f"one of {', '.join(OPTIMIZERS)}")
    if not 0 <= r.s_min < 1:
        raise SpecError("--s-min", r.s_min, "a sparsity in [0, 1)")
    if r.s_max is not None and not r.s_min < r.s_max < 1:
        raise SpecError("--s-max", r.s_max, f"a sparsity in ({r.s_min}, 1)")
    if r.samples < 0:
        raise SpecError("--samples", r.samples, "0 or a positive number of draws")
    if r.robust is not None and not (0.5 <= r.robust < 1 and r.samples > 0):
        raise SpecError("--robust-quantile", r.robust, "a quantile in [0.5, 1), with --samples > 0")
    if not r.s_step > 0 or (r.prescription is not None and not r.prescription > 0):
        raise SpecError("--s-step/--prescription", (r.s_step, r.prescription), "positive numbers")
    if r.top < 1:
        raise SpecError("--top", r.top, "a positive integer")
    if r.vocab <= 0 or r.kv_heads <= 0:
        raise SpecError("--vocab/--kv-heads", (r.vocab, r.kv_heads), "positive integers")
    if not 0 < r.mem_fraction <= 1:
        raise SpecError("--mem-fraction", r.mem_fraction, "a fraction in (0, 1]")
    if r.workers < 0:
        raise SpecError("--workers", r.workers, "0 (auto) or a positive integer")


def _estimator(r: SearchRequest, extrapolate: str):
    """The estimator of ``r``'s plans: its profile and tables, on ``r.stack`` (the ladder's bf16 models) where given."""
    from scaleplan.estimator import Estimator

    est = Estimator(profile=r.profile, db_url=r.db_url, extrapolate=extrapolate, calibration_id=r.calibration_id,
                    use_calibration=r.use_calibration)
    return est if r.stack is None else est.for_stack(r.stack, "bf16")


def ladder_grid(r: SearchRequest):
    """The MOSAIC grid of ``r`` (its q, experts, topk, g, sparsity guard, vocab, kv heads)."""
    from scaleplan.mosaic.ladder import LadderGrid

    return LadderGrid(q=r.q, experts=r.experts, topk=r.topk, g=r.g, s_min=r.s_min,
                      s_max=1.0 if r.s_max is None else r.s_max, vocab=r.vocab, kv_heads=r.kv_heads)


def plan_constraints(r: SearchRequest):
    """The plan search's constraints of ``r`` (micro-batch sizes, checkpointing modes, HBM fraction)."""
    from scaleplan.estimator import PlanConstraints

    return PlanConstraints(mbs=r.mbs, ckpt=r.ckpt or PlanConstraints.ckpt, mem_fraction=r.mem_fraction,
                           fold_experts=r.fold_experts, uneven_stages=r.uneven_stages)


def run_search(r: SearchRequest) -> SearchReport:
    """MOSAIC (eq:hw-minlp) for every budget of ``r``, with the views and files it asks for.

    Raises SpecError (one line naming the option) for a bad request, an unknown profile or law, or a grid
    without a realizable geometry; writes ``r.csv``, ``r.plot``, ``r.emit_spec`` and ``r.html`` when given."""
    from scaleplan.emit import check_emit
    from scaleplan.mosaic.law import load_law_full
    from scaleplan.mosaic.outputs import add_launch_outputs
    from scaleplan.mosaic.search import Envelope, Mosaic, default_workers

    check_request(r)
    grid = ladder_grid(r)
    from scaleplan.db.session import resolve_url

    # --law NAME reads the fit from the database the search uses, the default one included (None would be the paper's)
    loaded = load_law_full(resolve_url(r.db_url) if r.law_name else None, r.law_name)
    check_emit(r.emit, r.optimizer, "--optimizer", {"--emit-spec": r.emit_spec, "--html": r.html})
    est = _estimator(r, r.extrapolate)
    plan_c = plan_constraints(r)
    m = Mosaic(est, grid, loaded.law, plan_c, progress=r.progress, workers=r.workers or default_workers(),
               support=loaded.support)
    if m.geoms.empty:
        raise SpecError("grid", f"{grid.n_combinations} combinations", "at least one realizable geometry "
                        "(K <= E, d_ff divisible by G, S >= --s-min)")
    envs = [Envelope(nodes=n, days=d, goodput=r.goodput, gbs=r.gbs, seqlen=r.seqlen, optimizer=r.optimizer,
                     tpp_min=r.tpp_min, tpp_max=r.tpp_max) for n in r.nodes for d in r.days]
    from scaleplan.mosaic.edges import search_edges

    m.keep_workers()  # the main pass and the edge extension share the forked workers
    try:
        m, results, edges = search_edges(m, [(e, m.run(e)) for e in envs], r.extend_edges, r.mem_fraction)
    finally:
        m.close()  # the extended Mosaic shares the first one's workers
    report = SearchReport(r, {}, results)
    report.out = _document(report, m, est, loaded)
    report.out["edges"] = edges
    _write_files(report)
    add_launch_outputs(report.out, report.result, m.grid, est, report.envelope, r.mem_fraction, r.emit,
                       r.emit_spec, r.html)
    return report


def _document(report: SearchReport, m, est, loaded) -> dict[str, Any]:
    """The search JSON before its launchable outputs: the first budget in full, the sweep, the views."""
    r, results = report.request, report.results
    out_reach = _attach_reach(results, loaded, r, est)
    unc = _uncertainty(results, loaded, r, est)
    out = report.result.to_json(r.top)
    out["evidence_range"] = out_reach
    out["law"] = loaded.source
    out["law_support"] = loaded.support.to_dict()
    out["profile"] = est.profile.name
    out["stack"] = est.stack_key
    if unc:
        out.update(unc[0])
    if len(results) > 1:
        _add_sweep(out, results, unc, "nodes" if len(r.nodes) > 1 else "days")
    if r.by_sparsity:
        from scaleplan.mosaic.sparsity import by_sparsity as view

        c_rx = r.prescription or (out["best"]["c_model"] if out["best"] else 1.0)
        out.update(view(report.result.table, loaded.support, c_rx, r.s_step))
    if r.compare_measured:
        from scaleplan.mosaic.report import measured_only

        out["measured_only"] = measured_only(m, _estimator(r, "error"), report.envelope, out["best"])
    return out


def _add_sweep(out: dict, results: list, unc: list | None, axis: str) -> None:
    """A sweep's rows (every budget's optimum and best per G) and, with --samples, their uncertainty."""
    from scaleplan.mosaic.search import sweep_row

    out["sweep"] = [sweep_row(res, e) for e, res in results]
    out["sweep_axis"] = axis
    if unc:
        from scaleplan.mosaic.report import sweep_fields

        for row, u in zip(out["sweep"], unc):
            row.update(sweep_fields(u, row["best"]))


def _attach_reach(results, loaded, r: SearchRequest, est) -> dict:
    """Each candidate's distance from what was measured (mosaic.evidence.reach: the observed runs of the profile in
    the estimator's database, the law's data support) as columns of every result's table; returns what they were
    measured against (JSON ``evidence_range``)."""
    from scaleplan.mosaic.evidence import observed_range, reach

    # EP nodes as the candidates count them: scale-up domains (the node, or a GB200 NVL72 rack)
    runs = observed_range(r.db_url, est.profile.name, est.profile.peak("bf16"), int(est.profile.scaleup_domain))
    for _, res in results:
        res.table = res.table.assign(**reach(res.table, runs, loaded.support))
    return {"observed_runs": runs.to_dict(), "law_support": loaded.support.to_dict(), "law_scatter": loaded.scatter}


def _uncertainty(results, loaded, r: SearchRequest, est):
    """Per budget, the --samples JSON (and per-candidate columns in each result's table); None for 0 draws.
    The MFU error is the calibration in force in the database the estimator reads (r.db_url, None: the default)."""
    if r.samples == 0:
        return None
    from scaleplan.mosaic.evidence import errors_for
    from scaleplan.mosaic.report import attach_uncertainty
    from scaleplan.mosaic.uncertainty import mfu_error

    mfu = mfu_error(r.db_url, est.profile.name, r.calibration_id, r.use_calibration)
    return attach_uncertainty(results, loaded.law, loaded.ridge, loaded.source, mfu, r.samples, r.seed,
                              evidence=errors_for(est), law_scatter=loaded.scatter, robust=r.robust)


def _write_files(report: SearchReport) -> None:
    """--csv: every budget's feasible frontier; --plot: loss vs C_model by G, the sweep, or the by-sparsity view."""
    r, out, env0, res0 = report.request, report.out, report.envelope, report.result
    if r.csv:
        import pandas as pd

        frames = [res.frontier.assign(nodes=e.nodes, days=e.days).drop(columns=["why", "feasible", "plan_ok"],
                                                                        errors="ignore")
                  for e, res in report.results]
        pd.concat(frames).to_csv(r.csv, index=False)
    if not r.plot:
        return
    from scaleplan.mosaic.plots import plot_by_sparsity, plot_pareto, plot_sweep

    where = f"{out['profile']}: {env0.nodes} nodes, {env0.days:g} days"
    if "sweep" in out:
        plot_sweep(out["sweep"], r.plot, out["sweep_axis"])
    elif r.by_sparsity:
        plot_by_sparsity(out, r.plot, where)
    else:
        plot_pareto(res0.frontier, out["best"], r.plot, f"{where}, C_peak {res0.c_peak:.3g} FLOP")
