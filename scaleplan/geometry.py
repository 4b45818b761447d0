"""MoE geometry: layer shapes and parameter counts, in one place.

Used by the estimator, the reference model and the MOSAIC search alike. The architecture is the
paper's (sec:training-setup, sec:train_recipe): pre-norm decoder blocks; GQA attention with a
head-wise sigmoid output gate (a d x n_head projection); the first ``first_dense_layers`` blocks
carry a dense SwiGLU FFN of width d_ff; every other block an MoE layer with E routed SwiGLU
experts of width d_expert, optionally one always-on shared expert, and a router W_r in R^{E x d}.

A spec's model may differ from the paper's: multi-latent attention, biases, q/k norms, attention sinks,
MTP layers, a sigmoid router; :func:`spec_param_counts` counts those from :func:`block_params`, the one place a
block's parameters are counted (megatron-core's GPTModel built from the emitted arguments has exactly these,
tests/cli/test_megatron_families.py). The vectorised ladder functions count the paper's architecture only.

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
    """Parameter counts of a model (parameters, not bytes).

    ``n_tot`` / ``n_act``: non-embedding parameters of the main model, all / one token's (N_tot, N); ``embedding``:
    the input embedding and, untied, the LM head (V x d each; ``vocab_matrix`` is one of them); ``mtp`` /
    ``mtp_act``: the multi-token prediction layers beyond the main model (they share its embedding and head), all /
    one token's. Model cards count the main model (DeepSeek-V3's 671B); a checkpoint also stores the MTP layers."""

    n_tot: float
    n_act: float
    embedding: float  # input embedding + LM head (the head only when untied)
    mtp: float = 0.0
    mtp_act: float = 0.0
    vocab_matrix: float = 0.0  # V x d

    @property
    def s(self) -> float:
        return 1.0 - self.n_act / self.n_tot


def param_counts(L, d, n_heads, n_kv_heads, head_dim, d_ff, E, K, d_expert, n_shared=1,
                 first_dense=1, vocab=DEFAULT_VOCAB, tie_embeddings=False, gate=True, moe_frequency=1):
    """Return (n_tot, n_act, n_embedding) for one or many ladder geometries (numpy broadcasting): the paper's
    architecture (GQA, SwiGLU, no biases). A spec's model with any other feature: :func:`spec_param_counts`.

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


@dataclass(frozen=True)
class BlockParams:
    """Parameters of the parts of one block of a spec's model (counts). ``attention``: the attention with its
    biases, q/k norms, sinks and the block's two norms; ``dense_mlp``: a dense block's MLP (d_ff); ``expert``:
    one routed expert; ``shared``: the shared expert (0: none); ``router``: the router (E x d, its bias);
    ``mtp_extra``: what an MTP layer has beyond its block (two input norms, the 2d x d projection, a final norm)."""

    attention: float
    dense_mlp: float
    expert: float
    shared: float
    router: float
    mtp_extra: float


def mlp_params(d, width, glu=True, bias=False):
    """A (gated) MLP d -> width -> d: two or three matrices; with biases, those of fc1 (2 width gated) and fc2."""
    mats = (3 if glu else 2) * d * width
    return mats + ((2 if glu else 1) * width + d if bias else 0)


def spec_attention_params(m: ModelBlock) -> float:
    """One block's attention (:class:`BlockParams`.attention) of a spec's model: GQA (Q, K, V, O at the attention
    width, the output gate) or MLA (q: d x q_lora_rank x heads*head_dim or d x heads*head_dim directly; kv: d x
    (kv_lora_rank + rope) down, kv_lora_rank x heads*(head_dim - rope + v_head_dim) up; O: heads*v_head_dim x d),
    Megatron-Core's module shapes (transformer/attention.py, multi_latent_attention.py)."""
    d, nq, nkv, hd = m.hidden_sz, m.n_q_heads, m.n_kv_heads, m.head_dim
    if m.mla is not None:
        a, qr, kvr, rope = m.mla, m.mla.q_lora_rank, m.mla.kv_lora_rank, m.mla.qk_rope_head_dim
        q = d * nq * hd if qr is None else d * qr + qr * nq * hd
        kv = d * (kvr + rope) + kvr * nq * (hd - rope + a.v_head_dim)
        proj = q + kv + nq * a.v_head_dim * d
        norms = ((qr or 0) + kvr) if m.qk_norm else 0
    else:
        gate = gate_columns(nq, hd, m.attn_gate)
        proj = 2 * d * nq * hd + 2 * d * nkv * hd + d * gate
        norms = {False: 0, True: 2 * hd, "projection": (nq + nkv) * hd}[m.qk_norm]
        qkv_cols = nq * hd + 2 * nkv * hd + (gate if m.attn_gate == "element" else 0)
        proj += {"none": 0, "qkv": qkv_cols, "all": qkv_cols + d}[m.linear_bias]
    return float(proj + norms + (nq if m.attention_sinks else 0) + 2 * d)


def block_params(m: ModelBlock) -> BlockParams:
    """:class:`BlockParams` of a spec's model block."""
    d, bias, moe = m.hidden_sz, m.linear_bias == "all", m.moe
    expert = mlp_params(d, moe.expert_inter_sz, m.glu, bias) if moe else 0
    shared = mlp_params(d, moe.shared_expert_inter_sz, m.glu, bias) if moe and moe.shared_expert_inter_sz else 0
    router = moe.n_experts * (d + (1 if bias else 0)) if moe else 0
    return BlockParams(spec_attention_params(m), float(mlp_params(d, m.inter_sz, m.glu, bias)), float(expert),
                       float(shared), float(router), float(3 * d + 2 * d * d))


def spec_param_counts(m: ModelBlock) -> ParamCounts:
    """Parameter counts of a validated spec's model block (:class:`ParamCounts`). The MTP layers are blocks of the
    last block's kind (Megatron-Core builds them from the decoder's last layer spec) with :class:`BlockParams`'s
    ``mtp_extra``; the expert bias is a buffer, not a parameter."""
    b, moe = block_params(m), m.moe
    n_moe = moe_layer_count(m)
    n_dense = m.n_layers - n_moe
    moe_tot = moe_act = 0.0
    if moe is not None:
        moe_tot = moe.n_experts * b.expert + b.shared + b.router
        moe_act = moe.experts_per_token * b.expert + b.shared + b.router
    base = m.n_layers * b.attention + n_dense * b.dense_mlp + m.hidden_sz  # + the final norm
    vocab = float(m.vocab_sz * m.hidden_sz)
    last_moe = n_moe > 0 and is_moe_block(m, m.n_layers - 1)
    mtp_tot = m.mtp_layers * (b.attention + b.mtp_extra + (moe_tot if last_moe else b.dense_mlp))
    mtp_act = m.mtp_layers * (b.attention + b.mtp_extra + (moe_act if last_moe else b.dense_mlp))
    return ParamCounts(float(base + n_moe * moe_tot), float(base + n_moe * moe_act),
                       vocab * (1 if m.tie_embeddings else 2), float(mtp_tot), float(mtp_act), vocab)


def is_moe_block(m: ModelBlock, i: int) -> bool:
    """Whether block ``i`` (0-based) is an MoE block: after the first_dense_layers dense ones, every
    moe_frequency-th (the last of each group of moe_frequency), as Megatron-LM's --moe-layer-freq list has it."""
    if m.moe is None or i < m.moe.first_dense_layers:
        return False
    return (i - m.moe.first_dense_layers + 1) % m.moe.moe_frequency == 0


def moe_layer_count(m: ModelBlock) -> int:
    """Number of MoE blocks in the model (0 for a dense model)."""
    if m.moe is None:
        return 0
    after = m.n_layers - m.moe.first_dense_layers
    return after // m.moe.moe_frequency if m.moe.moe_frequency > 1 else after


def window_layer_count(m: ModelBlock) -> int:
    """Blocks whose attention is the sliding window (model.sliding_window's pattern, repeated); 0 without one."""
    w = m.sliding_window
    return 0 if w is None else sum(w.pattern[i % len(w.pattern)] == "S" for i in range(m.n_layers))


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
