"""`scaleplan calibrate`: add | fit | report | list.

Observed runs (CSV/JSON, see :mod:`scaleplan.calibrate.observations` for the columns) go into the
database; `fit` turns them into a new versioned chi_sys calibration (eq:desync) and/or fits the
dispatch floor from the dispatch benchmark; `report` shows what the calibration bought, per sweep.

`fit --kind dispatch --from-runs` (opt-in) instead fits two runtime scales in [0.2, 5] from the
observed runs' absolute step times (soft-L1 on log step time; calibrate/run_scales.py): ``host_scale``
on the dispatch law's host terms (t_gap, t_ep_host, t_host; on serial-dispatch profiles the ``ops:*``
host seconds) and ``kernel_scale`` on every table-read kernel time; a scale the runs cannot identify
stays 1. It stores a new 'dispatch' version (the law in force written out + both scales). `--kind
all` = dispatch from benchmarks, then chi_sys, as before; `--kind all --from-runs` puts the scale fit
between them. A later benchmark refit keeps the stored scales.
"""
from __future__ import annotations

from pathlib import Path

import typer

from scaleplan.cli._common import (
    DbOpt,
    ExtrapOpt,
    JsonOpt,
    check_extrapolate,
    db_url,
    escape,
    print_json,
    stderr,
    stdout,
    want_json,
)
from scaleplan.errors import SpecError

app = typer.Typer(no_args_is_help=True, help="Fit chi_sys and the dispatch law from observed runs; report accuracy.")

ProfileOpt = typer.Option("p6-b200.48xlarge", "--profile", help="Hardware profile (node type) to calibrate.")
ModeOpt = typer.Option(None, "--mode", help="absolute (default for fit) or normalized (every sweep scale-free).")


def _fixed(values: list[str] | None, opt: str = "--fix") -> dict[str, float] | None:
    from scaleplan.calibrate.chi_sys import BOUNDS, TERMS

    out = {}
    for v in values or []:
        k, sep, x = v.partition("=")
        if not sep or k.strip() not in TERMS:
            raise SpecError(opt, v, f"term=value with term in {', '.join(TERMS)}")
        try:
            out[k.strip()] = float(x)
        except ValueError:
            raise SpecError(opt, v, "a number after '='") from None
        lo, hi = BOUNDS[k.strip()]
        if not lo <= out[k.strip()] <= hi:  # also NaN and inf: the fit's own bounds for the term
            raise SpecError(opt, v, f"{k.strip()} in [{lo:g}, {hi:g}]")
    return out or None


def _prior(values: list[str] | None) -> dict[str, float] | None:
    """--prior reference (the reference estimator's published coefficients) and/or term=value."""
    from scaleplan.calibrate.chi_sys import REFERENCE_PRIOR

    out: dict[str, float] = {}
    for v in values or []:
        if v.strip() == "reference":
            out.update(REFERENCE_PRIOR)
        else:
            out.update(_fixed([v], "--prior") or {})
    return out or None


def _check_mode(mode: str | None) -> None:
    if mode is not None and mode not in ("absolute", "normalized"):
        raise SpecError("--mode", mode, "absolute or normalized")


@app.command("add")
def add(runs: Path = typer.Argument(None, help="CSV (or JSON) of observed runs; columns as mfu_sweeps.csv."),
        specs: Path = typer.Option(None, "--specs", help="YAML mapping model name -> spec, for a 'model' column."),
        profile: str = typer.Option(None, "--profile", help="Store under this profile (default: each spec's node_type)."),
        mfu_flops: str = typer.Option(None, "--mfu-flops", help="The FLOP count the file's MFU column was logged in: "
                                      "6n (6 x every active parameter x tokens, the validation sweeps'), eq-mfu "
                                      "(6 N_act, non-embedding) or megatron (Megatron-LM's TFLOP/s formula). "
                                      "An MFU without it is refused unless the row has its step time."),
        megatron_log: list[Path] = typer.Option(None, "--megatron-log", help="Megatron-LM training logs instead of "
                                                "a runs file (repeatable): spec, layout and step time read from each "
                                                "(docs/megatron.md)."),
        warmup: int = typer.Option(10, "--warmup", help="--megatron-log: iterations left out as warm-up."),
        sweep: str = typer.Option(None, "--sweep", help="--megatron-log: sweep name (default: each file's name)."),
        db: str = DbOpt, json_out: bool = JsonOpt) -> None:
    """Store observed training runs (idempotent: rows already stored are skipped; a bad row stores nothing).

    With --megatron-log, each Megatron-LM log gives one run: its argument dump the spec and layout (on
    --profile's node type), its iteration lines the step time (median after --warmup iterations, intervals with
    skipped or NaN iterations left out), its memory reports the peak; all files are read before any is stored.

    The measured step time is stored and compared: measured_t_iter_s / real_step_s_est directly,
    else an MFU (measured_mfu fraction, mfu_pct / real_mfu_pct_est percent) in the count --mfu-flops
    declares. Other columns: sweep, model|spec, n_devices, gbs, seqlen, tp, cp, pp, ep, dp, mbs;
    optional ckpt, vpp, etp, mfu_norm / real_mfu_norm (MFU / sweep max), peak_mem_gb,
    reference_pred_mfu_pct, reference_pred_step_s.
    """
    from scaleplan.calibrate.flops import COUNTS
    from scaleplan.calibrate.observations import add_runs

    if (runs is None) == (not megatron_log):
        raise SpecError("RUNS", runs, "either a runs file or --megatron-log FILE (one of the two)")
    if megatron_log:
        _add_megatron(megatron_log, profile, warmup, sweep, db, json_out)
        return
    if mfu_flops is not None and mfu_flops not in COUNTS:
        raise SpecError("--mfu-flops", mfu_flops, f"one of {', '.join(COUNTS)}")
    out = add_runs(db_url(db), runs, specs, profile, mfu_flops)
    if want_json(json_out):
        print_json(out)
    else:
        stdout.print(f"{out['file']}: {out['rows']} rows, {out['inserted']} new, {out['already_present']} "
                     f"already stored; sweeps " + ", ".join(f"{k} ({v})" for k, v in out["sweeps"].items()))


def _add_megatron(paths: list[Path], profile: str | None, warmup: int, sweep: str | None, db: str,
                  json_out: bool) -> None:
    """calibrate add --megatron-log: read every log, then store them (calibrate/megatron_log.py)."""
    from scaleplan.calibrate.megatron_log import add_megatron_logs
    from scaleplan.profiles import profile_names

    if profile is not None and profile not in profile_names():
        raise SpecError("--profile", profile, f"one of {', '.join(profile_names())}")
    if warmup < 0:
        raise SpecError("--warmup", warmup, "a non-negative iteration count")
    out = add_megatron_logs(db_url(db), paths, profile or "p6-b200.48xlarge", warmup, sweep)
    if want_json(json_out):
        print_json(out)
        return
    for r in out["runs"]:
        lo = r["layout"]
        stdout.print(f"{r['file']}: {r['n_devices']} GPUs tp={lo['tp']} cp={lo['cp']} pp={lo['pp']} dp={lo['dp']} "
                     f"ep={lo['ep']} vpp={lo['vpp']} mbs={lo['mbs']} {lo['ckpt']}: step {r['step_s']:.3f} s "
                     f"(median of iterations {r['iterations'][0]}-{r['iterations'][1]}, range "
                     f"{r['step_spread_s'][0]:.3f}-{r['step_spread_s'][1]:.3f}), sweep {r['sweep']}", highlight=False)
    stdout.print(f"{out['rows']} runs, {out['inserted']} new, {out['already_present']} already stored",
                 highlight=False)


def _print_chi(out: dict) -> None:
    c = out["coefficients"]
    stdout.print(f"chi_sys calibration id {out['calibration_id']} (version {out['version']}) for {out['profile']}, "
                 f"mode {out['mode']}, {out['n_obs']} observations")
    stdout.print("  " + "  ".join(f"{k}={v:.4g}" + ("" if k in out["free"] else " (fixed)") for k, v in c.items()))
    stdout.print(f"  leave-one-sweep-out step-time MAPE {out['cv_error']:.1%}")
    for n in out["notes"]:
        stdout.print(f"  note: {n}", markup=False)


def _print_dispatch(out: dict) -> None:
    c = out["coefficients"]
    stdout.print(f"dispatch calibration id {out['calibration_id']} (version {out['version']}) for {out['profile']}, "
                 f"{out['n_obs']} benchmark rows")
    stdout.print(f"  t_gap={c['t_gap_s'] * 1e6:.2f} us  kappa0={c['kappa0']:.4g}  kappa1={c['kappa1']:.4g}  "
                 f"t_host={c['t_host_s'] * 1e3:.3g} ms  chain gap={c['t_gap_chain_s'] * 1e6:.2f} us  "
                 f"(identified: {', '.join(out['identified'])})", highlight=False)
    for n in out["notes"]:
        stdout.print(f"  note: {n}", markup=False)


def _print_scales(out: dict) -> None:
    m = out["step_time_mape"]
    stdout.print(f"dispatch calibration id {out['calibration_id']} (version {out['version']}) for {out['profile']}: "
                 f"host_scale={out['host_scale']:.4g}, kernel_scale={out['kernel_scale']:.4g} (fitted: "
                 f"{', '.join(out['fitted'])}; bounds {out['bounds']}) from {out['n_obs']} observed runs; "
                 f"step-time MAPE {m['before']:.1%} at scale 1 -> {m['after']:.1%}", highlight=False)
    for r in out["runs"]:
        stdout.print(f"  run {r['id']} ({r['sweep']}): measured {r['t_meas_s']:.4g} s, predicted "
                     f"{r['t_pred_before_s']:.4g} -> {r['t_pred_after_s']:.4g} s, log residual "
                     f"{r['log_residual_after']:+.3f}", highlight=False)
    for n in out["notes"]:
        stdout.print(f"  note: {n}", markup=False)
    if out["skipped"]:
        stdout.print(f"  {len(out['skipped'])} run(s) left out: the estimator refused them")


@app.command("fit")
def fit(profile: str = ProfileOpt,
        kind: str = typer.Option("runtime", "--kind", help="runtime (default: host_scale, c_a2a, c_pp, c_level "
                                 "where the observed runs identify them, with leave-one-sweep-out), chi_sys, "
                                 "dispatch or all (dispatch benchmarks, then runtime)."),
        mode: str = ModeOpt,
        fix: list[str] = typer.Option(None, "--fix", help="Pin a chi_sys term, e.g. --fix c_pp=0.5 (repeatable)."),
        prior: list[str] = typer.Option(None, "--prior", help="Value for a term the data cannot identify "
                                        "(default 0): term=value, or 'reference' for the reference "
                                        "estimator's published c_a2a=1.2, c_pp=0.5, c_ovl=-0.18."),
        sweep: list[str] = typer.Option(None, "--sweep", help="Only these sweeps (repeatable)."),
        extrapolate: str = ExtrapOpt,
        from_runs: bool = typer.Option(False, "--from-runs", help="With --kind dispatch or all: also fit the "
                                       "runtime scales host_scale (dispatch host terms) and kernel_scale "
                                       "(table kernel times), each bounded [0.2, 5], on the observed runs' "
                                       "absolute step times (--sweep selects runs); with --kind dispatch "
                                       "only that fit, with all: benchmarks, scales, chi_sys."),
        stack: str = typer.Option("megatron", "--stack", help="Fit on the runs of this training stack only, as "
                                  "its key reads (`megatron` the paper's, else e.g. megatron[fp8_recipe=mxfp8]); "
                                  "the calibration applies to plans of that stack only."),
        db: str = DbOpt, json_out: bool = JsonOpt) -> None:
    """Fit and store a new calibration version (the estimator uses the newest)."""
    from scaleplan.calibrate.runner import fit_chi_sys, fit_dispatch_floor, fit_runtime, fit_scales_from_runs
    from scaleplan.stack import stack_from_key

    if kind not in ("runtime", "chi_sys", "dispatch", "all"):
        raise SpecError("--kind", kind, "runtime, chi_sys, dispatch or all")
    _check_mode(mode)
    check_extrapolate(extrapolate)
    if from_runs and kind in ("chi_sys", "runtime"):
        raise SpecError("--from-runs", f"with --kind {kind}", "--kind dispatch or all")
    stack_from_key(stack)  # a key that names no stack: one line, exit 2
    url = db_url(db)
    results = []
    if kind == "all" or (kind == "dispatch" and not from_runs):
        results.append(fit_dispatch_floor(url, profile))
    if from_runs:
        results.append(fit_scales_from_runs(url, profile, sweeps=sweep or None, extrapolate=extrapolate,
                                            stack=stack))
    if kind in ("runtime", "all") and not from_runs:
        results.append(fit_runtime(url, profile, sweeps=sweep or None, extrapolate=extrapolate, stack=stack))
    if kind == "chi_sys" or (kind == "all" and from_runs):
        results.append(fit_chi_sys(url, profile, mode or "absolute", _fixed(fix), sweeps=sweep or None,
                                   extrapolate=extrapolate, prior=_prior(prior), stack=stack))
    read_back_calibrations(url, [i for r in results for i in [r.get("calibration_id"), *r.get("calibration_ids", [])]])
    if want_json(json_out):
        print_json(results[0] if len(results) == 1 else {"fits": results})
        return
    for r in results:
        if r["kind"] == "runtime":
            _print_runtime(r)
            continue
        (_print_chi if r["kind"] == "chi_sys" else _print_scales if r.get("from_runs") else _print_dispatch)(r)


def read_back_calibrations(url: str | None, ids: list) -> None:
    """The calibration rows ``ids`` a command is about to print as stored, seen by a new connection
    (:func:`scaleplan.db.session.read_back`); raises ScaleplanError otherwise."""
    from scaleplan.db.models import Calibration
    from scaleplan.db.session import read_back

    read_back(url, Calibration, ids)


def _report_head(out: dict) -> str:
    """The report's first line: which calibrations "after" applies, the terms their fit freed with their values,
    and the terms left at 0 (so a row of zeros is not mistaken for the fit)."""
    if out["calibration_id"] is None:
        return f"no chi_sys calibration of {out['profile']} (chi_sys = 1): 'after' = 'before'"
    disp = out.get("dispatch")
    with_disp = f" with dispatch calibration {disp['id']}" if disp else ""
    fitted = out.get("fitted") or {}
    rest = [k for k, v in out["coefficients"].items() if k not in fitted]
    return (f"calibration {out['calibration_id']} (chi_sys){with_disp}, {out['profile']}, mode {out['mode']}: "
            + ("fitted " + ", ".join(f"{k}={v:.4g}" for k, v in fitted.items()) if fitted else "nothing fitted")
            + ("; not fitted: " + ", ".join(f"{k}={out['coefficients'][k]:.4g}" for k in rest) if rest else ""))


def _print_runtime(out: dict) -> None:
    m = out["step_time_mape"]
    stdout.print(f"runtime calibration ({out['profile']}, {out['n_obs']} runs; stored as "
                 f"{', '.join(map(str, out['calibration_ids'])) or 'not stored'}): "
                 + ", ".join(f"{k}={out['params'][k]:.4g}" for k in out["free"])
                 + f"; step-time MAPE {m['before']:.1%} -> {m['after']:.1%} (in-sample)", highlight=False)
    for k, why in out["unidentified"].items():
        stdout.print(f"  {k} not fitted: {why}", highlight=False)
    for s, v in out["loso"].items():
        stdout.print(f"  leave-one-sweep-out {s}: MAPE {v['mape_before']:.1%} uncalibrated -> "
                     f"{v['mape_loso']:.1%} fitted without it", highlight=False)
    for n in out["notes"]:
        stdout.print(f"  note: {n}", markup=False)


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


@app.command("report")
def report(profile: str = ProfileOpt,
           calibration: int = typer.Option(None, "--calibration", help="Report this calibration id (default: newest)."),
           mode: str = ModeOpt,
           plot: Path = typer.Option(None, "--plot", help="Write a parity plot (PNG)."),
           html: Path = typer.Option(None, "--html", metavar="FILE",
                                     help="Write a self-contained HTML report (interactive parity plot)."),
           sweep: list[str] = typer.Option(None, "--sweep", help="Only these sweeps (repeatable)."),
           extrapolate: str = ExtrapOpt,
           db: str = DbOpt, json_out: bool = JsonOpt) -> None:
    """Per-sweep step-time MAPE, Spearman, top-k overlap and leave-one-sweep-out MAPE, before and after calibration."""
    from scaleplan.calibrate.runner import build_report

    _check_mode(mode)
    check_extrapolate(extrapolate)
    out = build_report(db_url(db), profile, calibration, mode, plot=str(plot) if plot else None,
                       sweeps=sweep or None, extrapolate=extrapolate)
    if html:
        from scaleplan.report.html import write_report

        write_report(html, "calibrate", out)
        stderr.print(f"wrote the report {html}", highlight=False)
    if want_json(json_out):
        print_json(out)
        return
    stdout.print(_report_head(out), highlight=False)
    w = max([len(r["sweep"]) for r in out["sweeps"]] + [5])
    stdout.print("step-time MAPE: before = uncalibrated (the profile's dispatch law, chi_sys = 1), after = this "
                 "calibration, LOSO = refitted without the sweep; ref = the CSV's reference estimator", highlight=False)
    stdout.print(f"{'sweep':<{w}} {'n':>3} {'scale':<5} {'before':>7} {'after':>7} {'LOSO':>7} {'rho':>5} "
                 f"{'top5':>5} {'best@2':>6} {'ref':>7} {'ref@2':>5}", highlight=False)
    for r in out["sweeps"]:
        ref_top = r["reference_top1_in_top2"]
        stdout.print(f"{r['sweep']:<{w}} {r['n']:>3} {'ratio' if r['normalized'] else 'abs':<5} "
                     f"{_pct(r['mape_before']):>7} {_pct(r['mape_after']):>7} {_pct(r['loso_mape']):>7} "
                     f"{r['spearman']:>5.2f} {r['topk_overlap']['after']['5']:>5.0%} "
                     f"{'yes' if r['top1_in_top2'] else 'no':>6} {_pct(r['reference_mape']):>7} "
                     f"{'-' if ref_top is None else ('yes' if ref_top else 'no'):>5}", highlight=False)
    a = out.get("all_runs") or {}
    if a.get("n"):
        cv = "" if out.get("cv_error") is None else (f"; held-out (cv) {out['cv_error']:.1%}, the figure `calibrate "
                                                      "list` shows and `search --samples` draws from")
        stdout.print(f"all {a['n']} runs: step-time MAPE {_pct(a['mape_before'])} uncalibrated -> "
                     f"{_pct(a['mape_after'])} calibrated (in-sample){cv}", highlight=False)
    if out.get("plot"):
        stderr.print(f"parity plot: {out['plot']}")


@app.command("list")
def list_(profile: str = typer.Option(None, "--profile", help="Only this profile."),
          db: str = DbOpt, json_out: bool = JsonOpt) -> None:
    """Stored calibrations (all versions) and observed runs per sweep."""
    from sqlalchemy import func, select

    from scaleplan.db import models as m
    from scaleplan.db import session as dbs
    from scaleplan.db.calibrations import as_dict, list_calibrations

    url = db_url(db)
    dbs.ensure_schema(url)
    with dbs.session_scope(url) as s:
        cals = [as_dict(c) for c in list_calibrations(s, profile)]
        q = select(m.ObservedRun.profile, m.ObservedRun.sweep, m.ObservedRun.source, func.count()).group_by(
            m.ObservedRun.profile, m.ObservedRun.sweep, m.ObservedRun.source)
        if profile:
            q = q.where(m.ObservedRun.profile == profile)
        obs = [{"profile": p, "sweep": sw, "source": src, "n": n} for p, sw, src, n in s.execute(q)]
    if want_json(json_out):
        print_json({"calibrations": cals, "observations": obs})
        return
    from rich.table import Table  # here, not at the top: `scaleplan --help` does not need it

    t = Table("id", "profile", "stack", "kind", "version", "coefficients", "n_obs", "cv MAPE", "created")
    for c in cals:
        coeffs = "  ".join(f"{k}={v:.4g}" for k, v in c["coefficients"].items())
        t.add_row(str(c["id"]), c["profile"], escape(c["stack"]), c["kind"], str(c["version"]), coeffs, str(c["n_obs"]),
                  _pct(c["cv_error"]), (c["created_at"] or "")[:19])
    from rich.console import Console

    wide = Console(width=max(stdout.width, 220), soft_wrap=True)  # rich's 80 columns when piped cut every cell
    wide.print(t)
    t2 = Table("profile", "sweep", "source", "runs")
    for o in obs:
        t2.add_row(o["profile"], o["sweep"] or "-", o["source"], str(o["n"]))
    wide.print(t2)


@app.command("trace")
def trace(traces: list[Path] = typer.Argument(..., help="torch.profiler Chrome traces (JSON or .json.gz) of one "
                                              "rank each, with CUDA activity (Megatron-LM: --profile "
                                              "--use-pytorch-profiler)."),
          megatron_log: list[Path] = typer.Option(..., "--megatron-log", help="The run's Megatron-LM log (its "
                                                  "argument dump gives the model and layout): one for every "
                                                  "trace, or one per trace in the same order."),
          profile: str = typer.Option("p6-b200.48xlarge", "--profile", help="Hardware profile the run used."),
          stage: int = typer.Option(None, "--stage", help="Pipeline stage the traced rank ran (default: from "
                                    "the trace's rank in Megatron-Core's tp-cp-ep-dp-pp order)."),
          store: bool = typer.Option(False, "--store", help="Store a 'dispatch' calibration fitted on the traces "
                                     "(kappa0, kappa1 from the kernel counts; t_gap from the host seconds)."),
          db: str = DbOpt, json_out: bool = JsonOpt) -> None:
    """Measure the dispatch law's inputs in profiler traces: kernels, launches, blocking syncs and their callers,
    host and device busy time per step, beside the law in force; across several ranks of one pipeline stage,
    how long their collectives wait for the last rank (calibrate/trace.py, docs/megatron.md)."""
    from scaleplan.calibrate.trace import compare, group_waits, read_trace, store_law
    from scaleplan.estimator import Estimator
    from scaleplan.megatron.log import read_plan
    from scaleplan.profiles import profile_names

    if profile not in profile_names():
        raise SpecError("--profile", profile, f"one of {', '.join(profile_names())}")
    if len(megatron_log) not in (1, len(traces)):
        raise SpecError("--megatron-log", f"{len(megatron_log)} files for {len(traces)} traces",
                        "one log for every trace, or one per trace")
    logs = megatron_log * len(traces) if len(megatron_log) == 1 else megatron_log
    plans = {p: read_plan(p, profile) for p in dict.fromkeys(logs)}
    url = db_url(db)
    est = Estimator(profile, db_url=url)
    trs = [read_trace(t) for t in traces]
    rows = [compare(tr, *plans[lg], est, stage) for tr, lg in zip(trs, logs)]
    out: dict = {"profile": profile, "law": {"kappa0": est.dispatch.kappa0, "kappa1": est.dispatch.kappa1,
                                             "t_gap_s": est.dispatch.t_gap_s, "t_ep_host_s": est.dispatch.t_ep_host_s,
                                             "t_host_s": est.dispatch.t_host_s, "source": est.dispatch.source},
                 "traces": rows, "peer_waits": group_waits(trs, rows, logs)}
    if store:
        keys = {plans[lg][0].stack.key(plans[lg][0].model.precision) for lg in logs}
        if len(keys) > 1:
            raise SpecError("--megatron-log", ", ".join(sorted(keys)), "logs of one training stack (a calibration "
                            "belongs to one)")
        out["stored"] = store_law(url, profile, rows, est.dispatch, keys.pop())
        read_back_calibrations(url, [out["stored"]["calibration_id"]])
    if want_json(json_out):
        print_json(out)
        return
    for r in rows:
        _print_trace(r)
    for w in out["peer_waits"]:
        _print_waits(w)
    if store:
        st = out["stored"]
        c = st["coefficients"]
        stdout.print(f"stored dispatch calibration id {st['calibration_id']} (version {st['version']}) for {profile}: "
                     f"kappa0={c['kappa0']:.4g} kappa1={c['kappa1']:.4g} t_gap={c['t_gap_s'] * 1e6:.2f} us "
                     f"(host_scale 1); host time per micro-batch refitted within "
                     f"{max(abs(x) for x in st['host_time_rel_err']):.1%}", highlight=False)
        for n in st["notes"]:
            stdout.print(f"  note: {n}", highlight=False, markup=False)


def _print_trace(r: dict) -> None:
    ms = 1e3
    stdout.print(f"{r['file']} ({r['steps']} steps; stage {r['stage']}: {r['stage_from']}; n_mb {r['n_mb']:g}, "
                 f"{r['L_stage']:g} layers ({r['n_moe_stage']:g} MoE), E_loc {r['E_loc']:g}, {r['ckpt']})",
                 highlight=False)
    stdout.print(f"  step wall {r['wall_s']:.3f} s (estimator: {r['predicted_t_iter_s']:.3f} s); device busy "
                 f"{r['device_busy_s']:.3f} s (NCCL {r['nccl_s']:.3f} s), host busy {r['host_busy_s']:.3f} s, blocked in {r['syncs']:g} syncs "
                 f"{r['sync_s']:.3f} s", highlight=False)
    stdout.print(f"  overlap between syncs: the wall is {r['wall_s'] / r['overlap_bound_s']:.2f}x the law's "
                 f"max(host, device) and {r['wall_s'] / r['serial_bound_s']:.2f}x the sum of per-segment maxes",
                 highlight=False)
    stdout.print(f"  kernels {r['kernels']:g} ({r['launches']:g} launch calls, {r['copies']:g} copies/sets): "
                 f"{r['kappa_measured']:.0f} per layer-micro-batch (full-recompute units; the law: "
                 f"{r['kappa_law']:.0f})", highlight=False)
    gap = (f"t_gap that gives it {r['t_gap_implied_s'] * 1e6:.1f} us" if r["t_gap_implied_s"] > 0 else
           f"less than the law's {r['law_fixed_per_mb_s'] * ms:.1f} ms of t_ep_host and t_host alone")
    stdout.print(f"  host per micro-batch {r['host_per_mb_s'] * ms:.1f} ms (the law: {r['t_disp_law_s'] * ms:.1f} ms); "
                 f"{gap} (the law's t_gap: {r['t_gap_law_s'] * 1e6:.1f} us)", highlight=False)
    for c in r["sync_callers"]:
        stdout.print(f"    sync {c['per_step']:7.1f}/step {c['seconds_per_step'] * ms:8.2f} ms/step  {c['caller']}",
                     highlight=False)
    _print_pipeline(r["pipeline"])


def _print_pipeline(p: dict) -> None:
    """The traced stage's 1F1B schedule and all-to-all (calibrate/trace_pipeline.py)."""
    ms = 1e3
    if not p["forwards_per_step"]:
        stdout.print("  schedule: no forward_step / backward_step calls in the trace (record Python stacks: "
                     "Megatron-LM's --profile --use-pytorch-profiler)", highlight=False)
    elif p["round_trip_periods"] is None:
        stdout.print(f"  schedule: stage {p['stage']} of {p['pp']}, {p['forwards_before_backward']:g} forwards before "
                     "the first backward, no steady 1F1B phase to set a period (trace a later stage)", highlight=False)
    else:
        stdout.print(f"  schedule: stage {p['stage']} of {p['pp']}, steady period {p['steady_period_s'] * ms:.1f} ms; "
                     f"first micro-batch's round trip {p['round_trip_periods']:.2f} periods (every fill and drain hop "
                     f"a pacing period: {p['round_trip_pacing']:.2f}; at the other stages' own periods: less)",
                     highlight=False)
    if p["exchange_median_s"] is not None:
        stdout.print(f"  exchanges between stages: {p['exchanges_per_step']:g}/step, {p['exchange_s_per_step'] * ms:.1f} "
                     f"ms/step; median {p['exchange_median_s'] * ms:.2f} ms, p90 {p['exchange_p90_s'] * ms:.2f} ms, "
                     f"max {p['exchange_max_s'] * ms:.2f} ms", highlight=False)
    if p["a2a_per_layer_mb"] is not None and p["a2a_s"] > 0:
        hid = p["a2a_hidden_share"]
        stdout.print(f"  all-to-all: {p['a2a_per_layer_mb']:.1f} per MoE layer and micro-batch, {p['a2a_s'] * ms:.1f} "
                     f"ms/step on the device, {100 * hid:.0f}% of it beside a compute kernel (serial exchanges: "
                     "only the shared expert's share)", highlight=False)


def _print_waits(w: dict) -> None:
    if "note" in w:
        stdout.print(f"peer waits, stage {w['stage']} ({', '.join(w['files'])}): not compared: {w['note']}",
                     highlight=False)
        return
    stdout.print(f"peer waits, stage {w['stage']}, ranks {w['ranks']} ({w['steps']} steps matched): "
                 f"{w['wait_s'] * 1e3:.2f} ms per step and rank waiting for the last rank in collectives, of "
                 f"{w['nccl_s'] * 1e3:.2f} ms of NCCL kernel time" + (f"; {w['unmatched']} calls unmatched"
                                                                     if w["unmatched"] else ""), highlight=False)
    for k in w["by_kernel"][:6]:
        stdout.print(f"    {k['calls_per_step']:7.1f} calls/step  wait {k['mean_wait_s'] * 1e6:8.1f} us mean, "
                     f"{k['p90_wait_s'] * 1e6:8.1f} us p90  {k['kernel'][:80]}", highlight=False)
