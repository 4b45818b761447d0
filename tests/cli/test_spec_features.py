"""Every new model field refuses a bad value in one line naming the field, the value and what is allowed
(SpecError; exit 2 on the command line), and the parameter counts of MLA, MTP, biases, norms and sinks by hand."""
from __future__ import annotations

import copy

import pytest
import yaml

from scaleplan.errors import SpecError
from scaleplan.geometry import spec_attention_params, spec_param_counts, window_layer_count
from scaleplan.specs import parse_spec

BASE = {"model": {"n_layers": 4, "hidden_sz": 64, "inter_sz": 128, "n_q_heads": 4, "n_kv_heads": 4, "head_dim": 32,
                  "vocab_sz": 100, "attn_gate": False,
                  "moe": {"n_experts": 8, "experts_per_token": 2, "expert_inter_sz": 32}}}
MLA = {"q_lora_rank": 16, "kv_lora_rank": 8, "qk_rope_head_dim": 8, "v_head_dim": 16}


def _spec(**model):
    d = copy.deepcopy(BASE)
    moe = model.pop("moe", {})
    d["model"].update(model)
    d["model"]["moe"].update(moe)
    return d


@pytest.mark.parametrize("model,field,says", [
    ({"sliding_window": {"size": -128}}, "model.sliding_window.size", "greater than 0"),
    ({"sliding_window": {"size": 128, "pattern": "SX"}}, "model.sliding_window.pattern", "S (sliding) and F"),
    ({"sliding_window": {"size": 128, "pattern": "FF"}}, "model.sliding_window.pattern", "at least one S"),
    ({"sliding_window": {"size": 128, "pattern": "SFSFS"}}, "model.sliding_window.pattern", "at most n_layers=4"),
    ({"mla": {**MLA, "qk_rope_head_dim": 40}}, "model.mla.qk_rope_head_dim", "below head_dim=32"),
    ({"mla": {**MLA, "qk_rope_head_dim": 7}}, "model.mla.qk_rope_head_dim", "an even width"),
    ({"mla": {**MLA, "kv_lora_rank": 0}}, "model.mla.kv_lora_rank", "greater than 0"),
    ({"mla": MLA, "n_kv_heads": 2}, "model.n_kv_heads", "no GQA"),
    ({"mla": MLA, "linear_bias": "qkv"}, "model.linear_bias", "none with MLA"),
    ({"mla": MLA, "attn_gate": True}, "model.attn_gate", "false with MLA"),
    ({"mla": MLA, "rotary_embeds": False}, "model.rotary_embeds", "MLA's rotary part needs RoPE"),
    ({"mtp_layers": -1}, "model.mtp_layers", "greater than or equal to 0"),
    ({"mtp_layers": 1, "rotary_embeds": False}, "model.mtp_layers", "needs RoPE"),
    ({"linear_bias": "some"}, "model.linear_bias", "'none', 'qkv' or 'all'"),
    ({"qk_norm": "head"}, "model.qk_norm", "projection"),
    ({"swiglu_limit": 7.0, "glu": False}, "model.swiglu_limit", "unless glu is true"),
    ({"swiglu_limit": 0}, "model.swiglu_limit", "greater than 0"),
    ({"moe": {"router_score": "sqrtsoftplus"}}, "model.moe.router_score", "'softmax' or 'sigmoid'"),
    ({"moe": {"expert_bias": True}}, "model.moe.expert_bias", "router_score: sigmoid"),
])
def test_bad_feature_values_are_one_line_errors(model, field, says):
    with pytest.raises(SpecError) as e:
        parse_spec(_spec(**model))
    msg = str(e.value)
    assert msg.startswith(f"{field}: got ") and says in msg and "\n" not in msg, msg


def test_the_command_line_exits_2_on_a_negative_window(run, tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(_spec(sliding_window={"size": -1})))
    code, out, err = run("estimate", f, "--devices", "8")
    assert code == 2 and err.count("\n") == 1 and "model.sliding_window.size" in err


def test_mla_attention_by_hand():
    """DeepSeek-V3's attention block (its config's widths): W_DQ 7168x1536, q norm 1536, W_UQ 1536 x 128 heads x
    (128 + 64), W_DKV+W_KR 7168 x (512 + 64), kv norm 512, W_UK+W_UV 512 x 128 x (128 + 128), W_O 128 x 128 x 7168,
    and the block's two norms: 187,121,664 (the MLA paper's shapes, counted here without the code)."""
    spec = parse_spec({"model": {"n_layers": 1, "hidden_sz": 7168, "inter_sz": 18432, "n_q_heads": 128,
                                 "n_kv_heads": 128, "head_dim": 192, "vocab_sz": 1000, "attn_gate": False,
                                 "qk_norm": True, "mla": {"q_lora_rank": 1536, "kv_lora_rank": 512,
                                                          "qk_rope_head_dim": 64, "v_head_dim": 128}}})
    hand = (7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 + 128 * 128 * 7168
            + 2 * 7168)
    assert hand == 187_121_664 and spec_attention_params(spec.model) == hand


def test_biases_sinks_norms_and_mtp_by_hand():
    """GPT-OSS-like block on the small base: q/k/v/o biases (4x32 + 2x4x32 + 64), sinks (4), per-head q/k norms
    (2 x 32); the MoE MLP biases (2x32 + 64 per expert), router bias (8); one MTP layer of the last (MoE) block's
    kind with two input norms, a 128 x 64 projection and a final norm."""
    m = parse_spec(_spec(linear_bias="all", attention_sinks=True, qk_norm=True, mtp_layers=1,
                         moe={"first_dense_layers": 1})).model
    attn = 2 * 64 * 128 + 2 * 64 * 128 + (128 + 2 * 128 + 64) + 4 + 2 * 32 + 2 * 64
    expert = 3 * 64 * 32 + 2 * 32 + 64
    router = 8 * 64 + 8
    dense = 3 * 64 * 128 + 2 * 128 + 64
    p = spec_param_counts(m)
    assert p.n_tot == 4 * attn + dense + 3 * (8 * expert + router) + 64
    assert p.n_act == 4 * attn + dense + 3 * (2 * expert + router) + 64
    assert p.mtp == attn + 8 * expert + router + 2 * 64 + 2 * 64 * 64 + 64
    assert p.mtp_act == attn + 2 * expert + router + 2 * 64 + 2 * 64 * 64 + 64


def test_window_layer_count_follows_the_repeated_pattern():
    m = parse_spec(_spec(n_layers=4, sliding_window={"size": 8, "pattern": "SSF"})).model
    assert window_layer_count(m) == 3  # S S F S
