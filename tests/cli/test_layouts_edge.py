"""`layouts` and the search agree on the search's own spec. The spec is the paper-grid optimum
(micro-batch 8, which the search reached by extending its 1,2,4 once); `layouts` tried 1,2,4 only and ranked a
micro-batch-4 plan first at a lower MFU than the spec's own layout, without saying the edge was hit."""
from __future__ import annotations

import yaml

from .test_suggest import PLAN


def test_layouts_reaches_the_searchs_plan_and_says_the_edge(run, run_json, recorded_db, tmp_path):
    spec = tmp_path / "plan.yaml"
    spec.write_text(yaml.safe_dump(PLAN))
    own = run_json("estimate", spec, "--db", recorded_db)[0]  # the spec's own layout: micro-batch 8
    assert own["layout"]["mbs"] == 8
    doc = run_json("layouts", spec, "--top", "3", "--db", recorded_db)
    assert doc["best"]["mfu"] >= own["mfu"] - 1e-12, (doc["best"]["layout"], doc["best"]["mfu"], own["mfu"])
    e = doc["edges"]
    assert e["extended"] == ["mbs"] and e["found"][0]["value"] == 4 and e["found"][0]["extend_with"] == 8
    assert e["before"]["mfu"] < e["after"]["mfu"] == doc["best"]["mfu"]
    code, out, err = run("layouts", spec, "--top", "3", "--db", recorded_db)
    assert code == 0, err
    text = " ".join(out.split())
    assert "edge: plan #1 used the largest micro-batch tried (mbs 4" in text
    if e["still"]:  # plan #1 at the extended edge too: said, with the flag that goes further
        assert "pass --mbs with values beyond 8" in text


def test_the_extension_ranks_as_the_whole_grid_does(recorded_db):
    """The extension costs only the added micro-batch size and merges the rankings (edges.merged_layouts):
    the plans, their order (ties by the grid's order), the counts and their order, the totals and the
    analytic components are those of one ranking over the whole grid (micro-batch 1, 2, 4 and 8)."""
    from dataclasses import replace

    from scaleplan.estimator import Estimator, PlanConstraints
    from scaleplan.mosaic.edges import layouts_edges
    from scaleplan.specs import parse_spec

    est, spec = Estimator("p6-b200.48xlarge", db_url=recorded_db), parse_spec(PLAN)
    c = PlanConstraints(mem_fraction=0.95)
    n = spec.search.num_devices
    for top in (1, 7, None):
        got, info = layouts_edges(est, spec, n, c, top)
        assert info["extended"] == ["mbs"]
        want = est.layouts(spec, n, replace(c, mbs=(1, 2, 4, 8)), top=top)
        assert got.to_dict() == want.to_dict(), top
        assert list(got.infeasible_counts) == list(want.infeasible_counts)
        assert len(got.ranked) == (top or want.n_feasible) > 0


def test_grid_position_is_the_enumeration_order():
    """plans.grid_position orders plans as enumerate_plans lists them (axes given out of order included)."""
    from scaleplan.estimator.model_dims import geometry
    from scaleplan.estimator.plans import PlanConstraints, enumerate_plans, grid_position, plan_axes
    from scaleplan.geometry import ladder_model

    c = PlanConstraints(mbs=(4, 1, 2), ckpt=("full", "none"), vpp=(2, 1))
    plans = enumerate_plans(geometry(ladder_model(8, 16, 2, 2)), 64, 256, c, 2048)[0]
    axes = plan_axes(64, c)
    pos = [grid_position(axes, plans.row(i)) for i in range(len(plans))]
    assert len(pos) > 50 and pos == sorted(pos) and len(set(pos)) == len(pos)


def test_parts_costed_together_are_each_parts_own_layouts(recorded_db):
    """Estimator.layouts_parts costs several constraint sets in one evaluation: each result is that set's
    layouts alone (plans, order, counts, totals, analytic components, warnings), an empty set included; and
    layouts_edges, which costs the next micro-batch size with the grid, drops it when plan #1 does not use the
    largest tried (the result is the grid's own layouts)."""
    from dataclasses import replace

    from scaleplan.estimator import Estimator, PlanConstraints
    from scaleplan.mosaic.edges import layouts_edges
    from scaleplan.specs import parse_spec

    est, spec = Estimator("p6-b200.48xlarge", db_url=recorded_db), parse_spec(PLAN)
    n = spec.search.num_devices
    c = PlanConstraints(mem_fraction=0.95)
    parts = [replace(c, mbs=(1, 2)), replace(c, mbs=(3,)), replace(c, mbs=(8,), ckpt=("full",), mem_fraction=0.85)]
    got = est.layouts_parts(spec, n, parts, top=None)
    assert got[1].n_feasible == 0 and got[0].n_feasible > 0 and got[2].n_feasible > 0
    for part, res in zip(parts, got):
        assert res.to_dict() == est.layouts(spec, n, part, top=None).to_dict(), part
    wide = replace(c, mbs=(1, 2, 4, 8, 16))
    res, info = layouts_edges(est, spec, n, wide, 5)
    assert res.ranked[0].layout["mbs"] < 16 and info["extended"] == []
    assert res.to_dict() == est.layouts(spec, n, wide, top=5).to_dict()


def _odd_layers_spec(tmp_path, stack: dict | None = None):
    from .conftest import SPEC

    doc = {**SPEC, "model": {**SPEC["model"], "n_layers": 15}, **({"stack": stack} if stack else {})}
    p = tmp_path / "odd.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_plans_the_flags_left_out_are_ranked_apart_and_reported(run, run_json, recorded_db, tmp_path):
    """15 layers split evenly over no PP > 1: `layouts` says how many plans that refused and what plan #1 would be
    with --uneven-stages, which is what the user gets by passing it."""
    spec = _odd_layers_spec(tmp_path)
    doc = run_json("layouts", spec, "--devices", 32, "--db", recorded_db)
    w = doc["edges"]["widened"]
    assert w["flags"] == ["--uneven-stages"] and w["refused"]["layers_not_divisible_by_pp_vpp"] > 0
    flagged = run_json("layouts", spec, "--devices", 32, "--uneven-stages", "--db", recorded_db)
    assert w["best"]["layout"] == flagged["best"]["layout"] and w["best"]["mfu"] == flagged["best"]["mfu"]
    assert "widened" not in flagged["edges"]  # the flag given: nothing left out
    html = tmp_path / "layouts.html"
    code, out, _ = run("layouts", spec, "--devices", 32, "--db", recorded_db, "--html", html)
    said = "rules that --uneven-stages lifts (layers_not_divisible_by_pp_vpp"
    assert code == 0 and said in " ".join(out.split()) and said in html.read_text()


def test_an_uneven_split_under_the_a2a_overlap_also_lifts_vpp(run_json, recorded_db, tmp_path):
    """Under stack.a2a_overlap a pipeline needs VPP (Megatron-Core's rule): lifting the even split alone leaves every
    PP > 1 plan refused again, so the pass lifts --vpp too, and reports what both flags rank first."""
    spec = _odd_layers_spec(tmp_path, {"a2a_overlap": True, "shared_expert_overlap": False})
    w = run_json("layouts", spec, "--devices", 32, "--db", recorded_db)["edges"]["widened"]
    assert w["flags"] == ["--uneven-stages", "--vpp 1,2,4"] and w["refused"]["a2a_overlap_needs_vpp"] > 0
    flagged = run_json("layouts", spec, "--devices", 32, "--uneven-stages", "--vpp", "1,2,4", "--db", recorded_db)
    assert w["best"]["layout"] == flagged["best"]["layout"] and w["best"]["mfu"] == flagged["best"]["mfu"]


def test_the_widened_report_says_when_nothing_changes_or_nothing_fits():
    from scaleplan.mosaic.edges import widened_lines

    refused = {"layers_not_divisible_by_pp_vpp": 12}
    here = {"layout": {"tp": 1, "pp": 1}, "mfu": 0.2}
    same = widened_lines({"refused": refused, "flags": ["--uneven-stages"], "best": {**here, "t_iter_s": 1.0}}, here)
    none = widened_lines({"refused": refused, "flags": ["--uneven-stages", "--vpp 1,2,4"], "best": None}, here)
    assert same == ["12 plans were refused by rules that --uneven-stages lifts (layers_not_divisible_by_pp_vpp 12); "
                    "with it plan #1 stays"]
    assert none[0].endswith("lift (layers_not_divisible_by_pp_vpp 12); with them no plan is feasible either")
    assert widened_lines(None, here) == []


def test_a_host_bound_plan_1_on_an_untimed_host_is_ranked_again_at_no_host_cost(run, run_json, spec_file, recorded_db):
    """The 700M model at micro-batch 1 with fused permutation is host-bound on a host nobody timed: `layouts` ranks
    again at no host cost and reports that plan #1 beside its own, the one the public host_scale ranks first as it
    vanishes, with plan #1's own step there; on the paper's stack, whose host the law was traced on, it does not."""
    from scaleplan.estimator import Estimator, PlanConstraints
    from scaleplan.specs import Layout, parse_spec

    from .conftest import SPEC

    args = ("layouts", spec_file, "--devices", 32, "--mbs", "1", "--top", "2", "--db", recorded_db)
    doc = run_json(*args, "--stack", "permute_fusion=true")
    info = doc["edges"]["host_free"]
    spec = parse_spec({**SPEC, "stack": {"permute_fusion": True}})
    free = Estimator("p6-b200.48xlarge", recorded_db, host_scale=1e-6)
    want = free.layouts(spec, 32, PlanConstraints(mbs=(1,)), top=1).ranked[0]
    assert info["best"]["layout"] == dict(want.layout)
    assert abs(info["best"]["t_iter_s"] - want.t_iter_s) <= 1e-6 * want.t_iter_s
    here = free.estimate(spec, 32, [Layout(**doc["best"]["layout"])])[0].t_iter_s
    assert abs(info["here_t_iter_s"] - here) <= 1e-6 * here < doc["best"]["t_iter_s"]
    assert info["share"] == doc["best"]["breakdown_s"]["dispatch_floor"] / doc["best"]["t_iter_s"] >= 0.1
    code, out, _ = run(*args, "--stack", "permute_fusion=true")
    assert code == 0 and "plan #1 is host-bound on a stack whose host is untimed" in " ".join(out.split())
    assert "host_free" not in run_json(*args)["edges"]


def test_the_host_free_sentence_names_the_other_plan_and_both_steps():
    from scaleplan.mosaic.edges import host_free_lines

    here = {"layout": {"pp": 1, "mbs": 1}, "t_iter_s": 12.5}
    same = {"share": 0.61, "here_t_iter_s": 5.66, "best": {"layout": {"pp": 1, "mbs": 1}, "mfu": 0.1, "t_iter_s": 5.66}}
    assert host_free_lines(same, here) == [
        "plan #1 is host-bound on a stack whose host is untimed (61% of its step); at no host cost (the GPU's work "
        "alone) plan #1 stays, at 5.66 s against 12.5 s estimated"]
    other = {**same, "best": {"layout": {"pp": 2, "mbs": 1}, "mfu": 0.123, "t_iter_s": 4.5}}
    assert host_free_lines(other, here)[0].endswith(
        "plan #1 is pp=2 mbs=1 at 4.5 s, MFU 12.3% (plan #1 here: 5.66 s at no host cost, 12.5 s estimated)")
    assert host_free_lines(None, here) == [] and host_free_lines(other, None) == []
