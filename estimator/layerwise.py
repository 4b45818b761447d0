"""How Megatron-Core's layer-wise distributed optimizer (muon, scion) returns the updated parameters:
one broadcast per parameter tensor, not a bucketed all-gather.

``LayerWiseDistributedOptimizer`` (megatron/core/optimizer/layer_wise_optimizer.py, 2025) assigns
whole parameter tensors to DP ranks, steps only its own, and then "all-gathers" the updated
parameters through a broadcast loop: for every owner rank, for every tensor it owns,
``torch.distributed.broadcast(p, owner, group)`` over the DP x CP group (dense tensors) or the
expert-DP group (routed-expert tensors). Every rank takes part in every broadcast, one NCCL call per
tensor, and nothing overlaps them (they run after the step, before the next forward). So a step pays
one collective call per parameter tensor of its stage: its fixed cost (the latency floor of a
multi-node ring, about 0.2-0.4 ms per call on the recorded B200 tables at 4-32 ranks) times the
tensor count, which grows with the layers per stage and, through Transformer Engine's grouped
linear (one ``weight{i}`` parameter per local expert), with the local experts. The bucketed
all-gather that ZeRO-1 runs pays that fixed cost once per 40M-parameter bucket.

This module lists the tensors (:func:`stage_tensors`); :func:`scaleplan.estimator.comm.dp_comm_time`
times them. A broadcast of S bytes moves S over each link of the ring, as an all-gather of
S n / (n - 1) bytes (nccl-tests convention) does, so each call is read from the all-gather table at
that size (busbw invariance across the two collectives of one ring).

Megatron-Core module parameters per transformer block (Transformer Engine layer spec, no biases):
``linear_qkv.weight`` (with the output-gate columns) and its fused ``layer_norm_weight``,
``linear_proj.weight``, the pre-MLP norm (``pre_mlp_layernorm`` or the dense MLP's fused
``linear_fc1.layer_norm_weight``); an MoE block adds ``router.weight`` and the shared expert's
``linear_fc1`` / ``linear_fc2``, a dense block has its MLP's ``linear_fc1`` / ``linear_fc2``; each
local routed expert has its own ``linear_fc1.weight{i}`` and ``linear_fc2.weight{i}``. The first
stage holds the word embedding, the last the final norm and the LM head (or a tied copy).
"""
from __future__ import annotations

import numpy as np
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.model_dims import Geometry, vocab_shard
from scaleplan.estimator.params import stage_params
from scaleplan.estimator.shapes import StageCounts, local_experts

Tensors = list[tuple[np.ndarray, np.ndarray]]  # [(tensors per rank, elements per tensor)], arrays over plans


def stage_tensors(g: Geometry, lay: ParallelLayout,
                  stage: StageCounts | np.ndarray | float = 0.0) -> tuple[Tensors, Tensors]:
    """The parameter tensors one rank of the pipeline stage whose blocks ``stage`` counts holds, as (dense,
    routed experts): each a list of (count, elements per tensor), arrays over plans (module docstring for
    the list). Dense tensors are split over TP (the vocabulary over TP as Megatron pads it), expert tensors
    over ETP: each of the E / EP local experts per MoE block keeps its own fc1 and fc2 tensor, 1/ETP of
    the expert's weights (:func:`~scaleplan.estimator.shapes.local_experts`). ``stage``: its
    :class:`~scaleplan.estimator.shapes.StageCounts`, or a stage index."""
    p = stage_params(g, lay, stage)
    tp = lay.tp.astype(float)
    d = np.asarray(g.d, dtype=float)
    proj = d * g.nq * g.hd
    qkv = np.asarray(g.attn_params, dtype=float) - proj - 2 * d  # Q, K, V and the gate columns
    dense: Tensors = [(2 * p.n_layers + p.has_head, d),  # two norms per block, the final norm
                      (p.n_layers, qkv / tp), (p.n_layers, proj / tp),
                      (p.n_vocab, vocab_shard(g.vocab, lay.tp) * d)]
    experts: Tensors = []
    if g.is_moe:
        router = np.asarray(g.E, dtype=float) * d
        shared = np.asarray(g.moe_dense_params, dtype=float) - router
        dense += [(p.n_moe, router)]
        if g.has_shared:
            dense += [(p.n_moe, (shared - d * g.dsh) / tp), (p.n_moe, d * g.dsh / tp)]
        e_loc = local_experts(g, lay)
        per_expert = np.asarray(g.expert_params, dtype=float) / g.E
        experts = [(p.n_moe * e_loc, (per_expert - d * g.dexp) / lay.etp), (p.n_moe * e_loc, d * g.dexp / lay.etp)]
    mlp = np.asarray(g.dense_mlp_params, dtype=float)
    dense += [(p.n_dense, (mlp - d * g.dff) / tp), (p.n_dense, d * g.dff / tp)]
    return dense, experts
