"""MoE geometry: layer shapes and parameter counts, in one place.

Used by the estimator, the reference model and the MOSAIC search alike. The architecture is the
paper's (sec:training-setup, sec:train_recipe): pre-norm decoder blocks; GQA attention with a
head-wise sigmoid output gate (a d x n_head projection); the first ``first_dense_layers`` blocks
carry a dense SwiGLU FFN of width d_ff; every other block an MoE layer with E routed SwiGLU
experts of width d_expert, optionally one always-on shared expert, and a router W_r in R^{E x d}.

Parameter counts (all in parameters, not bytes):
  N_tot  total non-embedding parameters (model capacity, the scaling law's N_tot),
  N_act  non-embedding parameters one token activates (the scaling law's N),
  S      = 1 - N_act / N_tot (tab:symbols),
  G      = d_ff / d_expert (eq:granularity).
Every function accepts numpy arrays (broadcasting) as well as scalars, so the search can evaluate
thousands of geometries at once.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scaleplan.specs import ModelBlock, MoESpec

DEFAULT_VOCAB = 257_536
DEFAULT_KV_HEADS = 8
LADDER_M = 4
HEAD_DIM = 128
FFN_MULT = 2.5


def gate_columns(n_heads, head_dim, gate=True):
    """Output columns of the attention output gate (spec ``model.attn_gate``): 0 without a gate, n_heads for the
    paper's head-wise gate (true), n_heads * head_dim for Megatron-LM's element-wise gate ("element")."""
    if gate == "element":
        return n_heads * head_dim
    return n_heads if gate else 0


def attention_params(d, n_heads, n_kv_heads, head_dim, gate=True):
    """Q, K, V, O projections (at the attention width n_heads * head_dim, which may differ from d), the output
    gate (d x :func:`gate_columns`) and two norms."""
    qo = 2 * d * n_heads * head_dim
    kv = 2 * d * n_kv_heads * head_dim
    return qo + kv + d * gate_columns(n_heads, head_dim, gate) + 2 * d


def swiglu_params(d, width):
    """A SwiGLU MLP: gate and up (d x width each) plus down (width x d)."""
    return 3 * d * width


@dataclass(frozen=True)
class ParamCounts:
    n_tot: float
    n_act: float
    embedding: float  # input embedding + LM head (the head only when untied)

    @property
    def s(self) -> float:
        return 1.0 - self.n_act / self.n_tot


def param_counts(L, d, n_heads, n_kv_heads, head_dim, d_ff, E, K, d_expert, n_shared=1,
                 first_dense=1, vocab=DEFAULT_VOCAB, tie_embeddings=False, gate=True, moe_frequency=1):
    """Return (n_tot, n_act, n_embedding) for one or many geometries (numpy broadcasting).

    MoE layers: every ``moe_frequency``-th block after the ``first_dense`` dense blocks.
    n_embedding counts the input embedding and, when untied, the LM head (vocab x d each).
    """
    L = np.asarray(L)
    n_after = L - first_dense
    n_moe = n_after // moe_frequency if moe_frequency > 1 else n_after
    n_dense = L - n_moe
    attn = attention_params(d, n_heads, n_kv_heads, head_dim, gate)
    expert = swiglu_params(d, d_expert)
    shared = n_shared * expert
    router = E * d
    moe_tot = E * expert + shared + router
    moe_act = K * expert + shared + router
    dense = swiglu_params(d, d_ff)
    final_norm = d
    n_tot = L * attn + n_dense * dense + n_moe * moe_tot + final_norm
    n_act = L * attn + n_dense * dense + n_moe * moe_act + final_norm
    emb = vocab * d * (1 if tie_embeddings else 2)
    return n_tot, n_act, emb


def spec_param_counts(m: ModelBlock) -> ParamCounts:
    """Parameter counts of a validated spec's model block."""
    moe = m.moe
    if moe is None:  # a dense model: one "expert" of width d_ff, always on
        moe = MoESpec(n_experts=1, experts_per_token=1, expert_inter_sz=m.inter_sz, first_dense_layers=m.n_layers)
    n_shared = 1 if moe.shared_expert_inter_sz else 0
    # the shared expert may differ in width from a routed one: count it separately
    n_tot, n_act, emb = param_counts(
        m.n_layers, m.hidden_sz, m.n_q_heads, m.n_kv_heads, m.head_dim, m.inter_sz,
        moe.n_experts, moe.experts_per_token, moe.expert_inter_sz, n_shared=0,
        first_dense=moe.first_dense_layers, vocab=m.vocab_sz, tie_embeddings=m.tie_embeddings,
        gate=m.attn_gate, moe_frequency=moe.moe_frequency,
    )
    n_moe = moe_layer_count(m)
    shared = n_shared * swiglu_params(m.hidden_sz, moe.shared_expert_inter_sz)
    return ParamCounts(float(n_tot + n_moe * shared), float(n_act + n_moe * shared), float(emb))


def moe_layer_count(m: ModelBlock) -> int:
    """Number of MoE blocks in the model (0 for a dense model)."""
    if m.moe is None:
        return 0
    after = m.n_layers - m.moe.first_dense_layers
    return after // m.moe.moe_frequency if m.moe.moe_frequency > 1 else after


def ladder_dims(q, m=LADDER_M, head_dim=HEAD_DIM, ffn_mult=FFN_MULT):
    """Geometry ladder (sec:geometry-ladder): L = m q, n_head = m q, d = 128 n_head, d_ff = 2.5 d.

    Returns (L, n_head, d, d_ff) as integer arrays.
    """
    q = np.asarray(q)
    L = m * q
    n_head = m * q
    d = head_dim * n_head
    d_ff = (ffn_mult * d).astype(np.int64) if isinstance(d, np.ndarray) else int(ffn_mult * d)
    return L, n_head, d, d_ff


def ladder_model(q: int, E: int, K: int, G: int, vocab: int = DEFAULT_VOCAB,
                 kv_heads: int = DEFAULT_KV_HEADS, shared_expert: bool = True,
                 tie_embeddings: bool = False) -> ModelBlock:
    """A concrete model block for ladder seed q with E experts, top-K and split factor G.

    d_expert = d_ff / G (must be an integer); one shared expert of width d_expert; first block dense.
    Raises ValueError when d_ff is not divisible by G or kv_heads does not divide n_head.
    """
    L, n_head, d, d_ff = (int(x) for x in ladder_dims(q))
    if d_ff % G:
        raise ValueError(f"d_ff={d_ff} is not divisible by G={G}")
    d_exp = d_ff // G
    return ModelBlock(
        n_layers=L, hidden_sz=d, inter_sz=d_ff, n_q_heads=n_head, n_kv_heads=min(kv_heads, n_head),
        head_dim=HEAD_DIM, vocab_sz=vocab, tie_embeddings=tie_embeddings,
        moe=MoESpec(n_experts=E, experts_per_token=K, expert_inter_sz=d_exp,
                    shared_expert_inter_sz=d_exp if shared_expert else 0),
    )


def ladder_param_counts(q, E, K, G, vocab=DEFAULT_VOCAB, kv_heads=DEFAULT_KV_HEADS, shared_expert=True):
    """Vectorised (n_tot, n_act, n_embedding) over ladder geometries (arrays broadcast)."""
    L, n_head, d, d_ff = ladder_dims(q)
    d_exp = d_ff // np.asarray(G)
    kv = np.minimum(kv_heads, n_head)
    return param_counts(L, d, n_head, kv, HEAD_DIM, d_ff, E, K, d_exp,
                        n_shared=1 if shared_expert else 0, vocab=vocab)
