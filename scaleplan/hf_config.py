"""A spec from a Hugging Face ``config.json`` (``scaleplan spec from-hf``).

Families read (``model_type``): ``deepseek_v3`` and ``kimi_k2`` (DeepseekV3ForCausalLM: MLA, sigmoid router with
expert bias, dense first blocks, MTP), ``qwen3_moe``, ``gpt_oss``, ``mixtral`` and ``olmoe``. The meaning of each
key is the family's configuration class in transformers (``configuration_<family>.py``) and its modelling code.

Every key of the file is accounted for: read into the spec, checked to hold the one value the spec can describe
(``hidden_act: silu``, no attention dropout, ...), or known not to change the plan (token ids, norm epsilon, RoPE
base and scaling, initialisation, the checkpoint's quantisation: ``NO_EFFECT``). Anything else is an error naming
the key, so a config with a feature the planner would silently cost as something else is refused.

Never imports torch.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scaleplan.errors import SpecError

FAMILIES = {"deepseek_v3": "deepseek", "kimi_k2": "deepseek", "qwen3_moe": "qwen3_moe", "gpt_oss": "gpt_oss",
            "mixtral": "mixtral", "olmoe": "olmoe"}
# keys that do not change what is costed or emitted (why, in one word each group): identifiers and bookkeeping;
# numerics of a norm or of RoPE (its base and context scaling change no shape); the routing's numerics (scaling of
# the gate values, their normalisation, group-limited choice: the planner costs balanced routing either way); the
# auxiliary loss; the released checkpoint's storage format (quantization_config), not the training precision
NO_EFFECT = frozenset({
    "architectures", "auto_map", "_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "rms_norm_eps", "rope_theta",
    "rope_scaling", "rope_parameters", "max_position_embeddings", "initial_context_length", "pretraining_tp",
    "ep_size", "output_router_logits", "router_aux_loss_coef", "aux_loss_alpha", "seq_aux", "norm_topk_prob",
    "routed_scaling_factor", "n_group", "topk_group", "quantization_config", "max_window_layers",
})
# planning defaults of a spec written from a config (a config says nothing of the run): the catalogue's too
DEFAULT_DATA = {"gbs": 1024, "seqlen": 4096}


class _Config:
    """The config's mapping, remembering which keys were read."""

    def __init__(self, data: dict[str, Any], where: str):
        self.data, self.where, self.used = data, where, {"model_type"}

    def get(self, key: str, default: Any = ...) -> Any:
        self.used.add(key)
        if key not in self.data:
            if default is ...:
                raise SpecError(f"{self.where}: {key}", None, "present (this family's config has it)")
            return default
        return self.data[key]

    def expect(self, key: str, allowed: tuple, default: Any = None) -> Any:
        """The value of ``key``, which must be one of ``allowed`` (the values a spec can describe)."""
        v = self.get(key, default)
        if v not in allowed:
            raise SpecError(f"{self.where}: {key}", v, f"one of {', '.join(map(repr, allowed))} (what a scaleplan "
                            "spec describes)")
        return v

    def check_all_known(self, family: str) -> None:
        extra = sorted(set(self.data) - self.used - NO_EFFECT)
        if extra:
            raise SpecError(f"{self.where}: {extra[0]}", self.data[extra[0]],
                            f"a key of the {family} family that scaleplan reads (unknown key: its effect on the plan "
                            "is not modelled)")


def _base(c: _Config, head_dim: int) -> dict[str, Any]:
    """The fields every family has the same way: a SwiGLU pre-norm decoder with RMSNorm and RoPE, no dropout."""
    c.expect("hidden_act", ("silu",), "silu")
    c.expect("attention_dropout", (0, 0.0), 0.0)
    return {"n_layers": c.get("num_hidden_layers"), "hidden_sz": c.get("hidden_size"),
            "inter_sz": c.get("intermediate_size"), "n_q_heads": c.get("num_attention_heads"),
            "n_kv_heads": c.get("num_key_value_heads", c.get("num_attention_heads")), "head_dim": head_dim,
            "vocab_sz": c.get("vocab_size"), "tie_embeddings": bool(c.get("tie_word_embeddings", False)),
            "attn_gate": False}


def _moe(experts: int, topk: int, width: int, **kw) -> dict[str, Any]:
    return {"n_experts": experts, "experts_per_token": topk, "expert_inter_sz": width, "first_dense_layers": 0, **kw}


def _deepseek(c: _Config) -> dict[str, Any]:
    """DeepseekV3Config: MLA, dense first_k_dense_replace blocks, shared experts, sigmoid router with the
    aux-loss-free bias (topk_method noaux_tc), num_nextn_predict_layers MTP layers."""
    rope, nope = c.get("qk_rope_head_dim"), c.get("qk_nope_head_dim")
    m = _base(c, nope + rope)
    c.expect("attention_bias", (False,), False)
    c.expect("moe_layer_freq", (1,), 1)  # DeepSeek's freq > 1 counts MoE blocks from layer 0, not after the dense
    width, shared = c.get("moe_intermediate_size"), c.get("n_shared_experts", 0) or 0
    m["moe"] = _moe(c.get("n_routed_experts"), c.get("num_experts_per_tok"), width,
                    shared_expert_inter_sz=shared * width, first_dense_layers=c.get("first_k_dense_replace", 0),
                    router_score=c.expect("scoring_func", ("softmax", "sigmoid"), "softmax"),
                    expert_bias=c.expect("topk_method", ("greedy", "group_limited_greedy", "noaux_tc"),
                                         "greedy") == "noaux_tc")
    # q_a_layernorm and kv_a_layernorm: DeepSeek's MLA normalises both latents (Megatron-LM's --qk-layernorm)
    m["mla"] = {"q_lora_rank": c.get("q_lora_rank", None), "kv_lora_rank": c.get("kv_lora_rank"),
                "qk_rope_head_dim": rope, "v_head_dim": c.get("v_head_dim")}
    m["qk_norm"] = True
    m["mtp_layers"] = c.get("num_nextn_predict_layers", 0) or 0
    return m


def _qwen3_moe(c: _Config) -> dict[str, Any]:
    """Qwen3MoeConfig: per-head q/k RMSNorm, MoE blocks where (i + 1) % decoder_sparse_step == 0 outside
    mlp_only_layers (a leading run of dense blocks is what a spec describes)."""
    m = _base(c, c.get("head_dim", None) or c.get("hidden_size") // c.get("num_attention_heads"))
    c.expect("attention_bias", (False,), False)
    c.expect("use_sliding_window", (False,), False)
    c.get("sliding_window", None)  # read only with use_sliding_window
    dense = list(c.get("mlp_only_layers", []) or [])
    if dense != list(range(len(dense))):
        raise SpecError(f"{c.where}: mlp_only_layers", dense, "a leading run of blocks [0, 1, ..., k-1] (a spec's "
                        "model.moe.first_dense_layers)")
    m["moe"] = _moe(c.get("num_experts"), c.get("num_experts_per_tok"), c.get("moe_intermediate_size"),
                    first_dense_layers=len(dense), moe_frequency=c.get("decoder_sparse_step", 1))
    m["qk_norm"] = True
    return m


def _window_pattern(types: list[str], where: str) -> str:
    """The shortest S/F pattern whose repetition is ``layer_types`` (sliding_attention / full_attention)."""
    letters = {"sliding_attention": "S", "full_attention": "F"}
    bad = next((t for t in types if t not in letters), None)
    if bad is not None:
        raise SpecError(f"{where}: layer_types", bad, "sliding_attention or full_attention")
    s = "".join(letters[t] for t in types)
    return next(s[:p] for p in range(1, len(s) + 1) if all(s[i] == s[i % p] for i in range(len(s))))


def _gpt_oss(c: _Config) -> dict[str, Any]:
    """GptOssConfig: biases on Q, K, V, O, the router and the experts (attention_bias), a learned sink logit per
    head, sliding-window attention on the layer_types marked so, the clamped SwiGLU (swiglu_limit)."""
    m = _base(c, c.get("head_dim"))
    topk = c.get("num_experts_per_tok")
    c.expect("experts_per_token", (topk,), topk)
    m["linear_bias"] = "all" if c.expect("attention_bias", (True, False), True) else "none"
    m["attention_sinks"] = True
    L = m["n_layers"]
    types = c.get("layer_types", None) or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(L)]
    if len(types) != L:
        raise SpecError(f"{c.where}: layer_types", len(types), f"one entry per layer ({L})")
    window = c.get("sliding_window", None)
    if window and "sliding_attention" in types:
        m["sliding_window"] = {"size": window, "pattern": _window_pattern(types, c.where)}
    m["swiglu_limit"] = float(c.get("swiglu_limit"))
    m["moe"] = _moe(c.get("num_local_experts"), topk, c.get("intermediate_size"))
    return m


def _mixtral(c: _Config) -> dict[str, Any]:
    """MixtralConfig: Mistral's decoder (sliding_window on every layer when set), 8 experts of width
    intermediate_size."""
    m = _base(c, c.get("head_dim", None) or c.get("hidden_size") // c.get("num_attention_heads"))
    window = c.get("sliding_window", None)
    if window:
        m["sliding_window"] = {"size": window, "pattern": "S"}
    m["moe"] = _moe(c.get("num_local_experts"), c.get("num_experts_per_tok"), c.get("intermediate_size"))
    return m


def _olmoe(c: _Config) -> dict[str, Any]:
    """OlmoeConfig: q and k RMSNorm over the whole projections, 64 experts of width intermediate_size."""
    m = _base(c, c.get("hidden_size") // c.get("num_attention_heads"))
    c.expect("attention_bias", (False,), False)
    c.expect("clip_qkv", (None,), None)
    m["qk_norm"] = "projection"
    m["moe"] = _moe(c.get("num_experts"), c.get("num_experts_per_tok"), c.get("intermediate_size"))
    return m


_READERS = {"deepseek": _deepseek, "qwen3_moe": _qwen3_moe, "gpt_oss": _gpt_oss, "mixtral": _mixtral,
            "olmoe": _olmoe}


def model_from_hf(data: Any, where: str = "config.json") -> dict[str, Any]:
    """The spec's ``model`` mapping of a Hugging Face config mapping. Raises SpecError (one line) for an unknown
    ``model_type``, a key scaleplan does not read, or a value a spec cannot describe."""
    if not isinstance(data, dict):
        raise SpecError(where, type(data).__name__, "a JSON object (a Hugging Face config.json)")
    if isinstance(data.get("text_config"), dict):
        raise SpecError(f"{where}: text_config", "...", "a text-only model's config (multimodal wrappers: give the "
                        "text_config's own keys)")
    family = FAMILIES.get(data.get("model_type"))
    if family is None:
        raise SpecError(f"{where}: model_type", data.get("model_type"), f"one of {', '.join(FAMILIES)}")
    c = _Config(data, where)
    model = _READERS[family](c)
    c.check_all_known(str(data["model_type"]))
    return model


def read_config(path: str | Path) -> tuple[dict[str, Any], str]:
    """The mapping of a config.json, or of ``config.json`` in a model directory, and the name errors use.
    Raises SpecError for a missing or unreadable file or bad JSON."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        return json.loads(p.read_text()), str(p)
    except OSError as e:
        raise SpecError("config", str(p), f"a readable config.json or a model directory holding one "
                        f"({e.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpecError("config", str(p), f"a JSON file ({type(e).__name__})") from None


def spec_from_hf(data: Any, where: str = "config.json", *, gbs: int = DEFAULT_DATA["gbs"],
                 seqlen: int = DEFAULT_DATA["seqlen"], node_type: str = "p6-b200.48xlarge") -> dict[str, Any]:
    """A whole spec mapping of a config: its model (:func:`model_from_hf`) in bf16 with AdamW, full recompute, on
    ``node_type``, trained at ``gbs`` sequences of ``seqlen`` tokens (planning defaults: a config holds none).
    Validated: raises SpecError naming the field when the config's values break a spec rule."""
    from scaleplan.specs import parse_spec

    doc = {"model": model_from_hf(data, where), "data": {"gbs": gbs, "seqlen": seqlen},
           "optimizer": {"optimizer_type": "adamw"}, "performance": {"activation_checkpointing_type": "full"},
           "hardware": {"node_type": node_type}}
    parse_spec(doc, source=where)
    return doc
