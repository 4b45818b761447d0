"""Megatron-Core's ``--recompute-modules`` (the layout's ``selective`` checkpointing on a stack that names them,
scaleplan/stack.py): per module, the saved tensors it frees (names of estimator.memory.block_activation_terms)
and the forward work it re-runs in the backward. Read from core_v0.19.0 (transformer_config.recompute_modules,
transformer_layer.py, moe/experts.py, multi_latent_attention.py, tensor_parallel/random.py).

Two kinds of checkpoint: ``core_attn``, ``mlp``, ``moe`` and ``shared_experts`` wrap their module in
tensor_parallel.checkpoint (the module's inputs are kept, everything it saves inside is not); ``layernorm``,
``moe_act`` and ``mla_up_proj`` run under CheckpointWithoutOutput, which discards the output's storage once its
consumers have run, even though they saved it, and rebuilds it before their backward.

* core_attn: the attention kernel's log-sum-exp and what it saves beyond its inputs (the 'core' terms, as
  the ``selective`` mode without modules). Re-runs the SDPA forward.
* layernorm: the separate norms' outputs and statistics. Transformer Engine's layer specs fuse the attention
  norm into the QKV projection (LayerNormLinear) and a dense block's MLP norm into fc1, so only a MoE block's
  pre-MLP norm is separate (its output is the router's, the dispatcher's and the shared expert's input), and
  with multi-latent attention the input norm too. Megatron-Core keeps the pre-MLP norm's output when the
  router and preprocess are captured in CUDA graphs unless the dispatcher is the all-to-all
  (transformer_layer.can_recompute_pre_mlp_layernorm_for_cudagraph): the graph's static buffer holds it.
  Re-runs one RMSNorm forward per separate norm.
* moe_act: the routed experts' activation output (fc2's input; an FP8 fc2 keeps its own copy) and what an
  unfused activation keeps. Re-runs the routed SwiGLU.
* mlp: a dense block's MLP from its input on: fc1's saved input, its output, the activation, fc2's input and
  the fused norm's statistics. Re-runs the dense MLP forward.
* moe: a MoE block from the pre-MLP norm's output on: router, permutation, routed experts and shared expert,
  all-to-all included (the dispatcher's host sync runs again). Re-runs the whole MoE forward.
* shared_experts: the shared expert's fc1 output, activation and fc2 input. Re-runs the shared expert.
* mla_up_proj: the up-projected, rotated query, key and value. Re-runs the up-projection GEMMs and RoPE.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scaleplan.stack import Stack


@dataclass(frozen=True)
class Selective:
    """A stack's selective checkpointing: its recompute ``modules`` and whether CUDA graphs keep the pre-MLP
    norm's output (:func:`graphs_keep_pre_mlp_norm`)."""

    modules: tuple[str, ...]
    graphs_keep_norm: bool = False

    @classmethod
    def of(cls, stack: Stack) -> Selective | None:
        """The stack's (scaleplan.stack.Stack), or None where it names no modules (selective is core_attn)."""
        if stack.recompute_modules is None:
            return None
        return cls(tuple(stack.recompute_modules), graphs_keep_pre_mlp_norm(stack.cuda_graphs, stack.dispatcher))

# saved-tensor names (estimator.memory: block_activation_terms, _moe_terms, _mla_terms) each module frees, with
# the share of the term freed (norm_stats holds two norms' statistics)
_MOE_PART = ("router_in_fp32", "router_weight", "router_logits_scores", "router_topk", "expert_in",
             "expert_fc1_out", "expert_act_out", "expert_fc2_in", "expert_out", "expert_probs_in", "permute_idx",
             "shared_fc1_out", "shared_act_out", "shared_fc2_in", "expert_clamp_out")
FREES_MOE = {
    "layernorm": {"ffn_in": 1.0, "norm_stats": 0.5},
    "moe_act": {"expert_act_out": 1.0, "expert_probs_in": 1.0, "expert_fc2_in": 1.0, "expert_clamp_out": 1.0},
    "moe": dict.fromkeys(_MOE_PART, 1.0),
    "shared_experts": {"shared_fc1_out": 1.0, "shared_act_out": 1.0, "shared_fc2_in": 1.0},
    "mla_up_proj": {"mla_qkv": 1.0},
}
FREES_DENSE = {
    "mlp": {"ffn_in": 1.0, "fc1_out": 1.0, "act_out": 1.0, "fc2_in": 1.0, "norm_stats": 0.5},
    "mla_up_proj": {"mla_qkv": 1.0},
}
MLA_INPUT_NORM = {"qkv_in": 1.0, "norm_stats": 0.5}  # layernorm under MLA: the separate input norm as well
# kernels issued per layer and micro-batch in forward-pass units (estimator/ckpt.py's unit) each module adds:
# core_attn, layernorm and moe_act 0.1 each, so that core_attn (selective) is 3.1 and the three together
# (super-selective) 3.3 as the law counts them; a whole MoE block and a dense MLP by their share of a layer's
# forward launches (estimator/kernel_counts.py: moe_forward_share, dense_mlp_forward_share)
SMALL_MODULE_UNITS = 0.1


def frees(modules: Iterable[str], is_moe: bool, recipe: str | None = None, mla: bool = False,
          graphs_keep_norm: bool = False) -> dict[str, float]:
    """{saved-tensor name: share freed} of ``modules`` in a MoE block (``is_moe``) or a dense one; the 'core'
    terms of core_attn are the caller's (their tag). ``recipe``: the FP8 recipe (an FP8 fc2 keeps its own copy of
    its input under moe_act); ``mla``: the model has multi-latent attention; ``graphs_keep_norm``: CUDA graphs
    keep the pre-MLP norm's output (module docstring)."""
    table = FREES_MOE if is_moe else FREES_DENSE
    out: dict[str, float] = {}
    for m in modules:
        part = dict(table.get(m, {}))
        if m == "layernorm" and is_moe and graphs_keep_norm:
            part = {}
        if m == "moe_act" and recipe is not None:
            part.pop("expert_fc2_in", None)
        if m == "layernorm" and mla:
            part = {**part, "norm_stats": part.get("norm_stats", 0.0) + 0.5, "qkv_in": 1.0}
        for name, share in part.items():
            out[name] = min(out.get(name, 0.0) + share, 1.0)
    return out


def graphs_keep_pre_mlp_norm(cuda_graphs: Iterable[str], dispatcher: str) -> bool:
    """Whether Megatron-Core keeps the pre-MLP norm's output under layernorm recompute because the router is
    captured in a CUDA graph (transformer_layer.can_recompute_pre_mlp_layernorm_for_cudagraph: it recomputes it
    only with the preprocess captured too and the all-to-all dispatcher)."""
    graphs = set(cuda_graphs)
    return "moe_router" in graphs and not ("moe_preprocess" in graphs and dispatcher == "alltoall")


def kernel_units(modules: Iterable[str], moe_share: float, mlp_share: float) -> float:
    """Forward-pass units of kernels ``modules`` re-run per layer and micro-batch (estimator/ckpt.py's unit):
    :data:`SMALL_MODULE_UNITS` for each small module, a MoE block's and a dense MLP's share of a layer's forward
    launches for moe and mlp."""
    units = 0.0
    for m in modules:
        units += moe_share if m == "moe" else mlp_share if m == "mlp" else SMALL_MODULE_UNITS
    return units
