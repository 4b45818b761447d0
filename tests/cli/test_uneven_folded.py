"""Layouts that could not be stated before: uneven pipeline stages (Qwen3-235B-A22B's 94 layers over
PP 8 x VPP 2 on 64 B200, DeepSeek-V3's 61 over PP 16 on 256 B200) and the expert mesh folded over TP x DP (Qwen3
at TP 2, DP 16, EP 32 on 256 H100: EP 32 does not divide DP 16). Each estimates with a breakdown, states the
split it was costed with, and its --emit megatron text is one megatron-core's TransformerConfig accepts (the
split counted by hand from Megatron-Core's get_num_layers_to_build rule); `layouts` ranks each among its feasible
plans, and the arguments of its plan #1 pass megatron-core's checks too."""
from __future__ import annotations

import pytest

from . import mlm

CASES = [
    # (model, devices, profile, --layout, (first, last) stage layers: middle ceil(L / (PP VPP)) VPP, the last the
    # smaller half of the rest)
    ("qwen3-235b-a22b", 64, "p6-b200.48xlarge", "tp=1,pp=8,vpp=2,ep=8", (12, 10)),   # 94 = 12 + 6 x 12 + 10
    ("qwen3-235b-a22b", 256, "p5.48xlarge", "tp=2,pp=8,ep=32", (11, 11)),          # 94 = 11 + 6 x 12 + 11
    ("deepseek-v3", 256, "p6-b200.48xlarge", "tp=1,pp=16,ep=8", (3, 2)),           # 61 = 3 + 14 x 4 + 2
]


@pytest.mark.parametrize("model,n,profile,layout,split", CASES)
def test_estimates_with_the_stated_split(recorded_db, run_json, model, n, profile, layout, split):
    r = run_json("estimate", model, "--devices", n, "--profile", profile, "--layout", layout, "--db", recorded_db)[0]
    lay = r["layout"]
    assert (lay["decoder_first_pipeline_num_layers"], lay["decoder_last_pipeline_num_layers"]) == split
    assert lay["tp"] * lay["cp"] * lay["pp"] * lay["dp"] == n and r["t_iter_s"] > 0
    assert r["breakdown_s"]["experts"] > 0 and sum(r["breakdown_s"].values()) == pytest.approx(r["t_analytic_s"])


def test_an_expert_mesh_over_four_nodes(recorded_db, run_json):
    """TP 2 x DP 16 = 32 ranks per stage carry EP 32 x ETP 1 x EDP 1; EP ranks are neighbours (ETP 1), so the
    group fills four 8-GPU nodes; each rank holds 128 / 32 = 4 experts."""
    from scaleplan import catalogue
    from scaleplan.estimator.shapes import layout_shapes
    from scaleplan.specs import Layout, parse_spec

    r = run_json("estimate", "qwen3-235b-a22b", "--devices", 256, "--profile", "p5.48xlarge", "--layout",
                 "tp=2,pp=8,ep=32", "--db", recorded_db)[0]
    assert r["chi_inputs"]["ep_nodes"] == 4 and r["layout"]["dp"] == 16
    spec = parse_spec(catalogue.spec_data("qwen3-235b-a22b"))
    assert layout_shapes(spec.model, Layout(tp=2, pp=8, dp=16, ep=32), 4096).E_loc == 4


@pytest.mark.parametrize("model,n,profile,layout,split", CASES)
def test_megatron_accepts_the_emitted_split(recorded_db, run, monkeypatch, model, n, profile, layout, split):
    """Stubbed as tests/cli/test_megatron_accepts.py stubs it (no Transformer Engine on a CPU machine)."""
    pytest.importorskip("megatron.core.transformer.transformer_config")
    import megatron.core.models.common.embeddings.rope_utils as rope
    import megatron.core.transformer.transformer_config as tc

    monkeypatch.setattr(tc, "is_te_min_version", lambda *a, **k: True)
    monkeypatch.setattr(rope, "fused_apply_rotary_pos_emb", lambda *a, **k: None)
    code, out, err = run("estimate", model, "--devices", n, "--profile", profile, "--layout", layout, "--db",
                         recorded_db, "--emit", "megatron")
    assert code == 0, err
    ns, _ = mlm.parse(mlm.argv(out))
    mlm.validate(ns, n)
    cfg = mlm.transformer_config(ns)
    assert (cfg.num_layers_in_first_pipeline_stage, cfg.num_layers_in_last_pipeline_stage) == split
    assert cfg.expert_model_parallel_size == int(layout.split("ep=")[1].split(",")[0])


def test_layouts_rank_folded_expert_meshes(recorded_db, run_json):
    """`layouts --fold-experts` enumerates the expert meshes folded over TP (the paper's P_disc keeps EP within
    DP): on 256 H100 the TP 2 plans with EP 32 over DP 16 are among the ranked ones."""
    args = ("layouts", "qwen3-235b-a22b", "--devices", 256, "--profile", "p5.48xlarge", "--max-tp", 2, "--mbs", 1,
            "--ckpt", "full", "--top", 2000, "--db", recorded_db)
    folded = run_json(*args, "--fold-experts")
    plain = run_json(*args)
    ep_over_dp = [r["layout"] for r in folded["ranked"] if r["layout"]["dp"] % r["layout"]["ep"]]
    assert any(lo["tp"] == 2 and lo["dp"] == 16 and lo["ep"] == 32 for lo in ep_over_dp)
    assert not [r for r in plain["ranked"] if r["layout"]["dp"] % r["layout"]["ep"]]
    assert plain["infeasible_counts"]["ep_not_dividing_dp"] > 0


def test_layouts_rank_uneven_splits(recorded_db, run_json):
    args = ("layouts", "qwen3-235b-a22b", "--devices", 64, "--profile", "p6-b200.48xlarge", "--vpp", "1,2",
            "--max-tp", 1, "--top", 200, "--db", recorded_db)
    doc = run_json(*args, "--uneven-stages")
    uneven = [r for r in doc["ranked"] if "decoder_first_pipeline_num_layers" in r["layout"]]
    assert uneven and all(r["layout"]["pp"] * r["layout"]["vpp"] > 1 for r in uneven)
    assert any(r["layout"]["pp"] == 8 and r["layout"]["vpp"] == 2 for r in uneven)  # the published recipe's
    plain = run_json(*args)  # the even splits alone unless asked: 94 = 2 x 47
    assert all("decoder_first_pipeline_num_layers" not in r["layout"] for r in plain["ranked"])
    assert plain["infeasible_counts"]["layers_not_divisible_by_pp_vpp"] > 0


@pytest.mark.parametrize("layout,field", [
    ("pp=8,decoder_first_pipeline_num_layers=13", "decoder_first_pipeline_num_layers"),  # 81 over 7 stages
    ("pp=1,decoder_first_pipeline_num_layers=4", "pp"),
    # 94 - 13 - 10 = 71 over 6 middle stages at VP 2 (13 + 6 x 12 + 9 adds up and runs from a layout string:
    # tests/cli/test_pipeline_split.py)
    ("pp=8,vpp=2,decoder_first_pipeline_num_layers=13,decoder_last_pipeline_num_layers=10",
     "decoder_first_pipeline_num_layers"),
])
def test_a_split_that_does_not_add_up_is_one_line(recorded_db, run, layout, field):
    code, _, err = run("estimate", "qwen3-235b-a22b", "--devices", 64, "--profile", "p6-b200.48xlarge", "--layout",
                       f"tp=1,ep=8,{layout}", "--db", recorded_db)
    assert code == 2 and len(err.strip().splitlines()) == 1 and f"--layout {field}" in err, err


SEARCHES = [  # the layout search of each case: (model, devices, profile, the options that reach its layout, the case)
    ("deepseek-v3", 256, "p6-b200.48xlarge", ("--uneven-stages", "--vpp", "1", "--max-tp", 1), CASES[2]),
    ("qwen3-235b-a22b", 64, "p6-b200.48xlarge", ("--uneven-stages", "--vpp", "1,2", "--max-tp", 1), CASES[0]),
    ("qwen3-235b-a22b", 256, "p5.48xlarge", ("--fold-experts", "--uneven-stages", "--vpp", "1", "--max-tp", 2),
     CASES[1]),
]


def _degrees(layout: str) -> dict[str, int]:
    return {k: int(v) for k, v in (kv.split("=") for kv in layout.split(","))}


@pytest.mark.parametrize("model,n,profile,opts,case", SEARCHES, ids=[f"{s[0]} on {s[1]}" for s in SEARCHES])
def test_the_layout_search_ranks_each_case_and_megatron_accepts_its_pick(recorded_db, run_json, monkeypatch, model,
                                                                        n, profile, opts, case):
    """`layouts` ranks the issue's layout of each case (with the split counted by hand in CASES) among the feasible
    plans, and the Megatron-LM arguments of its plan #1 (--emit megatron) pass megatron-core's own checks with the
    plan's degrees and stage split."""
    doc = run_json("layouts", model, "--devices", n, "--profile", profile, *opts, "--mbs", 1, "--ckpt", "full",
                   "--top", 1000, "--db", recorded_db, "--emit", "megatron")
    want, split = _degrees(case[3]), case[4]
    hits = [r["layout"] for r in doc["ranked"] if all(r["layout"][k] == v for k, v in want.items())]
    assert [(lo["decoder_first_pipeline_num_layers"], lo["decoder_last_pipeline_num_layers"]) for lo in hits] == \
        [split] * len(hits) and hits
    pytest.importorskip("megatron.core.transformer.transformer_config")
    import megatron.core.models.common.embeddings.rope_utils as rope
    import megatron.core.transformer.transformer_config as tc

    monkeypatch.setattr(tc, "is_te_min_version", lambda *a, **k: True)
    monkeypatch.setattr(rope, "fused_apply_rotary_pos_emb", lambda *a, **k: None)
    ns, _ = mlm.parse(mlm.argv(doc["megatron_args"]))
    mlm.validate(ns, n)
    cfg, best = mlm.transformer_config(ns), doc["best"]["layout"]
    assert (cfg.pipeline_model_parallel_size, cfg.expert_model_parallel_size, cfg.tensor_model_parallel_size) == \
        (best["pp"], best["ep"], best["tp"])
    assert (cfg.num_layers_in_first_pipeline_stage, cfg.num_layers_in_last_pipeline_stage) == \
        (best.get("decoder_first_pipeline_num_layers"), best.get("decoder_last_pipeline_num_layers"))
