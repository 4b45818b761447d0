"""Megatron-LM arguments of the model features beyond the paper's architecture, both ways: multi-latent attention
and its widths, MTP layers, the sliding window and its per-block pattern, q/k norms, attention sinks, linear
biases, GPT-OSS's clamped SwiGLU, the sigmoid router and its expert bias (docs/megatron.md's table).

:func:`attention_args`, :func:`mlp_args`, :func:`router_args` give the flags; :func:`features_of_args` reads the
same features back from a log's argument dump (:mod:`scaleplan.megatron.log`). Flags and their meaning are those of
Megatron-LM's megatron/training/arguments.py and megatron-core's TransformerConfig / MLATransformerConfig.

Never imports torch.
"""
from __future__ import annotations

from typing import Any

from scaleplan.errors import SpecError
from scaleplan.specs import ModelBlock, MoESpec

# GPT-OSS's activation (transformers' GptOssExperts): gate clamped to <= limit, linear part to [-limit, limit],
# gate * sigmoid(1.702 gate) * (linear + 1): Megatron-LM's quick-GeGLU with a linear offset of 1 and a clamp
GLU_LINEAR_OFFSET = 1.0


def window_flags(pattern: str, n_layers: int) -> str | None:
    """Megatron-LM's --window-attn-skip-freq for a spec's S/F pattern over ``n_layers`` blocks: None when every
    block slides (all windowed is Megatron's default), an int k when every k-th block is full (S..SF: layer
    number i, 1-based, is windowed when i % k != 0), else the per-block list with 1 for a windowed block."""
    per = [pattern[i % len(pattern)] == "S" for i in range(n_layers)]
    if all(per):
        return None
    k = len(pattern)
    if pattern == "S" * (k - 1) + "F":
        return str(k)
    return "[" + ",".join(str(int(w)) for w in per) + "]"


def attention_args(m: ModelBlock) -> list[list[str]]:
    """Heads and widths (GQA's --kv-channels and query groups, or MLA's ranks and head widths), q/k norms, sinks,
    the sliding window, the linear biases."""
    out = [["--num-attention-heads", str(m.n_q_heads)]]
    if m.mla is not None:
        a = m.mla
        out.append(["--multi-latent-attention"])
        if a.q_lora_rank is not None:
            out.append(["--q-lora-rank", str(a.q_lora_rank)])
        out += [["--kv-lora-rank", str(a.kv_lora_rank)], ["--qk-head-dim", str(m.head_dim - a.qk_rope_head_dim)],
                ["--qk-pos-emb-head-dim", str(a.qk_rope_head_dim)], ["--v-head-dim", str(a.v_head_dim)]]
    else:
        out.append(["--kv-channels", str(m.head_dim)])
        if m.n_kv_heads != m.n_q_heads:
            out += [["--group-query-attention"], ["--num-query-groups", str(m.n_kv_heads)]]
    if m.qk_norm:
        out.append(["--qk-layernorm"])
    if m.attention_sinks:
        out.append(["--softmax-type", "learnable"])
    if m.sliding_window is not None:
        out.append(["--window-size", f"{m.sliding_window.size},0"])
        skip = window_flags(m.sliding_window.pattern, m.n_layers)
        if skip is not None:
            out.append(["--window-attn-skip-freq", skip])
    # Megatron-LM's linear layers carry biases unless --disable-bias-linear; --add-qkv-bias puts them back on QKV
    out += {"none": [["--disable-bias-linear"]], "qkv": [["--disable-bias-linear"], ["--add-qkv-bias"]],
            "all": []}[m.linear_bias]
    return out


def mlp_args(m: ModelBlock) -> list[list[str]]:
    """The MLP's activation: SwiGLU, GPT-OSS's clamped quick-GeGLU, or the plain two-matrix MLP."""
    if not m.glu:
        return []
    if m.swiglu_limit is None:
        return [["--swiglu"]]
    return [["--quick-geglu"], ["--glu-linear-offset", f"{GLU_LINEAR_OFFSET:g}"],
            ["--activation-func-clamp-value", f"{m.swiglu_limit:g}"]]


def router_args(moe: MoESpec) -> list[list[str]]:
    """The router's score function and the aux-loss-free expert bias."""
    out = []
    if moe.router_score != "softmax":
        out.append(["--moe-router-score-function", moe.router_score])
    if moe.expert_bias:
        out.append(["--moe-router-enable-expert-bias"])
    return out


def mtp_args(m: ModelBlock) -> list[list[str]]:
    return [["--mtp-num-layers", str(m.mtp_layers)]] if m.mtp_layers else []


def feature_notes(m: ModelBlock) -> list[str]:
    """What the flags of these features cannot say."""
    notes = []
    if m.qk_norm == "projection":
        notes.append("model.qk_norm projection (OLMoE: one norm over each whole q and k projection): Megatron-LM's "
                     f"--qk-layernorm normalises per head ({m.head_dim}-wide weights), the nearest it builds")
    if m.sliding_window is not None:
        notes.append(f"sliding window: each query attends to itself and the {m.sliding_window.size} tokens before "
                     "it on the windowed blocks (--window-size W,0); it needs Transformer Engine's or "
                     "FlashAttention's windowed kernel at run time")
    return notes


def _window_of_args(a: dict[str, Any], L: int, where: str) -> dict[str, Any] | None:
    """model.sliding_window of window_size / window_attn_skip_freq (the layer list of a hybrid run is read by
    :mod:`.hybrid` first and given here per block)."""
    size = a.get("window_size")
    if size in (None, "None"):
        return None
    if not (isinstance(size, (tuple, list)) and len(size) == 2 and int(size[1]) == 0 and int(size[0]) > 0):
        raise SpecError(f"{where}: window_size", size, "(W, 0): a causal window of W tokens")
    skip = a.get("window_attn_skip_freq")
    if skip in (None, "None"):
        per = [True] * L
    elif isinstance(skip, int):
        per = [(i + 1) % skip != 0 for i in range(L)]
    else:
        per = [bool(v) for v in skip]
    letters = "".join("S" if w else "F" for w in per)
    pattern = next(letters[:p] for p in range(1, L + 1) if all(letters[i] == letters[i % p] for i in range(L)))
    return {"size": int(size[0]), "pattern": pattern}


def features_of_args(a: dict[str, Any], L: int, where: str) -> dict[str, Any]:
    """The spec's model fields of these features, read from an argument dump (``L`` decoder blocks)."""
    m: dict[str, Any] = {}
    if a.get("multi_latent_attention"):
        rope = int(a.get("qk_pos_emb_head_dim") or 64)
        m["head_dim"] = int(a.get("qk_head_dim") or 128) + rope
        m["mla"] = {"q_lora_rank": a.get("q_lora_rank"), "kv_lora_rank": int(a.get("kv_lora_rank") or 32),
                    "qk_rope_head_dim": rope, "v_head_dim": int(a.get("v_head_dim") or 128)}
    m["qk_norm"] = bool(a.get("qk_layernorm"))
    m["attention_sinks"] = a.get("softmax_type") == "learnable"
    window = _window_of_args(a, L, where)
    if window is not None:
        m["sliding_window"] = window
    add_all = a.get("add_bias_linear", False) is not False
    m["linear_bias"] = "all" if add_all else "qkv" if a.get("add_qkv_bias") else "none"
    if a.get("quick_geglu"):
        if float(a.get("glu_linear_offset") or 0.0) != GLU_LINEAR_OFFSET or not a.get("activation_func_clamp_value"):
            raise SpecError(f"{where}: quick_geglu", True, "with --glu-linear-offset 1 and a clamp (GPT-OSS's "
                            "activation, model.swiglu_limit)")
        m["glu"], m["swiglu_limit"] = True, float(a["activation_func_clamp_value"])
    m["mtp_layers"] = int(a.get("mtp_num_layers") or 0)
    return m


def router_of_args(a: dict[str, Any]) -> dict[str, Any]:
    """model.moe's router fields of an argument dump."""
    return {"router_score": str(a.get("moe_router_score_function") or "softmax"),
            "expert_bias": bool(a.get("moe_router_enable_expert_bias"))}
