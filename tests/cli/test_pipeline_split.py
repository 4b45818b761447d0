"""The first and last stage layers of a Megatron-LM run stated in each of Megatron-LM's forms: the accounting flags
(--account-for-embedding/loss-in-pipeline-split) and the pipeline layout string (--pipeline-model-parallel-layout),
read back from a run's log into the split scaleplan costs; the layout string checked by megatron-core's own
PipelineParallelLayerLayout and its per-rank layer counts; what the stage model cannot state refused in one line."""
from __future__ import annotations

import json

import pytest

from scaleplan import catalogue
from scaleplan.errors import SpecError
from scaleplan.estimator.shapes import accounted_ends
from scaleplan.megatron.pipeline_split import layout_chunks, split_of_accounting, split_of_layout
from scaleplan.specs import parse_layout, parse_spec

from . import mlm
from .test_megatron_log import _log_of

# Megatron-Bridge's B200 configuration of Qwen3-235B-A22B: PP 8 x VP 4 over 94 layers with the embedding and the
# loss counted, so every rank holds 96 / 8 = 12 "layers", 3 per chunk: 2 decoder layers in the first chunk (the
# embedding is the third), 2 in the last (the loss), 3 in the 30 others = 2 + 30 x 3 + 2 = 94; ends 11, middle 12
QWEN_LAYOUT = "Et*2|(t*3|)*30,t*2L"


def test_accounting_flags_give_megatron_cores_stage_layers():
    # counted by hand from the rule: M = (L + e + l) / PP, first M - e, last M - l
    assert split_of_accounting(94, 8, True, True, "x") == (11, 11)
    assert split_of_accounting(95, 8, True, False, "x") == (11, 12)
    assert split_of_accounting(94, 8, False, False, "x") == (0, 0)
    assert split_of_accounting(94, 1, True, True, "x") == (0, 0)
    with pytest.raises(SpecError, match="multiple of PP 16"):
        split_of_accounting(61, 16, True, True, "x")  # 63 layers over 16 stages
    # the stated split that only these flags can emit (the end stages no multiple of VPP)
    assert tuple(map(bool, accounted_ends(94, 8, 4, 11, 11))) == (True, True)
    assert tuple(map(bool, accounted_ends(95, 8, 4, 11, 12))) == (True, False)
    assert tuple(map(bool, accounted_ends(94, 8, 2, 12, 10))) == (False, False)  # decoder-first/last state it
    assert tuple(map(bool, accounted_ends(94, 8, 1, 11, 11))) == (False, False)  # and without interleaving


def test_layout_string_expands_as_megatron_core_parses_it():
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    for text in (QWEN_LAYOUT, "Et*3|(tt|)*29,m|L", "E|(t|)*3,m|m||L", "Ettt|(tttt|)*14,ttmL"):
        ours = layout_chunks(text, "x")
        theirs = PipelineParallelLayerLayout.parse_str_to_list(text)
        assert [len(c) for c in ours] == [len(c) for c in theirs], text
        assert [c.count("t") for c in ours] == [[x.name for x in c].count("decoder") for c in theirs], text


@pytest.mark.parametrize("text,pp,L,mtp,split", [
    (QWEN_LAYOUT, 8, 94, 0, (11, 11)),
    ("Ettt|(tttt|)*14,ttmL", 16, 61, 1, (3, 2)),    # DeepSeek-V3 on PP 16 as scaleplan splits it: 3 + 14 x 4 + 2
    ("E(t*12|)*7,t*12L", 8, 96, 0, (0, 0)),          # even
])
def test_layout_string_split(text, pp, L, mtp, split):
    assert split_of_layout(text, pp, L, mtp, "x") == split


@pytest.mark.parametrize("text,pp,L,mtp,says", [
    ("Et*3|(tt|)*29,m|L", 16, 61, 1, "MTP layers in the last chunk"),  # MTP on a stage of its own
    ("Et*3|t*5|t*4|t*2L", 4, 14, 0, "equal middle stages"),
    ("tE|t|t|tL", 4, 4, 0, "one E opening the first chunk"),
    ("Et|t|tL", 3, 4, 0, "4 decoder layers"),
    ("Et|t|tL", 2, 3, 0, "multiple of PP 2"),
    ("Ex|tL", 2, 2, 0, "not x"),
])
def test_layout_strings_the_stage_model_cannot_state_are_one_line(text, pp, L, mtp, says):
    with pytest.raises(SpecError) as e:
        split_of_layout(text, pp, L, mtp, "run.log")
    msg = str(e.value)
    assert msg.startswith("run.log: pipeline_model_parallel_layout: got ") and says in msg and "\n" not in msg, msg


@pytest.fixture()
def _no_transformer_engine(monkeypatch):
    pytest.importorskip("megatron.core.transformer.transformer_config")
    import megatron.core.models.common.embeddings.rope_utils as rope
    import megatron.core.transformer.transformer_config as tc

    monkeypatch.setattr(tc, "is_te_min_version", lambda *a, **k: True)
    monkeypatch.setattr(rope, "fused_apply_rotary_pos_emb", lambda *a, **k: None)


def test_a_run_stated_by_a_layout_string_reads_back(_no_transformer_engine, tmp_path):
    """Qwen3-235B-A22B's arguments with the split stated as a layout string instead of the accounting flags:
    Megatron-LM's checks accept them (megatron-core's TransformerConfig parses and validates the layout, and its
    layout gives the ranks 11, 12 x 6, 11), and the run's log reads back into the layout scaleplan
    emits the flags for (11 and 11 decoder layers on the end stages)."""
    from scaleplan.megatron.args import megatron_text
    from scaleplan.megatron.log import read_plan

    spec = parse_spec(catalogue.spec_data("qwen3-235b-a22b"))
    lo = parse_layout("tp=1,pp=8,vpp=4,ep=8,decoder_first_pipeline_num_layers=11,decoder_last_pipeline_num_layers=11,"
                      "ckpt=full", spec.default_layout()).model_dump()
    lo["dp"] = 8
    text = megatron_text(spec, lo, 64, 8, "qwen3-235b-a22b")
    assert "--account-for-embedding-in-pipeline-split" in text and "--account-for-loss-in-pipeline-split" in text
    drop = ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
            "--num-virtual-stages-per-pipeline-rank")
    words = mlm.argv(text)
    kept = [w for i, w in enumerate(words) if w not in drop and not (i and words[i - 1] in drop and w.isdigit())]
    layout_text = " ".join(kept + ["--pipeline-model-parallel-layout", f"'{QWEN_LAYOUT}'"])
    ns, _ = mlm.parse(mlm.argv(layout_text))
    mlm.validate(ns, 64)
    cfg = mlm.transformer_config(ns)
    # megatron-core's parsed layout: [pipeline rank][virtual stage] -> layer types
    per_rank = [[[t.name for t in chunk].count("decoder") for chunk in row]
                for row in cfg.pipeline_model_parallel_layout.layout]
    assert per_rank[0] == [2, 3, 3, 3] and per_rank[-1] == [3, 3, 3, 2] and per_rank[1:-1] == [[3] * 4] * 6
    log = tmp_path / "train.log"
    log.write_text(_log_of(layout_text, 64, [1.0] * 12))
    back, lay, world = read_plan(log, spec.hardware.node_type)
    assert (lay["decoder_first_pipeline_num_layers"], lay["decoder_last_pipeline_num_layers"], lay["vpp"]) == \
        (11, 11, 4) and world == 64 and back.model.n_layers == 94


BRIDGE = "tp=1,pp=8,vpp=4,ep=8"


@pytest.mark.parametrize("split", [",decoder_first_pipeline_num_layers=11,decoder_last_pipeline_num_layers=11", ""],
                         ids=["stated", "chosen by scaleplan"])
def test_the_bridge_configuration_estimates_and_emits_the_accounting_flags(recorded_db, run_json, run, split,
                                                                          _no_transformer_engine):
    """`estimate` costs the B200 configuration's split with a breakdown and emits it as the accounting flags,
    which megatron-core's TransformerConfig accepts (its decoder-first/last fields unset). Unstated, it is the
    split scaleplan picks: no first / last multiple of VPP 4 leaves 12 on each middle stage (94 - 72 = 22 = 14 + 8,
    14 no multiple of 4), so the accounting flags' 11 + 6 x 12 + 11."""
    args = ("estimate", "qwen3-235b-a22b", "--devices", 64, "--profile", "p6-b200.48xlarge", "--layout",
            BRIDGE + split, "--db", recorded_db)
    r = run_json(*args)[0]
    lay = r["layout"]
    assert (lay["decoder_first_pipeline_num_layers"], lay["decoder_last_pipeline_num_layers"], lay["vpp"]) == \
        (11, 11, 4)
    assert r["breakdown_s"]["experts"] > 0 and sum(r["breakdown_s"].values()) == pytest.approx(r["t_analytic_s"])
    code, out, err = run(*args, "--emit", "megatron")
    assert code == 0, err
    ns, _ = mlm.parse(mlm.argv(out))
    mlm.validate(ns, 64)
    cfg = mlm.transformer_config(ns)
    assert cfg.account_for_embedding_in_pipeline_split and cfg.account_for_loss_in_pipeline_split
    assert cfg.num_layers_in_first_pipeline_stage is None and cfg.virtual_pipeline_model_parallel_size == 4


def test_layouts_rank_the_bridge_configuration(recorded_db, run_json):
    """`layouts --uneven-stages` enumerates PP 8 x VPP 4 for Qwen3-235B-A22B on 64 B200 (no split of stated
    counts exists; the accounting flags' does) and ranks it with 11 layers on each end stage."""
    doc = run_json("layouts", "qwen3-235b-a22b", "--devices", 64, "--profile", "p6-b200.48xlarge", "--uneven-stages",
                   "--vpp", "4", "--max-tp", 1, "--mbs", 1, "--ckpt", "full", "--top", 500, "--db", recorded_db)
    hits = [r["layout"] for r in doc["ranked"]
            if (r["layout"]["pp"], r["layout"]["vpp"], r["layout"]["ep"]) == (8, 4, 8)]
    assert hits and all((lo["decoder_first_pipeline_num_layers"], lo["decoder_last_pipeline_num_layers"]) == (11, 11)
                        for lo in hits)


def test_a_stored_run_keeps_the_split_its_log_states(_no_transformer_engine, run, tmp_path, sqlite_url):
    """A run of Qwen3-235B-A22B at PP 8 x VPP 2 with the embedding and loss counted (11 + 6 x 12 + 11, where
    scaleplan's own pick would be 12 + 6 x 12 + 10) stored by `calibrate add --megatron-log` is read back by the
    calibration with its own split, not the one scaleplan would pick."""
    from scaleplan.calibrate.evaluate import observed_from_db
    from scaleplan.db import session as dbs
    from scaleplan.megatron.args import megatron_text

    spec = parse_spec(catalogue.spec_data("qwen3-235b-a22b"))
    lo = parse_layout("tp=1,pp=8,vpp=2,ep=8,decoder_first_pipeline_num_layers=11,decoder_last_pipeline_num_layers=11,"
                      "ckpt=full", spec.default_layout()).model_dump()
    lo["dp"] = 8
    text = megatron_text(spec, lo, 64, 8, "qwen3-235b-a22b")
    assert "--account-for-embedding-in-pipeline-split" in text
    log = tmp_path / "qwen.log"
    log.write_text(_log_of(text, 64, [40.0] * 12))
    code, _, err = run("calibrate", "add", "--megatron-log", log, "--db", sqlite_url, "--profile", "p6-b200.48xlarge")
    assert code == 0, err
    with dbs.session_scope(sqlite_url) as s:
        (o,) = observed_from_db(s, "p6-b200.48xlarge")
    assert (o.layout["decoder_first_pipeline_num_layers"], o.layout["decoder_last_pipeline_num_layers"]) == (11, 11)


def test_a_stated_split_reads_whole_in_a_narrow_table(recorded_db, run, monkeypatch):
    """On an 80-column terminal the layouts table folds a stated split over lines instead of cutting it: the layout
    cells of the top plan, joined, hold both stage counts the JSON gives."""
    monkeypatch.setenv("COLUMNS", "80")
    args = ("layouts", "qwen3-235b-a22b", "--devices", 64, "--profile", "p6-b200.48xlarge", "--uneven-stages",
            "--vpp", "4", "--max-tp", 1, "--mbs", 1, "--ckpt", "full", "--top", 1, "--db", recorded_db)
    code, out, err = run(*args)
    assert code == 0, err
    rows = [ln.split("│") for ln in out.splitlines() if ln.startswith("│")]
    first = rows[0][1].strip()
    assert first == "1"
    cell = ""
    for r in rows:
        if r[1].strip() not in ("", "1"):
            break
        cell += r[2].strip()
    _, doc, _ = run(*args, "--json")
    lay = json.loads(doc)["ranked"][0]["layout"]
    for k in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"):
        assert f"{k}={lay[k]}" in cell


# Megatron-Bridge's DeepSeek-V3 B200 MXFP8 V2 layout (deepseek_workload_base_configs.py): PP 8 x VP 2, 8 decoder
# layers on the first stage, 8 on each middle one, 4 + 1 and the MTP layer on the last
DSV3_LAYOUT = "Et*4|(t*4|)*14tmL"


def test_a_split_no_stage_counts_state_is_emitted_as_a_layout_string(_no_transformer_engine, tmp_path):
    """DeepSeek-V3 at PP 8 x VP 2 with 8 and 5 layers on the end stages (5 no multiple of VP 2, nor one fewer than
    the middle stages' 8): `estimate` costs it and `--emit megatron` states it as a --pipeline-model-parallel-layout
    string, which Megatron-LM's checks accept and megatron-core splits 8 / 8 x 6 / 5 with the MTP layer last; a run
    with Megatron-Bridge's own string for it reads back into the same layout."""
    from scaleplan.megatron.args import megatron_text
    from scaleplan.megatron.log import read_plan

    spec = parse_spec(catalogue.spec_data("deepseek-v3"))
    lo = parse_layout("tp=1,pp=8,vpp=2,ep=32,decoder_first_pipeline_num_layers=8,decoder_last_pipeline_num_layers=5,"
                      "ckpt=selective", spec.default_layout()).model_dump()
    lo["dp"] = 32
    text = megatron_text(spec, lo, 256, 8, "deepseek-v3")
    assert "--pipeline-model-parallel-layout" in text and "--decoder-first-pipeline-num-layers" not in text
    ns, _ = mlm.parse(mlm.argv(text))
    mlm.validate(ns, 256)
    cfg = mlm.transformer_config(ns)
    per_rank = [[[t.name for t in chunk].count("decoder") for chunk in row]
                for row in cfg.pipeline_model_parallel_layout.layout]
    assert [sum(r) for r in per_rank] == [8] + [8] * 6 + [5]
    assert [t.name for t in cfg.pipeline_model_parallel_layout.layout[-1][-1]].count("mtp") == 1
    words = mlm.argv(text)
    at = words.index("--pipeline-model-parallel-layout")
    bridge = " ".join(words[:at + 1] + [f"'{DSV3_LAYOUT}'"] + words[at + 2:])
    log = tmp_path / "train.log"
    log.write_text(_log_of(bridge, 256, [1.0] * 12))
    back, lay, world = read_plan(log, spec.hardware.node_type)
    assert (lay["decoder_first_pipeline_num_layers"], lay["decoder_last_pipeline_num_layers"], lay["vpp"]) == (8, 5, 2)


def test_an_unstated_split_no_counts_state_is_halved_and_emitted_as_a_layout_string(_no_transformer_engine, run_json,
                                                                                  recorded_db, run):
    """DeepSeek-V3 at PP 8 x VP 4 given without a split: 61 layers leave 13 for the end stages after 6 middle stages
    of 8, no multiples of VP 4 and no accounting split, so scaleplan halves them, 7 + 6 x 8 + 6 (Megatron-Bridge's
    H100 layout "Et|(tt|)*30mL" splits them so), and `--emit megatron` states it as a layout string megatron-core
    accepts."""
    args = ("estimate", "deepseek-v3", "--devices", 512, "--profile", "p6-b200.48xlarge", "--layout",
            "tp=1,pp=8,vpp=4,ep=64,ckpt=selective", "--db", recorded_db)
    lay = run_json(*args)[0]["layout"]
    assert (lay["decoder_first_pipeline_num_layers"], lay["decoder_last_pipeline_num_layers"]) == (7, 6)
    code, text, err = run(*args, "--emit", "megatron")
    assert code == 0, err
    ns, _ = mlm.parse(mlm.argv(text))
    mlm.validate(ns, 512)
    cfg = mlm.transformer_config(ns)
    per_rank = [sum([t.name for t in chunk].count("decoder") for chunk in row)
                for row in cfg.pipeline_model_parallel_layout.layout]
    assert per_rank == [7] + [8] * 6 + [6]
