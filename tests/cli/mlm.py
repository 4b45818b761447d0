"""Megatron-LM's own view of emitted arguments, for the tests.

Two layers, as Megatron-LM has them:

* the command line (megatron/training/arguments.py, not in the megatron-core wheel): :func:`parse` reads
  ``--emit megatron`` text against the flag table of a named Megatron-LM version kept as data
  (tests/data/megatron/arguments_<version>.json: option names, dests, actions, nargs, types, choices and defaults,
  with its source) and fails on an unknown flag, a wrong value count or a value outside its choices;
* the model config (megatron-core's TransformerConfig, from the pinned wheel of the ``megatron`` extra): its
  ``__post_init__`` runs the MoE, recompute, fp8 and parallelism checks. :func:`transformer_config` builds it from
  the parsed arguments the way core_transformer_config_from_args does at that version (every TransformerConfig
  field the namespace has, plus its named renames), after the derivations validate_args makes first.

Facts of Megatron-LM are cited by file; no code is copied.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import shlex
from pathlib import Path

from scaleplan.megatron import MEGATRON_LM_VERSION

TABLE = Path(__file__).resolve().parents[1] / "data" / "megatron" / f"arguments_{MEGATRON_LM_VERSION}.json"


class Rejected(Exception):
    """Megatron-LM would refuse these arguments (argparse, validate_args or TransformerConfig)."""


def flag_table() -> dict[str, dict]:
    return {r["flag"]: r for r in json.loads(TABLE.read_text())["flags"]}


def argv(text: str) -> list[str]:
    """The words of ``--emit megatron`` text (comment lines and line continuations dropped)."""
    lines = [ln.rstrip().removesuffix("\\") for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    return shlex.split(" ".join(lines))


def _typed(row: dict, word: str):
    t = row["type"]
    try:
        if t == "int":
            return int(word)
        if t == "float":
            return float(word)
        if t == "moe_freq_type":  # arguments.py moe_freq_type: an int, or a Python list literal of 0/1
            return ast.literal_eval(word) if word.startswith("[") else int(word)
        if t == "tuple_type":  # arguments.py tuple_type: "1,2" or "(1,2)" -> (1, 2)
            return tuple(int(i) for i in word.strip("()").split(","))
    except (ValueError, SyntaxError):
        raise Rejected(f"{row['flag']}: {word!r} is not a {t}") from None
    return word


def parse(words: list[str]) -> tuple[dict, list[str]]:
    """argparse's view of ``words`` under the flag table: (namespace with every default, flags given).
    Raises Rejected for an unknown flag, a missing or extra value, or a value outside the flag's choices."""
    table = flag_table()
    ns = {r["dest"]: r["default"] for r in table.values()}
    given, i = [], 0
    while i < len(words):
        flag = words[i]
        if flag not in table:
            raise Rejected(f"unknown flag {flag} (not in Megatron-LM {MEGATRON_LM_VERSION})")
        row, i = table[flag], i + 1
        vals = []
        while i < len(words) and not words[i].startswith("--"):
            vals.append(words[i])
            i += 1
        _check_count(row, vals)
        if row["choices"] is not None and any(v not in row["choices"] for v in vals):
            raise Rejected(f"{flag} {vals}: not among its choices {row['choices']}")
        if row["kind"] in ("storetrue", "storefalse"):
            ns[row["dest"]] = row["const"]
        elif row["nargs"] in ("+", "*"):
            ns[row["dest"]] = [_typed(row, v) for v in vals]
        else:
            ns[row["dest"]] = _typed(row, vals[0])
        given.append(flag)
    return ns, given


def _check_count(row: dict, vals: list[str]) -> None:
    n = row["nargs"]
    want = {"+": "one or more", "*": "any", None: "one"}.get(n, str(n))
    ok = (len(vals) >= 1 if n == "+" else True if n == "*" else len(vals) == (1 if n is None else n))
    if row["kind"] in ("storetrue", "storefalse"):
        ok, want = not vals, "no"
    if not ok:
        raise Rejected(f"{row['flag']} takes {want} value(s), got {vals}")


def validate(ns: dict, world: int) -> None:
    """The derivations and layout checks of validate_args (arguments.py) that the model config depends on.
    Raises Rejected where Megatron-LM's would fail."""
    if ns["optimizer"] == "dist_muon":
        raise Rejected("--optimizer dist_muon is deprecated: use --optimizer muon --use-distributed-optimizer")
    if ns.get("bf16") and "accumulate_allreduce_grads_in_fp32" in ns:  # bf16 reduces gradients in fp32 unless
        # --grad-reduce-in-bf16 (the main gradients in fp32, their default)
        ns["accumulate_allreduce_grads_in_fp32"] = not ns.get("grad_reduce_in_bf16")
    tp, pp, cp = ns["tensor_model_parallel_size"], ns["pipeline_model_parallel_size"], ns["context_parallel_size"]
    if world % (tp * pp * cp):
        raise Rejected(f"world size {world} is not divisible by tp*pp*cp = {tp * pp * cp}")
    dp = world // (tp * pp * cp)
    if ns["global_batch_size"] % (ns["micro_batch_size"] * dp):
        raise Rejected(f"global batch {ns['global_batch_size']} not divisible by micro batch x DP")
    layout = ns.get("pipeline_model_parallel_layout")
    if ns.get("hybrid_layer_pattern") is not None:
        _validate_hybrid(ns, pp)
    elif layout is not None:  # validate_args: VPP from the layout's chunks (TransformerConfig checks the rest)
        from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

        chunks = PipelineParallelLayerLayout.get_num_stages_from_str(layout)
        if chunks % pp:
            raise Rejected(f"{chunks} pipeline layout chunks not divisible by pipeline size {pp}")
        if ns["num_layers_per_virtual_pipeline_stage"] is not None or ns["num_virtual_stages_per_pipeline_rank"]:
            raise Rejected("--pipeline-model-parallel-layout with another virtual pipeline argument")
        ns["virtual_pipeline_model_parallel_size"] = chunks // pp
    elif ns["decoder_first_pipeline_num_layers"] is None and ns["decoder_last_pipeline_num_layers"] is None \
            and (ns["num_layers"] + _accounted(ns)) % pp:  # the embedding and loss count where the flags say
        raise Rejected(f"num_layers {ns['num_layers']} (+ {_accounted(ns)}) not divisible by pipeline size {pp}")
    ep, etp = ns["expert_model_parallel_size"], ns["expert_tensor_parallel_size"] or tp  # unset: ETP = TP
    if world % (ep * etp * pp):
        raise Rejected(f"world size {world} not divisible by ep*etp*pp = {ep * etp * pp}")
    uneven = ns["decoder_first_pipeline_num_layers"] is not None or ns["decoder_last_pipeline_num_layers"] is not None
    if ns["num_layers_per_virtual_pipeline_stage"] is not None:
        if ns["num_virtual_stages_per_pipeline_rank"] is not None:
            raise Rejected("--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank")
        if uneven:  # validate_args: uneven stages name their virtual stages per rank instead
            raise Rejected("please use --num-virtual-stages-per-pipeline-rank with uneven pipeline parallelism")
        per_stage = (ns["num_layers"] + _accounted(ns)) // pp
        if per_stage % ns["num_layers_per_virtual_pipeline_stage"]:
            raise Rejected("layers per pipeline stage not divisible by layers per virtual stage")
        ns["virtual_pipeline_model_parallel_size"] = per_stage // ns["num_layers_per_virtual_pipeline_stage"]
    elif ns["num_virtual_stages_per_pipeline_rank"] is not None:
        ns["virtual_pipeline_model_parallel_size"] = ns["num_virtual_stages_per_pipeline_rank"]
    if ns.get("virtual_pipeline_model_parallel_size") == 1:
        ns["virtual_pipeline_model_parallel_size"] = None
    if isinstance(ns["moe_layer_freq"], list) and len(ns["moe_layer_freq"]) != ns["num_layers"]:
        raise Rejected(f"--moe-layer-freq has {len(ns['moe_layer_freq'])} entries for {ns['num_layers']} layers")
    if ns["train_samples"] is not None and ns["train_iters"] is not None:
        raise Rejected("--train-samples and --train-iters are exclusive")


def _accounted(ns: dict) -> int:
    """Layers --account-for-embedding/loss-in-pipeline-split add to num_layers in validate_args' checks."""
    return int(bool(ns.get("account_for_embedding_in_pipeline_split"))) + \
        int(bool(ns.get("account_for_loss_in_pipeline_split")))


def _validate_hybrid(ns: dict, pp: int) -> None:
    """validate_args' hybrid-pattern block (arguments.py at the newest main): num_layers and VPP from the pattern,
    MTP depth from its '/' parts, MLA from a '+'; the flags the pattern replaces must be unset. The pattern itself is
    parsed by megatron-core's own hybrid_layer_allocation where the installed wheel has it (tests only)."""
    pat = ns["hybrid_layer_pattern"]
    for k in ("num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
              "pipeline_model_parallel_layout"):
        if ns.get(k) is not None:
            raise Rejected(f"--{k.replace('_', '-')} should not be used with --hybrid-layer-pattern")
    if ns.get("account_for_embedding_in_pipeline_split") or ns.get("account_for_loss_in_pipeline_split"):
        raise Rejected("--account-for-embedding/loss-in-pipeline-split should not be used with --hybrid-layer-pattern")
    main, *mtp = pat.split("/")
    if "|" in main and (ns["decoder_first_pipeline_num_layers"] is not None
                        or ns["decoder_last_pipeline_num_layers"] is not None):
        raise Rejected("--decoder-first/last-pipeline-num-layers with pipe separators in the pattern")
    if any(p != mtp[0] for p in mtp) or any(ch not in "M G*D+-E|/" for ch in pat):
        raise Rejected(f"hybrid pattern {pat!r}: bad symbol or differing MTP patterns")
    segments = main.count("|") + 1
    ns["num_layers"] = len(main.replace("|", ""))
    if segments > 1 or pp > 1:
        if segments % pp:
            raise Rejected(f"{segments} hybrid segments not divisible by pipeline size {pp}")
        if segments == 1 and pp > 1 and ns["num_layers"] % pp:
            raise Rejected(f"{ns['num_layers']} hybrid layers not divisible by pipeline size {pp}")
        ns["virtual_pipeline_model_parallel_size"] = segments // pp if segments > pp else None
    if mtp and mtp[0]:
        ns["mtp_num_layers"] = len(mtp)
    if "+" in pat or "D" in pat:
        ns["multi_latent_attention"] = True
    ns["is_hybrid_model"] = True


def transformer_config(ns: dict):
    """megatron-core's TransformerConfig of a parsed namespace (its __post_init__ checks run here). Raises
    Rejected with the config's own message where it refuses."""
    import torch
    import torch.nn.functional as F
    from megatron.core.fusions.fused_bias_geglu import quick_gelu
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    cls = MLATransformerConfig if ns["multi_latent_attention"] else TransformerConfig
    dtype = torch.bfloat16 if ns["bf16"] else torch.float16 if ns["fp16"] else torch.float32
    if ns["add_bias_linear"]:  # validate_args keeps the bias flags in sync
        ns["add_qkv_bias"] = True
    kw = {f.name: ns[f.name] for f in dataclasses.fields(cls) if f.name in ns and f.init}
    # core_transformer_config_from_args (megatron/training/argument_utils.py): the renamed fields
    kw.update(num_moe_experts=ns["num_experts"], params_dtype=dtype, pipeline_dtype=dtype,
              num_query_groups=ns["num_query_groups"] if ns["group_query_attention"] else None,
              num_layers_in_first_pipeline_stage=ns["decoder_first_pipeline_num_layers"],
              num_layers_in_last_pipeline_stage=ns["decoder_last_pipeline_num_layers"])
    if ns.get("rope_type") is None:
        kw.pop("rope_type", None)
    for k in ("virtual_pipeline_model_parallel_size", "is_hybrid_model"):
        if k in ns:
            kw[k] = ns[k]
    if ns["swiglu"]:
        kw.update(activation_func=F.silu, gated_linear_unit=True)
    elif ns["quick_geglu"]:
        kw.update(activation_func=quick_gelu, gated_linear_unit=True)
    try:
        return cls(**kw)
    except (ValueError, AssertionError, TypeError) as e:
        raise Rejected(f"TransformerConfig: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
