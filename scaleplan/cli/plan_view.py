"""`scaleplan plan`'s options into a PlanRequest (:func:`request`) and its answer as text (:func:`show`): per
platform one table of node counts (days, P(reaches target), GPU-hours, cost, the window's MOSAIC optimum), the
cheapest / fastest / frontier marks, the prices with their source, what is measured and what analytic."""
from __future__ import annotations

from typing import Any

import typer

from scaleplan.cli._common import db_url, int_list, print_json, stderr, stdout, want_json
from scaleplan.errors import SpecError


def _split(items: list[str] | None) -> list[str]:
    return [x.strip() for item in items or [] for x in str(item).split(";") if x.strip()]


def parse_nodes(items: list[str] | None, platforms: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """``--nodes``: 'LIST' (every platform) or 'PROFILE=LIST', repeatable. Raises SpecError naming --nodes."""
    out: dict[str, tuple[int, ...]] = {}
    for item in _split(items):
        name, sep, counts = item.rpartition("=")
        if sep and not name:
            raise SpecError("--nodes", item, "LIST or PROFILE=LIST of positive integers")
        vals = int_list("--nodes", counts)
        for p in ([name] if sep else platforms):
            out[p] = vals
    return out


def parse_prices(items: list[str] | None) -> dict[str, float]:
    """``--price``: 'PROFILE=USD' pairs, comma-separated or repeated. Raises SpecError naming --price."""
    out = {}
    for item in _split(items):
        for pair in (x.strip() for x in item.split(",") if x.strip()):
            name, sep, usd = pair.partition("=")
            try:
                out[name.strip()] = float(usd)
            except ValueError:
                sep = ""
            if not sep or not name.strip():
                raise SpecError("--price", pair, "PROFILE=USD per GPU-hour (e.g. p5.48xlarge=4.92)")
    return out


def _goodput(p: dict):
    from scaleplan.mosaic.goodput import Goodput

    d = Goodput()
    return Goodput(failures_per_gpu_hour=d.failures_per_gpu_hour if p["failure_rate"] is None else p["failure_rate"],
                   restart_s=d.restart_s if p["restart_min"] is None else 60.0 * p["restart_min"],
                   ckpt_save_s=d.ckpt_save_s if p["ckpt_save_s"] is None else p["ckpt_save_s"],
                   ckpt_interval_s=None if p["ckpt_interval_min"] is None else 60.0 * p["ckpt_interval_min"],
                   fixed=p["goodput"])


def request(p: dict[str, Any]):
    """The PlanRequest of the parsed options ``p`` (lists split, --calibration resolved, goodput model built)."""
    from scaleplan.mosaic.plan import PlanRequest
    from scaleplan.mosaic.run import SearchRequest
    from scaleplan.report.provenance import calibration_option
    from scaleplan.specs import parse_ckpt_modes

    platforms = tuple(x.strip() for x in p["platforms"].split(",") if x.strip())
    cal_id, use_cal = calibration_option(p["calibration"])
    lists = {k: int_list(f"--{k}", p[k]) for k in ("q", "experts", "topk", "g", "mbs")}
    same = ("gbs", "seqlen", "s_min", "s_max", "tpp_min", "tpp_max", "optimizer", "samples", "seed", "workers",
            "extrapolate", "law_name", "mem_fraction")
    search = SearchRequest(profile=(platforms or ("-",))[0], nodes=(1,), days=(1.0,), ckpt=parse_ckpt_modes(p["ckpt"]),
                           calibration_id=cal_id, use_calibration=use_cal, db_url=db_url(p["db"]),
                           extend_edges=False, stack=_stack(p.get("stack"), p["spec"]), **lists,
                           **{k: p[k] for k in same})
    return PlanRequest(search=search, platforms=platforms, nodes=parse_nodes(p["nodes"], platforms),
                       max_gpus=p["max_gpus"], target_loss=p["target_loss"], spec=p["spec"], tokens=p["tokens"],
                       max_days=p["max_days"], max_gpu_hours=p["max_gpu_hours"], max_cost=p["max_cost"],
                       prices=parse_prices(p["price"]), goodput=_goodput(p), pick=p["pick"],
                       confidence=p["confidence"], emit=p["emit"],
                       emit_spec=p["emit_spec"], html=p["html"])


def _stack(text: str | None, spec_path):
    """--stack: for the ladder (scaleplan.cli.search's rules), or over --spec's own stack block checked against its
    model, as estimate reads it. None without --stack."""
    if not text:
        return None
    if spec_path is None:
        from scaleplan.cli.search import ladder_stack

        return ladder_stack(text)
    from scaleplan.cli.estimate import load_spec_with_stack

    return load_spec_with_stack(spec_path, text).stack


def show(report, json_out: bool) -> None:
    """The answer: its JSON (--json), Megatron-Core's arguments (--emit megatron), or the tables."""
    out = report.out
    if want_json(json_out):
        print_json(out)
        return
    if report.request.emit == "megatron":
        typer.echo(out["megatron_args"])
        return
    _header(out)
    for pl in out["platforms"]:
        if pl["points"]:
            _console().print(_platform_table(pl, out))
        for line in _platform_lines(pl):
            stdout.print(line, highlight=False)
    _forward(out)
    _summary(out)
    for k, label in (("emitted_spec", "wrote the chosen point's spec to"), ("html", "wrote the report")):
        if out.get(k):
            stderr.print(f"{label} {out[k]}", highlight=False)


def _console():
    from rich.console import Console

    return Console(width=max(stdout.width, 176), soft_wrap=True)


def _header(out: dict) -> None:
    q, t, n = out["question"], out["question"]["target"], out["counts"]
    what = ("the best loss the constraints buy" if t is None else f"target loss {t['loss']:.4f}" if "loss" in t
            else f"{t['spec']} on {t['tokens']:.4g} tokens")
    cons = [f"{k} {q[k]:g}" for k in ("max_days", "max_gpu_hours", "max_cost_usd") if q[k] is not None]
    gp = out["goodput"]
    eta = ("fixed " + f"{gp['fixed']:g}" if gp["fixed"] is not None else
           f"failures {gp['failures_per_gpu_hour']:.3g}/GPU-h, restart {gp['restart_s'] / 60:g} min, checkpoint stall "
           f"{gp['ckpt_save_s']:g} s every " + ("Young's optimum" if gp["ckpt_interval_s"] is None else
                                                 f"{gp['ckpt_interval_s'] / 60:g} min"))
    stdout.print(f"[bold]scaleplan plan[/bold]: {what}; constraints: {', '.join(cons) or 'none'}; law: {out['law']}; "
                 f"goodput: {eta}", highlight=False)
    if t is not None and "spec" in t:
        stdout.print(f"the spec's model on {n['node_counts']} (platform, node count) pairs, {n['elapsed_s']:.1f} s",
                     highlight=False)
    else:
        share = n["estimator_evaluations"] / max(1, n["geometries"] * n["node_counts"])
        stdout.print(f"{n['geometries']} geometries x {n['node_counts']} (platform, node count) pairs: "
                     f"{n['estimator_evaluations']} best plans searched ({share:.0%} of all; the rest ruled out by the "
                     f"MFU <= 1 bound), {n['elapsed_s']:.1f} s", highlight=False)
    stdout.print(f"planned to {out['planned_to']}", highlight=False)


def _marks(p: dict, pl: dict) -> str:
    tags = [name for name in ("cheapest", "fastest") if pl.get(name) is p or (pl.get(name) and _same(pl[name], p))]
    if not tags and any(_same(f, p) for f in pl["frontier"]):
        tags.append("frontier")
    if p.get("violates"):
        tags.append("over " + "+".join(p["violates"]))
    return ", ".join(tags)


def _same(a: dict, b: dict) -> bool:
    return a["profile"] == b["profile"] and a["nodes"] == b["nodes"] and a["days"] == b["days"]


def _platform_table(pl: dict, out: dict):
    from rich import box
    from rich.table import Table

    from scaleplan.cli.search import _layout_cell, beyond_cell

    ev = pl["evidence"]
    composed = f"composed from another part's rows: {', '.join(ev['composed'])}; " if ev.get("composed") else ""
    kind = "ANALYTIC (no measured table: wider draws)" if ev["analytic_platform"] else \
        f"measured: {', '.join(ev['measured']) or 'none'}; {composed}analytic: {', '.join(ev['analytic']) or 'none'}"
    t = Table(title=f"{pl['profile']} ({pl['gpu_name']}, {pl['gpus_per_node']} per node, NVLink domain "
                    f"{pl['scaleup_domain']}): {kind}", box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")
    fixed = out["question"]["target"] is not None and "spec" in out["question"]["target"]
    prob = "P(by deadline)" if fixed else "P(reach)"
    for c in ("nodes", "GPUs", "days", "days 90%", prob, "GPU-hours", "cost $", "eta", "model", "TPP", "MFU %",
              "mem GB", "layout", "beyond", ""):
        t.add_column(c, justify="left" if c in ("model", "layout", "beyond", "") else "right", no_wrap=c != "",
                     min_width=21 if c == "" else None)
    for p in pl["points"]:
        b = p.get("plan")
        if b is None:
            short = "over the constraints" if p["why"].startswith("none within") else "unreachable here"
            t.add_row(str(p["nodes"]), str(p["n_devices"]), "-", "", "", "", "", f"{p['eta_good']:.3f}", "", "", "", "",
                      "", "", short)
            continue
        band = "-" if p.get("days_p05") is None else f"{p['days_p05']:.3g}-" + (
            f"{p['days_p95']:.3g}" if p.get("days_p95") is not None else "never")
        model = (f"L{b['n_layers']} E{b['n_experts']} K{b['topk']} G{b['g']}" if "n_layers" in b
                 else f"{b['model'][-14:]} ({b['n_act'] / 1e9:.3g} B)")
        t.add_row(str(p["nodes"]), str(p["n_devices"]), f"{p['days']:.3g}", band,
                  _pct(p.get("p_within_deadline") if fixed else p.get("p_reach")), f"{p['gpu_hours']:,.0f}",
                  "-" if p["cost_usd"] is None else f"{p['cost_usd']:,.0f}", f"{p['eta_good']:.3f}", model,
                  f"{b['tpp']:.0f}" if "tpp" in b else "-", f"{100 * b['mfu']:.1f}", f"{b['mem_per_device_gb']:.0f}",
                  _layout_cell(b["layout"]), beyond_cell(b), _marks(p, pl))
    return t


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _platform_lines(pl: dict) -> list[str]:
    pr, ev = pl["price"], pl["evidence"]
    price = ("no price: cost in GPU-hours only (--price " + pl["profile"] + "=USD)") if pr is None else (
        f"price ${pr['usd_per_gpu_hour']:g}/GPU-hour from " + (pr["source"] if pr["source"] == "--price" else
                                                               f"the profile: {pr['source']}, {pr['date']}"))
    sig, runs = ev["mfu_error"], ev["observed_runs"]
    dist = (f" and its distance from the {runs['source']}" if runs["n"] else
            f"; {runs['source'].replace('(', 'to measure distance from (', 1)}")
    lines = [f"  {price}", f"  MFU error sigma {sig['sigma']:.3f} ({sig['source']}), widened per plan by its "
                           f"unmeasured share{dist}"]
    c = pl.get("cheapest")
    if c and c.get("plan") and "perf_doublings" in c["plan"]:
        inside = "the law's data and the observed runs' range" if runs["n"] else "the law's data"
        where = ("beyond what was measured: " + "; ".join(c["plan"]["beyond"]) if c["plan"]["beyond"] else
                 f"inside {inside}")
        lines.append(f"  cheapest ({c['nodes']} nodes) lies {where}; its MFU drawn with sigma {c['mfu_sigma']:.3f}")
    return lines


def _forward(out: dict) -> None:
    rows = [(pl["profile"], pl["best_loss"]) for pl in out["platforms"] if pl["best_loss"]]
    if not rows:
        return
    from rich.table import Table

    q = out.get("confidence")
    at = f"loss P>={q:.0%}" if q is not None else None
    t = Table(title="the forward question: the lowest loss within the constraints, per platform" +
                    (f" (reached or beaten in {q:.0%} of the draws)" if q is not None else "") +
                    " (every node count: --json, --html)")
    for c in ("platform", "nodes", "days", *([at] if at else []), "loss", "loss 90%", "P(TPP)", "model", "MFU %",
              "GPU-hours", "cost $"):
        t.add_column(c, justify="right")
    for name, p in rows:
        b = p["plan"]
        t.add_row(name, str(p["nodes"]), f"{p['days']:.3g}", *([f"{p['loss_q']:.4f}"] if at else []), f"{b['loss']:.4f}",
                  "-" if p.get("loss_p05") is None else f"{p['loss_p05']:.4f}-{p['loss_p95']:.4f}",
                  _pct(p.get("p_feasible")), f"L{b['n_layers']} E{b['n_experts']} K{b['topk']} G{b['g']}", f"{100 * b['mfu']:.1f}",
                  f"{p['gpu_hours']:,.0f}", "-" if p["cost_usd"] is None else f"{p['cost_usd']:,.0f}")
    _console().print(t)


def _summary(out: dict) -> None:
    from scaleplan.mosaic.plan_points import fwd_loss, label

    o = out["overall"]
    analytic = {pl["profile"] for pl in out["platforms"] if pl["evidence"]["analytic_platform"]}
    by = "cost" if o["by"] == "cost" else "GPU-hours (not every platform has a price)"
    for name in ("cheapest", "fastest"):
        p = o[name]
        if p is None:
            continue
        money = f"${p['cost_usd']:,.0f}" if p["cost_usd"] is not None else f"{p['gpu_hours']:,.0f} GPU-hours"
        fixed = "loss" not in (out["question"]["target"] or {"loss": 0})
        reach = "" if p.get("p_reach") is None or fixed else f", P(reaches target) {p['p_reach']:.0%}"
        if p.get("p_within_deadline") is not None:
            reach += f", P(done by the deadline) {p['p_within_deadline']:.0%}"
        if p.get("days_p95") is not None:
            reach += f", 95% of draws within {p['days_p95']:.3g} days"
        warn = (" [yellow](analytic platform: nothing measured on it, drawn wider)[/yellow]"
                if p["profile"] in analytic else "")
        stdout.print(f"[bold]{name}[/bold]{' by ' + by if name == 'cheapest' else ''}: {label(p)}, {money}{reach}{warn}",
                     highlight=False)
    if o["best_loss"] is not None:
        p, q = o["best_loss"], out.get("confidence")
        at = "" if q is None else f" (reached or beaten in {q:.0%} of the draws; {p['plan']['loss']:.4f} at the point estimates)"
        stdout.print(f"[bold]best loss within the constraints[/bold]: {fwd_loss(p):.4f} on {label(p)}{at}",
                     highlight=False)
