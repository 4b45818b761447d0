"""Parameters one rank of a pipeline stage holds (:class:`StageParams`): what its DP collectives reduce
(:mod:`comm`), its optimizer steps (:mod:`optimizer`) and its memory stores (:mod:`memory`).

Where Megatron-Core puts them: a stage holds the blocks :mod:`~scaleplan.estimator.shapes` counts for it
(:class:`~scaleplan.estimator.shapes.StageCounts`: its dense and MoE blocks); the input embedding sits on the first stage, the LM head
(``output_layer``) and the final norm on the last. With tied embeddings and PP > 1 the last stage keeps
a copy of the embedding for the LM head (its gradient is all-reduced with the first stage's); with one
stage a tied model holds one matrix, an untied one two. Both are Megatron's padded vocabulary
(:func:`scaleplan.estimator.model_dims.vocab_shard`), split over TP. Attention, the dense and shared MLPs and
the router are split over TP, the routed experts over EP x ETP; the final norm is replicated.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.model_dims import Geometry, vocab_shard
from scaleplan.estimator.shapes import StageCounts, as_stage, stage_counts


@dataclass(frozen=True)
class StageParams:
    """Per rank of pipeline stage s (arrays over plans; counts of parameters or blocks)."""

    n_layers: np.ndarray  # blocks on the stage
    n_dense: np.ndarray   # dense blocks on the stage
    n_moe: np.ndarray     # MoE blocks on the stage
    n_vocab: np.ndarray   # V_loc x d matrices on the stage: embedding, LM head (or its tied copy)
    has_embedding: np.ndarray  # bool: the first stage
    has_head: np.ndarray       # bool: the last stage (LM head, final norm, loss)
    dense: np.ndarray     # parameters outside the routed experts (attention, MLPs, router, vocabulary, norm)
    experts: np.ndarray   # routed-expert parameters
    router: np.ndarray    # the routers' parameters (E x d per MoE block), inside ``dense``

    @property
    def total(self) -> np.ndarray:
        return self.dense + self.experts


def stage_params(g: Geometry, lay: ParallelLayout, stage: StageCounts | np.ndarray | float = 0.0) -> StageParams:
    """:class:`StageParams` of one rank of the pipeline stage whose blocks ``stage`` counts (arrays over
    the plans of ``lay``; a :class:`~scaleplan.estimator.shapes.StageCounts`, or a stage index)."""
    stage = as_stage(g, lay, stage)
    pp = lay.pp.astype(float)
    nd, nm, n_l = stage.n_dense, stage.n_moe, stage.n_layers
    first, last = np.asarray(stage.has_embedding, bool), np.asarray(stage.has_head, bool)
    # MTP layers on the last stage (counted among its blocks) also read the input embedding: a copy there when
    # PP > 1 and the head is not already one
    mtp_emb = (np.asarray(g.mtp) > 0) & (pp > 1) & (not g.tie)
    n_vocab = first * 1.0 + np.where(last & ((not g.tie) | (pp > 1)), 1.0, 0.0) + np.where(last & mtp_emb, 1.0, 0.0)
    V_loc = vocab_shard(g.vocab, lay.tp)
    dense = ((n_l * g.attn_params + nd * g.dense_mlp_params + nm * g.moe_dense_params) / lay.tp
             + n_vocab * V_loc * g.d + np.where(last, g.d + g.mtp * g.mtp_extra_params / lay.tp, 0.0))
    experts = nm * g.expert_params / (lay.ep * lay.etp)  # E / EP local experts, each 1/ETP of its weights
    router = nm * g.E * g.d if g.is_moe else np.zeros_like(nm)
    shape = np.shape(dense)
    return StageParams(n_l * np.ones(shape), nd * np.ones(shape), nm * np.ones(shape), n_vocab * np.ones(shape),
                       first & np.ones(shape, bool), last & np.ones(shape, bool), dense, experts, router)


def dp_stages(g: Geometry, lay: ParallelLayout) -> list[tuple[np.ndarray, StageCounts]]:
    """The pipeline stages whose DP traffic or optimizer step can be the exposed part of a step, as
    (present, the stage's blocks) per stage (arrays over plans): the first stage (s = 0), the first middle
    one (s = 1, PP > 2: the middle stage with the shortest drain) and the last (s = PP - 1, PP > 1). After a
    stage's last backward the 1F1B drain still runs s backward passes of the stages before it (the first
    stage finishes the step last): what the stage's DP traffic has left then hides behind them; a ZeRO-1
    parameter all-gather behind as many forward passes of the next step's fill. With VPP-way
    interleaving each of those passes is one chunk, 1/VPP of a stage's."""
    pp = lay.pp.astype(float)
    return [(np.ones(pp.shape, bool), stage_counts(g, lay, np.zeros(pp.shape))),
            (pp > 2, stage_counts(g, lay, np.where(pp > 2, 1.0, 0.0))),
            (pp > 1, stage_counts(g, lay, pp - 1))]
