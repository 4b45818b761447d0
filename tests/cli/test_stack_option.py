"""--stack on estimate, layouts and search: the training stack over the spec's stack block (search: the
ladder's), and a bad option or FP8 recipe refused in one line with exit 2."""
from __future__ import annotations

import pytest
import yaml

from .conftest import SMALL_SEARCH, SPEC


def test_estimate_costs_the_stack_given_on_the_command_line(run_json, spec_file, recorded_db):
    args = ("estimate", spec_file, "--devices", 32, "--layout", "pp=2,ep=8", "--db", recorded_db)
    paper = run_json(*args)[0]
    grouped = run_json(*args, "--stack", "grouped_gemm=grouped")[0]
    # one grouped kernel for the 16 local experts' GEMMs: fewer launches, the same device work
    assert grouped["breakdown_s"]["dispatch_floor"] < paper["breakdown_s"]["dispatch_floor"]
    assert grouped["breakdown_s"]["experts"] == paper["breakdown_s"]["experts"]


@pytest.mark.parametrize("precision, text, field", [
    ("fp8", "fp8_recipe=mxfp9", "--stack fp8_recipe"),
    ("bf16", "fp8_recipe=mxfp8", "stack.fp8_recipe"),
    ("bf16", "dispatcher=nccl", "--stack dispatcher"),
    ("bf16", "fusion=true", "--stack"),
])
def test_a_bad_stack_option_is_one_line_and_exit_2(run, tmp_path, recorded_db, precision, text, field):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({**SPEC, "model": {**SPEC["model"], "precision": precision}}))
    for cmd in ("estimate", "layouts"):
        code, _, err = run(cmd, p, "--devices", 32, "--stack", text, "--db", recorded_db)
        assert code == 2 and field in err and len(err.strip().splitlines()) == 1, (cmd, err)


def test_a_host_bound_plan_on_an_untraced_stack_says_so_and_names_the_stack(run, run_json, spec_file, recorded_db):
    """The 700M model at micro-batch 1 is host-bound (the validation runs were). On the paper's stack the law was
    traced on that stack: no warning; with fused permutation the law's per-kernel host cost is carried over to a
    stack nobody timed, and the text output (rich markup) keeps the stack key's brackets."""
    args = ("estimate", spec_file, "--devices", 32, "--layout", "pp=2,ep=8", "--db", recorded_db)
    paper, fused = run_json(*args)[0], run_json(*args, "--stack", "permute_fusion=true")[0]
    key = "megatron[permute_fusion=true]"
    assert fused["breakdown_s"]["dispatch_floor"] >= 0.1 * fused["t_iter_s"]
    assert not [w for w in paper["warnings"] if w.startswith("dispatch_floor:")]
    note = [w for w in fused["warnings"] if w.startswith("dispatch_floor:")]
    assert len(note) == 1 and f"--stack {key}" in note[0]
    share = fused["breakdown_s"]["dispatch_floor"] / fused["t_iter_s"]
    assert note[0].startswith(f"dispatch_floor: {share:.0%} of the step")
    code, out, _ = run(*args, "--stack", "permute_fusion=true")
    assert code == 0 and key in " ".join(out.split())


def test_the_host_bound_note_states_the_step_at_no_host_cost(run_json, spec_file, recorded_db):
    """The note's second number is the plan's step with the host's launches taken to nothing, the GPU's work
    alone. CUDA graphs change who issues the captured kernels, not the kernels the device runs
    (estimator/kernel_counts.graph_savings), so two stacks apart only in CUDA graphs have different estimates
    and one step at no host cost; and that step is the one the public host_scale argument gives as it vanishes."""
    import re

    from scaleplan.estimator import Estimator

    from scaleplan.specs import Layout, parse_spec

    def note_and_step(stack: str) -> tuple[float, dict]:
        # selective: Megatron-Core runs per-layer CUDA graphs with no full recompute (layout rule layer_graphs_not_full)
        r = run_json("estimate", spec_file, "--devices", 32, "--layout", "pp=2,ep=8,ckpt=selective", "--db",
                     recorded_db, "--stack", stack)[0]
        note = next(w for w in r["warnings"] if w.startswith("dispatch_floor:"))
        return float(re.search(r"at no host cost the step is ([0-9.e+-]+) s", note).group(1)), r

    eager, r_eager = note_and_step("permute_fusion=true")
    graphed, r_graphed = note_and_step("permute_fusion=true,cuda_graphs=attn")
    assert r_graphed["t_iter_s"] < r_eager["t_iter_s"]  # the graphs take launches off a host-bound step
    assert graphed == pytest.approx(eager, rel=2e-3)  # the note prints three significant digits
    assert eager < 0.9 * r_eager["t_iter_s"]  # the plan is host-bound: the note is worth its words
    spec = parse_spec({**SPEC, "stack": {"permute_fusion": True}})
    free = Estimator("p6-b200.48xlarge", recorded_db, host_scale=1e-6).estimate(
        spec, 32, [Layout(pp=2, ep=8, ckpt="selective")])[0]
    assert eager == pytest.approx(free.t_iter_s, rel=2e-3)


def test_calibrate_list_shows_the_stack_key_whole(run, sqlite_url):
    from scaleplan.db import calibrations as store
    from scaleplan.db import session as dbs

    key = "megatron[permute_fusion=true,dispatcher=deepep]"
    with dbs.session_scope(sqlite_url) as s:
        store.store_calibration(s, "p6-b200.48xlarge", "dispatch", {"t_gap_s": 3e-5}, inputs={}, residuals=[],
                                cv_error=None, n_obs=1, notes="", stack=key)
    code, out, _ = run("calibrate", "list", "--db", sqlite_url)
    assert code == 0 and key in out


def test_search_costs_the_stack_given_and_emits_it(run_json, recorded_db, tmp_path):
    """search --stack plans the ladder on that training stack: its JSON names the stack, the spec it emits holds
    the stack block, and estimating that spec (which costs its stack) gives the search's MFU; on the paper's stack
    the same grid's optimum costs otherwise (stock Megatron-Core's host is counted as measured)."""
    stack = "permute_fusion=true,router_fusion=true,dispatcher=hybridep"
    spec_path = tmp_path / "opt.yaml"
    out = run_json(*SMALL_SEARCH, "--db", recorded_db, "--stack", stack, "--emit-spec", spec_path)
    assert out["stack"].startswith("megatron[") and "hybridep" in out["stack"]
    emitted = yaml.safe_load(spec_path.read_text())
    assert emitted["stack"] == {"permute_fusion": True, "router_fusion": True, "dispatcher": "hybridep"}
    best = out["best"]
    est = run_json("estimate", spec_path, "--db", recorded_db)
    assert est[0]["mfu"] == pytest.approx(best["mfu"], rel=1e-9)
    paper = run_json("estimate", spec_path, "--db", recorded_db, "--stack", "permute_fusion=false,"
                     "router_fusion=false,dispatcher=alltoall")
    assert paper[0]["t_iter_s"] != pytest.approx(est[0]["t_iter_s"], rel=1e-3)
    assert run_json(*SMALL_SEARCH, "--db", recorded_db)["stack"] == "megatron"


@pytest.mark.parametrize("stack, field", [("bogus=1", "--stack"), ("fp8_recipe=mxfp8", "stack.fp8_recipe")])
def test_search_refuses_a_stack_the_ladder_cannot_run_in_one_line(run, recorded_db, stack, field):
    code, out, err = run(*SMALL_SEARCH, "--db", recorded_db, "--stack", stack)
    assert code == 2 and field in err and len(err.strip().splitlines()) == 1


def test_an_emitted_spec_keeps_the_stack_it_was_costed_on(run_json, recorded_db, tmp_path):
    """layouts and plan --emit-spec write the spec's stack block with the chosen layout, so estimating what they
    wrote costs the same stack (and gives their MFU)."""
    stock = {"permute_fusion": True, "router_fusion": True, "dispatcher": "hybridep"}
    src = tmp_path / "stack.yaml"
    src.write_text(yaml.safe_dump({**SPEC, "stack": stock}))
    out_layouts, out_plan = tmp_path / "layouts.yaml", tmp_path / "plan.yaml"
    best = run_json("layouts", src, "--devices", 32, "--top", 1, "--db", recorded_db, "--emit-spec",
                    out_layouts)["best"]
    assert yaml.safe_load(out_layouts.read_text())["stack"] == stock
    assert run_json("estimate", out_layouts, "--db", recorded_db)[0]["mfu"] == pytest.approx(best["mfu"], rel=1e-9)
    run_json("plan", "--spec", src, "--tokens", "2e11", "--platforms", "p6-b200.48xlarge", "--nodes", "4",
             "--samples", "0", "--db", recorded_db, "--emit-spec", out_plan)
    assert yaml.safe_load(out_plan.read_text())["stack"] == stock
