"""What the CLI runs: fit chi_sys / the dispatch floor from the database and store them; build reports."""
from __future__ import annotations

from typing import Any

import numpy as np
from scaleplan.calibrate import writers
from scaleplan.calibrate.chi_sys import TERMS, features, fit_chi
from scaleplan.calibrate.dispatch import fit_dispatch, load_dispatch_rows
from scaleplan.calibrate.evaluate import (
    Predictor,
    bases_for,
    chi_data,
    estimator_predictor,
    observed_from_db,
    usable,
)
from scaleplan.calibrate.report import parity_plot, pooled, run_rows, sweep_report
from scaleplan.calibrate.run_scales import BOUNDS, absolute_times, fit_run_scales
from scaleplan.calibrate.run_scales import PARAMS as RUN_SCALES  # kept by a benchmark refit
from scaleplan.calibrate.writers import keys_in, keys_not_in, law_coefficients, write_chi_sys, write_dispatch

from scaleplan.db import calibrations as store  # every calibration row is read there (written: writers.py)
from scaleplan.errors import ScaleplanError

DEFAULT_PROFILE = "p6-b200.48xlarge"


def _observations(url, profile, sweeps=None, sources=None, stack: str = store.PAPER_STACK_KEY):
    """The observed runs of ``profile`` (in ``sweeps``, from ``sources``) that ran the training ``stack`` (a
    Stack.key): a calibration is fitted on one stack's runs. Raises ScaleplanError when there are none."""
    from scaleplan.db import session as dbs
    from scaleplan.stack import spec_stack_key

    dbs.ensure_schema(url)
    with dbs.session_scope(url) as s:
        obs = observed_from_db(s, profile, sweeps, sources)
    others = sorted({spec_stack_key(o.spec) for o in obs} - {stack})
    obs = [o for o in obs if spec_stack_key(o.spec) == stack]
    if not obs:
        where = f" in sweeps {', '.join(sweeps)}" if sweeps else ""
        also = f" (the database has runs of {', '.join(others)}: pass --stack)" if others else ""
        raise ScaleplanError(f"no observed runs for profile {profile!r}{where} on stack {stack}{also}; add some "
                             "with `scaleplan calibrate add runs.csv`")
    return obs


def fit_chi_sys(url: str | None, profile: str = DEFAULT_PROFILE, mode: str = "absolute",
                fixed: dict[str, float] | None = None, predictor: Predictor | None = None,
                sweeps: list[str] | None = None, sources: list[str] | None = None,
                extrapolate: str = "clamp", save: bool = True,
                prior: dict[str, float] | None = None, stack: str = store.PAPER_STACK_KEY) -> dict[str, Any]:
    """Fit chi_sys (eq:desync) on the profile's observed runs; store a new Calibration version.

    ``fixed`` pins terms; ``prior`` gives values for terms the data cannot identify (default 0).

    Raises ScaleplanError: no observations, too few for the parameters, nothing identifiable.
    """
    from scaleplan.db import session as dbs

    obs = _observations(url, profile, sweeps, sources, stack)
    predictor = predictor or stack_predictor(profile, url, extrapolate)
    obs, preds, skipped = usable(obs, predictor(obs))
    bases = bases_for(obs, mode)
    d = chi_data(obs, preds, bases)
    fit = fit_chi(d, mode, fixed, prior=prior)
    rows, _ = sweep_report(obs, preds, bases, fit.coefficients, mode, fixed, prior)
    cv = float(np.mean([r["loso_mape"] for r in rows]))
    used = [o for o in obs if o.sweep in bases]
    inputs = {"mode": mode, "fixed": fixed or {}, "prior": prior or {}, "free": fit.free, "unidentified": fit.unidentified,
              "observation_ids": [o.id for o in used],
              "sweeps": {s: {"quantity": b.quantity, "scale_free": b.scale_free} for s, b in bases.items()},
              "features": {t: features(d)[:, j].tolist() for j, t in enumerate(TERMS)}, "y": d.y.tolist(),
              "cv": {r["sweep"]: {"loso_mape": r["loso_mape"], "mape_after": r["mape_after"]} for r in rows}}
    out = {"profile": profile, "kind": "chi_sys", "mode": mode, "coefficients": fit.coefficients, "free": fit.free,
           "unidentified": fit.unidentified, "n_obs": fit.n_obs, "cv_error": cv, "notes": fit.notes,
           "sweeps": rows, "skipped": skipped, "calibration_id": None, "version": None}
    if skipped:
        out["notes"] = out["notes"] + [f"{len(skipped)} run(s) left out: the estimator refused them (see skipped)"]
    if save:
        with dbs.session_scope(url) as s:
            row = write_chi_sys(s, profile, fit.coefficients, stack=stack, inputs=inputs,
                                residuals=fit.residuals.tolist(),
                                cv_error=cv, n_obs=fit.n_obs, notes="; ".join(fit.notes) or None)
            out.update(calibration_id=row.id, version=row.version)
    return out


def _dispatch_prior(profile: str, prev: tuple[int, dict] | None) -> tuple[dict[str, float], str]:
    """The dispatch law in force before a fit, by the estimator's own precedence
    (:func:`scaleplan.estimator.dispatch.law_in_force`: defaults < the profile's block < the previous
    calibration; the measured rows are what the fit replaces), as the fit's prior, and where it came from.
    The t_gap of the module defaults, or one that was itself a chain gap, is left out: the fit identifies
    it from today's rows."""
    from types import SimpleNamespace

    from scaleplan.estimator.dispatch import law_in_force

    from scaleplan.profiles import load_profile

    block = getattr(load_profile(profile), "dispatch", None)
    row = SimpleNamespace(id=prev[0], coefficients=prev[1]) if prev is not None else None
    law, _ = law_in_force(block, None, None, row)
    prior = {k: v for k, v in law_coefficients(law).items() if k != "t_ep_host_s"}
    co = prev[1] if prev is not None else {}
    if law.source == "default" or (co.get("t_gap_chain_s") is not None and co.get("t_gap_s") == co["t_gap_chain_s"]):
        prior.pop("t_gap_s")
    where = {"default": "the estimator's defaults"}.get(law.source, law.source)
    if block is not None and prev is None:
        where = f"the profile's dispatch block ({block.source})"
    return prior, where


def fit_dispatch_floor(url: str | None, profile: str = DEFAULT_PROFILE, save: bool = True) -> dict[str, Any]:
    """Fit the dispatch law from DispatchPoint rows; store a new 'dispatch' version.

    The chain gap (and t_host, from host_overhead rows) come from the rows; what they cannot
    identify (the in-block t_gap, kappa0, kappa1) keeps the law in force: the previous dispatch
    calibration, else the profile's dispatch block, else the estimator's defaults.
    """
    from scaleplan.db import session as dbs

    dbs.ensure_schema(url)
    with dbs.session_scope(url) as s:
        rows = load_dispatch_rows(s, profile)
        prev = store.newest(s, profile, "dispatch")
        prev = (prev.id, dict(prev.coefficients or {})) if prev is not None else None
    if not rows:
        raise ScaleplanError(f"no dispatch benchmark rows for profile {profile!r}; run "
                             "`scaleplan bench run --suite dispatch` or import recorded tables")
    prior, source = _dispatch_prior(profile, prev)
    fit = fit_dispatch(rows, prior, source)
    for k in RUN_SCALES:  # a --from-runs fit stays in force until refitted (kept by write_dispatch)
        if prev is not None and k in prev[1]:
            fit.notes.append(f"{k} = {float(prev[1][k]):.4g} kept from calibration {prev[0]}")
    co = writers.dispatch_coefficients(fit.coefficients, prev[1] if prev else None, keep=keys_in(RUN_SCALES))
    out = {"profile": profile, "kind": "dispatch", "coefficients": co, "identified": fit.identified,
           "unidentified": fit.unidentified, "n_obs": fit.n_obs, "per_mode_gap_s": fit.per_mode_gap_s,
           "t_lat_s": fit.t_lat_s, "notes": fit.notes, "calibration_id": None, "version": None}
    if save:
        rms = float(np.sqrt(np.mean(np.square(fit.residuals))))
        with dbs.session_scope(url) as s:
            row = write_dispatch(
                s, profile, fit.coefficients, keep=keys_in(RUN_SCALES),
                inputs={"rows": rows, "identified": fit.identified, "unidentified": fit.unidentified,
                        "per_mode_gap_s": fit.per_mode_gap_s, "t_lat_s": fit.t_lat_s},
                residuals=fit.residuals, cv_error=None, n_obs=fit.n_obs, notes="; ".join(fit.notes))
            out.update(calibration_id=row.id, version=row.version, rms_log_residual=rms)
    return out


def stack_predictor(profile, url, extrapolate, host_scale=None, use_calibration=True,
                     kernel_scale=None) -> Predictor:
    """:func:`estimator_predictor` with each run's software stack: a ``scaleplan validate`` run (source
    'validate') trained scaleplan's own reference model, predicted with stack 'reference' (its
    measured host dispatch, the ops:* rows); every other run (Megatron sweeps) with 'megatron'."""
    def predict(obs):
        out = [None] * len(obs)
        stacks = ["reference" if o.source == "validate" else "megatron" for o in obs]
        for stack in sorted(set(stacks)):
            idx = [i for i, s in enumerate(stacks) if s == stack]
            ps = estimator_predictor(profile, url, extrapolate, host_scale, use_calibration,
                                     kernel_scale=kernel_scale, stack=stack)([obs[i] for i in idx])
            for i, p in zip(idx, ps):
                out[i] = p
        return out

    return predict


def fit_scales_from_runs(url: str | None, profile: str = DEFAULT_PROFILE, sweeps: list[str] | None = None,
                         sources: list[str] | None = None, extrapolate: str = "clamp", save: bool = True,
                         use_calibration: bool = True, stack: str = store.PAPER_STACK_KEY) -> dict[str, Any]:
    """Fit the runtime scales (host_scale, kernel_scale) on observed absolute step times; store a new
    'dispatch' version = the law in force (newest dispatch calibration's coefficients) + both scales.

    See :mod:`scaleplan.calibrate.run_scales`. ``use_calibration`` False fits on the uncalibrated
    law (benchmarks' LOO). Runs of ``scaleplan validate`` are predicted with the estimator's
    reference stack, the others with Megatron's (:func:`stack_predictor`).
    Raises ScaleplanError: no runs, none absolute, nothing identifiable.
    """
    from scaleplan.db import session as dbs

    obs = _observations(url, profile, sweeps, sources, stack)
    predictor = stack_predictor(profile, url, extrapolate, 1.0, use_calibration, 1.0)
    obs, preds, skipped = usable(obs, predictor(obs))
    idx, t_meas = absolute_times(obs, preds)
    obs = [obs[i] for i in idx]
    cache: dict[tuple[float, float], np.ndarray] = {}

    def t_of_scales(s_h: float, s_k: float) -> np.ndarray:
        if (s_h, s_k) not in cache:
            ps = stack_predictor(profile, url, extrapolate, s_h, use_calibration, s_k)(obs)
            cache[(s_h, s_k)] = np.array([p.t_analytic_s for p in ps])
        return cache[(s_h, s_k)]

    from scaleplan.profiles import load_profile

    serial = bool(load_profile(profile).serial_dispatch)
    fit = fit_run_scales(t_of_scales, t_meas, params=RUN_SCALES if serial else RUN_SCALES[:1])
    # the law in force, written out (so a later benchmark refit keeps its block-level t_gap) and
    # overlaid with the previous dispatch row's other keys: the estimator sees the same base law
    from scaleplan.estimator import Estimator

    base = law_coefficients(Estimator(profile, url, extrapolate, use_calibration=use_calibration, host_scale=1.0,
                                      kernel_scale=1.0).dispatch)
    keep = keys_not_in(RUN_SCALES) if use_calibration else keys_in(())
    with dbs.session_scope(url) as s:
        prev = store.newest(s, profile, "dispatch", stack)
        coeffs = writers.dispatch_coefficients(fit.coefficients(), dict(prev.coefficients or {}) if prev else None,
                                             base, keep)
    runs = [{"id": o.id, "sweep": o.sweep, "t_meas_s": float(t), "t_pred_before_s": float(t * np.exp(rb)),
             "t_pred_after_s": float(t * np.exp(ra)), "log_residual_before": rb, "log_residual_after": ra}
            for o, t, rb, ra in zip(obs, t_meas, fit.residuals_before, fit.residuals)]
    mape = {k: float(np.mean(np.abs(np.expm1(getattr(fit, a))))) for k, a in
            (("before", "residuals_before"), ("after", "residuals"))}
    out = {"profile": profile, "kind": "dispatch", "from_runs": True, "coefficients": coeffs,
           **fit.coefficients(), "fitted": fit.fitted, "bounds": list(BOUNDS), "at_bound": fit.at_bound,
           "n_obs": fit.n_obs, "step_time_mape": mape, "runs": runs, "skipped": skipped, "notes": fit.notes,
           "calibration_id": None, "version": None}
    if save:
        with dbs.session_scope(url) as s:
            row = write_dispatch(
                s, profile, fit.coefficients(), base=base, keep=keep, stack=stack,
                inputs={"from_runs": True, "observation_ids": [o.id for o in obs], "bounds": list(BOUNDS),
                        "fitted": fit.fitted, "base": base, "runs": runs},
                residuals=fit.residuals, cv_error=None, n_obs=fit.n_obs,
                notes="; ".join([f"{', '.join(fit.fitted)} fitted on {fit.n_obs} observed step times"] + fit.notes))
            out.update(calibration_id=row.id, version=row.version)
    return out


def build_report(url: str | None, profile: str | None = None, calibration_id: int | None = None,
                 mode: str | None = None, predictor: Predictor | None = None, plot: str | None = None,
                 sweeps: list[str] | None = None, extrapolate: str = "clamp",
                 stack: str = store.PAPER_STACK_KEY) -> dict[str, Any]:
    """The accuracy report (JSON-ready) of a chi_sys calibration (given id, else the profile's newest).

    Without any chi_sys calibration the report still runs, with chi_sys = 1 ("after" = "before").
    """
    from scaleplan.db import session as dbs

    dbs.ensure_schema(url)
    with dbs.session_scope(url) as s:
        cal = store.by_id(s, calibration_id) if calibration_id is not None else None
        if cal is not None and cal.kind != "chi_sys":
            raise ScaleplanError(f"--calibration {calibration_id} is a {cal.kind!r} calibration; give a chi_sys one")
        profile = cal.profile if cal is not None else (profile or DEFAULT_PROFILE)
        stack = (cal.stack or store.PAPER_STACK_KEY) if cal is not None else stack
        cal = cal or store.newest(s, profile, "chi_sys", stack)
        info = store.as_dict(cal) if cal is not None else None
        inputs = dict(cal.inputs or {}) if cal is not None else {}
        disp = store.newest(s, profile, "dispatch", stack)  # its host scales are part of what "after" applies
        disp = {"id": disp.id, "coefficients": dict(disp.coefficients or {})} if disp is not None else None
    coeffs = info["coefficients"] if info else {t: 0.0 for t in TERMS}
    mode = mode or inputs.get("mode", "absolute")
    fixed = inputs.get("fixed") or None
    prior = inputs.get("prior") or None
    obs = _observations(url, profile, sweeps, stack=stack)
    # "before" is the uncalibrated estimator (the profile's dispatch law, chi_sys = 1), as `calibrate fit` prints it
    before_fn = stack_predictor(profile, url, extrapolate, use_calibration=False) if predictor is None else None
    predictor = predictor or stack_predictor(profile, url, extrapolate)
    obs, preds, skipped = usable(obs, predictor(obs))
    preds_before = before_fn(obs) if before_fn else None
    if preds_before is not None and any(p is None for p in preds_before):
        preds_before = None
    bases = bases_for(obs, mode)
    rows, arrays = sweep_report(obs, preds, bases, coeffs, mode, fixed, prior, preds_before)
    runtime_loso = inputs.get("loso") if inputs.get("runtime") else None
    for r in rows:  # a runtime fit's held-out figure is the one it printed: every term refitted without the sweep
        if runtime_loso and r["sweep"] in runtime_loso:
            r["loso_mape"], r["cv"] = float(runtime_loso[r["sweep"]]["mape_loso"]), "runtime fit, leave-one-sweep-out"
    out = {"calibration_id": info["id"] if info else None, "coefficients": coeffs, "sweeps": rows,
           "profile": profile, "mode": mode, "version": info["version"] if info else None,
           "n_obs": int(sum(r["n"] for r in rows)), "skipped": skipped, "runs": run_rows(arrays),
           "all_runs": pooled(arrays), "cv_error": info.get("cv_error") if info else None,
           "dispatch": disp, "fitted": _fitted(inputs, coeffs, disp)}
    if plot:
        out["plot"] = parity_plot(arrays, plot, title=f"{profile}: MFU parity"
                                  + (f" (calibration {info['id']})" if info else " (chi_sys = 1)"))
    return out


def _fitted(inputs: dict, coeffs: dict, disp: dict | None) -> dict[str, float]:
    """The terms the calibration's fit freed (its inputs' ``free``), each with its value: chi_sys terms from its
    coefficients, the host scales of a runtime fit from the dispatch calibration stored with it."""
    other = (disp or {}).get("coefficients") or {}
    return {k: float(coeffs.get(k, other.get(k, float("nan")))) for k in inputs.get("free") or []}


def _leave_one_sweep_out(profile: str, url: str | None, groups: list, labels: list[str], t_meas: np.ndarray,
                         extrapolate: str) -> tuple[dict[str, dict], list[float]]:
    """Refit the runtime calibration without each sweep in turn and predict that sweep: per sweep, the
    mean |t_pred / t_meas - 1| before any fit and held out, with the held-out fit's parameters; and every
    held-out run's t_pred / t_meas - 1 (the estimator's out-of-sample error). A single sweep gives ({}, [])."""
    from scaleplan.calibrate.joint import IDENTITY, estimator_t_pred, fit_joint

    loso, loso_rel = {}, []
    for s in sorted(set(labels)):
        tr = [i for i, lab in enumerate(labels) if lab != s]
        te = [i for i, lab in enumerate(labels) if lab == s]
        if not tr:
            continue
        f = fit_joint(estimator_t_pred(profile, url, [groups[i] for i in tr], extrapolate), t_meas[tr],
                      [labels[i] for i in tr])
        t_te = estimator_t_pred(profile, url, [groups[i] for i in te], extrapolate)(f.params)
        t_0 = estimator_t_pred(profile, url, [groups[i] for i in te], extrapolate)(IDENTITY)
        loso_rel.extend((t_te / t_meas[te] - 1).tolist())
        loso[s] = {"mape_before": float(np.mean(np.abs(t_0 / t_meas[te] - 1))),
                   "mape_loso": float(np.mean(np.abs(t_te / t_meas[te] - 1))), "params": f.params}
    return loso, loso_rel


def fit_runtime(url: str | None, profile: str = DEFAULT_PROFILE, sweeps: list[str] | None = None,
                sources: list[str] | None = None, extrapolate: str = "compose", save: bool = True,
                stack: str = store.PAPER_STACK_KEY) -> dict[str, Any]:
    """Fit the runtime calibration (calibrate/joint.py: host_scale, c_a2a, c_pp, c_level, each only
    where the runs identify it) on the observed runs' absolute step times, with a leave-one-sweep-out
    check; store a 'dispatch' version (the law in force + host_scale and ep_host_scale) and a 'chi_sys'
    version.

    Raises ScaleplanError: no observed runs, none with an absolute measurement.
    """
    from scaleplan.calibrate.joint import estimator_t_pred, fit_joint

    from scaleplan.db import session as dbs
    from scaleplan.specs import Layout, parse_spec

    obs = _observations(url, profile, sweeps, sources, stack)
    obs, preds, skipped = usable(obs, estimator_predictor(profile, url, extrapolate, 1.0, False,
                                                          kernel_scale=1.0)(obs))
    idx, t_meas = absolute_times(obs, preds)
    if not idx:
        raise ScaleplanError("runtime calibration: no observed run has a step time or an absolute MFU")
    obs = [obs[i] for i in idx]
    groups = [(parse_spec(o.spec), o.n_devices, [Layout(**o.layout)]) for o in obs]
    labels = [o.sweep for o in obs]
    fit = fit_joint(estimator_t_pred(profile, url, groups, extrapolate), t_meas, labels)
    loso, loso_rel = _leave_one_sweep_out(profile, url, groups, labels, t_meas, extrapolate)
    mape = {"before": float(np.mean(np.abs(np.expm1(fit.residuals_before)))),
            "after": float(np.mean(np.abs(np.expm1(fit.residuals))))}
    from scaleplan.estimator import Estimator

    law = law_coefficients(Estimator(profile, url, extrapolate, use_calibration=False).dispatch)
    chi = {"c_a2a": fit.params["c_a2a"], "c_pp": fit.params["c_pp"], "c_ovl": 0.0, "c_level": fit.params["c_level"]}
    out = {"profile": profile, "kind": "runtime", "params": fit.params, "free": fit.free,
           "unidentified": fit.unidentified, "n_obs": len(obs), "step_time_mape": mape, "loso": loso,
           "notes": fit.notes, "skipped": skipped, "calibration_ids": []}
    if save:
        inputs = {"runtime": True, "observation_ids": [o.id for o in obs], "free": fit.free,
                  "unidentified": fit.unidentified, "loso": loso}
        cv = float(np.mean([v["mape_loso"] for v in loso.values()])) if loso else None
        with dbs.session_scope(url) as s:
            # residuals: the leave-one-sweep-out relative step-time errors when there are >= 2 sweeps
            # (what the search's uncertainty reads), else the in-sample ones
            row = {"inputs": inputs, "residuals": loso_rel if loso_rel else np.expm1(fit.residuals).tolist(),
                   "cv_error": cv, "n_obs": len(obs),
                   "notes": f"runtime fit ({', '.join(fit.free) or 'nothing identified'})"}
            # fitted on the uncalibrated law: the row is that law + the host scales, nothing of an earlier row
            d = write_dispatch(s, profile, {k: fit.params[k] for k in ("host_scale", "ep_host_scale")}, base=law,
                               stack=stack, **row)
            c = write_chi_sys(s, profile, chi, stack=stack, **row)
            out["calibration_ids"] += [d.id, c.id]
    return out
