"""One plan, derived once: the per-rank shapes every cost reads.

:func:`plan_shapes` derives from a :class:`~scaleplan.estimator.layout.ParallelLayout` and the model's
:class:`~scaleplan.estimator.model_dims.Geometry` what one rank of each plan holds and processes: the
tokens of a micro-batch, the micro-batches of a step (n_mb), the local experts and their routed rows, the
vocabulary shard, and the blocks of each pipeline stage. The time model, the memory model, the optimizer,
calibrate trace, validate and the Megatron-LM arguments all read it; nothing else divides a model size by
a parallel degree (tests/structure/test_shapes_record.py).

**Experts (Megatron-Core's MoE parallel folding).** The routed experts live on their own mesh, EP x ETP x
EDP = TP x CP x DP ranks per stage: a rank holds E / EP local experts (``BaseMoELayer.num_local_experts =
num_moe_experts // ep_size``), each of them 1/ETP of the expert width (``TEGroupedMLP`` shards fc1 / fc2
over the expert-tensor-parallel group). After the all-to-all the ETP group all-gathers its tokens, so a
rank runs T K ETP / TP routed rows (balanced routing), and each local expert's tile is EP times the paper's
T B K / E: the local experts receive tokens from every EP rank (the paper keys the grouped GEMM on
T B K / E, "invariant to expert parallelism", which under-counts expert work by EP).

**Pipeline stages (Megatron-Core's ``get_num_layers_to_build`` and ``get_transformer_layer_offset``).** The
first and the last stage may hold their own layer counts; the PP - 2 middle stages share the rest evenly.
With VPP chunks each stage holds VPP chunks of 1/VPP of its layers, and the model runs VPP rounds: round v
is stage 0's chunk, then each middle stage's, then the last stage's. Which blocks are dense follows the
model's MoE layer pattern (the first ``first_dense`` blocks dense, then every ``moe_every``-th block an MoE
one), so a stage's dense and MoE blocks are counted, not assumed.

Arrays: float arrays of shape (P,), one element per plan; :meth:`PlanShapes.one` gives one plan's record
with Python numbers in the same fields. Tokens are rows of the activations a rank holds, widths columns;
bytes in the model precision.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
from numpy.typing import ArrayLike
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.model_dims import Geometry, geometry, vocab_shard
from scaleplan.estimator.sources import distinct

from scaleplan.specs import Layout, ModelBlock
from scaleplan.units import ACT_DTYPE, BYTES_PER_ELEMENT


@dataclass(frozen=True)
class StageCounts:
    """The blocks one pipeline stage of each plan holds (arrays over plans; the mean middle stage may hold
    a fractional MoE count)."""

    index: np.ndarray          # the stage's index s (0 first, PP - 1 last)
    n_layers: np.ndarray       # transformer blocks on the stage, all its VPP chunks
    n_dense: np.ndarray        # its dense blocks
    n_moe: np.ndarray          # its MoE blocks
    chunk_layers: np.ndarray   # blocks per virtual stage (one VPP chunk), n_layers / VPP
    has_embedding: np.ndarray  # bool: the first stage (input embedding)
    has_head: np.ndarray       # bool: the last stage (final norm, LM head, loss)

    @property
    def blocks(self) -> tuple[int, int, int]:
        """The identity of its block-count arrays (n_layers, n_dense, n_moe): stages that share them (the middle
        ones, mostly) hold the same blocks, so what depends on the blocks alone is worked out once for them."""
        return id(self.n_layers), id(self.n_dense), id(self.n_moe)

    def take(self, idx: ArrayLike, memo: dict | None = None) -> StageCounts:
        """The stage of the plans at ``idx``; ``memo`` ({id(array): its selection}) gathers an array the
        stages share once."""
        memo = {} if memo is None else memo
        return StageCounts(*(_gather(getattr(self, f.name), idx, memo) for f in fields(StageCounts)))


def _gather(x: np.ndarray, idx, memo: dict) -> np.ndarray:
    """``x[idx]``, once per array in ``memo`` (the stages of the common case share their arrays)."""
    key = id(x)
    if key not in memo:
        memo[key] = (x, x[idx])  # x kept alive so its id is not reused
    return memo[key][1]


def concat_stages(stages: list[StageCounts]) -> StageCounts:
    """The stages one after the other (arrays concatenated in order): several stages of a plan set as one
    set of elements."""
    return StageCounts(*(np.concatenate([np.broadcast_to(getattr(st, f.name), np.shape(st.n_layers))
                                         for st in stages]) for f in fields(StageCounts)))


@dataclass(frozen=True)
class PlanShapes:
    """What one rank of each plan holds and processes per micro-batch (module docstring); built by
    :func:`plan_shapes`. ``first``, ``last``: the end stages (the same stage where PP = 1); ``middle``: the
    mean of the PP - 2 middle stages (``n_middle`` of them), ``middle_lo`` / ``middle_hi`` the middle stages
    with the fewest / most MoE blocks (all three equal ``last`` in shape where PP <= 2, with n_middle 0)."""

    n_mb: np.ndarray       # micro-batches per step, G / (DP B_micro)
    seq_shard: np.ndarray  # sequence positions per rank, seqlen / CP
    T: np.ndarray          # tokens of a rank's micro-batch, seqlen B_micro / CP (all TP ranks hold them)
    Tsp: np.ndarray        # the sequence-parallel shard, T / TP
    q_loc: np.ndarray      # query heads per TP rank, n_q / TP
    kv_loc: np.ndarray     # KV heads per TP rank (replicated once TP exceeds n_kv)
    n_qkv: np.ndarray      # QKV(+gate) GEMM output width per TP rank
    n_attn_out: np.ndarray  # attention output GEMM input width per TP rank (n_q v_dim / TP: value heads)
    mla_q_out: np.ndarray  # MLA: the query up-projection's output per TP rank, n_q head_dim / TP (0 for GQA)
    mla_kv_out: np.ndarray  # MLA: the key/value up-projection's, n_q (head_dim - rope + v_dim) / TP (0 for GQA)
    E_loc: np.ndarray      # local experts, E / EP (1 for a dense model)
    R: np.ndarray          # routed rows per rank, T K ETP cf / TP (balanced routing; cf the capacity factor)
    tile: np.ndarray       # rows per local expert, R EP / E (tokens from every EP rank)
    ffn_loc: np.ndarray    # expert width per ETP rank, d_expert / ETP
    V_loc: np.ndarray      # Megatron-padded vocabulary per TP rank
    a2a_bytes: np.ndarray  # EP all-to-all buffer per rank and pass, R d bytes
    b_el: float            # bytes per activation element (the model precision's; bf16 under FP8; scalar)
    n_middle: np.ndarray   # middle pipeline stages, max(PP - 2, 0)
    first: StageCounts
    middle: StageCounts
    middle_lo: StageCounts
    middle_hi: StageCounts
    last: StageCounts

    @property
    def stages(self) -> tuple[StageCounts, ...]:
        """(first, middle_lo, middle_hi, last): every distinct stage a plan can pace on."""
        return self.first, self.middle_lo, self.middle_hi, self.last

    @property
    def max_moe_per_stage(self) -> np.ndarray:
        """The most MoE blocks any stage holds (arrays over plans)."""
        return np.maximum(np.maximum(self.first.n_moe, self.last.n_moe),
                          np.where(self.n_middle > 0, self.middle_hi.n_moe, 0.0))

    def take(self, idx: ArrayLike, stages: bool = True) -> PlanShapes:
        """The shapes of the plans at ``idx`` (indices or a mask); without their pipeline stages (None) where
        ``stages`` is False: the per-layer kernels read none, and there are 35 arrays fewer to gather."""
        out, memo = {}, {}
        for f in fields(PlanShapes):
            v = getattr(self, f.name)
            if v is None or isinstance(v, StageCounts):
                out[f.name] = v.take(idx, memo) if stages and v is not None else None
            else:
                out[f.name] = v if f.name == "b_el" else _gather(v, idx, memo)
        return PlanShapes(**out)

    def one(self, i: int = 0) -> PlanShapes:
        """Plan ``i``'s record with Python numbers in every field (the scalar form for one plan)."""
        def scalar(x):
            x = np.asarray(x)[i]
            return bool(x) if x.dtype == bool else float(x)
        out = {}
        for f in fields(PlanShapes):
            v = getattr(self, f.name)
            if isinstance(v, StageCounts):
                out[f.name] = replace(v, **{g.name: scalar(getattr(v, g.name)) for g in fields(StageCounts)})
            else:
                out[f.name] = v if f.name == "b_el" else scalar(v)
        return PlanShapes(**out)


def plan_shapes(g: Geometry, lay: ParallelLayout, seqlen: int, gbs: int | None = None) -> PlanShapes:
    """The shapes of every plan of ``lay`` for model ``g`` at ``seqlen`` tokens per sequence and ``gbs``
    sequences per step (None: n_mb left NaN, for callers that cost one micro-batch). See :class:`PlanShapes`."""
    tp, cp, ep, etp, mbs, dp = (getattr(lay, f).astype(float) for f in ("tp", "cp", "ep", "etp", "mbs", "dp"))
    b_el = BYTES_PER_ELEMENT[ACT_DTYPE.get(g.precision, "bf16")]  # activations: bf16 under FP8 GEMMs
    seq = seqlen / cp
    T = seqlen * mbs / cp
    kv_loc = np.maximum(g.nkv / tp, 1.0)
    n_qkv = (g.nq * g.hd + g.gate) / tp + 2 * kv_loc * g.hd
    mla = np.asarray(g.kv_rank) > 0
    mla_q = np.where(mla, g.nq * g.hd / tp, 0.0)
    mla_kv = np.where(mla, g.nq * (g.hd - g.rope_dim + g.v_dim) / tp, 0.0)
    E_loc = local_experts(g, lay)
    # the capacity factor sizes the routed token budget and the all-to-all: each expert's buffer holds
    # cf x its balanced share (dropped or padded rows)
    R = T * g.K * etp * g.capacity_factor / tp if g.is_moe else np.zeros_like(T)
    tile = R * ep / g.E if g.is_moe else np.zeros_like(T)
    n_mb = gbs / (dp * mbs) if gbs is not None else np.full_like(T, np.nan)
    first, middle, lo, hi, last = _stage_summary(g, lay)
    return PlanShapes(n_mb=n_mb, seq_shard=seq, T=T, Tsp=T / tp, q_loc=g.nq / tp, kv_loc=kv_loc, n_qkv=n_qkv, n_attn_out=g.nq * g.v_dim / tp,
                      mla_q_out=mla_q, mla_kv_out=mla_kv,
                     E_loc=E_loc, R=R, tile=tile, ffn_loc=g.dexp / etp, V_loc=vocab_shard(g.vocab, tp),
                     a2a_bytes=R * g.d * b_el, b_el=b_el, n_middle=np.maximum(lay.pp - 2.0, 0.0), first=first,
                     middle=middle, middle_lo=lo, middle_hi=hi, last=last)


def layout_shapes(model: ModelBlock, layout: Layout, seqlen: int, gbs: int | None = None,
                  n_devices: int | None = None) -> PlanShapes:
    """One plan's shapes in the scalar form (:meth:`PlanShapes.one`) from a spec's model block and a
    layout (DP derived from ``n_devices`` where the layout omits it)."""
    n = n_devices or layout.tp * layout.cp * layout.pp * (layout.dp or 1)
    return plan_shapes(geometry(model), ParallelLayout.from_specs([layout], n), seqlen, gbs).one()


def split_of(model: ModelBlock, layout: Layout) -> tuple[int, int]:
    """(first, last) stage layers the plan ``layout`` of ``model`` states or is costed with where the even
    split does not exist (:func:`resolve_split`); (0, 0) for the even split."""
    g = geometry(model)
    lay = resolve_split(g, ParallelLayout.from_specs([layout], layout.tp * layout.cp * layout.pp * (layout.dp or 1)))
    return int(lay.decoder_first_pipeline_num_layers[0]), int(lay.decoder_last_pipeline_num_layers[0])


def local_experts(g: Geometry, lay: ParallelLayout) -> np.ndarray:
    """E / EP: the routed experts one rank holds (each 1/ETP of an expert's weights; 1 for a dense model),
    float arrays over plans (Megatron-Core's ``num_local_experts``)."""
    return g.E / lay.ep.astype(float) if g.is_moe else np.ones(len(lay))


# -- pipeline stages -----------------------------------------------------------------------------------
def stage_split(L: ArrayLike, pp: ArrayLike, first: ArrayLike = 0,
                last: ArrayLike = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first, middle, last) stage layers per plan (float arrays) as Megatron-Core's
    ``get_num_layers_to_build`` splits ``L`` layers over ``pp`` stages: the first / last stage holds
    ``first`` / ``last`` layers where stated (> 0), the other stages the rest evenly (an unstated end stage
    among them); L / PP each where neither is stated. One stage holds them all."""
    L, pp = np.asarray(L, dtype=float), np.asarray(pp, dtype=float)
    first, last = np.asarray(first, dtype=float), np.asarray(last, dtype=float)
    if not (first.any() or last.any()):  # the even split (most plans)
        even = np.broadcast_to(L / pp, np.broadcast_shapes(L.shape, pp.shape, first.shape, last.shape))
        return even, even, even
    shared = pp - (first > 0) - (last > 0)  # the stages that split the rest evenly
    per = np.where(shared > 0, (L - first - last) / np.maximum(shared, 1.0), 0.0)
    F, Ls = np.where(first > 0, first, per), np.where(last > 0, last, per)
    return np.where(pp == 1, L, F), np.where(pp == 1, L, per), np.where(pp == 1, L, Ls)


def accounted_ends(L: ArrayLike, pp: ArrayLike, vpp: ArrayLike, first: ArrayLike,
                   last: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """(embedding, loss) bool arrays: where a stated split is the one Megatron-Core builds with
    ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split`` and interleaving,
    which the first / last stage counts cannot state (they are not multiples of VPP). Those flags count the
    embedding and the loss as one layer each: every stage holds M = (L + e + l) / PP layers, M a multiple of VPP,
    the first (last) stage's first (last) chunk one decoder layer fewer (transformer_block.get_num_layers_to_build),
    so the first stage holds M - e decoder layers and the last M - l."""
    L, pp, vpp, first, last = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (L, pp, vpp, first, last)))
    F, _, Ls = stage_split(L, pp, first, last)
    emb, loss = np.zeros(L.shape, dtype=bool), np.zeros(L.shape, dtype=bool)
    need = (pp > 1) & (vpp > 1) & ((first > 0) | (last > 0)) & ((F % vpp != 0) | (Ls % vpp != 0))
    for e, lo in ((1, 0), (0, 1), (1, 1)):
        valid, aF, aL = accounting_split(L, pp, vpp, e, lo)
        ok = need & valid & (F == aF) & (Ls == aL)
        emb, loss = emb | (ok & (e == 1)), loss | (ok & (lo == 1))
    return emb, loss


def accounting_split(L: ArrayLike, pp: ArrayLike, vpp: ArrayLike, emb: int,
                     loss: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(exists, first, last) of the split Megatron-LM's --account-for-embedding/loss-in-pipeline-split builds
    with ``emb`` / ``loss`` (0 or 1) counted as layers: every stage M = (L + emb + loss) / PP, a multiple of VPP
    (``exists`` where it is), the first stage M - emb decoder layers and the last M - loss (int arrays;
    megatron-core transformer_block.get_num_layers_to_build)."""
    total, p = np.asarray(L) + emb + loss, np.maximum(np.asarray(pp), 1)
    M = total // p
    return (total % p == 0) & (M % vpp == 0), M - emb, M - loss


def auto_split(L: ArrayLike, pp: ArrayLike, vpp: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) stage layers for a plan whose ``pp`` x ``vpp`` chunks cannot split ``L`` layers evenly
    (int arrays; 0 where they can, or where no split exists): each middle stage holds ceil(L / (PP VPP)) VPP
    layers, the first and the last share the rest, the last the smaller half (it also holds the LM head and
    the loss), each a positive multiple of VPP (Megatron-Core's condition). Megatron-LM takes such counts
    only when stated (--decoder-first/last-pipeline-num-layers); scaleplan states them in its plans. Where no
    such split exists, the one Megatron-LM's --account-for-embedding/loss-in-pipeline-split builds
    (:func:`accounted_ends`; both counted first, as Megatron-Bridge's recipes count them): Qwen3-235B-A22B's 94
    layers over PP 8 x VPP 4 as 11 + 6 x 12 + 11. Where neither exists, the rest halved, the last the smaller half,
    which only a --pipeline-model-parallel-layout string states (scaleplan/megatron/args.py): DeepSeek-V3's 61
    layers over PP 8 x VPP 4 as 7 + 6 x 8 + 6, Megatron-Bridge's H100 layout "Et|(tt|)*30mL"."""
    L, pp, vpp = (np.asarray(x, dtype=np.int64) for x in (L, pp, vpp))
    L, pp, vpp = np.broadcast_arrays(L, pp, vpp)
    middle = -(-L // (pp * vpp)) * vpp
    rest = L - np.maximum(pp - 2, 0) * middle
    last = rest // (2 * vpp) * vpp
    first = rest - last
    uneven = (pp > 1) & (L % (pp * vpp) != 0)
    ok = uneven & (last >= vpp) & (first >= vpp) & (first % vpp == 0)
    first, last = np.where(ok, first, 0), np.where(ok, last, 0)
    for e, lo in ((1, 1), (0, 1), (1, 0)):  # the accounting flags' split where the stated counts find none
        valid, aF, aL = accounting_split(L, pp, vpp, e, lo)
        acc = uneven & ~ok & (vpp > 1) & valid
        first, last, ok = np.where(acc, aF, first), np.where(acc, aL, last), ok | acc
    half = uneven & ~ok & (rest >= 2)  # any counts: a layout string
    return np.where(half, rest - rest // 2, first), np.where(half, rest // 2, last)


def resolve_split(g: Geometry, lay: ParallelLayout) -> ParallelLayout:
    """``lay`` with the first / last stage's layers stated wherever its plans leave them unstated and the
    even split does not exist (:func:`auto_split`): every plan then names the split it is costed and emitted
    with."""
    F, Ls = lay.decoder_first_pipeline_num_layers, lay.decoder_last_pipeline_num_layers
    unset = (F == 0) & (Ls == 0) & (np.asarray(g.L) % (lay.pp * lay.vpp) != 0)
    if not unset.any():
        return lay
    aF, aL = auto_split(np.broadcast_to(np.asarray(g.L), lay.pp.shape), lay.pp, lay.vpp)
    if not (unset & (aF > 0)).any():
        return lay
    return replace(lay, decoder_first_pipeline_num_layers=np.where(unset, aF, F),
                   decoder_last_pipeline_num_layers=np.where(unset, aL, Ls))


def _stage_layers(g: Geometry, lay: ParallelLayout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first, middle, last) stage layers of every plan (:func:`stage_split` of its stated counts, or of the
    counts :func:`resolve_split` states for it)."""
    lay = resolve_split(g, lay)
    return stage_split(g.L, lay.pp, lay.decoder_first_pipeline_num_layers, lay.decoder_last_pipeline_num_layers)


def _moe_before(g: Geometry, b) -> np.ndarray:
    """MoE blocks among the model's first ``b`` blocks (the MoE layer pattern of Megatron-LM's
    ``--moe-layer-freq``: the first ``first_dense`` blocks dense, then every ``moe_every``-th an MoE block)."""
    if not g.is_moe:
        return np.zeros(np.shape(b))
    return np.floor(np.maximum(np.asarray(b, dtype=float) - g.dense_lead, 0.0) / g.moe_every)


def stage_counts(g: Geometry, lay: ParallelLayout, s: ArrayLike) -> StageCounts:
    """The blocks of stage ``s`` (an index, arrays broadcast with the plans) as Megatron-Core lays the
    model out (module docstring; :func:`_chunk_moe` counts them chunk by chunk, in closed form where the dense
    lead fits in stage 0's first chunk)."""
    pp, vpp = lay.pp.astype(float), lay.vpp.astype(float)
    s = np.broadcast_to(np.asarray(s, dtype=float), pp.shape)
    F, M, Ls = _stage_layers(g, lay)
    last = (s == pp - 1) & (pp > 1)
    n_layers = np.where(s == 0, F, np.where(last, Ls, M))
    chunk = n_layers / vpp
    if _lead_in_first_chunk(g, lay, F):  # the dense lead in stage 0's first chunk, MoE blocks everywhere else
        n_moe = n_layers - np.where(s == 0, np.asarray(g.dense_lead, dtype=float), 0.0) if g.is_moe else 0.0 * s
    else:
        n_moe = _chunk_moe(g, lay, s, (F, M, Ls), chunk)
    return _with_mtp(g, StageCounts(s, n_layers, n_layers - n_moe, n_moe, chunk, s == 0, (s == pp - 1)))


def _chunk_moe(g: Geometry, lay: ParallelLayout, s: np.ndarray, split: tuple[np.ndarray, ...],
               chunk: np.ndarray) -> np.ndarray:
    """The MoE blocks of stage ``s``, chunk by chunk (module docstring): chunk v holds blocks
    [v R + o_s, v R + o_s + c_s), R the blocks of one round, o_s the stage's offset in it, c_s ``chunk``;
    ``split``: the (first, middle, last) stages' blocks."""
    pp, vpp = lay.pp.astype(float), lay.vpp.astype(float)
    F, M, Ls = split
    n_mid = np.maximum(pp - 2, 0.0)
    last = (s == pp - 1) & (pp > 1)
    rnd = (F + n_mid * M + np.where(pp > 1, Ls, 0.0)) / vpp
    off = np.where(s == 0, 0.0, F / vpp + np.where(last, n_mid, s - 1) * M / vpp)
    n_moe = np.zeros(pp.shape)
    for v in range(int(vpp.max()) if len(vpp) else 0):
        a = v * rnd + off
        n_moe = n_moe + np.where(v < vpp, _moe_before(g, a + chunk) - _moe_before(g, a), 0.0)
    return n_moe


def _with_mtp(g: Geometry, st: StageCounts) -> StageCounts:
    """``st`` with the model's MTP layers among its blocks where it is the last stage: they run there
    (Megatron-Core's placement without a layout string), each a block of the last block's kind, so its time,
    parameters and activations count with the stage's blocks."""
    mtp = np.where(np.asarray(st.has_head, bool), np.asarray(g.mtp, dtype=float), 0.0)
    if not np.any(mtp):
        return st
    n_moe = st.n_moe + mtp * float(g.mtp_moe)
    return replace(st, n_layers=st.n_layers + mtp, n_dense=st.n_dense + mtp * (1.0 - float(g.mtp_moe)), n_moe=n_moe)


def as_stage(g: Geometry, lay: ParallelLayout, stage: StageCounts | ArrayLike) -> StageCounts:
    """``stage`` itself when it is a :class:`StageCounts`, else :func:`stage_counts` of the stage index it holds."""
    return stage if isinstance(stage, StageCounts) else stage_counts(g, lay, stage)


def _stage_summary(g: Geometry, lay: ParallelLayout) -> tuple[StageCounts, ...]:
    """(first, mean middle, fewest-MoE middle, most-MoE middle, last) stages of every plan. The middle
    stages hold equal block counts; their MoE counts differ only where the dense blocks reach past the first
    stage or the MoE pattern skips blocks. With every block after the dense lead an MoE one (``moe_every``
    1) the MoE count grows with the stage index, so stage 1 holds the fewest and stage PP - 2 the most;
    otherwise every middle stage of each distinct (model, PP, VPP) is counted."""
    pp = lay.pp.astype(float)
    F, M, Ls = _stage_layers(g, lay)
    if _lead_in_first_chunk(g, lay, F):
        return _lead_first_summary(g, lay, F, M, Ls)
    first, last = stage_counts(g, lay, np.zeros(len(lay))), stage_counts(g, lay, pp - 1)
    n_mid = np.maximum(pp - 2, 0.0)
    has_mid = n_mid > 0
    if not has_mid.any():
        return first, last, last, last, last
    if np.all(np.asarray(g.moe_every) == 1):
        lo, hi = stage_counts(g, lay, np.where(has_mid, 1.0, pp - 1)), stage_counts(g, lay, np.where(has_mid, pp - 2, pp - 1))
    else:
        lo, hi = _middle_extremes(g, lay)
    total_moe = (np.asarray(g.n_moe, dtype=float) + np.asarray(g.mtp, dtype=float) * float(g.mtp_moe)) * np.ones(len(lay))
    mean_moe = np.where(has_mid, (total_moe - first.n_moe - last.n_moe) / np.maximum(n_mid, 1.0), last.n_moe)
    mid_layers = np.where(has_mid, lo.n_layers, last.n_layers)
    middle = StageCounts(np.where(has_mid, 1.0, last.index), mid_layers, mid_layers - mean_moe, mean_moe,
                         mid_layers / lay.vpp, np.zeros(len(lay), bool), ~has_mid)
    return first, middle, lo, hi, last


def _lead_in_first_chunk(g: Geometry, lay: ParallelLayout, F: np.ndarray) -> bool:
    """Whether every block after the dense lead is an MoE one and the dense lead fits in stage 0's first chunk
    (``F``: the first stage's blocks) in every plan: then stage 0 holds the dense blocks and every other stage
    MoE blocks alone (the case of nearly every plan a search meets, counted in closed form)."""
    if g.is_moe and not np.all(np.asarray(g.moe_every) == 1):
        return False
    return bool(np.all(np.asarray(g.dense_lead) <= F / lay.vpp)) if g.is_moe else True


def _lead_first_summary(g: Geometry, lay: ParallelLayout, F: np.ndarray, M: np.ndarray,
                        Ls: np.ndarray) -> tuple[StageCounts, ...]:
    """:func:`_stage_summary` where :func:`_lead_in_first_chunk` holds (equal to the general count there), of
    stages of ``F``, ``M`` (each middle one) and ``Ls`` blocks."""
    pp, vpp = lay.pp.astype(float), lay.vpp
    zero, has_mid, one = np.zeros(len(lay)), pp > 2, pp == 1
    nd0 = np.asarray(g.dense_lead, dtype=float) * np.ones(len(lay)) if g.is_moe else F
    nd, nm = (np.where(one, nd0, 0.0), np.where(one, F - nd0, Ls)) if g.is_moe else (Ls, zero)  # PP 1: stage 0
    mid = np.where(has_mid, M, Ls)
    nd_m, nm_m = (np.where(has_mid, 0.0, nd), np.where(has_mid, M, nm)) if g.is_moe else (mid, zero)
    no, yes = np.zeros(len(lay), bool), np.ones(len(lay), bool)
    first = StageCounts(zero, F, nd0, F - nd0, F / vpp, yes, one)
    last = StageCounts(pp - 1, Ls, nd, nm, Ls / vpp, one, yes)
    lo = StageCounts(np.where(has_mid, 1.0, pp - 1), mid, nd_m, nm_m, mid / vpp, one, ~has_mid)
    hi = StageCounts(np.where(has_mid, pp - 2, pp - 1), mid, nd_m, nm_m, mid / vpp, one, ~has_mid)
    middle = StageCounts(np.where(has_mid, 1.0, pp - 1), mid, nd_m, nm_m, mid / vpp, no, ~has_mid)
    return tuple(_with_mtp(g, st) for st in (first, middle, lo, hi, last))


def _middle_extremes(g: Geometry, lay: ParallelLayout) -> tuple[StageCounts, StageCounts]:
    """The middle stages with the fewest and the most MoE blocks (the last stage where PP <= 2), every
    middle stage counted once per distinct (model, PP, VPP): a (distinct, stage) grid."""
    first_u, inv = distinct(*g.batch_keys, lay.pp, lay.vpp)
    gu, lu = g.take(first_u), lay.take(first_u)
    pp = lu.pp.astype(float)
    S = int(max(pp.max() - 2, 1))
    s = 1.0 + np.arange(S)[None, :] * np.ones((len(lu), 1))
    s = np.where(s <= pp[:, None] - 2, s, np.maximum(pp[:, None] - 1, 0))  # absent middles: the last stage
    idx = np.repeat(np.arange(len(lu)), S)
    moe = stage_counts(gu.take(idx), lu.take(idx), s.reshape(-1)).n_moe.reshape(len(lu), S)
    lo_s = s[np.arange(len(lu)), np.argmin(moe, axis=1)]
    hi_s = s[np.arange(len(lu)), np.argmax(moe, axis=1)]
    return stage_counts(g, lay, lo_s[inv]), stage_counts(g, lay, hi_s[inv])
