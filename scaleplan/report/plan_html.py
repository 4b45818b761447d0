"""The ``scaleplan plan --html`` sections: the time-versus-cost frontier per platform (cost vs days, colour by
platform, hover shows the plan), the cheapest plan per platform, every frontier point, the forward question's
best losses and eta_good per cluster. Built from the plan JSON (:func:`scaleplan.mosaic.plan.run_plan`'s
``out``); the page around it is :mod:`scaleplan.report.html`'s."""
from __future__ import annotations

import html
from typing import Any

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def _num(x: Any, fmt: str = "{:.4g}") -> str:
    from scaleplan.report.html import _num as num

    return num(x, fmt)


def _money(p: dict) -> str:
    return f"${p['cost_usd']:,.0f}" if p.get("cost_usd") is not None else f"{p['gpu_hours']:,.0f} GPU-hours"


def _model(b: dict) -> str:
    return (f"L{b['n_layers']} E{b['n_experts']} K{b['topk']} G{b['g']}" if "n_layers" in b
            else f"the spec's model (N_act {b['n_act'] / 1e9:.2f} B)")


def _layout(b: dict) -> str:
    from scaleplan.estimator.layout import layout_text

    return layout_text(b["layout"])


def hover(p: dict) -> str:
    """A point's plan in a few lines: cluster, window and its band, P(reach), cost, the optimum, layout, MFU."""
    b = p["plan"]
    band = "" if p.get("days_p05") is None else (f" (90%: {p['days_p05']:.3g}-" + (
        f"{p['days_p95']:.3g})" if p.get("days_p95") is not None else "never)"))
    text = (f"{p['nodes']} x {html.escape(p['profile'])} = {p['n_devices']} GPUs<br>{p['days']:.3g} days{band}, "
            f"eta_good {p['eta_good']:.3f}<br>{_money(p)} ({p['gpu_hours']:,.0f} GPU-hours)<br>{_model(b)}: "
            f"N_act {b['n_act'] / 1e9:.2f} B, N_tot {b['n_tot'] / 1e9:.1f} B, D {b['d_tokens']:.3g} tokens<br>"
            f"layout: {html.escape(_layout(b))}<br>MFU {100 * b['mfu']:.1f}%, memory "
            f"{b['mem_per_device_gb']:.0f} GB/device")
    if b.get("loss") is not None:
        text += f", loss {b['loss']:.4f}"
    if p.get("p_reach") is not None:
        text += f"<br>P(reaches target) {100 * p['p_reach']:.0f}%"
    if b.get("beyond"):
        text += "<br>beyond what was measured: " + html.escape("; ".join(b["beyond"]))
    return text


def frontier_figure(d: dict) -> str | None:
    """Cost (or GPU-hours) vs days of every point per platform (colour), the frontier's points larger, each
    platform's cheapest starred."""
    plats = [pl for pl in d.get("platforms") or [] if any(p.get("plan") for p in pl["points"])]
    if not plats:
        return None
    import plotly.graph_objects as go

    from scaleplan.report.html import _fig_html

    by_cost = d["overall"]["by"] == "cost"
    y = (lambda p: p["cost_usd"]) if by_cost else (lambda p: p["gpu_hours"])  # noqa: E731
    fig = go.Figure()
    for i, pl in enumerate(plats):
        pts = [p for p in pl["points"] if p.get("plan")]
        front = {(p["nodes"], p["days"]) for p in pl["frontier"]}
        color = _COLORS[i % len(_COLORS)]
        fig.add_trace(go.Scatter(
            x=[p["days"] for p in pts], y=[y(p) for p in pts], mode="lines+markers", name=pl["profile"],
            text=[hover(p) for p in pts], hoverinfo="text", line={"color": color, "width": 1},
            marker={"color": color, "size": [12 if (p["nodes"], p["days"]) in front else 6 for p in pts]}))
        if pl["cheapest"]:
            c = pl["cheapest"]
            fig.add_trace(go.Scatter(x=[c["days"]], y=[y(c)], mode="markers", name=f"cheapest on {pl['profile']}",
                                     text=[hover(c)], hoverinfo="text", showlegend=False,
                                     marker={"symbol": "star", "size": 18, "color": color,
                                             "line": {"color": "black", "width": 1}}))
    deadline = d["question"].get("max_days")
    if deadline:  # a trace, not a shape: on a log axis plotly places a shape's annotation in log10 units
        ys = [y(p) for pl in plats for p in pl["points"] if p.get("plan")]
        fig.add_trace(go.Scatter(x=[deadline, deadline], y=[min(ys), max(ys)], mode="lines", name="deadline",
                                 line={"dash": "dash", "color": "grey"}, hoverinfo="name"))
    fig.update_layout(title="Time vs cost per platform (large markers: the frontier; star: the cheapest)",
                      xaxis={"title": "days (wall-clock, goodput included)", "type": "log"},
                      yaxis={"title": "cost (USD)" if by_cost else "GPU-hours (not every platform has a price)",
                             "type": "log"})
    return _fig_html(fig, "plan-frontier")


COLS = ("platform", "price $/GPU-h", "nodes", "GPUs", "days", "days 90%", "P(reach)", "GPU-hours", "cost $",
        "model", "D (T)", "MFU %", "mem GB", "layout", "tables", "beyond the law's data or the observed runs")


def point_row(pl: dict, p: dict) -> list[str]:
    b, ev, pr = p["plan"], pl["evidence"], pl["price"]
    band = "-" if p.get("days_p05") is None else (f"{p['days_p05']:.3g}-" + (
        f"{p['days_p95']:.3g}" if p.get("days_p95") is not None else "never"))
    return [pl["profile"], "-" if pr is None else _num(pr["usd_per_gpu_hour"]), str(p["nodes"]), str(p["n_devices"]),
            _num(p["days"], "{:.3g}"), band, _num(p.get("p_reach"), "{:.0%}"), f"{p['gpu_hours']:,.0f}",
            "-" if p["cost_usd"] is None else f"{p['cost_usd']:,.0f}", _model(b), _num(b["d_tokens"] / 1e12, "{:.3g}"),
            _num(100 * b["mfu"], "{:.1f}"), _num(b["mem_per_device_gb"], "{:.0f}"), _layout(b),
            "analytic" if ev["analytic_platform"] else "measured: " + (", ".join(ev["measured"]) or "none")
            + ("; composed: " + ", ".join(ev["composed"]) if ev.get("composed") else ""),
            _beyond(p)]


def _beyond(p: dict) -> str:
    """Where the point's plan lies beyond what was measured (its flags) and its MFU draw's sigma; '-' inside."""
    flags = (p.get("plan") or {}).get("beyond")
    if flags is None:
        return "-"
    sig = "" if p.get("mfu_sigma") is None else f" (MFU sigma {p['mfu_sigma']:.3f})"
    return ("; ".join(flags) or "inside") + sig


def plan_sections(d: dict, figs: list[str], tables: list[dict]) -> None:
    """The plan report's figures and tables (into ``figs`` and ``tables``, :mod:`scaleplan.report.html`'s)."""
    from scaleplan.report.html import _table

    f = frontier_figure(d)
    if f:
        figs.append(f)
    plats = d.get("platforms") or []
    c = d.get("chosen")
    if c and c.get("plan"):
        pl = next(pl for pl in plats if pl["profile"] == c["profile"])
        tables.append(_table(f"The chosen point (--pick {d['question'].get('pick')})", COLS, [point_row(pl, c)],
                             note="the point --emit-spec and --emit megatron write"))
    cheap = [point_row(pl, pl["cheapest"]) for pl in plats if pl.get("cheapest")]
    if cheap:
        tables.append(_table("The cheapest plan per platform (within the constraints)", COLS, cheap, sortable=True,
                             note=_price_note(plats)))
    front = [point_row(pl, p) for pl in plats for p in pl["frontier"]]
    if front:
        tables.append(_table("The time-versus-cost frontier (fastest first per platform)", COLS, front,
                             sortable=True, note="P(reach): share of the draws (law ridge and its error beyond its "
                             "data, x the MFU error widened by the plan's distance from the observed runs and its "
                             "unmeasured share) in which this plan reaches the target in its window"))
    q = d.get("confidence")
    fw = [[pl["profile"], str(p["nodes"]), _num(p["days"], "{:.3g}"), _num(p.get("loss_q"), "{:.4f}"),
           _num(p["plan"]["loss"], "{:.4f}"), "-" if p.get("loss_p05") is None else
           f"{p['loss_p05']:.4f}-{p['loss_p95']:.4f}", _num(p.get("p_feasible"), "{:.0%}"), _model(p["plan"]),
           _money(p), _beyond(p)]
          for pl in plats for p in pl["forward"]]
    if fw:
        at = "loss in {:.0%} of draws".format(q) if q is not None else "loss at the confidence (none asked)"
        tables.append(_table("The forward question: the lowest loss within the constraints",
                             ("platform", "nodes", "days", at, "loss (point)", "loss 90%", "P(TPP floor)", "model",
                              "cost", "beyond"), fw, sortable=True))
    eta = d.get("goodput", {}).get("eta_good") or {}
    if eta:
        gpus = {}
        for pl in plats:
            for p in pl["points"] or pl["forward"]:
                gpus.setdefault(p["n_devices"], p["eta_good"])
        tables.append(_table("Goodput eta_good by cluster size", ("GPUs", "eta_good", "lost to failures"),
                             [[str(n), f"{e:.4f}", f"{1 - e:.2%}"] for n, e in sorted(gpus.items())],
                             note=str(d["goodput"].get("model", ""))))


def _price_note(plats: list[dict]) -> str:
    parts = []
    for pl in plats:
        pr = pl["price"]
        parts.append(f"{pl['profile']}: " + ("no price" if pr is None else f"${pr['usd_per_gpu_hour']:g}/GPU-h from "
                                               + (pr["source"] if pr["source"] == "--price"
                                                  else f"{pr['source']}, {pr['date']}")))
    return "prices: " + "; ".join(parts)


def plan_inputs(d: dict) -> list[tuple[str, str]]:
    """The inputs block of the plan report: target, constraints, law, goodput model, counts."""
    q, t = d["question"], d["question"]["target"]
    what = ("none (the forward question)" if t is None else f"loss {t['loss']:.4f}" if "loss" in t
            else f"{t['spec']} on {t['tokens']:.4g} tokens")
    gp = d.get("goodput", {})
    n = d.get("counts", {})
    return [("target", what), ("planned to", str(d.get("planned_to", "the point estimates"))),
            ("deadline (days)", _num(q.get("max_days"))),
            ("budget (GPU-hours)", _num(q.get("max_gpu_hours"))), ("budget (USD)", _num(q.get("max_cost_usd"))),
            ("platforms", ", ".join(q.get("platforms", []))), ("law", str(d.get("law"))),
            ("goodput", f"{gp.get('model', '-')}; {gp.get('source', '')}"),
            ("search", f"{n.get('geometries')} geometries x {n.get('node_counts')} clusters, "
                       f"{n.get('estimator_evaluations')} best plans searched")]
