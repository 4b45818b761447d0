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
property of any table set: it is ``benchmarks/estimator_accuracy.py --analytic`` (an empty database), the
all-analytic estimator's uncalibrated per-sweep MFU MAPE against the published runs (:data:`ANALYTIC_MAPE`), in
every case.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: holdout.measured_errors on the recorded B200 tables (the fallback, module docstring); per table kind
COMPOSE_MAPE = {"grouped_gemm": 0.099, "gemm": 0.092, "sdpa": 0.063, "collectives": 0.084}
#: holdout.group_sizes on the recorded B200 tables: a collective at twice the largest group it was measured at
GROUP_EXTRAPOLATION_MAPE = 0.141
#: estimator_accuracy.py --analytic (an empty database): the all-analytic estimator's MFU MAPE, mean of two sweeps
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


# --- how far from what was measured end to end --------------------------------------------------------------
# The tables above cost a plan's parts; the observed runs of the profile (``calibrate add``, ``validate``) are
# the only check of a whole plan, and the law's training runs the only check of its loss. A search that maximises
# over a model's errors picks the plans the model is most optimistic about, and those lie where nothing checked
# it: a predicted MFU above every run's, an expert group over more nodes, a larger micro-batch or model. So each
# candidate carries its distance from that evidence, in doublings (|log2| of the value over the nearest end of
# the measured range, 0 inside it), summed over the features:
#
#   performance: D_perf = sum_f doublings(f) over PERF_FEATURES; its MFU draw widens to
#                sigma_c = sqrt(sigma^2 (1 + D_perf) + sigma_evidence^2)
#                (one more calibration error per doubling beyond the runs, the errors of successive doublings
#                independent: sigma is the calibration's leave-one-sweep-out error, itself the error of
#                predicting a sweep the fit has not seen, so the unit of extrapolation it measures);
#   law:         D_law = doublings of TPP beyond the law's data + doublings of 1 - S beyond it; each draw adds
#                z_law * scatter * D_law to the loss (scatter: the law's held-out RMSE; one z_law per draw shared
#                by every candidate: a law that errs beyond its data errs the same way for all of them, by the
#                distance; an exponent error grows linearly in log distance).

#: (search-table column, label) of the features the observed runs span; the label names them in the flags
PERF_FEATURES = (("mfu_plan", "MFU"), ("ep_nodes", "EP nodes"), ("mbs", "micro-batch"), ("pp", "PP"),
                 ("n_act", "N_act"))
#: each flag's short name, for a table cell (the flags' first words)
FLAG_TAGS = {"S": "S", "TPP": "TPP", "MFU": "MFU", "EP nodes": "EPn", "micro-batch": "mb", "PP": "PP", "N_act": "N"}
REACH_COLUMNS = ("perf_doublings", "law_doublings", "beyond")


@dataclass(frozen=True)
class RunRange:
    """The range each of PERF_FEATURES spans over the observed runs of a profile (``ranges``: column -> (lo, hi);
    empty without a run); ``n`` runs, ``source`` says which."""

    n: int
    ranges: dict
    source: str

    def to_dict(self) -> dict:
        return {"n": self.n, "ranges": {k: list(v) for k, v in self.ranges.items()}, "source": self.source}


NO_RUNS = RunRange(0, {}, "no observed run on this profile (`scaleplan calibrate add`, `scaleplan validate`)")


def _run_features(r, peak_flops: float, gpus_per_node: int) -> dict | None:
    """PERF_FEATURES of one observed run (a row of observed_run), None where its spec or step time is unusable."""
    from scaleplan.errors import ScaleplanError
    from scaleplan.estimator.layout import ParallelLayout
    from scaleplan.estimator.model_dims import geometry
    from scaleplan.specs import Layout, parse_spec

    if not r["measured_t_iter_s"] or r["measured_t_iter_s"] <= 0:
        return None
    try:
        n_act = geometry(parse_spec(r["spec"]).model).n_act
        lay = ParallelLayout.from_specs([Layout(**{k: r[k] for k in ("tp", "cp", "pp", "dp", "ep", "etp", "vpp",
                                                                     "mbs", "ckpt")})], int(r["n_devices"]))
    except (ScaleplanError, ValueError, TypeError, KeyError):
        return None
    mfu = 6.0 * n_act * r["gbs"] * r["seqlen"] / (r["measured_t_iter_s"] * r["n_devices"] * peak_flops)  # eq:mfu
    return {"mfu_plan": mfu, "ep_nodes": float(lay.nodes("ep", gpus_per_node)[0]), "mbs": float(r["mbs"]),
            "pp": float(r["pp"]), "n_act": float(n_act)}


def observed_range(db_url: str | None, profile: str, peak_flops: float, gpus_per_node: int) -> RunRange:
    """The PERF_FEATURES ranges of the observed runs of ``profile`` with a measured step time (MFU by eq:mfu at
    ``peak_flops`` FLOP/s per device, as the search counts it). :data:`NO_RUNS` without any."""
    from scaleplan.db.session import resolve_url
    from scaleplan.db.state_cache import cached_read

    url = resolve_url(db_url)
    rows = cached_read("observed-runs", url, (profile,), (__name__,), lambda: _read_runs(url, profile),
                       valid=lambda v: isinstance(v, list))
    feats = [f for f in (_run_features(r, peak_flops, gpus_per_node) for r in rows) if f is not None]
    if not feats:
        return NO_RUNS
    ranges = {k: (min(f[k] for f in feats), max(f[k] for f in feats)) for k, _ in PERF_FEATURES}
    ids = sorted(r["id"] for r in rows)
    return RunRange(len(feats), ranges, f"{len(feats)} observed runs of {profile} (ids {ids[0]}-{ids[-1]})")


def _read_runs(url: str, profile: str) -> list[dict]:
    """The observed_run rows of ``profile`` as dicts (a Core query; [] without the table)."""
    import sqlalchemy as sa

    from scaleplan.db.session import get_engine

    eng = get_engine(url)
    if "observed_run" not in sa.inspect(eng).get_table_names():
        return []
    cols = "id, spec, n_devices, gbs, seqlen, tp, cp, pp, dp, ep, etp, vpp, mbs, ckpt, measured_t_iter_s"
    with eng.connect() as c:
        res = c.execute(sa.text(f"SELECT {cols} FROM observed_run WHERE profile = :p").columns(spec=sa.JSON),
                        {"p": profile})
        return [dict(r._mapping) for r in res]


def doublings(v, lo, hi):
    """|log2| of ``v`` over the nearest end of [lo, hi], 0 inside it (arrays; NaN values give 0)."""
    v = np.asarray(v, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.maximum(np.maximum(np.log2(v / hi), np.log2(lo / v)), 0.0)
    return np.nan_to_num(out, nan=0.0, posinf=0.0)


def _perf_terms(table, runs: RunRange):
    """(column, label, values, lo, hi, doublings) of each of PERF_FEATURES the runs span and the table has."""
    for col, label in PERF_FEATURES:
        if col not in runs.ranges or col not in table:
            continue
        lo, hi = runs.ranges[col]
        v = table[col].to_numpy(dtype=float, na_value=np.nan)
        yield col, label, v, lo, hi, doublings(v, lo, hi)


def _law_terms(table, support):
    """(TPP, its doublings beyond the law's data, 1 - S, its doublings) of a table's rows."""
    tpp = table["tpp"].to_numpy(dtype=float)
    one_minus_s = 1.0 - table["s"].to_numpy(dtype=float)
    return (tpp, doublings(tpp, support.tpp_min, support.tpp_max), one_minus_s,
            doublings(one_minus_s, 1.0 - support.s_max, 1.0 - support.s_min))


def perf_doublings(table, runs: RunRange) -> np.ndarray:
    """The perf_doublings column of :func:`reach` alone (0 for a row without a plan), for the many rows a plan at a
    confidence weighs (``scaleplan plan --confidence``). [rows]"""
    perf = sum((t[-1] for t in _perf_terms(table, runs)), np.zeros(len(table)))
    ok = table["plan_ok"].to_numpy(bool) if "plan_ok" in table else np.ones(len(table), bool)
    return np.where(ok, perf, 0.0)


def law_doublings(table, support) -> np.ndarray:
    """The law_doublings column of :func:`reach` alone (a table's tpp and s against the law's data). [rows]"""
    _, d_tpp, _, d_s = _law_terms(table, support)
    return d_tpp + d_s


def reach(table, runs: RunRange, support) -> dict:
    """Columns perf_doublings, law_doublings and beyond (the flags, comma-joined: "TPP 115 > 70", ...) of a
    scored search table (mfu_plan, ep_nodes, mbs, pp, n_act, tpp, s, plan_ok) against the observed runs and the
    law's data ``support`` (mosaic.law.LawSupport). Arrays over the rows."""
    n = len(table)
    flags = [[] for _ in range(n)]
    fmt = {"mfu_plan": lambda x: f"{100 * x:.1f}%", "n_act": lambda x: f"{x / 1e9:.1f}B"}
    for col, label, v, lo, hi, d in _perf_terms(table, runs):
        f = fmt.get(col, lambda x: f"{x:g}")
        for i in np.flatnonzero(d > 0):
            side = f"> {f(hi)}" if v[i] > hi else f"< {f(lo)}"
            flags[i].append(f"{label} {f(v[i])} {side}")
    tpp, d_tpp, one_minus_s, d_s = _law_terms(table, support)
    for i in np.flatnonzero(d_tpp > 0):
        side = f"> {support.tpp_max:g}" if tpp[i] > support.tpp_max else f"< {support.tpp_min:g}"
        flags[i].insert(0, f"TPP {tpp[i]:.0f} {side}")
    for i in np.flatnonzero(d_s > 0):
        s = 1.0 - one_minus_s[i]
        flags[i].insert(0, f"S {s:.3f} {'>' if s > support.s_max else '<'} "
                           f"{support.s_max if s > support.s_max else support.s_min:g}")
    ok = table["plan_ok"].to_numpy(bool) if "plan_ok" in table else np.ones(n, bool)
    return {"perf_doublings": perf_doublings(table, runs), "law_doublings": d_tpp + d_s,
            "beyond": [", ".join(f) if ok[i] else "" for i, f in enumerate(flags)]}
