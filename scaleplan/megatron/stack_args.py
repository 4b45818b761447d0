"""The training stack (scaleplan/stack.py) as Megatron-LM arguments, and back from a log's argument dump.

Flags and choices are core_v0.19.0's (tests/data/megatron/arguments_core_v0.19.0.json): --moe-grouped-gemm,
--moe-token-dispatcher-type alltoall | allgather | flex with --moe-flex-dispatcher-backend deepep | hybridep,
--moe-permute-fusion, --moe-router-fusion, --overlap-moe-expert-parallel-comm with --delay-wgrad-compute,
--cuda-graph-impl transformer_engine with --cuda-graph-modules,
--moe-router-dtype, --fp8-recipe, --fp8-param-gather, --grad-reduce-in-bf16, --no-check-for-nan-in-loss-and-grad. What no flag sets (Transformer Engine's grouped GEMM kernel, an environment
variable) is a comment line (:func:`stack_notes`).
"""
from __future__ import annotations

from typing import Any

from scaleplan.errors import SpecError
from scaleplan.stack import ROUTER_DTYPES, Stack

GROUPED_KERNEL_NOTE = ("grouped GEMM kernel: Transformer Engine >= 2.17 (cuBLASLt >= 13.3) with "
                       "NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM=1 in the environment of every rank (one grouped "
                       "GEMM per expert projection); without it TE runs one GEMM per local expert")
CAPTURED_STEP_NOTE = ("full-iteration CUDA graph: the step must read no token count on the host; Megatron-Bridge's "
                      "recipes add --moe-expert-rank-capacity-factor 1.5 with --moe-paged-stash (HybridEP buffers "
                      "sized on the host) or the CuTe DSL fused grouped MLP, neither costed here")
# Megatron-Core refuses delayed scaling with the moe_act / layernorm recompute (TransformerConfig.__post_init__)
DELAYED_RECOMPUTE = ("super-selective",)


def stack_args(stack: Stack, precision: str, moe: bool) -> list[list[str]]:
    """The arguments of ``stack`` for a model in ``precision`` (``moe``: it has MoE layers), one flag with its
    values per item; the precision flags themselves (--bf16 --fp8-format hybrid) are the caller's."""
    out: list[list[str]] = []
    if moe:
        if stack.experts == "grouped":
            out.append(["--moe-grouped-gemm"])
        if stack.dispatcher in ("alltoall", "allgather"):
            out.append(["--moe-token-dispatcher-type", stack.dispatcher])
        else:
            out += [["--moe-token-dispatcher-type", "flex"], ["--moe-flex-dispatcher-backend", stack.dispatcher]]
        if stack.permute_fusion:
            out.append(["--moe-permute-fusion"])
        if stack.router_fusion:
            out.append(["--moe-router-fusion"])
        if stack.router_dtype != "model":
            out.append(["--moe-router-dtype", stack.router_dtype])
        if stack.a2a_overlap:  # Megatron-Bridge sets the two together (utils/overrides.py moe_a2a_overlap)
            out += [["--overlap-moe-expert-parallel-comm"], ["--delay-wgrad-compute"]]
    if stack.captures_step():
        out.append(["--cuda-graph-impl", "full_iteration"])
    elif stack.cuda_graphs:
        out += [["--cuda-graph-impl", "transformer_engine"], ["--cuda-graph-modules", *stack.cuda_graphs]]
    recipe = stack.recipe(precision)
    if recipe:
        out.append(["--fp8-recipe", recipe])
    if stack.fp8_param:
        out.append(["--fp8-param-gather"])
    if not stack.grads_fp32:
        out.append(["--grad-reduce-in-bf16"])
    if stack.cross_entropy == "te":  # --cross-entropy-loss-fusion itself is the caller's (args.py)
        out.append(["--cross-entropy-fusion-impl", "te"])
    if not stack.nan_check:
        out.append(["--no-check-for-nan-in-loss-and-grad"])
    return out


def stack_notes(stack: Stack, ckpt: str, precision: str) -> list[str]:
    """Comment lines for what no flag carries. Raises SpecError for a stack Megatron-Core refuses with the
    layout's checkpointing (delayed scaling with super-selective recompute)."""
    if stack.recipe(precision) == "delayed" and ckpt in DELAYED_RECOMPUTE:
        raise SpecError("--layout ckpt", ckpt, "none, selective or full with stack.fp8_recipe delayed "
                        "(Megatron-Core refuses delayed scaling with the moe_act / layernorm recompute)")
    return [GROUPED_KERNEL_NOTE] * (stack.grouped_gemm == "grouped") + [CAPTURED_STEP_NOTE] * stack.captures_step()


def _modules(value: Any) -> tuple[str, ...]:
    """--cuda-graph-modules as a dump prints it: a list of names or of CudaGraphModule members."""
    if value in (None, "", [], "[]"):
        return ()
    items = value if isinstance(value, (list, tuple)) else str(value).strip("[]").split(",")
    return tuple(str(v).strip().strip("'\"").split(".")[-1].split(":")[0].strip("<> ") for v in items if str(v).strip())


def stack_from_dump(a: dict[str, Any], where: str) -> dict[str, Any]:
    """The spec's ``stack`` block of an argument dump (only the fields that depart from the paper's stack, so
    a run on the paper's stack stores the spec it stored before). Raises SpecError naming the argument whose
    value no stack option spells."""
    block: dict[str, Any] = {}
    if a.get("num_experts") and not a.get("moe_grouped_gemm"):
        block["experts"] = "sequential"
    kind = a.get("moe_token_dispatcher_type") or "allgather"
    if kind == "flex":
        kind = a.get("moe_flex_dispatcher_backend") or "deepep"
    if kind not in ("alltoall", "allgather", "deepep", "hybridep"):
        raise SpecError(f"{where}: moe_token_dispatcher_type", kind, "alltoall, allgather or flex (deepep, hybridep)")
    if a.get("num_experts") and kind != "alltoall":
        block["dispatcher"] = kind
    for arg, name in (("moe_permute_fusion", "permute_fusion"), ("moe_router_fusion", "router_fusion"),
                      ("fp8_param_gather", "fp8_param")):
        if a.get(arg):
            block[name] = True
    if a.get("moe_shared_expert_intermediate_size") and kind != "allgather" and not a.get("moe_shared_expert_overlap"):
        block["shared_expert_overlap"] = False
    router_dtype = a.get("moe_router_dtype") or "model"
    if router_dtype not in ROUTER_DTYPES:
        raise SpecError(f"{where}: moe_router_dtype", router_dtype, "fp32, fp64 or unset")
    if a.get("num_experts") and router_dtype != "fp32":
        block["router_dtype"] = router_dtype
    if a.get("check_for_nan_in_loss_and_grad") is False:  # --no-check-for-nan-in-loss-and-grad (default on)
        block["nan_check"] = False
    if a.get("overlap_moe_expert_parallel_comm"):  # which Megatron-Core runs only without the shared expert's overlap
        block["a2a_overlap"], block["shared_expert_overlap"] = True, False
    if a.get("grad_reduce_in_bf16") or ("accumulate_allreduce_grads_in_fp32" in a
                                        and not a["accumulate_allreduce_grads_in_fp32"] and a.get("bf16")):
        block["grads_fp32"] = False
    impl = a.get("cuda_graph_impl") or "none"
    if impl not in ("none", "transformer_engine", "local", "full_iteration"):
        raise SpecError(f"{where}: cuda_graph_impl", impl, "none, local, transformer_engine (per-layer graphs) or "
                        "full_iteration")
    if impl == "full_iteration":
        block["cuda_graphs"] = ["full_iteration"]
    elif impl != "none":
        block["cuda_graphs"] = list(_modules(a.get("cuda_graph_modules")) or ("attn", "mlp"))
    if not a.get("cross_entropy_loss_fusion"):
        block["cross_entropy"] = "unfused"
    elif a.get("cross_entropy_fusion_impl") == "te":
        block["cross_entropy"] = "te"
    mods = recompute_modules_of(a)
    if mods is not None:
        block["recompute_modules"] = list(mods)
    recipe = (a.get("fp8_recipe") or "delayed") if a.get("fp8") else None
    if recipe and recipe != "tensorwise":  # tensorwise: what a spec's fp8 means without a recipe
        block["fp8_recipe"] = recipe
    return block


# the module sets the checkpointing modes name themselves (scaleplan.megatron.args._RECOMPUTE)
NAMED_MODULE_SETS = ({"core_attn"}, {"core_attn", "layernorm", "moe_act"})


def recompute_modules_of(a: dict[str, Any]) -> tuple[str, ...] | None:
    """The stack's recompute_modules of a dump: None where its selective recompute is one the checkpointing
    modes name (selective, super-selective) or it has none."""
    if a.get("recompute_granularity") != "selective":
        return None
    mods = [str(m) for m in (a.get("recompute_modules") or ["core_attn"])]
    return None if set(mods) in NAMED_MODULE_SETS else tuple(mods)
