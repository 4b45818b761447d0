"""How far a candidate's predicted MFU rests on measurements: the extra error its plan's unmeasured parts add.

A plan's step time is a sum of components (estimator breakdown), each read from a measured table
(measured / interpolated), composed beyond it by the table's physical rule, extrapolated to more ranks than
the collective tables measured (busbw invariance, labelled analytic and marked per plan:
EstimateResult.extrapolated_collectives), or costed analytically (no table at all). The MFU error the search draws (:mod:`scaleplan.mosaic.uncertainty`) is the
estimator's error where its tables are measured; each unmeasured part adds the measured error of the rule
that produced it, weighted by its share of the step time:

    sigma_evidence = sum_k share_k * sigma(rule_k),   sigma(rule) = MAPE(rule) * sqrt(pi / 2)

(the shares' errors are added linearly: one plan's components are costed by the same rules on the same
hardware, so their errors are not independent; sqrt(pi/2) turns a MAPE into a log-normal sigma, as
uncertainty.FALLBACK_SIGMA does). The draw's log-factor then has sigma sqrt(sigma_calibration^2 +
sigma_evidence^2).

Rule errors are measured on the tables the search reads (:func:`errors_for`): estimator/holdout.py
hides part of each table, composes it back and compares (``measured_errors``, about 15 s), once per
content of the measurement rows, cached beside the compiled tables:
* composed, per table kind: the worst MAPE over the kind's hold-outs at the present cut and at one twice as
  deep, above and below the measured range (``benchmarks/compose_accuracy.py`` prints them). A composed
  lookup may lie on either side of its table and at either distance, so its error is the worst measured one;
* more ranks than measured: ``holdout.group_sizes``, the largest measured group predicted from the next
  smaller one by the estimator's invariance (one doubling; further doublings compound, so this is a lower
  bound for a 256-rank group extrapolated from 32).

Where the tables cannot measure a rule, :data:`RECORDED` (the same measurement on the recorded B200 tables,
../shared/recorded/dmlc-scaleplan, typed in below) stands in: for tables built from frames in hand rather than
read from a database, for a table kind without a hold-out (no rows, or none beyond a cut: then no lookup of
that kind is composed either, or too few to check), and for an analytic-only database (no tables: nothing is
composed or extrapolated, so only the analytic rule's error is used). The analytic rule's own error is not a
property of any table set: it is ``benchmarks/estimator_accuracy.py`` on an empty database, the all-analytic
estimator's uncalibrated per-sweep MFU MAPE against the published runs (:data:`ANALYTIC_MAPE`), in every case.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

#: holdout.measured_errors on the recorded B200 tables (the fallback, module docstring); per table kind
COMPOSE_MAPE = {"grouped_gemm": 0.099, "gemm": 0.092, "sdpa": 0.063, "collectives": 0.084}
#: holdout.group_sizes on the recorded B200 tables: a collective at twice the largest group it was measured at
GROUP_EXTRAPOLATION_MAPE = 0.141
#: estimator_accuracy.py on an empty database: the all-analytic estimator's MFU MAPE, mean of two sweeps
ANALYTIC_MAPE = (0.127 + 0.189) / 2


@dataclass(frozen=True)
class RuleErrors:
    """The MAPE (fraction of the time) of each rule that costs a component without a measured point:
    ``composed`` per table kind, ``group_extrapolation``, ``analytic``; ``source`` says where each came from."""

    composed: dict
    group_extrapolation: float
    analytic: float
    source: str


RECORDED = RuleErrors(COMPOSE_MAPE, GROUP_EXTRAPOLATION_MAPE, ANALYTIC_MAPE,
                      "hold-outs of the recorded B200 tables (scaleplan/mosaic/evidence.py)")


def from_measured(measured: dict) -> RuleErrors:
    """RuleErrors of ``holdout.measured_errors``' output, :data:`RECORDED` where it measured nothing."""
    composed = {k: float(measured["composed"].get(k, v)) for k, v in COMPOSE_MAPE.items()}
    group = measured.get("group_extrapolation")
    own = sorted(measured["composed"]) + (["group extrapolation"] if group is not None else [])
    lent = [k for k in COMPOSE_MAPE if k not in measured["composed"]] + ([] if group is not None else ["group extrapolation"])
    src = ("hold-outs of the tables in use" + (f" ({', '.join(own)})" if lent else "")
           + (f"; recorded B200 figures for {', '.join(lent)}" if lent else ""))
    return RuleErrors(composed, GROUP_EXTRAPOLATION_MAPE if group is None else float(group), ANALYTIC_MAPE,
                      src if own else RECORDED.source)


def errors_for(est) -> RuleErrors:
    """The rule errors of the tables ``est`` reads (measured once per table content, module docstring);
    :data:`RECORDED` for tables not read from a database (``Estimator.from_frames``, stand-in estimators)."""
    source = getattr(getattr(est, "tables", None), "source", None)
    if source is None:
        return RECORDED
    from scaleplan.estimator.holdout import cached_errors

    return from_measured(cached_errors(*source))


#: which table a component's composed lookups come from (the rest read the dense GEMM table)
COMPONENT_TABLE = {"experts": "grouped_gemm", "sdpa": "sdpa", "ep_a2a": "collectives", "dp_comm": "collectives",
                   "tp_comm": "collectives", "cp_comm": "collectives", "pp_p2p": "collectives",
                   "bias_sync": "collectives"}
_LOGNORMAL = math.sqrt(math.pi / 2)
#: components no bench table costs: the host dispatch law (the profile's traces) and the pipeline bubble
#: (derived from the other components)
NOT_TABLE_READ = ("dispatch_floor", "bubble")


def plan_evidence(res, errors: RuleErrors = RECORDED) -> dict:
    """The evidence of one best plan (an EstimateResult; breakdown_s, sources, extrapolated_collectives (the
    plan's own mark, :attr:`Recorder.extrapolated`), composed_share).

    Returns {analytic_share, extrapolated_share (fractions of the step time costed without a table / by
    extrapolating a collective to more ranks), evidence_sigma (the log-normal sigma the plan's unmeasured parts
    add), extrapolated_collectives (those collectives, comma-joined), unmeasured_kernel_share (the share of the
    time of the components a table could cost, i.e. all but NOT_TABLE_READ, that no table did)}. ``errors``:
    the rules' errors (:func:`errors_for` the estimator that produced ``res``).
    """
    bd = getattr(res, "breakdown_s", None) or {}
    src = getattr(res, "sources", None) or {}
    total = sum(v for v in bd.values() if v > 0)
    extrap = set(getattr(res, "extrapolated_collectives", None) or ())
    shares = {"analytic": 0.0, "extrapolated": 0.0, "composed": 0.0}
    sigma = 0.0
    for k, t in bd.items():
        if t <= 0 or total <= 0:
            continue
        share = t / total
        how = src.get(k)
        if how == "analytic":
            kind = "extrapolated" if k in extrap else "analytic"
            mape = errors.group_extrapolation if kind == "extrapolated" else errors.analytic
        elif how == "composed":
            kind, mape = "composed", errors.composed[COMPONENT_TABLE.get(k, "gemm")]
        else:
            continue
        shares[kind] += share
        sigma += share * mape * _LOGNORMAL
    if not bd:  # a result without a breakdown (a stand-in estimator): its composed share only
        shares["composed"] = float(getattr(res, "composed_share", 0.0) or 0.0)
        sigma = shares["composed"] * max(errors.composed.values()) * _LOGNORMAL
    kernels = sum(t for k, t in bd.items() if t > 0 and k not in NOT_TABLE_READ)
    unmeasured = sum(t for k, t in bd.items() if t > 0 and k not in NOT_TABLE_READ and src.get(k) == "analytic")
    own = sorted(k for k, v in src.items() if v == "analytic" and bd.get(k, 0) > 0 and k in extrap)
    return {"analytic_share": shares["analytic"], "extrapolated_share": shares["extrapolated"],
            "evidence_sigma": sigma, "extrapolated_collectives": ",".join(own),
            "unmeasured_kernel_share": unmeasured / kernels if kernels > 0 else 0.0}


def describe(errors: RuleErrors = RECORDED) -> dict:
    """The rule errors behind sigma_evidence, for the search JSON's uncertainty_inputs."""
    return {"rule": "sigma_evidence = sum over the plan's unmeasured components of share x MAPE x sqrt(pi/2)",
            "composed_mape": errors.composed, "group_extrapolation_mape": errors.group_extrapolation,
            "analytic_mape": errors.analytic, "source": errors.source}
