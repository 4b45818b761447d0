"""The training stack of a plan (scaleplan/stack.py): its fields, the key a calibration carries, and the
one-line errors for an unknown option or FP8 recipe."""
from __future__ import annotations

import pytest

from scaleplan.errors import SpecError
from scaleplan.specs import parse_spec
from scaleplan.stack import DISPATCHERS, FP8_RECIPES, PAPER_STACK, Stack, parse_stack

MODEL = {"n_layers": 4, "hidden_sz": 1024, "inter_sz": 2048, "n_q_heads": 8, "n_kv_heads": 8, "head_dim": 128,
         "vocab_sz": 32000, "moe": {"n_experts": 8, "experts_per_token": 2, "expert_inter_sz": 1024}}


def _spec(stack: dict, precision: str = "bf16", **moe):
    return parse_spec({"model": {**MODEL, "precision": precision, "moe": {**MODEL["moe"], **moe}}, "stack": stack})


def test_a_spec_without_a_stack_block_runs_the_papers_stack():
    s = _spec({})
    assert s.stack == PAPER_STACK and s.stack.key("bf16") == "megatron"
    # the paper's stack (app:training-stack): grouped experts, all-to-all, nothing fused or captured
    assert (s.stack.experts, s.stack.dispatcher, s.stack.permute_fusion, s.stack.cuda_graphs) == \
        ("grouped", "alltoall", False, ())


def test_an_fp8_model_defaults_to_current_scaling_and_the_key_names_only_departures():
    s = _spec({}, "fp8")
    assert s.stack.recipe("fp8") == "tensorwise" and s.stack.key("fp8") == "megatron[fp8_recipe=tensorwise]"
    assert _spec({}, "bf16").stack.recipe("bf16") is None
    mx = _spec({"fp8_recipe": "mxfp8", "grouped_gemm": "grouped", "cuda_graphs": ["attn", "moe_router"]}, "fp8")
    assert mx.stack.key("fp8") == "megatron[grouped_gemm=grouped,cuda_graphs=attn+moe_router,fp8_recipe=mxfp8]"
    # two spellings of one stack have one key; two stacks never share one, nor a bf16 and an FP8 run
    assert _spec({"fp8_recipe": "tensorwise"}, "fp8").stack.key("fp8") == s.stack.key("fp8")
    keys = {Stack(fp8_recipe=r).key("fp8") for r in FP8_RECIPES} | {Stack(dispatcher=d).key() for d in DISPATCHERS}
    assert len(keys) == len(FP8_RECIPES) + len(DISPATCHERS) and "megatron" in keys


@pytest.mark.parametrize("stack, precision, field, value", [
    ({"fp8_recipe": "mxfp9"}, "fp8", "stack.fp8_recipe", "mxfp9"),
    ({"fp8_recipe": "mxfp8"}, "bf16", "stack.fp8_recipe", "mxfp8"),
    ({"fp8_param": True}, "bf16", "stack.fp8_param", True),
    ({"dispatcher": "nccl"}, "bf16", "stack.dispatcher", "nccl"),
    ({"grouped": True}, "bf16", "stack.grouped", True),
    ({"cuda_graphs": ["moe_preprocess"]}, "bf16", "stack.cuda_graphs", ["moe_preprocess"]),
    ({"cuda_graphs": ["moe"]}, "bf16", "stack.cuda_graphs", "moe"),
    ({"experts": "sequential", "grouped_gemm": "grouped"}, "bf16", "stack.grouped_gemm", "grouped"),
    ({"grouped_gemm": "grouped", "fp8_recipe": "delayed"}, "fp8", "stack.grouped_gemm", "grouped"),
    # a captured step (Megatron-LM's --cuda-graph-impl full_iteration): alone, without the loss's host read, and
    # on the one dispatcher that reads no token count on the host
    ({"cuda_graphs": ["full_iteration", "attn"], "nan_check": False, "dispatcher": "hybridep"}, "bf16",
     "stack.cuda_graphs", ["full_iteration", "attn"]),
    ({"cuda_graphs": ["full_iteration"], "dispatcher": "hybridep"}, "bf16", "stack.nan_check", True),
    ({"cuda_graphs": ["full_iteration"], "nan_check": False}, "bf16", "stack.dispatcher", "alltoall"),
    # core_v0.19.0 TransformerConfig: the whole MoE layer or its router, not both; no MoE recompute under the
    # router's graph
    ({"cuda_graphs": ["moe", "moe_router"]}, "bf16", "stack.cuda_graphs", ["moe", "moe_router"]),
    ({"cuda_graphs": ["moe_router"], "recompute_modules": ["moe"]}, "bf16", "stack.recompute_modules", ["moe"]),
])
def test_a_bad_stack_is_one_line_naming_the_field_and_value(stack, precision, field, value):
    with pytest.raises(SpecError) as e:
        _spec(stack, precision)
    assert e.value.field == field and e.value.value == value
    assert "\n" not in str(e.value) and field in str(e.value)


def test_a_whole_moe_layer_is_captured_only_when_it_drops_and_pads():
    assert _spec({"cuda_graphs": ["moe"]}, capacity_factor=1.25).stack.cuda_graphs == ("moe",)


def test_parse_stack_overrides_a_base_and_names_a_bad_key_or_value():
    base = Stack(dispatcher="deepep")
    s = parse_stack("fp8_recipe=mxfp8, permute_fusion=true, cuda_graphs=attn+moe_router+moe_preprocess", base)
    assert (s.dispatcher, s.fp8_recipe, s.permute_fusion) == ("deepep", "mxfp8", True)
    assert s.cuda_graphs == ("attn", "moe_router", "moe_preprocess")
    assert parse_stack("cuda_graphs=none", s).cuda_graphs == ()
    for text, field in (("fp8_recipe=e4m3", "--stack fp8_recipe"), ("fusion=true", "--stack"),
                        ("router_fusion=1", "--stack router_fusion"), ("cuda_graphs=attn+attn", "--stack cuda_graphs")):
        with pytest.raises(SpecError) as e:
            parse_stack(text)
        assert e.value.field == field and "\n" not in str(e.value), text


def test_a_captured_step_is_a_stack_of_its_own():
    s = _spec({"cuda_graphs": ["full_iteration"], "nan_check": False, "dispatcher": "hybridep"}).stack
    assert s.captures_step() and not _spec({"cuda_graphs": ["attn"]}).stack.captures_step()
    assert s.key() == "megatron[dispatcher=hybridep,cuda_graphs=full_iteration,nan_check=false]"


def test_a_dense_mlp_graph_needs_a_dense_block():
    """core_v0.19.0: "mlp cuda graph is only supported for dense layers": refused where every block is MoE, taken
    where the first block is dense (MODEL's default first_dense_layers 1)."""
    assert _spec({"cuda_graphs": ["attn", "mlp"]}).stack.cuda_graphs == ("attn", "mlp")
    with pytest.raises(SpecError) as e:
        _spec({"cuda_graphs": ["mlp"]}, first_dense_layers=0)
    assert e.value.field == "stack.cuda_graphs" and e.value.value == "mlp" and "\n" not in str(e.value)
