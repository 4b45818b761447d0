"""The Megatron-LM arguments of today's models in both forms, GPTModel's (`--emit megatron`) and the newest
HybridModel's `--hybrid-layer-pattern` (`--emit megatron-hybrid`), each accepted by Megatron-LM's own checks (the flag
table, validate_args' derivations in tests/cli/mlm.py, megatron-core's TransformerConfig / MLATransformerConfig) and
read back by `calibrate add --megatron-log` into the spec and layout they came from.

The hybrid grammar is Megatron-LM main's hybrid_layer_allocation.py (read with the fetch tool; the installed
megatron-core wheel predates it): checked here by its own rules (segment k on pipeline rank k mod PP as virtual
stage k div PP) against the GPT form's interleaved layer assignment.
"""
from __future__ import annotations

import pytest

from scaleplan import catalogue
from scaleplan.megatron.hybrid import even_segments, hybrid_pattern, read_pattern
from scaleplan.estimator.shapes import split_of, stage_split
from scaleplan.specs import Layout, parse_layout, parse_spec

from . import mlm
from .test_megatron_log import _log_of

pytest.importorskip("megatron.core.transformer.transformer_config")


@pytest.fixture(autouse=True)
def _no_transformer_engine(monkeypatch):
    import megatron.core.models.common.embeddings.rope_utils as rope
    import megatron.core.transformer.transformer_config as tc

    monkeypatch.setattr(tc, "is_te_min_version", lambda *a, **k: True)
    monkeypatch.setattr(rope, "fused_apply_rotary_pos_emb", lambda *a, **k: None)


GRID = [  # (catalogue model, devices, layout)
    ("deepseek-v3", 64, "tp=1,pp=1,ep=64,ckpt=full"),
    ("kimi-k2", 128, "tp=2,pp=1,ep=64,ckpt=selective"),
    ("qwen3-235b-a22b", 64, "tp=2,pp=2,ep=16,ckpt=full"),
    ("qwen3-30b-a3b", 32, "tp=2,pp=2,ep=8,vpp=3,ckpt=none"),
    ("gpt-oss-120b", 64, "tp=1,pp=4,vpp=3,ep=8,ckpt=full"),
    ("gpt-oss-20b", 16, "tp=2,pp=2,ep=4,ckpt=selective"),
    ("mixtral-8x22b", 64, "tp=4,pp=4,vpp=2,ep=4,ckpt=full"),
    ("mixtral-8x7b", 16, "tp=2,pp=2,ep=4,ckpt=full"),
    ("olmoe-1b-7b", 8, "tp=1,pp=2,ep=4,ckpt=none"),
    ("moe-18b", 256, "tp=1,pp=4,vpp=3,ep=16,ckpt=full"),
    # uneven stages (the split scaleplan costs them with) and an expert mesh folded over TP x DP
    ("deepseek-v3", 256, "tp=1,pp=16,ep=8,ckpt=full"),
    ("qwen3-235b-a22b", 64, "tp=1,pp=8,vpp=2,ep=8,ckpt=full"),
    ("qwen3-235b-a22b", 256, "tp=2,pp=8,ep=32,ckpt=full"),
    # Megatron-Bridge's B200 configuration of Qwen3-235B-A22B (PP 8 x VP 4, 94 layers): the embedding and the loss
    # counted as layers (--account-for-embedding/loss-in-pipeline-split), 11 decoder layers on each end stage
    ("qwen3-235b-a22b", 64, "tp=1,pp=8,vpp=4,ep=8,decoder_first_pipeline_num_layers=11,"
                            "decoder_last_pipeline_num_layers=11,ckpt=full"),
]


def _case(name: str, n: int, layout: str):
    spec = parse_spec(catalogue.spec_data(name))
    lo = parse_layout(layout, spec.default_layout()).model_dump()
    lo["dp"] = n // (lo["tp"] * lo["cp"] * lo["pp"])
    return spec, lo


def _megatron_stage_layers(cfg, pp: int) -> list[int]:
    """Decoder layers megatron-core's own get_num_layers_to_build gives each pipeline rank (over its virtual
    stages) under ``cfg``."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    vp = cfg.virtual_pipeline_model_parallel_size
    return [sum(get_num_layers_to_build(cfg, vp_stage=v if vp else None, pp_rank=r) for v in range(vp or 1))
            for r in range(pp)]


def _stages(n_layers: int, pp: int, first: int, last: int) -> list[int]:
    """Decoder layers per pipeline rank of scaleplan's stage split (estimator/shapes.stage_split)."""
    F, M, Ls = (int(x) for x in stage_split(n_layers, pp, first, last))
    return [F] + [M] * (pp - 2) + [Ls] if pp > 1 else [n_layers]


@pytest.mark.parametrize("hybrid", [False, True], ids=["GPTModel", "HybridModel"])
@pytest.mark.parametrize("name,n,layout", GRID, ids=[g[0] for g in GRID])
def test_megatron_accepts_todays_models(name, n, layout, hybrid):
    from scaleplan.megatron.args import megatron_text

    spec, lo = _case(name, n, layout)
    text = megatron_text(spec, lo, n, 8, name, tokens=1e12, hybrid=hybrid)
    ns, _ = mlm.parse(mlm.argv(text))
    mlm.validate(ns, n)
    cfg = mlm.transformer_config(ns)
    m = spec.model
    assert ("pretrain_hybrid.py" in text) is hybrid
    assert cfg.num_layers == (2 * m.n_layers if hybrid else m.n_layers)
    assert (cfg.virtual_pipeline_model_parallel_size or 1) == lo["vpp"]
    assert (cfg.mtp_num_layers or 0) == m.mtp_layers
    first, last = split_of(m, Layout(**lo))
    if not hybrid:  # the hybrid form states the split in its segments (test_uneven_stages_read_back)
        assert _megatron_stage_layers(cfg, lo["pp"]) == _stages(m.n_layers, lo["pp"], first, last)
    assert cfg.multi_latent_attention is (m.mla is not None)
    if m.mla is not None:
        assert type(cfg).__name__ == "MLATransformerConfig"
        assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_head_dim + cfg.qk_pos_emb_head_dim, cfg.v_head_dim) == \
            (m.mla.q_lora_rank, m.mla.kv_lora_rank, m.head_dim, m.mla.v_head_dim)
    assert cfg.qk_layernorm is bool(m.qk_norm) and (cfg.softmax_type == "learnable") is m.attention_sinks
    assert cfg.add_bias_linear is (m.linear_bias == "all")
    assert cfg.moe_router_score_function == m.moe.router_score
    assert cfg.moe_router_enable_expert_bias is m.moe.expert_bias
    if m.sliding_window is not None:
        assert cfg.window_size == (m.sliding_window.size, 0)


@pytest.mark.parametrize("hybrid", [False, True], ids=["GPTModel", "HybridModel"])
@pytest.mark.parametrize("name,n,layout", GRID, ids=[g[0] for g in GRID])
def test_a_log_of_the_run_reads_back_the_spec_and_layout(tmp_path, name, n, layout, hybrid):
    from scaleplan.megatron.args import megatron_text
    from scaleplan.megatron.log import read_plan

    spec, lo = _case(name, n, layout)
    log = tmp_path / "train.log"
    log.write_text(_log_of(megatron_text(spec, lo, n, 8, name, hybrid=hybrid), n, [1.0] * 12))
    back, lay, world = read_plan(log, spec.hardware.node_type)
    want = spec.model.model_copy(update={"moe": spec.model.moe.model_copy(update={"expert_tp_degree": lo["etp"]})})
    # what a log cannot say: the paper's head-wise gate (not emitted), OLMoE's norm over the projection (emitted as
    # Megatron-LM's per-head one)
    if want.attn_gate is True:
        want = want.model_copy(update={"attn_gate": False})
    if want.qk_norm == "projection":
        want = want.model_copy(update={"qk_norm": True})
    assert back.model == want and world == n
    assert {k: lay[k] for k in ("tp", "pp", "vpp", "ep", "etp", "ckpt")} == \
        {k: lo[k] for k in ("tp", "pp", "vpp", "ep", "etp", "ckpt")}
    # the stage split the arguments (or the hybrid pattern's segments) state: the one it was costed with
    split = split_of(spec.model, Layout(**lo))
    assert (lay.get("decoder_first_pipeline_num_layers", 0), lay.get("decoder_last_pipeline_num_layers", 0)) == split


def test_hybrid_segments_are_the_interleaved_chunks():
    """Segment k of the pattern runs on pipeline rank k mod PP as virtual stage k div PP (hybrid_layer_allocation.py
    select_pipeline_segment); GPTModel's interleaved schedule gives virtual stage v of rank r the blocks of chunk
    v PP + r. So the pattern's segments, in order, hold the same blocks as the GPT form's chunks."""
    m = parse_spec(catalogue.spec_data("qwen3-235b-a22b")).model.model_copy(update={"n_layers": 24})
    pp, vpp = 2, 3
    text = hybrid_pattern(m, even_segments(24, pp, vpp))
    segs = text.split("|")
    assert len(segs) == pp * vpp and all(s == "*E" * 4 for s in segs)
    chunk = 24 // (pp * vpp)
    for r in range(pp):
        for v in range(vpp):
            k = v * pp + r
            first_block = sum(len(s) // 2 for s in segs[:k])
            assert first_block == (v * pp + r) * chunk


def test_deepseek_pattern_and_its_reading():
    m = parse_spec(catalogue.spec_data("deepseek-v3")).model
    text = hybrid_pattern(m, [m.n_layers])
    assert text == "+-" * 3 + "+E" * 58 + "/+E"
    back = read_pattern(text, "log")
    assert back == {"blocks": [False] * 3 + [True] * 58, "mla": True, "mtp_layers": 1, "segments": [61]}


@pytest.mark.parametrize("text,says", [
    ("M*-M*-", "Mamba"), ("*E*EE", "pairs of an attention"), ("*E+E", "one attention kind"),
    ("*E*E/*E/*-", "identical MTP patterns"), ("*E*x", "one of"),
])
def test_a_pattern_a_spec_cannot_describe_is_refused(text, says):
    from scaleplan.errors import SpecError

    with pytest.raises(SpecError, match=says):
        read_pattern(text, "log")


def test_mlm_refuses_a_hybrid_run_that_megatron_refuses():
    """The checker is not a rubber stamp: segments that PP does not divide, a VPP flag beside the pattern."""
    base = "--hybrid-layer-pattern *E*E|*E*E|*E*E --micro-batch-size 1 --global-batch-size 8"
    for extra, why in (("--pipeline-model-parallel-size 2", "not divisible by pipeline size"),
                       ("--num-layers-per-virtual-pipeline-stage 1", "should not be used")):
        ns, _ = mlm.parse((base + " " + extra).split())
        with pytest.raises(mlm.Rejected, match=why):
            mlm.validate(ns, 8)


@pytest.mark.parametrize("hybrid", [False, True], ids=["GPTModel", "HybridModel"])
def test_every_flag_of_todays_models_is_documented(hybrid):
    from pathlib import Path

    from scaleplan.megatron.args import megatron_args

    doc = (Path(__file__).resolve().parents[2] / "docs" / "megatron.md").read_text()
    for name, n, layout in GRID:
        spec, lo = _case(name, n, layout)
        for flag in megatron_args(spec, lo, hybrid=hybrid):
            assert f"`{flag[0]}" in doc or f" {flag[0]}" in doc, (name, flag[0])


def test_uneven_stages_segment_as_megatron_core_builds_them():
    """Qwen3-235B-A22B's 94 blocks over PP 8 x VP 2 with 10 on the first stage and 12 on the last (Megatron-Core's
    get_num_layers_to_build: the 6 middle stages share 72, 12 each; each stage's blocks split over its 2 chunks)."""
    from scaleplan.megatron.hybrid import stage_segments

    seg = stage_segments(94, 8, 2, first=10, last=12)
    assert sum(seg) == 94 and len(seg) == 16
    assert seg[0] == seg[8] == 5 and seg[7] == seg[15] == 6 and set(seg[1:7] + seg[9:15]) == {6}
    assert stage_segments(61, 16, 1, first=1) == [1] + [4] * 15
    assert stage_segments(61, 16, 1, first=3, last=2) == [3] + [4] * 14 + [2]
    from scaleplan.errors import SpecError

    with pytest.raises(SpecError, match="equal counts"):
        stage_segments(61, 16, 1, first=3)  # 58 over 15 stages
    with pytest.raises(SpecError, match="virtual-stage count"):
        stage_segments(94, 8, 2, first=13, last=9)  # 72 over 6 middle stages, 12 each; 13 is odd over VP 2
    # 11 and 11: the embedding and the loss counted as layers (--account-for-embedding/loss-in-pipeline-split):
    # every chunk 12 / 2 = 6 layers, the first chunk of the first stage and the last of the last one fewer
    assert stage_segments(94, 8, 2, first=11, last=11) == [5] + [6] * 14 + [5]


def test_a_patterns_segments_give_the_stage_split():
    from scaleplan.errors import SpecError
    from scaleplan.megatron.hybrid import split_of_segments, stage_segments

    assert split_of_segments(stage_segments(94, 8, 2, first=12, last=10), 8, "log") == (12, 10)
    assert split_of_segments(stage_segments(61, 16, 1, first=3, last=2), 16, "log") == (3, 2)
    assert split_of_segments(stage_segments(96, 8, 2), 8, "log") == (0, 0)
    with pytest.raises(SpecError, match="equal middle stages"):
        split_of_segments([4, 5, 6, 4], 4, "log")
