"""The self-contained HTML report of `search`, `layouts`, `calibrate report` and `validate` (``--html FILE``).

One file that opens offline: plotly.js is inlined (no CDN, no network), the page is a jinja2 template
(templates/report.html.j2) and every figure is a plotly figure rendered to a ``<div>``.

Why plotly: its figures are interactive (hover text per point, zoom, legend toggling) with no server, the
Python package ships the complete plotly.js bundle so :func:`plotly.offline.get_plotlyjs` can inline it (the
file works air-gapped and never fetches anything), and it is a widely used, maintained library. Altair/Vega-Lite
would need three separately vendored JS bundles (vega, vega-lite, vega-embed) to do the same offline.

The builder takes plain dicts: the commands' JSON outputs (plus, for search, ``frontier``: the feasible
candidates as records), so it does not depend on the planner's internal objects. Never imports torch.
"""
from __future__ import annotations

import datetime as dt
import html
import math
from pathlib import Path
from typing import Any

from scaleplan.estimator.layout import FIELDS as LAYOUT_FIELDS
from scaleplan.estimator.layout import layout_text

KINDS = ("search", "layouts", "calibrate", "validate", "plan")
# the paper's result-table columns (tab:results), as `scaleplan search` prints them
RESULT_COLS = ("L", "E", "K", "G", "N_act (B)", "N_tot (B)", "S", "TPP", "D (T)", "MFU (%)", "Loss", "pp", "ep",
               "mb", "cp", "tp", "ckpt")
GEOM_COLS = (("L", "n_layers"), ("d", "d"), ("d_ff", "d_ff"), ("d_expert", "d_expert"), ("heads", "n_heads"),
             ("kv heads", "n_kv_heads"), ("head_dim", "head_dim"), ("vocab", "vocab"), ("E", "n_experts"),
             ("K", "topk"), ("G", "g"), ("shared expert", "d_shared_expert"))


# ------------------------------------------------------------------------------------------- formatting

def _num(x: Any, fmt: str = "{:.4g}") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return fmt.format(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def _layout_text(lay: dict[str, Any] | None) -> str:
    if not lay:
        return "-"
    return layout_text(lay)


def result_row(r: dict[str, Any]) -> list[str]:
    """A search candidate in the paper's result-table columns (RESULT_COLS)."""
    lay = r.get("layout", {})
    return [str(r["n_layers"]), str(r["n_experts"]), str(r["topk"]), str(r["g"]), _num(r["n_act"] / 1e9, "{:.1f}"),
            _num(r["n_tot"] / 1e9, "{:.1f}"), _num(r["s"], "{:.3f}"), _num(r["tpp"], "{:.0f}"),
            _num(r["d_tokens"] / 1e12, "{:.2f}"), _num(100 * r["mfu"], "{:.2f}"), _num(r["loss"], "{:.4f}"),
            *(str(lay.get(k, "-")) for k in ("pp", "ep", "mbs", "cp", "tp")), str(lay.get("ckpt", "-"))]


def geometry_row(g: dict[str, Any] | None) -> list[str]:
    return ["-" if not g or g.get(k) is None else str(g[k]) for _, k in GEOM_COLS]


def _hover(r: dict[str, Any]) -> str:
    """Hover text of a frontier point: geometry, layout, MFU, memory, P(optimal) when present."""
    g = r.get("geometry") or r
    text = (f"L{r['n_layers']} E{r['n_experts']} K{r['topk']} G{r['g']}<br>"
            f"d {g.get('d', '-')}, d_ff {g.get('d_ff', '-')}, d_expert {g.get('d_expert', '-')}<br>"
            f"N_act {r['n_act'] / 1e9:.2f} B, N_tot {r['n_tot'] / 1e9:.1f} B, S {r['s']:.3f}, TPP {r['tpp']:.0f}<br>"
            f"layout: {html.escape(_layout_text(r.get('layout') or r))}<br>"
            f"MFU {100 * r['mfu']:.2f}%, memory {r.get('mem_per_device_gb', float('nan')):.1f} GB/device<br>"
            f"loss {r['loss']:.4f}, C_model {r['c_model']:.3g} FLOP")
    if r.get("p_optimal") is not None and r["p_optimal"] == r["p_optimal"]:
        text += f"<br>P(optimal) {100 * r['p_optimal']:.1f}%"
    return text


# ------------------------------------------------------------------------------------------- figures

def _fig_html(fig, div_id: str) -> str:
    fig.update_layout(template="plotly_white", margin={"l": 60, "r": 20, "t": 50, "b": 50}, height=480)
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config={"displaylogo": False})


def frontier_figure(frontier: list[dict[str, Any]], best: dict[str, Any] | None) -> str | None:
    """Loss vs C_model of every feasible candidate, one trace (colour) per G; the optimum starred."""
    if not frontier:
        return None
    import plotly.graph_objects as go

    fig = go.Figure()
    for g in sorted({int(r["g"]) for r in frontier}):
        pts = [r for r in frontier if int(r["g"]) == g]
        fig.add_trace(go.Scatter(x=[r["c_model"] for r in pts], y=[r["loss"] for r in pts], mode="markers",
                                 name=f"G = {g}", text=[_hover(r) for r in pts], hoverinfo="text",
                                 marker={"size": 7, "opacity": 0.8}))
    if best:
        fig.add_trace(go.Scatter(x=[best["c_model"]], y=[best["loss"]], mode="markers", name="optimum",
                                 text=[_hover(best)], hoverinfo="text",
                                 marker={"symbol": "star", "size": 18, "color": "black"}))
    fig.update_layout(title="Feasible frontier: predicted loss vs C_model (colour: G)",
                      xaxis={"title": "C_model = 6 N_act D (FLOP)", "type": "log"},
                      yaxis={"title": "predicted loss (eq:joint-law)"})
    return _fig_html(fig, "frontier")


def sparsity_figure(rows: list[dict[str, Any]], s_max: float | None) -> str | None:
    """The by-sparsity view: best loss per sparsity bin (hollow where the prescription is not deliverable)."""
    if not rows:
        return None
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(
        x=[r["s"] for r in rows], y=[r["loss"] for r in rows], mode="lines+markers", name="L*_hw(S)",
        text=[_hover({**r, "mem_per_device_gb": float("nan")}) for r in rows], hoverinfo="text",
        marker={"size": 8, "symbol": ["circle" if r.get("prescription_feasible") else "circle-open" for r in rows]}))
    if s_max is not None:
        fig.add_vline(x=s_max, line_dash="dash", annotation_text="law's data support (s_max)")
    fig.update_layout(title="Best candidate per sparsity bin", xaxis={"title": "sparsity S"},
                      yaxis={"title": "predicted loss"})
    return _fig_html(fig, "sparsity")


def sweep_figure(sweep: list[dict[str, Any]], axis: str) -> str | None:
    """Budget sweep: the optimal loss per budget, and the best candidate per G (fig:gpuhours)."""
    if not sweep:
        return None
    import plotly.graph_objects as go

    fig = go.Figure()
    x = [row["gpu_hours"] for row in sweep]
    gs = sorted({int(g) for row in sweep for g in (row.get("best_per_g") or {})})
    for g in gs:
        pts = [(row["gpu_hours"], (row.get("best_per_g") or {}).get(g) or (row.get("best_per_g") or {}).get(str(g)))
               for row in sweep]
        pts = [(h, b) for h, b in pts if b]
        fig.add_trace(go.Scatter(x=[h for h, _ in pts], y=[b["loss"] for _, b in pts], mode="lines+markers",
                                 name=f"best with G = {g}", text=[_hover(b) for _, b in pts], hoverinfo="text"))
    best = [(h, row["best"]) for h, row in zip(x, sweep) if row.get("best")]
    fig.add_trace(go.Scatter(x=[h for h, _ in best], y=[b["loss"] for _, b in best], mode="markers",
                             name="optimum", text=[_hover(b) for _, b in best], hoverinfo="text",
                             marker={"symbol": "star", "size": 14, "color": "black"}))
    fig.update_layout(title=f"Budget sweep over {axis}: optimal loss vs GPU-hours",
                      xaxis={"title": "GPU-hours", "type": "log"}, yaxis={"title": "predicted loss"})
    return _fig_html(fig, "sweep")


_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def parity_figure(runs: list[dict[str, Any]]) -> str | None:
    """Calibration parity: predicted vs measured MFU per observed run, one colour per sweep (filled: calibrated,
    rings: uncalibrated, larger and drawn after so a filled point at the same place shows inside its ring)."""
    if not runs:
        return None
    import plotly.graph_objects as go

    fig = go.Figure()
    for sweep in sorted({r["sweep"] for r in runs}):
        pts = [r for r in runs if r["sweep"] == sweep]
        text = [f"{sweep} run {r['id']}<br>{html.escape(str(r['layout']))}<br>measured {100 * r['measured']:.2f}%"
                f", before {100 * r['before']:.2f}%, after {100 * r['after']:.2f}%" for r in pts]
        color = _COLORS[len(fig.data) // 2 % len(_COLORS)]
        fig.add_trace(go.Scatter(x=[100 * r["measured"] for r in pts], y=[100 * r["after"] for r in pts],
                                 mode="markers", name=f"{sweep} (calibrated)", text=text, hoverinfo="text",
                                 marker={"size": 7, "color": color, "opacity": 0.8}))
        # the uncalibrated rings larger and drawn after (on top): a calibrated point at the same place sits inside
        fig.add_trace(go.Scatter(x=[100 * r["measured"] for r in pts], y=[100 * r["before"] for r in pts],
                                 mode="markers", name=f"{sweep} (uncalibrated)", text=text, hoverinfo="text",
                                 marker={"symbol": "circle-open", "size": 13, "color": color,
                                         "line": {"width": 2}}))
    vals = [100 * r[k] for r in runs for k in ("measured", "after", "before")]
    lo, hi = min(vals), max(vals)
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x", line={"dash": "dash",
                                                                                       "color": "grey"}))
    fig.update_layout(title="MFU parity: predicted vs measured", xaxis={"title": "measured MFU (%)"},
                      yaxis={"title": "predicted MFU (%)"})
    return _fig_html(fig, "parity")


def component_figure(rows: list[dict[str, Any]]) -> str | None:
    """validate: predicted per-component seconds (stacked) beside the measured step time, per layout.
    Only rows that carry ``predicted_breakdown_s`` take part."""
    rows = [r for r in rows if r.get("predicted_breakdown_s")]
    if not rows:
        return None
    import plotly.graph_objects as go

    labels = [_layout_text(r["layout"]) for r in rows]
    comps = sorted({k for r in rows for k, v in r["predicted_breakdown_s"].items() if v > 0})
    fig = go.Figure()
    for c in comps:
        fig.add_trace(go.Bar(x=labels, y=[r["predicted_breakdown_s"].get(c, 0.0) for r in rows], name=c,
                             offsetgroup="predicted"))
    fig.add_trace(go.Bar(x=labels, y=[r.get("measured_t_iter_s") for r in rows], name="measured t_iter",
                         offsetgroup="measured", marker={"color": "black"}))
    fig.update_layout(barmode="relative", title="Predicted components (stacked) vs measured step time",
                      yaxis={"title": "seconds per iteration"})
    return _fig_html(fig, "components")


# ------------------------------------------------------------------------------------------- sections

def _table(title: str, cols, rows, sortable: bool = False, note: str = "", prose: bool = False,
           wrap: tuple[int, ...] = ()) -> dict[str, Any]:
    """A table of the report. ``prose``: its cells are sentences (they wrap to the page's width); ``wrap``: the
    indices of the columns whose text wraps in a table that otherwise scrolls sideways in its own box."""
    return {"title": title, "cols": list(cols), "rows": [list(r) for r in rows], "sortable": sortable, "note": note,
            "prose": prose, "wrap": list(wrap)}


def _provenance_tables(prov: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not prov:
        return []
    cals = prov.get("calibration") or []
    cal_rows = [[str(c["id"]), c["kind"], str(c["version"]), str(c["fitted_at"]), c["fitted_on"],
                 _num(c.get("cv_error"))] for c in cals] or [["none", "-", "-", "-", "chi_sys = 1", "-"]]
    runs = [[str(r["id"]), r["suite"], r["source"], str(r.get("gpu_name") or "-"), str(r["started_at"])[:19],
             str(r.get("source_file") or "-"), str(r["n_points"])] for r in prov.get("table_runs") or []]
    return [_table("Calibration in force", ("id", "kind", "version", "fitted", "fitted on", "CV error"), cal_rows,
                   note=f"dispatch law: {prov.get('dispatch_law', '-')}; extrapolate: {prov.get('extrapolate', '-')}"),
            _table("Measured table runs read", ("run", "suite", "source", "GPU", "started", "file", "points"), runs,
                   sortable=True, note="a point measured in several runs is read from the newest")]


def _inputs(kind: str, d: dict[str, Any]) -> list[tuple[str, str]]:
    items: list[tuple[str, str]] = []
    if kind == "search":
        env = d.get("envelope", {})
        items += [("profile", str(d.get("profile"))), ("devices", str(d.get("n_devices")))]
        items += [(k, _num(v)) for k, v in env.items()]
        items += [("C_peak (FLOP)", _num(d.get("c_peak"), "{:.3g}")), ("law", str(d.get("law"))),
                  ("memory fraction of HBM", _num(d.get("mem_fraction"))),
                  ("candidates", (f"{d.get('n_candidates')} realizable of {d.get('n_grid')}, "
                                  f"{d.get('n_feasible')} feasible"))]
    elif kind == "layouts":
        items += [("spec", str(d.get("spec_path"))), ("devices", str(d.get("n_devices"))),
                  ("memory fraction of HBM", _num(d.get("mem_fraction"))),
                  ("plans", f"{d.get('n_feasible')} feasible of {d.get('n_plans')}")]
    elif kind == "calibrate":
        items += [("profile", str(d.get("profile"))), ("calibration", str(d.get("calibration_id"))),
                  ("mode", str(d.get("mode"))), ("observations", str(d.get("n_obs"))),
                  ("coefficients", ", ".join(f"{k}={v:.4g}" for k, v in (d.get("coefficients") or {}).items()))]
    elif kind == "validate":
        items += [("spec", str(d.get("spec_path"))), ("profile", str(d.get("profile"))),
                  ("device", str(d.get("device")))]
    elif kind == "plan":
        from scaleplan.report.plan_html import plan_inputs

        items += plan_inputs(d)
    analytic = d.get("analytic_components")
    if analytic is not None:
        items.append(("analytic (no measured table)", ", ".join(analytic) or "none"))
    composed = (d.get("best") or {}).get("composed_share")
    if composed is not None:
        items.append(("optimum's time from composed lookups", f"{100 * composed:.0f}%"))
    return items


def _search_sections(d: dict[str, Any], figs: list[str], tables: list[dict[str, Any]]) -> None:
    best = d.get("best")
    if best:
        tables.append(_table("Optimum (the paper's result-table columns)", (*RESULT_COLS, "beyond the law's data or "
                             "the observed runs"), [[*result_row(best), _beyond(best)]], wrap=(len(RESULT_COLS),),
                             note="Loss: at the point estimates (the recommendation also gives its mean over the "
                                  "draws)"))
        tables.append(_table("Optimum's full geometry", [c for c, _ in GEOM_COLS], [geometry_row(best.get("geometry"))],
                             note="layout: " + _layout_text(best.get("layout"))))
    figs += [f for f in (frontier_figure(d.get("frontier") or [], best),
                         sparsity_figure(d.get("by_sparsity") or [], d.get("s_max")),
                         sweep_figure(d.get("sweep") or [], d.get("sweep_axis", "budget"))) if f]
    _verdict_tables(d, tables)
    from scaleplan.mosaic.report import shown_rows

    # the columns that decide first (visible without scrolling the table's box), then the result-table columns
    cols = ("#", "model", "status", "P(optimal)", "loss", "loss 90% (draws)", "TPP", "P(TPP >= floor)",
            "MFU 90% (%)", "beyond the law's data or the observed runs", *RESULT_COLS[4:], "mem GB",
            *(c for c, _ in GEOM_COLS[1:4]))
    rows = [[str(i + 1), f"L{r['n_layers']} E{r['n_experts']} K{r['topk']} G{r['g']}", status,
             _num(r.get("p_optimal"), "{:.0%}"), _num(r["loss"], "{:.4f}"), _band(r, "loss", 1, "{:.4f}"),
             _num(r["tpp"], "{:.0f}"), _num(r.get("p_feasible"), "{:.0%}"), _band(r, "mfu", 100, "{:.1f}"),
             _beyond(r), *result_row(r)[4:], _num(r.get("mem_per_device_gb"), "{:.1f}"),
             *geometry_row(r.get("geometry"))[1:4]]
            for i, (r, status) in enumerate(shown_rows(d))]
    floor = (d.get("envelope") or {}).get("tpp_min")
    tables.append(_table("Top candidates and every candidate the summary names (click a column to sort)", cols, rows,
                         sortable=True, wrap=(2, 9), note=f"TPP floor {_num(floor)}; loss: at the point estimates, "
                         "its 90% band over the draws; status: recommended, tie, near-tie (P(optimal) >= 5%), mostly "
                         "infeasible (under the TPP floor at the point estimates or in most draws), most frequent (the "
                         "draws' most frequent optimum); the table scrolls sideways in its box"))


def _beyond(r: dict[str, Any]) -> str:
    """Where a candidate lies beyond the law's data or the observed runs (mosaic.evidence.reach), '-' inside."""
    return "; ".join(r.get("beyond") or []) or "-"


def _band(r: dict[str, Any], key: str, scale: float, fmt: str) -> str:
    lo, hi = r.get(f"{key}_p05"), r.get(f"{key}_p95")
    return "-" if lo is None or hi is None else f"{fmt.format(scale * lo)}-{fmt.format(scale * hi)}"


def _verdict_tables(d: dict[str, Any], tables: list[dict[str, Any]]) -> None:
    """The recommendation, the edges and the --samples verdicts, one sentence per row."""
    from scaleplan.mosaic.edges import edge_lines

    rec = d.get("recommendation")
    if rec:
        tables.append(_table("Recommendation", ("which model to train, and why",), [[rec["statement"]]],
                             prose=True))
    lines = edge_lines(d.get("edges") or {})
    if lines:
        tables.append(_table("Edges of the searched grid", ("edge",), [[x] for x in lines], prose=True))
    v = d.get("verdicts")
    if v:
        tables.append(_table(f"Verdicts over {d.get('samples')} draws", ("statement",),
                             [[x] for x in v.get("statements", [])], prose=True))


def _layouts_sections(d: dict[str, Any], figs: list[str], tables: list[dict[str, Any]]) -> None:
    tables.append(_table("Model geometry", [c for c, _ in GEOM_COLS], [geometry_row(d.get("geometry"))]))
    cols = ("#", *LAYOUT_FIELDS, "MFU %", "HFU %", "t_iter s", "mem GB",
            "chi_sys", "composed")
    rows = []
    for i, r in enumerate(d.get("ranked") or []):
        lay = r["layout"]
        rows.append([str(i + 1), *(str(lay[k]) for k in LAYOUT_FIELDS),
                     _num(100 * r["mfu"], "{:.2f}"), _num(100 * r["hfu"], "{:.2f}"),
                     _num(r["t_iter_s"], "{:.3f}"), _num(r["mem_per_device_gb"], "{:.1f}"), _num(r["chi_sys"], "{:.3f}"),
                     _num(100 * r.get("composed_share", 0.0), "{:.0f}%")])
    tables.append(_table("Ranked layouts (click a column to sort)", cols, rows, sortable=True))
    from scaleplan.mosaic.edges import layouts_lines

    lines = layouts_lines(d.get("edges") or {}, d.get("best"))
    if lines:
        tables.append(_table("Edges of the search (micro-batch sizes, flags)", ("edge",), [[x] for x in lines],
                             prose=True))
    best = d.get("best")
    if best and best.get("breakdown_s"):
        figs.append(component_figure([{"layout": best["layout"], "predicted_breakdown_s": best["breakdown_s"],
                                       "measured_t_iter_s": None}]) or "")


def _calibrate_sections(d: dict[str, Any], figs: list[str], tables: list[dict[str, Any]]) -> None:
    f = parity_figure(d.get("runs") or [])
    if f:
        figs.append(f)
    cols = ("sweep", "n", "MAPE before", "MAPE after", "LOSO MAPE", "Spearman")
    rows = [[r["sweep"], str(r["n"]), _num(r.get("mape_before"), "{:.1%}"), _num(r.get("mape_after"), "{:.1%}"),
             _num(r.get("loso_mape"), "{:.1%}"), _num(r.get("spearman"), "{:.2f}")] for r in d.get("sweeps") or []]
    a = d.get("all_runs") or {}
    note = "before: uncalibrated (the profile's dispatch law, chi_sys = 1); after: this calibration; LOSO: refitted " \
        "without the sweep"
    if a.get("n"):
        note += (f". All {a['n']} runs: step-time MAPE {_num(a.get('mape_before'), '{:.1%}')} -> "
                 f"{_num(a.get('mape_after'), '{:.1%}')} (in-sample), held-out (cv) {_num(d.get('cv_error'), '{:.1%}')}"
                 " - the figures `calibrate fit` and `calibrate list` print")
    tables.append(_table("Per-sweep accuracy", cols, rows, sortable=True, note=note))


def _validate_sections(d: dict[str, Any], figs: list[str], tables: list[dict[str, Any]]) -> None:
    rows = d.get("rows") or []
    f = component_figure(rows)
    if f:
        figs.append(f)
    cols = ("layout", "measured t_iter s", "predicted t_iter s", "measured MFU %", "predicted MFU %",
            "measured peak GB", "predicted GB")
    tables.append(_table("Measured vs predicted", cols, [[
        _layout_text(r["layout"]), _num(r.get("measured_t_iter_s")), _num(r.get("predicted_t_iter_s")),
        _num(100 * r["measured_mfu"] if r.get("measured_mfu") is not None else None, "{:.2f}"),
        _num(100 * r["predicted_mfu"] if r.get("predicted_mfu") is not None else None, "{:.2f}"),
        _num(r.get("measured_peak_mem_gb"), "{:.2f}"), _num(r.get("predicted_mem_gb"), "{:.2f}")] for r in rows],
        sortable=True))


def _plan_sections(d: dict[str, Any], figs: list[str], tables: list[dict[str, Any]]) -> None:
    from scaleplan.report.plan_html import plan_sections

    plan_sections(d, figs, tables)


_SECTIONS = {"search": _search_sections, "layouts": _layouts_sections, "calibrate": _calibrate_sections,
             "validate": _validate_sections, "plan": _plan_sections}
_TITLES = {"search": "MOSAIC plan", "layouts": "Ranked execution plans", "calibrate": "Calibration report",
           "validate": "Validation: measured vs predicted",
           "plan": "Cluster plan: cheapest, fastest and the frontier per platform"}


def build_report(kind: str, data: dict[str, Any]) -> str:
    """The report page (HTML text) of ``kind`` (search, layouts, calibrate, validate) from the command's JSON
    dict. Raises ValueError for an unknown kind."""
    if kind not in KINDS:
        raise ValueError(f"report kind {kind!r}: one of {', '.join(KINDS)}")
    import jinja2
    from plotly.offline import get_plotlyjs

    figs: list[str] = []
    tables: list[dict[str, Any]] = []
    _SECTIONS[kind](data, figs, tables)
    env = jinja2.Environment(loader=jinja2.PackageLoader("scaleplan.report", "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]))
    spec = data.get("spec") or data.get("emitted_spec_doc")
    return env.get_template("report.html.j2").render(
        title=_TITLES[kind], kind=kind, generated=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        inputs=_inputs(kind, data), provenance=_provenance_tables(data.get("provenance")),
        tables=tables, figures=[f for f in figs if f], plotly_js=get_plotlyjs(),
        spec_yaml=_yaml(spec) if spec else None, megatron=data.get("megatron_args"))


def _yaml(doc: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(doc, sort_keys=False)


def write_report(path: str | Path, kind: str, data: dict[str, Any]) -> Path:
    """Write :func:`build_report` to ``path``. Raises SpecError naming --html when it cannot be written."""
    from scaleplan.errors import SpecError

    text = build_report(kind, data)
    p = Path(path)
    try:
        p.write_text(text, encoding="utf-8")
    except OSError as e:
        raise SpecError("--html", str(path), f"a writable file path ({e.strerror})") from None
    return p
