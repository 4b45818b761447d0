"""The training stack a plan runs on: what Megatron-Core (with Transformer Engine) launches for an MoE layer.

The stack is an input like the layout (docs/spec.md, ``stack:``): the time model counts the kernels this
stack launches per layer and micro-batch (estimator/kernel_counts.py), removes the host cost of what CUDA
graphs replay, costs the FP8 quantize kernels of its recipe, and keeps the memory its tensors take; a
calibration is fitted on, and applied to, one stack (:meth:`Stack.key`).

Why in the spec and not the profile: a node type's tables measure its devices, fabric and host whatever
framework runs on them, while the stack is chosen per run by command-line flags (``--emit megatron``
writes them, ``calibrate add --megatron-log`` reads them back), as the layout is. The defaults are the
paper's stack (app:training-stack): grouped-GEMM experts whose GEMMs Transformer Engine issues one per local
expert, unfused permutation and router, the all-to-all dispatcher, no CUDA graphs, FP8 (when the model
precision asks for it) with per-tensor current scaling, weights kept in bf16, gradients reduced in fp32.

Names follow Megatron-LM core_v0.19.0 (megatron/training/arguments.py) and Transformer Engine.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from scaleplan.errors import FieldCheck, SpecError
from scaleplan.units import BYTES_PER_ELEMENT

# experts: TEGroupedMLP (--moe-grouped-gemm: one Transformer Engine GroupedLinear per projection) or
# SequentialMLP (a Python loop over the local experts, one TE Linear per expert and projection).
EXPERTS = ("grouped", "sequential")
# how TE's GroupedLinear runs its GEMMs: "per_expert", one cuBLAS GEMM per local expert on several streams
# (nvte_multi_stream_cublas_gemm: every TE release, the only path for FP8 before 2.17); "grouped", one
# grouped kernel per projection and pass (TE >= 2.17 grouped-tensor path, cuBLASLt >= 13.3:
# NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM=1; bf16, current scaling or MXFP8 on Blackwell).
GROUPED_GEMMS = ("per_expert", "grouped")
# --moe-token-dispatcher-type alltoall | allgather, or flex with --moe-flex-dispatcher-backend deepep |
# hybridep (fused dispatch and combine kernels, no host sync on the token counts)
DISPATCHERS = ("alltoall", "allgather", "deepep", "hybridep")
# --fp8-recipe: per-tensor delayed or current (tensorwise) scaling, 1x128 / 128x128 blocks, MXFP8 (1x32, E8M0)
FP8_RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")
# --cuda-graph-modules with --cuda-graph-impl transformer_engine (per-layer graphs), or full_iteration alone: the
# whole forward-backward step of every micro-batch one graph (--cuda-graph-impl full_iteration, core_v0.19.0
# full_cuda_graph.FullCudaGraphWrapper), as Megatron-Bridge's 26.06 MXFP8 recipes on GB200, GB300 and B300 run
CUDA_GRAPH_MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "full_iteration")
# --recompute-modules under --recompute-granularity selective (TransformerConfig.recompute_modules; gdn_norm_out,
# the GatedDeltaNet norm, has no model here): estimator/recompute.py says what each frees and re-runs
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
# the loss: Megatron-Core's vocab-parallel cross-entropy unfused, fused (--cross-entropy-loss-fusion, the "native"
# jit-fused implementation) or Transformer Engine's (--cross-entropy-fusion-impl te), which writes the gradient
# into the logits (estimator/stack_memory.cross_entropy_bytes)
CROSS_ENTROPY = ("native", "te", "unfused")
# --moe-router-dtype: the router's logits and routing probabilities in fp32 or fp64 (what scaleplan emits: fp32),
# or "model", the flag unset (Megatron-LM's default): the activations' dtype, as Megatron-Bridge's GPT-OSS and Qwen3
# recipes run
ROUTER_DTYPES = ("fp32", "fp64", "model")

Experts = Literal["grouped", "sequential"]
GroupedGemm = Literal["per_expert", "grouped"]
Dispatcher = Literal["alltoall", "allgather", "deepep", "hybridep"]
Fp8Recipe = Literal["delayed", "tensorwise", "blockwise", "mxfp8"]
GraphModule = Literal["attn", "mlp", "moe", "moe_router", "moe_preprocess", "full_iteration"]
RecomputeModule = Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"]
CrossEntropy = Literal["native", "te", "unfused"]
RouterDtype = Literal["fp32", "fp64", "model"]

DEFAULT_FP8_RECIPE = "tensorwise"


class Stack(BaseModel):
    """``stack:`` of a spec. Every field has the paper stack's value as its default (module docstring).

    experts, grouped_gemm, permute_fusion (--moe-permute-fusion), router_fusion (--moe-router-fusion),
    dispatcher, cuda_graphs (modules captured per layer; empty: none), fp8_recipe (None: tensorwise when
    the model is FP8; only with model.precision fp8), fp8_param (--fp8-param-gather: FP8 primary weights),
    grads_fp32 (the gradient buffer and its reduce-scatter in fp32, Megatron-LM's default under --bf16;
    false: --grad-reduce-in-bf16, as Megatron-Bridge's MoE performance recipes run), cross_entropy
    (:data:`CROSS_ENTROPY`; the paper's stack fuses it, app:training-stack), shared_expert_overlap
    (--moe-shared-expert-overlap: the shared expert runs under the routed exchange; the all-gather dispatcher
    never overlaps it), a2a_overlap (--overlap-moe-expert-parallel-comm with --delay-wgrad-compute: each
    micro-batch's MoE-layer forward runs merged with another's backward, the one's all-to-alls under the other's
    compute, estimator/ep_overlap.py; Megatron-Core allows it with the all-to-all and flex dispatchers and without
    --moe-shared-expert-overlap), nan_check (--check-for-nan-in-loss-and-grad, Megatron-LM's default: the loss
    function reads each micro-batch's loss on the host, a device sync that exposes the LM head's forward;
    Megatron-Bridge's performance recipes turn it off, utils/overrides.py), router_dtype (:data:`ROUTER_DTYPES`: the
    dtype of the routing probabilities the experts' outputs and biases are weighted by), recompute_modules (what the layout's ``selective`` checkpointing recomputes,
    Megatron-Core's --recompute-modules; None: core_attn, its default; ``super-selective`` stays core_attn,
    layernorm and moe_act whatever this says).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    experts: Experts = "grouped"
    grouped_gemm: GroupedGemm = "per_expert"
    permute_fusion: bool = False
    router_fusion: bool = False
    dispatcher: Dispatcher = "alltoall"
    cuda_graphs: tuple[GraphModule, ...] = ()
    fp8_recipe: Fp8Recipe | None = None
    fp8_param: bool = False
    grads_fp32: bool = True
    cross_entropy: CrossEntropy = "native"
    shared_expert_overlap: bool = True
    a2a_overlap: bool = False
    nan_check: bool = True
    router_dtype: RouterDtype = "fp32"
    recompute_modules: tuple[RecomputeModule, ...] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Stack:
        for name in ("cuda_graphs", "recompute_modules"):
            mods = getattr(self, name) or ()
            if len(set(mods)) != len(mods):
                raise FieldCheck(name, list(mods), "each module at most once")
        if "moe_preprocess" in self.cuda_graphs and "moe_router" not in self.cuda_graphs:
            raise FieldCheck("cuda_graphs", list(self.cuda_graphs), "moe_preprocess only together with moe_router")
        if {"moe", "moe_router"} <= set(self.cuda_graphs):  # core_v0.19.0 TransformerConfig.__post_init__
            raise FieldCheck("cuda_graphs", list(self.cuda_graphs), "moe or moe_router, not both (Megatron-Core)")
        if "moe_router" in self.cuda_graphs and "moe" in (self.recompute_modules or ()):
            raise FieldCheck("recompute_modules", list(self.recompute_modules or ()), "without moe while moe_router "
                             "is captured (Megatron-Core refuses moe recompute with the router's CUDA graph)")
        if self.a2a_overlap and self.shared_expert_overlap:
            raise FieldCheck("a2a_overlap", True, "true only with shared_expert_overlap: false (Megatron-Core "
                             "refuses --overlap-moe-expert-parallel-comm with --moe-shared-expert-overlap)")
        if self.a2a_overlap and self.dispatcher == "allgather":
            raise FieldCheck("a2a_overlap", True, "true only with the alltoall, deepep or hybridep dispatcher "
                             "(Megatron-Core: --moe-token-dispatcher-type alltoall or flex)")
        if self.a2a_overlap and "moe" in (self.recompute_modules or ()):
            raise FieldCheck("a2a_overlap", True, "true only without moe in recompute_modules (Megatron-Core "
                             "refuses to recompute the MoE block under --overlap-moe-expert-parallel-comm)")
        if self.captures_step():
            _check_full_iteration(self)
        if self.grouped_gemm == "grouped" and self.experts != "grouped":
            raise FieldCheck("grouped_gemm", "grouped", "grouped only with experts: grouped (TE GroupedLinear)")
        return self

    def captures_step(self) -> bool:
        """Whether the whole forward-backward step replays as one CUDA graph (cuda_graphs: full_iteration): the host
        issues no kernel of it one by one and reads nothing back from the device inside it."""
        return "full_iteration" in self.cuda_graphs

    def recipe(self, precision: str) -> str | None:
        """The FP8 recipe the time and memory models cost: this stack's, the default for an FP8 model, or
        None when the model does not run FP8 GEMMs."""
        return (self.fp8_recipe or DEFAULT_FP8_RECIPE) if precision == "fp8" else None

    def router_bytes(self, act_bytes: float) -> float:
        """Bytes of one router logit, score or routing probability: 4 or 8 under --moe-router-dtype fp32 / fp64,
        else (``model``) the activations' ``act_bytes`` (the router's GEMM runs in its input's dtype)."""
        return float(act_bytes if self.router_dtype == "model" else BYTES_PER_ELEMENT[self.router_dtype])

    def selective_modules(self) -> tuple[str, ...]:
        """The modules the layout's ``selective`` checkpointing recomputes: :attr:`recompute_modules`, or
        Megatron-Core's default (core_attn) when it is None."""
        return ("core_attn",) if self.recompute_modules is None else tuple(self.recompute_modules)

    def overlaps_shared_expert(self) -> bool:
        """Whether the shared expert runs under the routed exchange (--moe-shared-expert-overlap, which
        Megatron-Core allows with the all-to-all and flex dispatchers only)."""
        return self.shared_expert_overlap and self.dispatcher != "allgather"

    def key(self, precision: str = "bf16") -> str:
        """The stack as one canonical string: "megatron" for the paper's stack in bf16, else "megatron" and its
        departures from it in field order ("megatron[grouped_gemm=grouped,fp8_recipe=mxfp8]"). A
        calibration carries it and applies only to plans of the same key. An FP8 model always names its
        recipe (its GEMMs launch the recipe's quantize kernels, so a bf16 run's calibration is not its own);
        another precision never does."""
        parts = []
        for name, default in _DEFAULTS.items():
            v = self.recipe(precision) if name == "fp8_recipe" else getattr(self, name)
            if v != default:
                parts.append(f"{name}={'+'.join(v) or 'none' if isinstance(v, tuple) else str(v).lower()}")
        return "megatron" + (f"[{','.join(parts)}]" if parts else "")


def _check_full_iteration(stack: Stack) -> None:
    """Megatron-LM's rules for --cuda-graph-impl full_iteration (core_v0.19.0 arguments.py): no per-layer modules
    beside it, the loss's NaN check off (it reads the loss on the host); and a capture holds no host read of the
    token counts, which every dispatcher but HybridEP makes (estimator/dispatch.HOST_SYNCS: HybridEP sizes its
    buffers on the host under --moe-expert-rank-capacity-factor, as Megatron-Bridge's full-iteration recipes set
    it). Raises FieldCheck."""
    if stack.cuda_graphs != ("full_iteration",):
        raise FieldCheck("cuda_graphs", list(stack.cuda_graphs), "full_iteration alone (Megatron-LM: "
                         "--cuda-graph-modules must be empty with --cuda-graph-impl full_iteration)")
    if stack.nan_check:
        raise FieldCheck("nan_check", True, "false with cuda_graphs full_iteration (Megatron-LM asserts "
                         "--no-check-for-nan-in-loss-and-grad: the check reads the loss on the host)")
    if stack.dispatcher != "hybridep":
        raise FieldCheck("dispatcher", stack.dispatcher, "hybridep with cuda_graphs full_iteration (the others read "
                         "the token counts on the host, which a captured step cannot)")


PAPER_STACK = Stack()
_DEFAULTS = {name: getattr(PAPER_STACK, name) for name in Stack.model_fields}


def check_for_model(stack: Stack, precision: str, capacity_factor: float | None, *, mla: bool = False,
                    shared_expert: bool = False, dense_block: bool = True) -> None:
    """Cross-field rules between the stack and the model. Raises SpecError (one line): an FP8 recipe or FP8
    weights on a model that is not FP8; the grouped GEMM kernel with a recipe TE runs per expert; a captured
    MoE layer ("moe") without a capacity factor (Megatron-Core captures whole MoE layers only when they drop
    and pad: CudaGraphModule.moe); a captured dense MLP ("mlp") on a model without a dense block; a recompute
    module Megatron-Core refuses for this model and stack (:func:`check_recompute`). ``mla``: the model has
    multi-latent attention; ``shared_expert``: a shared expert; ``dense_block``: a block without experts."""
    if precision != "fp8" and stack.fp8_recipe is not None:
        raise SpecError("stack.fp8_recipe", stack.fp8_recipe, "set only with model.precision fp8")
    if precision != "fp8" and stack.fp8_param:
        raise SpecError("stack.fp8_param", True, "true only with model.precision fp8")
    if stack.grouped_gemm == "grouped" and stack.recipe(precision) in ("delayed", "blockwise"):
        raise SpecError("stack.grouped_gemm", "grouped", f"per_expert with the {stack.recipe(precision)} recipe: "
                        "TE's grouped-tensor path runs bf16, tensorwise and mxfp8 only and falls back to one GEMM "
                        "per expert otherwise (is_module_grouped_tensor_path_supported)")
    if "mlp" in stack.cuda_graphs and not dense_block:  # core_v0.19.0: "mlp cuda graph is only supported for dense"
        raise SpecError("stack.cuda_graphs", "mlp", "a capture of dense MLPs needs a dense block (model.moe."
                        "first_dense_layers > 0 or moe_frequency > 1); capture moe_router and moe_preprocess instead")
    if "moe" in stack.cuda_graphs and (capacity_factor is None or capacity_factor == 1.0):
        raise SpecError("stack.cuda_graphs", "moe", "a whole MoE layer is captured only with drop-and-pad "
                        "(model.moe.capacity_factor != 1); capture moe_router and moe_preprocess instead")
    check_recompute(stack, precision, mla, shared_expert)


def check_recompute(stack: Stack, precision: str, mla: bool, shared_expert: bool) -> None:
    """Megatron-Core's rules for --recompute-modules (core_v0.19.0 TransformerConfig.__post_init__), one-line
    SpecError: moe_act needs grouped-GEMM experts, mla_up_proj multi-latent attention; moe_act and layernorm
    refuse delayed FP8 scaling; shared_experts refuses --moe-shared-expert-overlap (and needs a shared expert)."""
    mods, field = stack.recompute_modules or (), "stack.recompute_modules"
    if "moe_act" in mods and stack.experts != "grouped":
        raise SpecError(field, "moe_act", "with experts: grouped only (Megatron-Core: only with --moe-grouped-gemm)")
    if "mla_up_proj" in mods and not mla:
        raise SpecError(field, "mla_up_proj", "only for a model with multi-latent attention (model.mla)")
    if stack.recipe(precision) == "delayed" and {"moe_act", "layernorm"} & set(mods):
        raise SpecError(field, sorted({"moe_act", "layernorm"} & set(mods)),
                        "without moe_act and layernorm under delayed FP8 scaling (Megatron-Core refuses them)")
    if "shared_experts" in mods and not shared_expert:
        raise SpecError(field, "shared_experts", "only for a model with a shared expert")
    if "shared_experts" in mods and stack.overlaps_shared_expert():
        raise SpecError(field, "shared_experts", "with shared_expert_overlap: false only (Megatron-Core refuses "
                        "shared-expert recompute with --moe-shared-expert-overlap)")


def parse_stack(text: str, base: Stack | None = None, field: str = "--stack") -> Stack:
    """``fp8_recipe=mxfp8,grouped_gemm=grouped,cuda_graphs=attn+moe_router`` into a :class:`Stack` (keys not
    given keep ``base``'s values; booleans true/false; module lists joined by '+'). Raises SpecError naming
    the unknown key or the bad value."""
    values = dict((base or PAPER_STACK).model_dump())
    for part in filter(None, (s.strip() for s in text.split(","))):
        key, sep, val = (x.strip() for x in part.partition("="))
        if not sep or key not in Stack.model_fields:
            raise SpecError(field, part, f"key=value with key in {', '.join(Stack.model_fields)}")
        if isinstance(_DEFAULTS[key], bool):
            if val.lower() not in ("true", "false"):
                raise SpecError(f"{field} {key}", val, "true or false")
            values[key] = val.lower() == "true"
        elif key in ("cuda_graphs", "recompute_modules"):
            values[key] = tuple(m for m in val.split("+") if m and m != "none")
        else:
            values[key] = None if val == "none" and key == "fp8_recipe" else val
    try:
        return Stack(**values)
    except ValidationError as err:
        e = err.errors()[0]
        check = (e.get("ctx") or {}).get("error")
        if isinstance(check, FieldCheck):
            raise SpecError(f"{field} {check.field}", check.value, str(check)) from None
        where = ".".join(str(x) for x in e["loc"][:1])
        raise SpecError(f"{field} {where}".strip(), e.get("input") if where else text,
                        e["msg"].removeprefix("Value error, ")) from None


def spec_stack_key(spec: dict) -> str:
    """:meth:`Stack.key` of a stored spec mapping (an observed run's): its ``stack`` block (absent: the
    paper's) under its model precision. A block that no longer parses raises SpecError."""
    model = spec.get("model") if isinstance(spec, dict) else None
    precision = model.get("precision", "bf16") if isinstance(model, dict) else "bf16"
    block = spec.get("stack") or {}
    try:
        return Stack(**block).key(precision)
    except (ValidationError, TypeError) as e:
        raise SpecError("spec.stack", block, f"a stack block ({str(e).splitlines()[0]})") from None


def stack_from_key(key: str, field: str = "--stack") -> Stack:
    """The :class:`Stack` a :meth:`Stack.key` names ("megatron" or "megatron[k=v,...]"). Raises SpecError for
    a string that is not such a key."""
    text = key.strip()
    if text == "megatron":
        return PAPER_STACK
    if not (text.startswith("megatron[") and text.endswith("]")):
        raise SpecError(field, key, 'a stack key: "megatron" or "megatron[key=value,...]" (as `calibrate list` '
                        "prints it)")
    return parse_stack(text[len("megatron["):-1], field=field)
