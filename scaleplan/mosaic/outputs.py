"""The search's launchable outputs: the full geometry of every candidate row, the provenance of the answer,
``--emit-spec``, ``--emit megatron`` and ``--html`` (:func:`add_launch_outputs`).

Never imports torch (a planner command).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from scaleplan.estimator.layout import FIELDS as LAYOUT_FIELDS

# frontier columns the HTML report plots (hover: geometry, layout, MFU, memory, P(optimal) when present)
_FRONTIER_COLS = ("q", "n_layers", "d", "d_ff", "d_expert", "n_experts", "topk", "g", "n_act", "n_tot", "s", "tpp",
                  "d_tokens", "c_model", "loss", "mfu_plan", "mem_gb", *LAYOUT_FIELDS, "p_optimal")


def _rows(out: dict[str, Any]):
    """Every candidate row of a search JSON: best, top, near_ties and each sweep row's best / best_per_g."""
    yield out.get("best")
    yield from out.get("top", [])
    yield from out.get("near_ties", []) or []
    for s in out.get("sweep", []) or []:
        yield s.get("best")
        yield from (s.get("best_per_g") or {}).values()


def frontier_records(frontier) -> list[dict[str, Any]]:
    """The feasible candidates (SearchResult.frontier) as plain dicts for the report (``mfu`` = mfu_plan)."""
    cols = [c for c in _FRONTIER_COLS if c in frontier.columns]
    recs = frontier[cols].rename(columns={"mfu_plan": "mfu", "mem_gb": "mem_per_device_gb"}).to_dict("records")
    for r in recs:
        for k, v in r.items():
            if hasattr(v, "item"):
                r[k] = v.item()
    return recs


def add_launch_outputs(out: dict[str, Any], res0, grid, est, env0, mem_fraction: float, emit: str | None,
           emit_spec: Path | None, html: Path | None) -> None:
    """Complete ``out`` (the search JSON) in place: geometry on every row, provenance, inputs; then write
    --emit-spec / --html and add --emit megatron's text. Raises SpecError when there is nothing to emit."""
    from scaleplan.emit import add_geometry, search_spec
    from scaleplan.errors import SpecError
    from scaleplan.report.provenance import provenance

    for r in _rows(out):
        if r and "geometry" not in r:
            add_geometry(r, grid)
    out["provenance"] = provenance(est)
    out["mem_fraction"] = mem_fraction
    out["envelope"] = {"nodes": env0.nodes, "days": env0.days, "goodput": env0.goodput, "gbs": env0.gbs,
                       "seqlen": env0.seqlen, "optimizer": env0.optimizer, "tpp_min": env0.tpp_min,
                       "tpp_max": env0.tpp_max}
    best = out.get("best")
    if (emit or emit_spec) and best is None:
        raise SpecError("--emit/--emit-spec", "no feasible configuration", "an envelope with a feasible candidate")
    doc = None
    if best is not None:
        doc = search_spec(best, grid, gbs=env0.gbs, seqlen=env0.seqlen, optimizer=env0.optimizer,
                          node_type=est.profile.name, n_devices=res0.n_devices, stack=est.training_stack)
    if emit is not None:
        from scaleplan.megatron.args import megatron_text
        from scaleplan.specs import parse_spec

        cand = (f"the search's optimum on {env0.nodes} x {est.profile.name}, {env0.days:g} days: L{best['n_layers']} "
                f"E{best['n_experts']} K{best['topk']} G{best['g']}, D = {best['d_tokens']:.4g} tokens, predicted "
                f"MFU {100 * best['mfu']:.2f}%, loss {best['loss']:.4f}")
        out["megatron_args"] = megatron_text(parse_spec(doc), best["layout"], res0.n_devices,
                                             est.profile.gpus_per_node, cand, float(best["d_tokens"]),
                                             hybrid=emit == "megatron-hybrid")
    if emit_spec:
        from scaleplan.emit import write_spec

        cal = out["provenance"]["calibration"]
        cal_text = ", ".join(f"{c['kind']} #{c['id']}" for c in cal) if cal else "none (--calibration none)"
        write_spec(emit_spec, doc,
                   f"scaleplan search: the optimum on {env0.nodes} x {est.profile.name}, {env0.days:g} days\n"
                   f"L{best['n_layers']} E{best['n_experts']} K{best['topk']} G{best['g']}: predicted MFU "
                   f"{100 * best['mfu']:.2f}%, loss {best['loss']:.4f}, {best['d_tokens']:.4g} tokens\n"
                   f"calibration in force: {cal_text}; estimate applies the newest unless told\n"
                   f"estimate it with: scaleplan estimate {emit_spec}")
        out["emitted_spec"] = str(emit_spec)
    if html:
        from scaleplan.report.html import write_report

        report = dict(out, frontier=frontier_records(res0.frontier), emitted_spec_doc=doc)
        write_report(html, "search", report)
        out["html"] = str(html)
