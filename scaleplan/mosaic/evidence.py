"""How far a candidate's predicted MFU rests on measurements: the extra error its plan's unmeasured parts add.

A plan's step time is a sum of components (estimator breakdown), each read from a measured table
(measured / interpolated), composed beyond it by the table's physical rule, extrapolated to more ranks than
the collective tables measured (busbw invariance, labelled analytic with an "invariance" warning), or costed
analytically (no table at all). The MFU error the search draws (:mod:`scaleplan.mosaic.uncertainty`) is the
estimator's error where its tables are measured; each unmeasured part adds the measured error of the rule
that produced it, weighted by its share of the step time:

    sigma_evidence = sum_k share_k * sigma(rule_k),   sigma(rule) = MAPE(rule) * sqrt(pi / 2)

(the shares' errors are added linearly: one plan's components are costed by the same rules on the same
hardware, so their errors are not independent; sqrt(pi/2) turns a MAPE into a log-normal sigma, as
uncertainty.FALLBACK_SIGMA does). The draw's log-factor then has sigma sqrt(sigma_calibration^2 +
sigma_evidence^2).

Rule errors (all measured on the recorded B200 tables, ../shared/recorded/dmlc-scaleplan):
* composed, per table kind: ``benchmarks/compose_accuracy.py``, the worst MAPE over the kind's hold-outs
  at the present cut and at one twice as deep, above and below the measured range (estimator/holdout.py
  rule_errors: grouped GEMM 15.4%, GEMM 10.4%, SDPA 16.5%, collectives 17.0%). A composed lookup may lie
  on either side of its table and at either distance, so its error is the worst measured one, not the
  first hold-out's (10.0%, 6.4%, 5.6%, 17.0%: three of the four would understate it);
* more ranks than measured: estimator/holdout.py group_sizes, the largest measured group predicted from the
  next smaller one by the estimator's invariance: 14.2% (one doubling; further doublings compound, so this
  is a lower bound for a 256-rank group extrapolated from 32);
* analytic (no table): ``benchmarks/estimator_accuracy.py`` on an empty database, the all-analytic
  estimator's uncalibrated per-sweep MFU MAPE: 12.7% (700m-32dev) and 18.9% (5p4b-256dev), mean 15.8%
  (the same sweeps with the recorded tables: 8.0% and 11.2%). tests/mosaic/test_evidence.py recomputes the
  first two from the recorded tables.
"""
from __future__ import annotations

import math

#: compose_accuracy.py's worst hold-out per table kind, both cuts, above and below the range (MAPE of the
#: composed over the measured time; estimator/holdout.py rule_errors, recomputed by tests/mosaic/test_evidence.py)
COMPOSE_MAPE = {"grouped_gemm": 0.154, "gemm": 0.104, "sdpa": 0.165, "collectives": 0.170}
#: estimator/holdout.py group_sizes: a collective at twice the largest group it was measured at
GROUP_EXTRAPOLATION_MAPE = 0.142
#: estimator_accuracy.py on an empty database: the all-analytic estimator's MFU MAPE, mean of two sweeps
ANALYTIC_MAPE = (0.127 + 0.189) / 2
#: which table a component's composed lookups come from (the rest read the dense GEMM table)
COMPONENT_TABLE = {"experts": "grouped_gemm", "sdpa": "sdpa", "ep_a2a": "collectives", "dp_comm": "collectives",
                   "tp_comm": "collectives", "cp_comm": "collectives", "pp_p2p": "collectives",
                   "bias_sync": "collectives"}
_LOGNORMAL = math.sqrt(math.pi / 2)
#: components no bench table costs: the host dispatch law (the profile's traces) and the pipeline bubble
#: (derived from the other components)
NOT_TABLE_READ = ("dispatch_floor", "bubble")


def _extrapolated_components(warnings) -> set[str]:
    """Components the estimator extrapolated to more ranks than measured (its 'invariance' warnings)."""
    return {w.split(":", 1)[0] for w in warnings or [] if "invariance" in w}


def plan_evidence(res) -> dict:
    """The evidence of one best plan (an EstimateResult; breakdown_s, sources, warnings, composed_share).

    Returns {analytic_share, extrapolated_share (fractions of the step time costed without a table / by
    extrapolating a collective to more ranks), evidence_sigma (the log-normal sigma the plan's unmeasured parts
    add), extrapolated_collectives (those collectives, comma-joined), unmeasured_kernel_share (the share of the
    time of the components a table could cost, i.e. all but NOT_TABLE_READ, that no table did)}.
    """
    bd = getattr(res, "breakdown_s", None) or {}
    src = getattr(res, "sources", None) or {}
    total = sum(v for v in bd.values() if v > 0)
    extrap = _extrapolated_components(getattr(res, "warnings", None))
    shares = {"analytic": 0.0, "extrapolated": 0.0, "composed": 0.0}
    sigma = 0.0
    for k, t in bd.items():
        if t <= 0 or total <= 0:
            continue
        share = t / total
        how = src.get(k)
        if how == "analytic":
            kind = "extrapolated" if k in extrap else "analytic"
            mape = GROUP_EXTRAPOLATION_MAPE if kind == "extrapolated" else ANALYTIC_MAPE
        elif how == "composed":
            kind, mape = "composed", COMPOSE_MAPE[COMPONENT_TABLE.get(k, "gemm")]
        else:
            continue
        shares[kind] += share
        sigma += share * mape * _LOGNORMAL
    if not bd:  # a result without a breakdown (a stand-in estimator): its composed share only
        shares["composed"] = float(getattr(res, "composed_share", 0.0) or 0.0)
        sigma = shares["composed"] * max(COMPOSE_MAPE.values()) * _LOGNORMAL
    kernels = sum(t for k, t in bd.items() if t > 0 and k not in NOT_TABLE_READ)
    unmeasured = sum(t for k, t in bd.items() if t > 0 and k not in NOT_TABLE_READ and src.get(k) == "analytic")
    own = sorted(k for k, v in src.items() if v == "analytic" and bd.get(k, 0) > 0 and k in extrap)
    return {"analytic_share": shares["analytic"], "extrapolated_share": shares["extrapolated"],
            "evidence_sigma": sigma, "extrapolated_collectives": ",".join(own),
            "unmeasured_kernel_share": unmeasured / kernels if kernels > 0 else 0.0}


def describe() -> dict:
    """The rule errors behind sigma_evidence, for the search JSON's uncertainty_inputs."""
    return {"rule": "sigma_evidence = sum over the plan's unmeasured components of share x MAPE x sqrt(pi/2)",
            "composed_mape": COMPOSE_MAPE, "group_extrapolation_mape": GROUP_EXTRAPOLATION_MAPE,
            "analytic_mape": ANALYTIC_MAPE, "source": "scaleplan/mosaic/evidence.py"}
