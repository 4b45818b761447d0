"""Edges found, not hidden: does the optimum sit on the boundary of a searched axis?

An optimum at the smallest or largest searched value of an axis may only be the best of what was searched.
Grid axes (q, E, K, G) and the micro-batch size are extended once by one step beyond that edge (the step is the
spacing of the two outermost values; G and mbs double or halve) and the search rerun; only the new geometries
and the new micro-batch size are planned, the rest of the plans are reused. Policy limits (the TPP cap and
floor, the memory fraction) are reported with the flag that moves them, never moved silently. An axis the
user gave a single value is their choice, not an edge.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas only where a search merges its plans: `layouts` starts without it
    import pandas as pd

#: grid axis -> (LadderGrid field, flag, optimum's JSON key)
GRID_AXES = {"q": ("q", "--q", "q"), "E": ("experts", "--experts", "n_experts"), "K": ("topk", "--topk", "topk"),
             "G": ("g", "--g", "g")}
GEOM_KEY = ["q", "n_experts", "topk", "g"]
#: the optimum "uses the memory" when its plan needs at least this share of the --mem-fraction cap
MEM_EDGE = 0.98


@dataclass(frozen=True)
class Edge:
    """The optimum at ``side`` ("smallest", "largest", "cap", "floor") of ``axis``, moved by ``flag``;
    ``extend_with``: the value one more step adds (None for a policy limit or an axis that cannot go further)."""

    axis: str
    flag: str
    value: float
    side: str
    extend_with: int | None = None

    def to_dict(self) -> dict:
        return {"axis": self.axis, "flag": self.flag, "value": self.value, "side": self.side,
                "extend_with": self.extend_with, "text": self.text()}

    def text(self) -> str:
        if self.side in ("smallest", "largest"):
            return (f"the optimum's {self.axis} = {self.value:g} is the {self.side} searched; one more step: "
                    f"{self.flag} with {self.extend_with}")
        if self.axis == "TPP cap":
            return (f"the optimum could train on more tokens than the TPP cap {self.value:g} allows: raise "
                    f"{self.flag} (the law's data support ends at TPP 70; beyond is extrapolation)")
        if self.axis == "TPP floor":
            return f"the optimum sits at the TPP floor {self.value:g}: {self.flag} decides whether it is allowed"
        return (f"the optimum's plan needs {self.value:.0%} of the memory cap: {self.flag} (one headroom rule for "
                "estimate, layouts and search) decides which plans fit")


def _step(values: tuple[int, ...], side: str, doubling: bool) -> int | None:
    """One step beyond the ``side`` edge of sorted ``values`` (None when it would leave the positive integers)."""
    v = sorted(values)
    if doubling:
        nxt = v[-1] * 2 if side == "largest" else v[0] // 2
    else:
        nxt = v[-1] + (v[-1] - v[-2]) if side == "largest" else v[0] - (v[1] - v[0])
    return nxt if nxt >= 1 and nxt not in v else None


def _axis_edge(axis: str, flag: str, values: tuple[int, ...], value: int, doubling: bool) -> Edge | None:
    if len(set(values)) < 2:
        return None
    for side, end in (("smallest", min(values)), ("largest", max(values))):
        nxt = _step(tuple(values), side, doubling)
        if value == end and nxt is not None:  # K = 1, G = 1, mbs = 1: the end of the space, not of the search
            return Edge(axis, flag, float(value), side, nxt)
    return None


def find_edges(best: dict | None, grid, mbs: tuple[int, ...], tpp: tuple[float, float], mem_fraction: float,
               hbm_gb: float) -> list[Edge]:
    """The edges the optimum ``best`` (a search JSON row) sits on. ``tpp``: (tpp_min, tpp_max)."""
    if not best:
        return []
    out = [_axis_edge(name, flag, getattr(grid, field), int(best[key]), name == "G")
           for name, (field, flag, key) in GRID_AXES.items()]
    out.append(_axis_edge("mbs", "--mbs", tuple(mbs), int(best["layout"]["mbs"]), True))
    if best.get("tpp_capped"):
        out.append(Edge("TPP cap", "--tpp-max", tpp[1], "cap"))
    elif best["tpp"] <= 1.02 * tpp[0]:
        out.append(Edge("TPP floor", "--tpp-min", tpp[0], "floor"))
    use = best["mem_per_device_gb"] / (mem_fraction * hbm_gb)
    if use >= MEM_EDGE:
        out.append(Edge("memory", "--mem-fraction", use, "cap"))
    return [e for e in out if e is not None]


def extended(grid, mbs: tuple[int, ...], edges: list[Edge]):
    """(grid, mbs) with each extendable edge's value added; the axes extended (names)."""
    axes = []
    for e in edges:
        if e.extend_with is None:
            continue
        if e.axis == "mbs":
            mbs = tuple(sorted({*mbs, e.extend_with}))
        else:
            field = GRID_AXES[e.axis][0]
            grid = replace(grid, **{field: tuple(sorted({*getattr(grid, field), e.extend_with}))})
        axes.append(e.axis)
    return grid, mbs, axes


def merged_plans(old_geoms: pd.DataFrame, old_plans: pd.DataFrame, new_geoms: pd.DataFrame,
                 plan_new, plan_extra=None) -> pd.DataFrame:
    """Plans aligned with ``new_geoms``: the old plan of every geometry searched before, ``plan_new(geoms)`` for
    the others, and where ``plan_extra(geoms)`` (the added micro-batch size on every geometry) gives more
    tokens/s, that plan instead. Both callables return :func:`scaleplan.mosaic.search.plan_table` frames."""
    import pandas as pd

    old = old_plans.set_axis(pd.MultiIndex.from_frame(old_geoms[GEOM_KEY].astype(int)))
    keys = pd.MultiIndex.from_frame(new_geoms[GEOM_KEY].astype(int))
    seen = keys.isin(old.index)
    parts = [old.loc[keys[seen]]]
    if (~seen).any():
        parts.append(plan_new(new_geoms[~seen].reset_index(drop=True)).set_axis(keys[~seen]))
    plans = pd.concat(parts).reindex(keys).reset_index(drop=True).astype(old_plans.dtypes.to_dict())
    if plan_extra is None:
        return plans
    extra = plan_extra(new_geoms.reset_index(drop=True))
    better = extra["plan_ok"].to_numpy(bool) & (
        ~plans["plan_ok"].to_numpy(bool) | (extra["tokens_per_s"].to_numpy(float) >
                                            plans["tokens_per_s"].fillna(0).to_numpy(float)))
    merged = pd.concat([plans[~better], extra.loc[better, plans.columns]]).sort_index(kind="stable")
    return merged.reset_index(drop=True).astype(old_plans.dtypes.to_dict())


def search_edges(m, results: list, extend: bool, mem_fraction: float) -> tuple:
    """Find the first budget's edges and, with ``extend``, rerun every budget once with them extended.

    ``m``: the Mosaic that produced ``results`` ([(Envelope, SearchResult)]). Returns (mosaic, results, info):
    the extended ones when extended, and the JSON ``edges`` object: {"found": [Edge dicts], "extended": axes,
    "before" / "after": the optimum before and after (rows), "changed": bool, "still": the extended optimum's edges} (no "before"
    when nothing was extended)."""
    from scaleplan.estimator import PlanConstraints
    from scaleplan.mosaic.search import row_json

    env0, res0 = results[0]
    if res0.best is None:
        return m, results, {"found": [], "extended": []}
    base = m.constraints or PlanConstraints()
    hbm_gb = m.est.profile.hbm_bytes / 1e9
    tpp = (env0.tpp_min, env0.tpp_max)
    before = row_json(res0.best)
    found = find_edges(before, m.grid, tuple(base.mbs), tpp, mem_fraction, hbm_gb)
    info = {"found": [e.to_dict() for e in found], "extended": []}
    grid2, mbs2, axes = extended(m.grid, tuple(base.mbs), found)
    if not extend or not axes:
        return m, results, info
    t0 = time.perf_counter()
    m2 = m.extended(grid2, replace(base, mbs=mbs2), [e for e, _ in results])
    results2 = [(e, m2.run(e)) for e, _ in results]
    spent = time.perf_counter() - t0
    for (_, old), (_, new) in zip(results, results2):
        new.elapsed_s = old.elapsed_s + spent / len(results2)  # the first pass and the extension
    after = results2[0][1].best
    after_row = None if after is None else row_json(after)
    key = ("q", "n_experts", "topk", "g")
    changed = after_row is not None and (any(after_row[k] != before[k] for k in key) or
                                         after_row["layout"] != before["layout"])
    still = find_edges(after_row, grid2, mbs2, tpp, mem_fraction, hbm_gb)
    info.update(extended=axes, before=before, after=after_row, changed=bool(changed),
                still=[e.to_dict() for e in still if e.axis in axes])
    return m2, results2, info


def edge_lines(info: dict) -> list[str]:
    """The edges object as sentences for the terminal and the report."""
    lines = [e["text"] for e in info.get("found", [])]
    if info.get("extended"):
        b = info["before"]
        was = f"L{b['n_layers']} E{b['n_experts']} K{b['topk']} G{b['g']} mbs {b['layout']['mbs']} loss {b['loss']:.4f}"
        a = info.get("after")
        now = "" if a is None else (f"L{a['n_layers']} E{a['n_experts']} K{a['topk']} G{a['g']} mbs "
                                    f"{a['layout']['mbs']} loss {a['loss']:.4f}")
        lines.append(f"extended {', '.join(info['extended'])} once and searched again: " +
                     (f"the optimum moved to {now} (it was {was})" if info["changed"] else f"the optimum stays ({was})"))
        for e in info.get("still", []):
            lines.append(f"still at the {e['side']} {e['axis']} after extending: pass {e['flag']} with values beyond "
                         f"{e['value']:g} to go further")
    elif any(e["extend_with"] is not None for e in info.get("found", [])):
        lines.append("not extended (--no-extend-edges): pass the flags above with one more value to check")
    return lines


def layouts_edges(est, spec, n_devices: int, constraints, top: int) -> tuple:
    """``est.layouts`` with the search's micro-batch rule: when plan #1 uses the largest micro-batch tried (of two
    or more), the next doubling is added and the plans ranked again, once, as the search extends its mbs; so
    ``layouts`` on a search's spec reaches the plan the search found. Returns (LayoutsResult, edges info in the
    shape of :func:`search_edges`' (rows: {"layout", "mfu"}), which :func:`layouts_edge_lines` words)."""
    from scaleplan.estimator.plans import plan_axes

    tried = tuple(constraints.mbs)
    ahead = _axis_edge("mbs", "--mbs", tried, max(tried), True)  # the extension, should plan #1 take the largest
    if ahead is None:
        res = est.layouts(spec, n_devices, constraints, top=top)
        added = None
    else:  # the added micro-batch size costed with the grid (it costs little there; a second pass, the fixed
        # cost again), ranked apart, and kept only when plan #1 of the grid asked does use the largest
        res, added = est.layouts_parts(spec, n_devices, [constraints, replace(constraints, mbs=(ahead.extend_with,))],
                                       top=top)
    best = res.ranked[0] if res.ranked else None
    edge = None if best is None else _axis_edge("mbs", "--mbs", tried, int(best.layout["mbs"]), True)
    if edge is None or edge.side != "largest":
        return res, {"found": [], "extended": []}
    mbs2 = tuple(sorted({*constraints.mbs, edge.extend_with}))
    # every evaluation is elementwise: the two rankings merged as one grid would rank them
    res2 = merged_layouts(res, added, plan_axes(n_devices, replace(constraints, mbs=mbs2)), top)
    after = res2.ranked[0] if res2.ranked else None
    still = None if after is None else _axis_edge("mbs", "--mbs", mbs2, int(after.layout["mbs"]), True)
    row = lambda r: None if r is None else {"layout": dict(r.layout), "mfu": float(r.mfu)}  # noqa: E731
    return res2, {"found": [edge.to_dict()], "extended": ["mbs"], "before": row(best), "after": row(after),
                  "changed": after is not None and after.layout != best.layout,
                  "still": [still.to_dict()] if still is not None and still.side == "largest" else []}


def merged_layouts(a, b, axes: dict[str, list[int]], top: int | None):
    """The LayoutsResult of one enumeration over ``axes`` (:func:`~scaleplan.estimator.plans.plan_axes`) from
    those of two that split it by micro-batch size (``a``, ``b``): the plans ranked by MFU, ties in the order
    the whole grid enumerates them (:func:`~scaleplan.estimator.plans.grid_position`), the first ``top``
    (their union holds them); counts, totals and analytic components added up; the counts in the order of
    the rules (estimator/layout.py), then memory, then any other reason."""
    from scaleplan.estimator.layout import RULES
    from scaleplan.estimator.plans import grid_position
    from scaleplan.estimator.results import LayoutsResult

    ranked = sorted(a.ranked + b.ranked, key=lambda r: (-r.mfu, grid_position(axes, r.layout)))
    known = [r.name for r in RULES] + ["memory"]
    seen = {**a.infeasible_counts, **b.infeasible_counts}
    names = [k for k in known if k in seen] + [k for k in seen if k not in known]
    counts = {k: a.infeasible_counts.get(k, 0) + b.infeasible_counts.get(k, 0) for k in names}
    return LayoutsResult(ranked[:top] if top is not None else ranked, counts, a.n_plans + b.n_plans,
                         a.n_feasible + b.n_feasible, sorted({*a.analytic_components, *b.analytic_components}))


def layouts_edge_lines(info: dict) -> list[str]:
    """`layouts`' edges object as sentences (plan #1 on the largest micro-batch tried, and what extending did)."""
    if not info.get("extended"):
        return []
    b, a = info["before"], info["after"]
    lines = [f"plan #1 used the largest micro-batch tried (mbs {b['layout']['mbs']}, MFU {100 * b['mfu']:.1f}%); "
             f"added mbs {info['found'][0]['extend_with']} and ranked again, as the search does: "
             + (f"plan #1 is now mbs {a['layout']['mbs']} at MFU {100 * a['mfu']:.1f}%" if info["changed"]
                else "plan #1 stays")]
    for e in info.get("still", []):
        lines.append(f"still at the largest micro-batch tried (mbs {e['value']:g}): pass --mbs with values beyond "
                     f"{e['value']:g} to go further")
    return lines


#: rules whose refusals a search flag lifts: the even split over PP x VPP chunks (--uneven-stages states first / last
#: stage counts) and the all-to-all overlap's need for VPP (--vpp)
LIFTED_BY = {"layers_not_divisible_by_pp_vpp": "--uneven-stages", "layers_not_split_over_stages": "--uneven-stages",
             "a2a_overlap_needs_vpp": "--vpp"}


def _lifted(c, flag: str, base) -> bool:
    """Whether ``flag`` is lifted in constraints ``c``: uneven stages asked, or VPP beyond the user's ``base``."""
    return c.uneven_stages if flag == "--uneven-stages" else max(c.vpp) > max(base.vpp)


def _lift(c, flags: set[str]):
    """``c`` with ``flags`` lifted: uneven stages, or the next two doublings of the largest VPP tried added."""
    if "--uneven-stages" in flags:
        c = replace(c, uneven_stages=True)
    if "--vpp" in flags:
        c = replace(c, vpp=tuple(sorted({*c.vpp, 2 * max(c.vpp), 4 * max(c.vpp)})))
    return c


def widened_pass(est, spec, n_devices: int, constraints, res) -> dict | None:
    """What `layouts` left out by its own flags: where plans were refused by a rule of :data:`LIFTED_BY` that the
    user's flags did not lift, rank once more with those flags lifted (:func:`_lift`) as :func:`layouts_edges`
    ranks, again while that ranking's refusals name a flag not yet lifted (an uneven split under the all-to-all
    overlap then asks for VPP), and report its plan #1 beside plan #1 here. Reported, not merged: an uneven split
    or an interleaved schedule is the user's to opt in to. None when nothing was so refused. Returns
    {"refused": {rule: plans}, "flags": [...], "best": {"layout", "mfu", "t_iter_s"} or None}."""
    refused, wide, cur, best = {}, constraints, res, None
    while new := {k: v for k, v in cur.infeasible_counts.items()
                  if v and k in LIFTED_BY and not _lifted(wide, LIFTED_BY[k], constraints)}:
        refused.update({k: refused.get(k, 0) + v for k, v in new.items()})
        wide = _lift(wide, {LIFTED_BY[k] for k in new})
        cur = layouts_edges(est, spec, n_devices, wide, 1)[0]  # with the micro-batch rule, as the flags would rank
        best = next(iter(cur.ranked), None)
    if not refused:
        return None
    flags = (["--uneven-stages"] if wide.uneven_stages and not constraints.uneven_stages else []) + \
        ([f"--vpp {','.join(map(str, wide.vpp))}"] if wide.vpp != tuple(constraints.vpp) else [])
    return {"refused": refused, "flags": flags, "best": None if best is None else
            {"layout": dict(best.layout), "mfu": float(best.mfu), "t_iter_s": float(best.t_iter_s)}}


def widened_lines(info: dict | None, here: dict | None) -> list[str]:
    """:func:`widened_pass`' report as one sentence; ``here``: plan #1 of the ranking shown ({"layout", "mfu"})."""
    if not info:
        return []
    n = sum(info["refused"].values())
    why = ", ".join(f"{k} {v}" for k, v in info["refused"].items())
    b, flags = info["best"], " ".join(info["flags"])
    head = (f"{n} plans were refused by rules that {flags} {'lifts' if len(info['flags']) == 1 else 'lift'} ({why}); "
            f"with {'it' if len(info['flags']) == 1 else 'them'}")
    if b is None:
        return [f"{head} no plan is feasible either"]
    if here is not None and b["layout"] == here["layout"]:
        return [f"{head} plan #1 stays"]
    lay = " ".join(f"{k}={v}" for k, v in b["layout"].items())
    beside = "" if here is None else f" (plan #1 here: MFU {100 * here['mfu']:.1f}%)"
    return [f"{head} plan #1 is {lay} at MFU {100 * b['mfu']:.1f}%, t_iter {b['t_iter_s']:.3g} s{beside}"]


def host_free_pass(est, spec, n_devices: int, constraints, res) -> dict | None:
    """Where plan #1 of `layouts` is host-bound on a stack whose host is untimed (its ``dispatch_floor:`` warning,
    :meth:`Estimator.host_untimed_bound`), the ranking at no host cost (:meth:`Estimator.host_free`: the GPU's work
    alone), as :func:`layouts_edges` ranks: the other end of the range that host leaves open, so a user reads whether
    the recommendation holds across it. None otherwise. Returns {"share": plan #1's host share, "here_t_iter_s":
    plan #1's step at no host cost, "best": {"layout", "mfu", "t_iter_s"} at no host cost, or None}."""
    from scaleplan.specs import Layout

    first = next(iter(res.ranked), None)
    mine = est.for_stack(spec.stack, spec.model.precision)
    share = None if first is None else first.breakdown_s["dispatch_floor"] / first.t_iter_s
    if first is None or not mine.host_untimed_bound(share):
        return None
    free = mine.host_free()
    best = next(iter(layouts_edges(free, spec, n_devices, constraints, 1)[0].ranked), None)
    here = free.estimate(spec, n_devices, [Layout(**first.layout)])[0].t_iter_s
    return {"share": float(share), "here_t_iter_s": float(here), "best": None if best is None else
            {"layout": dict(best.layout), "mfu": float(best.mfu), "t_iter_s": float(best.t_iter_s)}}


def host_free_lines(info: dict | None, here: dict | None) -> list[str]:
    """:func:`host_free_pass`' report as one sentence; ``here``: plan #1 of the ranking shown ({"layout", "t_iter_s"})."""
    if not info or here is None:
        return []
    head = (f"plan #1 is host-bound on a stack whose host is untimed ({100 * info['share']:.0f}% of its step); at no "
            "host cost (the GPU's work alone)")
    b = info["best"]
    if b is None:
        return [f"{head} no plan is feasible"]
    if b["layout"] == here["layout"]:
        return [f"{head} plan #1 stays, at {info['here_t_iter_s']:.3g} s against {here['t_iter_s']:.3g} s estimated"]
    lay = " ".join(f"{k}={v}" for k, v in b["layout"].items())
    return [(f"{head} plan #1 is {lay} at {b['t_iter_s']:.3g} s, MFU {100 * b['mfu']:.1f}% (plan #1 here: "
             f"{info['here_t_iter_s']:.3g} s at no host cost, {here['t_iter_s']:.3g} s estimated)")]


def layouts_lines(edges: dict, best: dict | None) -> list[str]:
    """Everything `layouts` says of its edges, for the terminal and the report: the micro-batch rule's lines
    (:func:`layouts_edge_lines`), the widened pass's (:func:`widened_lines`) and the host-free pass's
    (:func:`host_free_lines`); ``best``: plan #1's JSON row."""
    return layouts_edge_lines(edges) + widened_lines(edges.get("widened"), best) + \
        host_free_lines(edges.get("host_free"), best)
