"""Scalar model geometry the time and memory models need, derived from a spec's model block.

Parameter counts come from :mod:`scaleplan.geometry` (the one place they are counted); this module
only adds per-layer shapes and the per-stage parameter split.
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, fields

import numpy as np
from numpy.typing import ArrayLike
from scaleplan.geometry import (
    block_params,
    gate_columns,
    is_moe_block,
    moe_layer_count,
    spec_param_counts,
    window_layer_count,
)
from scaleplan.specs import ModelBlock

# Megatron pads the vocabulary so the embedding splits evenly over TP ranks:
# padded = ceil(V / (128 * TP)) * 128 * TP (--make-vocab-size-divisible-by 128).
VOCAB_DIVISOR = 128


def padded_vocab(vocab: ArrayLike, tp: ArrayLike = 1) -> np.ndarray:
    """Megatron's padded vocabulary size (works on numpy arrays of TP)."""
    mult = VOCAB_DIVISOR * tp
    return -(-vocab // mult) * mult


def vocab_shard(vocab: ArrayLike, tp: ArrayLike) -> np.ndarray:
    """V_loc: the rows of the padded vocabulary one TP rank holds, pad(V, TP) / TP (float arrays of TP):
    its share of the embedding and the LM head, and the logits it computes."""
    tp = np.asarray(tp)
    return padded_vocab(vocab, tp.astype(np.int64)) / tp


@dataclass(frozen=True)
class Geometry:
    L: int            # transformer blocks
    d: int            # hidden
    nq: int           # query heads
    nkv: int          # kv heads
    hd: int           # head dim
    dff: int          # dense FFN width
    vocab: int
    tie: bool
    glu: bool
    gate: int         # output-gate columns per block: 0, nq (head-wise) or nq*hd (element-wise, Megatron-LM)
    E: int            # routed experts (1 for a dense model)
    K: int
    dexp: int         # routed expert width
    dsh: int          # shared expert width (0: none)
    n_dense: int      # dense blocks (the first blocks)
    n_moe: int        # MoE blocks
    precision: str
    n_act: float      # non-embedding active params (geometry)
    n_tot: float
    embedding: float  # input embedding + untied LM head
    attn_params: float      # per block
    dense_mlp_params: float
    moe_dense_params: float  # per MoE block: router + shared expert (replicated over EP)
    expert_params: float     # per MoE block: all routed experts (sharded over EP)
    capacity_factor: float = 1.0  # routed rows per expert relative to balanced routing (MoE block)
    sdpa_precision: str = "bf16"  # the dtype SDPA runs in (spec model.sdpa_precision)
    dropout: bool = False         # hidden dropout after attention and MLP, attention dropout in SDPA
    first_dense: int = -1         # dense blocks before the first MoE block (-1: the n_dense first blocks)
    moe_every: int = 1            # after them every moe_every-th block is an MoE block (--moe-layer-freq)
    # today's models (spec model.mla, sliding_window, mtp_layers, qk_norm, attention_sinks, linear_bias)
    hv: int = 0                   # value head width (0: head_dim; MLA's v_head_dim)
    kv_rank: int = 0              # MLA's key/value latent rank (0: GQA attention)
    q_rank: int = 0               # MLA's query latent rank (0: none, queries projected from d directly)
    rope_dim: int = 0             # MLA's rotary part of each q/k head (the rest carries no position)
    qk_norm: int = 0              # elements per token the q/k norms normalise (0: none)
    window: int = 0               # sliding window W (tokens before each query; 0: full attention everywhere)
    window_share: float = 0.0     # the share of the blocks that slide (model.sliding_window's pattern)
    mtp: int = 0                  # multi-token prediction layers (on the last pipeline stage)
    mtp_moe: bool = False         # an MTP layer's block is an MoE block (the last block's kind)
    mtp_extra_params: float = 0.0  # per MTP layer beyond its block: 2 norms, the 2d x d projection, a norm
    bias: str = "none"            # linear biases: none, qkv, all (their gradient reductions are costed)
    sinks: bool = False           # a learned softmax logit per head (no time: one more column of the softmax)
    glu_clamp: bool = False       # the experts' GLU inputs clamped (GPT-OSS, model.swiglu_limit): an unfused pass

    @property
    def is_moe(self) -> bool:
        return self.n_moe > 0

    @property
    def v_dim(self) -> ArrayLike:
        """Width of a value head (and of the output projection's input per head): head_dim except MLA's."""
        return np.where(np.asarray(self.hv) > 0, self.hv, self.hd)

    @property
    def is_mla(self) -> bool:
        """Any plan's model has multi-latent attention (its attention GEMMs are MLA's)."""
        return bool(np.any(np.asarray(self.kv_rank) > 0))

    @property
    def has_gate(self) -> bool:
        """The blocks carry an output gate (``gate`` > 0)."""
        return self.gate > 0

    @property
    def dense_lead(self) -> ArrayLike:
        """The dense blocks before the MoE pattern starts (``first_dense``, else the n_dense first blocks)."""
        return np.where(np.asarray(self.first_dense) < 0, self.n_dense, self.first_dense)

    @property
    def has_shared(self) -> bool:
        """The MoE blocks carry a shared expert (``dsh`` > 0)."""
        return self.dsh > 0

    @property
    def batch_keys(self) -> tuple:
        """Columns (arrays over plans) that tell the plans' geometries apart: none for one geometry
        (:class:`GeometryBatch` has its per-plan geometry index); lookups made once per distinct tuple
        add them to their key."""
        return ()

    @property
    def dense_keys(self) -> tuple:
        """Like :attr:`batch_keys`, for the fields outside the MoE block (:data:`DENSE_FIELDS`): the
        attention, dense-MLP, TP/CP and vocabulary kernels are the same for geometries alike in them."""
        return ()

    def take(self, idx: ArrayLike) -> Geometry:
        """The geometry of the plans at ``idx``: one geometry serves every plan (GeometryBatch selects)."""
        return self

    @property
    def n_mfu_validation(self) -> float:
        """Parameters per token of the FLOP count the validation runs logged their MFU in
        (shared/validation/README.md: 6 N tokens, N every active parameter that multiplies a token:
        input embedding and untied LM head, attention Q K V O, dense MLPs, K routed experts and the
        shared expert; router and head-wise gate left out, which gives the README's N:
        tests/estimator/test_geometry_ladder.py).
        calibrate/flops.py's '6n' count; ``mfu`` is eq:mfu with N = N_act."""
        router = self.n_moe * self.E * self.d if self.is_moe else 0.0
        gate = self.L * self.d * self.gate
        return self.n_act + self.embedding - router - gate


def _features(m: ModelBlock) -> dict:
    """The Geometry fields of the model features beyond the paper's architecture (spec model.mla, ...)."""
    a, w = m.mla, m.sliding_window
    qk = 0
    if m.qk_norm:
        qk = ((a.q_lora_rank or 0) + a.kv_lora_rank) if a is not None else (m.n_q_heads + m.n_kv_heads) * m.head_dim
    return dict(hv=a.v_head_dim if a else 0, kv_rank=a.kv_lora_rank if a else 0,
                q_rank=(a.q_lora_rank or 0) if a else 0, rope_dim=a.qk_rope_head_dim if a else 0, qk_norm=qk,
                window=w.size if w else 0, window_share=window_layer_count(m) / m.n_layers,
                mtp=m.mtp_layers, mtp_moe=m.moe is not None and is_moe_block(m, m.n_layers - 1),
                mtp_extra_params=block_params(m).mtp_extra, bias=m.linear_bias, sinks=m.attention_sinks,
                glu_clamp=m.swiglu_limit is not None)


def geometry(m: ModelBlock) -> Geometry:
    pc, b = spec_param_counts(m), block_params(m)
    moe = m.moe
    n_moe = moe_layer_count(m)
    E = moe.n_experts if moe else 1
    K = moe.experts_per_token if moe else 1
    dexp = moe.expert_inter_sz if moe else m.inter_sz
    dsh = moe.shared_expert_inter_sz if moe else 0
    return Geometry(
        L=m.n_layers, d=m.hidden_sz, nq=m.n_q_heads, nkv=m.n_kv_heads, hd=m.head_dim, dff=m.inter_sz,
        vocab=m.vocab_sz, tie=m.tie_embeddings, glu=m.glu,
        gate=int(gate_columns(m.n_q_heads, m.head_dim, m.attn_gate)), E=E, K=K, dexp=dexp, dsh=dsh,
        n_dense=m.n_layers - n_moe, n_moe=n_moe, precision=m.precision,
        n_act=pc.n_act, n_tot=pc.n_tot, embedding=pc.embedding, attn_params=b.attention,
        dense_mlp_params=b.dense_mlp, moe_dense_params=b.router + b.shared if moe else 0.0,
        expert_params=E * b.expert if moe else 0.0,
        capacity_factor=float(moe.capacity_factor) if moe else 1.0,
        sdpa_precision=m.sdpa_precision, dropout=m.dropout,
        first_dense=moe.first_dense_layers if moe else -1, moe_every=moe.moe_frequency if moe else 1,
        **_features(m),
    )


#: the fields a batch holds once (the models branch on them), and the ones it holds per plan
STRUCTURE_FIELDS = ("tie", "glu", "precision", "sdpa_precision", "dropout", "bias", "sinks", "mtp_moe",
                    "glu_clamp")
PER_PLAN_FIELDS = tuple(f.name for f in fields(Geometry) if f.name not in STRUCTURE_FIELDS)
# per-plan fields with a class default: the default would answer a read before __getattr__ could gather them
DEFAULTED_FIELDS = tuple(f.name for f in fields(Geometry) if f.name in PER_PLAN_FIELDS and f.default is not MISSING)
#: the fields the kernels outside the MoE block read (attention, dense MLP, TP/CP, vocabulary)
DENSE_FIELDS = ("d", "nq", "nkv", "hd", "gate", "dff", "n_dense", "vocab", "hv", "kv_rank", "q_rank", "rope_dim",
                "qk_norm", "window", "window_share")


def structure(g: Geometry) -> tuple:
    """What the time and memory models branch on: geometries alike in it evaluate in one batch."""
    return tuple(getattr(g, f) for f in STRUCTURE_FIELDS) + (g.is_moe, g.has_gate, g.has_shared)


@dataclass(frozen=True)
class GeometryBatch(Geometry):
    """Several geometries of one :func:`structure` broadcast per plan, so the time and memory models
    evaluate every plan of every geometry in one pass (``Estimator.best_plans``).

    Each field of :data:`PER_PLAN_FIELDS` is an array of shape (P,): the value of the plan's geometry
    (same units as :class:`Geometry`), gathered from the geometries' values when first read (each level
    of an evaluation, every plan or each distinct degree tuple, reads a few of them); the
    :data:`STRUCTURE_FIELDS` and the flags ``is_moe``, ``has_gate``, ``has_shared`` hold one value for
    the batch. ``index`` (int, (P,)): the position of each plan's geometry in the list it was stacked
    from. Build with :meth:`stack`; :meth:`take` selects plans.
    """

    index: np.ndarray | None = None
    dense_index: np.ndarray | None = None  # (P,): the plan's geometry's rank among the batch's DENSE_FIELDS tuples
    moe: bool = False
    gated: bool = False
    shared: bool = False

    @classmethod
    def stack(cls, geoms: list[Geometry], index: np.ndarray) -> GeometryBatch:
        """Plan p gets ``geoms[index[p]]``. Raises ValueError when the geometries differ in structure."""
        kinds = {structure(g) for g in geoms}
        if len(kinds) != 1:
            raise ValueError(f"geometries of {len(kinds)} structures cannot share a batch: {sorted(map(str, kinds))}")
        table = {f: np.array([getattr(g, f) for g in geoms]) for f in PER_PLAN_FIELDS}
        dense = sorted({tuple(getattr(g, f) for f in DENSE_FIELDS) for g in geoms})
        rank = np.array([dense.index(tuple(getattr(g, f) for f in DENSE_FIELDS)) for g in geoms], dtype=np.int64)
        return cls._of(table, rank, np.asarray(index, dtype=np.int64), geoms[0])

    @classmethod
    def _of(cls, table: dict[str, np.ndarray], rank: np.ndarray, index: np.ndarray, like: Geometry) -> GeometryBatch:
        """The batch whose plan p has the geometry ``index[p]`` of the per-geometry values ``table`` (dense
        ranks ``rank``), the structure of ``like``. Only the fields with a class default (DEFAULTED_FIELDS)
        are gathered now; :meth:`__getattr__` gathers the others when read."""
        b = object.__new__(cls)
        attrs = {f: getattr(like, f) for f in STRUCTURE_FIELDS}
        attrs.update(index=index, dense_index=rank[index], moe=like.is_moe, gated=like.has_gate,
                     shared=like.has_shared, _table=table, _rank=rank)
        attrs.update({f: table[f][index] for f in DEFAULTED_FIELDS})
        for k, v in attrs.items():
            object.__setattr__(b, k, v)
        return b

    def __getattr__(self, name: str):
        """A per-plan field read for the first time: its geometries' values at ``index`` (kept)."""
        table = self.__dict__.get("_table")
        if table is None or name not in table:
            raise AttributeError(name)
        v = table[name][self.index]
        object.__setattr__(self, name, v)
        return v

    @property
    def is_moe(self) -> bool:
        return self.moe

    @property
    def has_gate(self) -> bool:
        return self.gated

    @property
    def has_shared(self) -> bool:
        return self.shared

    @property
    def batch_keys(self) -> tuple:
        return (self.index,)

    @property
    def dense_keys(self) -> tuple:
        return (self.dense_index,)

    def take(self, idx: ArrayLike) -> GeometryBatch:
        return GeometryBatch._of(self._table, self._rank, self.index[idx], self)
