"""Bridge observed runs to the estimator: analytic (chi = 1) predictions and the fit's inputs.

For each ObservedRun the estimator is asked, without calibration (eq:cal-iter with chi_sys = 1),
for t_analytic_s, the MFU at chi = 1 and the chi_sys inputs (t_A2A, nodes spanned by EP and PP,
deep pipeline in one node). Calibrated predictions are then MFU_an / chi (same FLOPs per step).

The predictor is injectable (any callable with :data:`Predictor`'s signature) so the fit and the
report can be tested with a fake one.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scaleplan.calibrate.chi_sys import ChiData
from scaleplan.estimator.layout import FIELDS, SPLIT_FIELDS

from scaleplan.errors import ScaleplanError


@dataclass
class Observed:
    """The part of an ObservedRun the calibration needs (decoupled from the ORM session)."""

    id: int
    sweep: str
    profile: str
    spec: dict[str, Any]
    n_devices: int
    layout: dict[str, Any]
    t_iter_s: float | None = None
    mfu: float | None = None
    mfu_norm: float | None = None
    reference_mfu: float | None = None
    reference_mfu_norm: float | None = None
    reference_step_s: float | None = None
    source: str = ""

    @classmethod
    def from_row(cls, r) -> Observed:
        lay = {f: getattr(r, f) for f in FIELDS}  # the ORM row's layout columns
        # a stated stage split has no column: the run's spec states it (a Megatron-LM log's parallelism block)
        par = (r.spec or {}).get("parallelism") or {}
        if all(par.get(k) == lay[k] for k in ("pp", "vpp")):
            lay.update({k: par[k] for k in SPLIT_FIELDS if par.get(k)})
        extra = r.extra or {}
        return cls(id=r.id, sweep=r.sweep or f"run-{r.id}", profile=r.profile, spec=r.spec, n_devices=r.n_devices,
                   layout=lay, t_iter_s=r.measured_t_iter_s, mfu=r.measured_mfu, mfu_norm=r.measured_mfu_norm,
                   reference_mfu=r.reference_mfu, reference_mfu_norm=extra.get("reference_mfu_norm"),
                   reference_step_s=extra.get("reference_step_s"), source=r.source)


@dataclass
class Prediction:
    """Analytic (chi = 1) prediction of one observed run. Times in seconds, MFU a fraction."""

    t_analytic_s: float
    mfu_analytic: float
    t_a2a_s: float
    ep_nodes: int
    pp_nodes: int
    deep_pp_in_node: bool
    warnings: list[str] = field(default_factory=list)
    error: str | None = None  # the estimator refused this run (it is then left out, and listed)

    @classmethod
    def failed(cls, reason: str) -> Prediction:
        nan = float("nan")
        return cls(nan, nan, nan, 0, 0, False, error=reason)


Predictor = Callable[[Sequence[Observed]], list[Prediction]]


def estimator_predictor(profile: str, db_url: str | None, extrapolate: str = "clamp",
                        host_scale: float | None = None, use_calibration: bool = True,
                        kernel_scale: float | None = None, stack: str = "megatron") -> Predictor:
    """A :data:`Predictor` backed by ``scaleplan.estimator.Estimator``: the chi = 1 step time.

    The analytic time is ``t_analytic_s`` (chi_sys = 1, eq:cal-iter) evaluated under the dispatch
    law in force for the profile (its newest 'dispatch' calibration, else the estimator's
    default), so chi_sys is fitted on exactly the time the estimator will multiply; the analytic
    MFU is ``mfu * chi_sys`` (MFU scales as 1 / t_iter). Runs are grouped by (spec, n_devices), one
    ``estimate`` call per group. Raises ScaleplanError (e.g. OutOfRangeError with
    extrapolate='error') naming the sweep. ``host_scale`` / ``kernel_scale`` override the fitted
    runtime scales (see :mod:`scaleplan.calibrate.run_scales`); ``use_calibration`` False ignores
    stored rows; ``stack`` as the Estimator's ("reference" for runs of scaleplan's own model).
    """
    from scaleplan.estimator import Estimator

    from scaleplan.specs import Layout, parse_spec

    est = Estimator(profile=profile, db_url=db_url, extrapolate=extrapolate, use_calibration=use_calibration,
                    host_scale=host_scale, kernel_scale=kernel_scale, stack=stack)

    def predict(obs: Sequence[Observed]) -> list[Prediction]:
        groups: dict[tuple[str, int], list[int]] = {}
        for i, o in enumerate(obs):
            groups.setdefault((json.dumps(o.spec, sort_keys=True), o.n_devices), []).append(i)
        out: list[Prediction | None] = [None] * len(obs)
        for (spec_js, n_dev), idx in groups.items():
            spec = parse_spec(json.loads(spec_js))
            layouts = [Layout(**obs[i].layout) for i in idx]
            try:
                results = est.estimate(spec, n_dev, layouts)
            except ScaleplanError:  # find which run(s) the estimator refuses; keep the others
                results = []
                for lay in layouts:
                    try:
                        results.append(est.estimate(spec, n_dev, [lay])[0])
                    except ScaleplanError as e:
                        results.append(str(e))
            for i, r in zip(idx, results):
                out[i] = Prediction.failed(r) if isinstance(r, str) else _from_result(r)
        return out  # type: ignore[return-value]

    return predict


def _from_result(r) -> Prediction:
    ci = r.chi_inputs
    return Prediction(t_analytic_s=r.t_analytic_s, mfu_analytic=r.mfu_validation * r.chi_sys, t_a2a_s=ci["t_a2a_s"],
                      ep_nodes=int(ci["ep_nodes"]), pp_nodes=int(ci["pp_nodes"]),
                      deep_pp_in_node=bool(ci["deep_pp_in_node"]), warnings=list(r.warnings))


def usable(obs: Sequence[Observed], preds: Sequence[Prediction]):
    """(observations, predictions) the estimator could evaluate, and the skipped ones with reasons."""
    keep = [(o, p) for o, p in zip(obs, preds) if p.error is None]
    skipped = [{"id": o.id, "sweep": o.sweep, "layout": o.layout, "reason": p.error}
               for o, p in zip(obs, preds) if p.error is not None]
    return [o for o, _ in keep], [p for _, p in keep], skipped


# --- measured quantities and fit data -------------------------------------------------------------

def sweep_quantity(obs: Sequence[Observed]) -> str | None:
    """Which measurement a sweep's rows are compared on: 't_iter' (the measured step time, which an
    MFU import in a declared FLOP count also stores) or 'mfu_norm' (ratios only), the first present
    on every row; None if neither is (a row stored with an MFU of no declared count has no step time)."""
    if all(o.t_iter_s is not None for o in obs):
        return "t_iter"
    if all(o.mfu_norm is not None for o in obs):
        return "mfu_norm"
    return None


def measured_mfu(o: Observed, p: Prediction, q: str) -> float:
    """The measured MFU-like quantity of a run on the sweep's scale: the step time converted into the
    prediction's own FLOP count (MFU_an t_an / t_meas), so prediction and measurement share one count."""
    if q == "mfu_norm":
        return float(o.mfu_norm)
    return p.mfu_analytic * p.t_analytic_s / float(o.t_iter_s)


@dataclass
class SweepBasis:
    """How a sweep is compared: its measured quantity and whether only ratios count (scale-free)."""

    quantity: str
    scale_free: bool


def bases_for(obs: Sequence[Observed], mode: str) -> dict[str, SweepBasis]:
    """sweep -> basis. A ratio-only sweep is always scale-free; mode 'normalized' makes all scale-free."""
    by: dict[str, list[Observed]] = {}
    for o in obs:
        by.setdefault(o.sweep, []).append(o)
    out = {}
    for s, rows in by.items():
        q = sweep_quantity(rows)
        if q:
            out[s] = SweepBasis(q, q == "mfu_norm" or mode == "normalized")
    return out


def chi_data(obs: Sequence[Observed], preds: Sequence[Prediction], bases: dict[str, SweepBasis]) -> ChiData:
    """ChiData of the runs whose sweep has a basis: y = log(MFU_an / MFU_meas) = log(t_meas / t_an)."""
    keep = [i for i, o in enumerate(obs) if o.sweep in bases]
    y = [np.log(preds[i].mfu_analytic / measured_mfu(obs[i], preds[i], bases[obs[i].sweep].quantity))
         for i in keep]
    return ChiData(t_analytic_s=[preds[i].t_analytic_s for i in keep], t_a2a_s=[preds[i].t_a2a_s for i in keep],
                   ep_nodes=[preds[i].ep_nodes for i in keep], pp_nodes=[preds[i].pp_nodes for i in keep],
                   deep_pp_in_node=[preds[i].deep_pp_in_node for i in keep], y=y,
                   sweep=[obs[i].sweep for i in keep], scale_free=[bases[obs[i].sweep].scale_free for i in keep])


def observed_from_db(sess, profile: str | None, sweeps: list[str] | None = None,
                     sources: list[str] | None = None) -> list[Observed]:
    from scaleplan.calibrate.observations import load_observed

    return [Observed.from_row(r) for r in load_observed(sess, profile, sweeps, sources)]
