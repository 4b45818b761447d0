"""Per-layer kernel times of one micro-batch (paper sec:iteration-time-model), vectorised over plans:
the attention block, the dense MLP, the MoE block, the TP and CP collectives and the vocabulary work,
each forward and backward, as a typed record (:class:`LayerKernels`). They depend on (TP, CP, EP, ETP,
B_micro) only: :meth:`KernelModel.layer_kernels` evaluates each distinct tuple once and hands the
times to every plan sharing it. Mixed into :class:`scaleplan.estimator.model.TimeModel`; the tables are an
argument (``tb``: the spec precision's view, or a recording view), never state; seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
from scaleplan.estimator import analytic as an
from scaleplan.estimator.comm import collective_time
from scaleplan.estimator.compute import (
    elementwise_times,
    expert_times,
    gemm_times,
    permute_times,
    sdpa_times,
    vocab_times,
)
from scaleplan.estimator.model_dims import Geometry
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.sources import Recorder, distinct
from scaleplan.estimator.shapes import RankShapes, rank_shapes
from scaleplan.estimator.tables import ANALYTIC


@dataclass(frozen=True)
class LayerKernels:
    """Seconds per layer and micro-batch (arrays over plans; _f forward, _b backward). The MoE block's
    terms are zero for a dense model."""

    attn_f: np.ndarray    # attention projections: QKV (+ head gate) and output GEMMs
    attn_b: np.ndarray
    sd_f: np.ndarray      # SDPA on the local heads, 1/CP of the causal work
    sd_b: np.ndarray
    ew_f: np.ndarray      # element-wise: 2 norms, 2 residual adds, RoPE, head gate
    ew_b: np.ndarray
    dense_f: np.ndarray   # one dense block's MLP
    dense_b: np.ndarray
    moe_f: np.ndarray     # the MoE block on the GPU: router + top-k + permute + routed experts
    moe_b: np.ndarray
    a2a_f: np.ndarray     # EP all-to-all, dispatch + combine
    a2a_b: np.ndarray
    sh_f: np.ndarray      # shared expert (overlaps the all-to-all)
    sh_b: np.ndarray
    E_loc: np.ndarray     # local experts E / EP (1 for a dense model)
    rg_f: np.ndarray      # router GEMM
    rg_b: np.ndarray
    tk_f: np.ndarray      # top-k
    tk_b: np.ndarray
    perm: np.ndarray      # permute + unpermute, forward
    perm_b: np.ndarray    # their backward
    ex_f: np.ndarray      # routed experts (grouped GEMMs and their SwiGLU)
    ex_b: np.ndarray
    tp_f: np.ndarray      # TP all-gathers + reduce-scatters (sequence parallel)
    tp_b: np.ndarray
    cp_f: np.ndarray      # CP key/value exchange the attention does not cover
    cp_b: np.ndarray
    t_first: np.ndarray   # embedding gather / scatter-add (first stage)
    t_last_f: np.ndarray  # LM head + cross-entropy forward (last stage)
    t_last_b: np.ndarray  # their backward
    T: np.ndarray         # tokens of a rank's sequence shard
    Tsp: np.ndarray       # its sequence-parallel shard, T / TP

    def take(self, idx) -> LayerKernels:
        return LayerKernels(**{f: getattr(self, f)[idx] for f in _NAMES})


_NAMES = tuple(f.name for f in fields(LayerKernels))
# the MoE block's terms (zero for a dense model), and the device-kernel times kernel_scale multiplies
# (never collectives or shapes)
_MOE_KERNELS = ("moe_f", "moe_b", "a2a_f", "a2a_b", "sh_f", "sh_b", "rg_f", "rg_b", "tk_f", "tk_b", "perm", "perm_b",
                "ex_f", "ex_b")
_DEVICE_KERNELS = ("attn_f", "attn_b", "sd_f", "sd_b", "ew_f", "ew_b", "dense_f", "dense_b", "moe_f", "moe_b", "sh_f",
                   "sh_b", "rg_f", "rg_b", "tk_f", "tk_b", "perm", "perm_b", "ex_f", "ex_b", "t_first", "t_last_f",
                   "t_last_b")


class KernelModel:
    """The kernels of one layer; needs ``self.prof``, ``self.gpn``, ``self.kernel_scale``."""

    def layer_kernels(self, tb, g: Geometry, lay: ParallelLayout, seqlen: int, rec: Recorder) -> LayerKernels:
        """:class:`LayerKernels` of every plan of ``lay`` (arrays of length P) from the tables ``tb``
        (:meth:`Tables.view` of the spec precision), each distinct (TP, CP, EP, ETP, B_micro) evaluated
        once (per geometry of a :class:`~scaleplan.estimator.model_dims.GeometryBatch`); lookups recorded in
        ``rec``."""
        first, inv = distinct(*g.batch_keys, lay.tp, lay.cp, lay.ep, lay.etp, lay.mbs)
        rec_u = Recorder(len(first), rec.mode)
        k = LayerKernels(**self._kernels(tb, g.take(first), lay.take(first), seqlen, rec_u)).take(inv)
        rec.fold(rec_u, inv)
        return k

    def _kernels(self, tb, g: Geometry, lay: ParallelLayout, seqlen: int, rec: Recorder) -> dict[str, np.ndarray]:
        """Per-layer, per-micro-batch forward/backward times that depend only on (TP, CP, EP, ETP,
        B_micro): evaluated once per distinct tuple and broadcast to the plans sharing it. The kernels
        outside the MoE block depend on fewer: :meth:`_dense_kernels` runs once per distinct (dense
        fields of the geometry, TP, CP, B_micro); their lookups are recorded in the order they occur
        (attention and dense MLP, the MoE block, TP, vocabulary and CP)."""
        P = len(lay)
        first, inv = distinct(*g.dense_keys, lay.tp, lay.cp, lay.mbs)
        pre, post = Recorder(len(first), rec.mode), Recorder(len(first), rec.mode)
        k = {name: v[inv] for name, v in self._dense_kernels(tb, g.take(first), lay.take(first), seqlen, pre,
                                                             post).items()}
        rec.fold(pre, inv)
        sh = rank_shapes(g, lay, seqlen)  # the same shapes bench plan measures
        if g.is_moe:
            moe = self._moe_kernels(tb, rec, g, sh, lay, self.prof.peak(g.precision), self.prof.hbm_bandwidth)
            ks = self.kernel_scale
            if ks != 1.0:  # fitted for serial-dispatch (CPU) profiles only (calibrate/run_scales.py)
                moe = {name: ks * v if name in _DEVICE_KERNELS else v for name, v in moe.items()}
            k.update(moe)
        else:
            k.update(dict.fromkeys(_MOE_KERNELS, np.zeros(P)), E_loc=np.ones(P))
        rec.fold(post, inv)
        k.update(T=sh.T, Tsp=sh.Tsp)
        return {name: np.broadcast_to(np.asarray(k[name], dtype=float), (P,)) for name in _NAMES}

    def _dense_kernels(self, tb, g: Geometry, lay: ParallelLayout, seqlen: int, pre: Recorder,
                       post: Recorder) -> dict[str, np.ndarray]:
        """The kernels outside the MoE block (seconds per layer and micro-batch): attention and the dense
        MLP (lookups in ``pre``), TP collectives, vocabulary and the exposed CP exchange (in ``post``)."""
        prof = self.prof
        peak = prof.peak(g.precision)
        hbm = prof.hbm_bandwidth
        tp, cp, mbs = (getattr(lay, f).astype(float) for f in ("tp", "cp", "mbs"))
        sh = rank_shapes(g, lay, seqlen)
        b_el, T, kv_loc = sh.b_el, sh.T, sh.kv_loc
        k = self._attention_kernels(tb, pre, g, sh, tp, cp, mbs, seqlen, peak, hbm)

        # dense MLP (first block(s))
        w1 = 2 if g.glu else 1
        dm_f1, dm_b1 = gemm_times(tb, prof, pre, "dense_mlp", T, w1 * g.dff / tp, g.d, peak, active=g.n_dense > 0)
        dm_f2, dm_b2 = gemm_times(tb, prof, pre, "dense_mlp", T, g.d, g.dff / tp, peak, active=g.n_dense > 0)
        act_dense = an.memory_time(b_el * T * g.dff / tp * 3, hbm)
        k["dense_f"], k["dense_b"] = dm_f1 + dm_f2 + act_dense, dm_b1 + dm_b2 + 2 * act_dense

        # TP (sequence parallel): 2 all-gathers + 2 reduce-scatters of the full [T, d] per pass
        tp_inter = lay.spans_nodes("tp", self.gpn)
        tp_one = collective_time(tb, prof, post, "tp_comm", "all_gather", tp, T * g.d * b_el, tp_inter) + \
            collective_time(tb, prof, post, "tp_comm", "reduce_scatter", tp, T * g.d * b_el, tp_inter)
        k["tp_f"] = k["tp_b"] = 2 * tp_one
        k["t_first"], k["t_last_f"], k["t_last_b"] = vocab_times(tb, prof, post, g, T, tp, peak, hbm, b_el)
        ks = self.kernel_scale
        if ks != 1.0:  # fitted for serial-dispatch (CPU) profiles only (calibrate/run_scales.py)
            k.update({name: ks * v for name, v in k.items() if name in _DEVICE_KERNELS})

        # CP: all-gather K,V forward; all-gather + reduce-scatter of dK,dV backward
        kv_bytes = seqlen * mbs * 2 * kv_loc * g.hd * b_el
        cp_inter = lay.spans_nodes("cp", self.gpn)
        # TE's ring attention exchanges K/V blocks peer to peer while it computes on the previous
        # block: only the part of the exchange longer than the attention itself is exposed
        sd_f, sd_b = k["sd_f"], k["sd_b"]
        cp_f = np.maximum(collective_time(tb, prof, post, "cp_comm", "all_gather", cp, kv_bytes, cp_inter) - sd_f, 0.0)
        cp_b = np.maximum(cp_f + collective_time(tb, prof, post, "cp_comm", "reduce_scatter", cp, kv_bytes, cp_inter)
                          - sd_b, 0.0)
        k.update(cp_f=cp_f, cp_b=cp_b)
        return {name: np.broadcast_to(np.asarray(v, dtype=float), (len(tp),)) for name, v in k.items()}

    def _attention_kernels(self, tb, rec: Recorder, g: Geometry, sh: RankShapes, tp: np.ndarray, cp: np.ndarray,
                           mbs: np.ndarray, seqlen: int, peak: float, hbm: float) -> dict[str, np.ndarray]:
        """The attention block's projections, SDPA and element-wise work, forward and backward
        (attn_f, attn_b, sd_f, sd_b, ew_f, ew_b; seconds per layer and micro-batch)."""
        b_el, T, Tsp, kv_loc = sh.b_el, sh.T, sh.Tsp, sh.kv_loc
        # attention projections (gate folded into the QKV GEMM: same input, n_q extra columns)
        prof = self.prof
        f_qkv, b_qkv = gemm_times(tb, prof, rec, "attn_proj", T, sh.n_qkv, g.d, peak)
        f_o, b_o = gemm_times(tb, prof, rec, "attn_proj", T, g.d, sh.n_attn_out, peak)
        attn_f, attn_b = f_qkv + f_o, b_qkv + b_o

        # SDPA on TP-sharded heads; CP: each rank computes 1/CP of the (load-balanced) causal work
        sd_f, sd_b = sdpa_times(tb, prof, rec, g, seqlen, mbs, g.nq / tp, hbm)
        sd_f, sd_b = sd_f / cp, sd_b / cp

        # element-wise: 2 norms, 2 residual adds, RoPE on q/k, gate sigmoid*mul
        ew_f, ew_b = elementwise_times(tb, rec, g, T, Tsp, (g.nq / tp + kv_loc) * g.hd, b_el, hbm)
        if g.has_gate:  # the head gate has no table: bytes through HBM
            gate = an.memory_time(b_el * T * g.nq * g.hd / tp * 3, hbm)
            ew_f, ew_b = ew_f + gate, ew_b + 2 * gate
        return {"attn_f": attn_f, "attn_b": attn_b, "sd_f": sd_f, "sd_b": sd_b, "ew_f": ew_f, "ew_b": ew_b}

    def _moe_kernels(self, tb, rec: Recorder, g: Geometry, sh: RankShapes, lay: ParallelLayout, peak: float,
                     hbm: float) -> dict[str, np.ndarray]:
        """The MoE block per layer and micro-batch, forward and backward (seconds; _MOE_KERNELS and
        E_loc): router + top-k, permute, routed experts, shared expert, EP all-to-all."""
        b_el, T, Tsp = sh.b_el, sh.T, sh.Tsp
        tp, ep, etp = (getattr(lay, f).astype(float) for f in ("tp", "ep", "etp"))
        w1 = 2 if g.glu else 1
        sh_f = sh_b = np.zeros(len(tp))
        E_loc, R, tile = sh.E_loc, sh.R, sh.tile    # balanced routing; EP tile correction
        # router GEMM (fp32 island costed as bf16 GEMM: d x E is tiny) + top-k
        prof = self.prof
        rg_f, rg_b = gemm_times(tb, prof, rec, "router", Tsp, g.E, g.d, peak)
        if tb.topk:
            tk_f = rec.use("router", tb.topk["fwd"].lookup(Tsp, g.E, g.K))
            tk_b = rec.use("router", tb.topk["bwd"].lookup(Tsp, g.E, g.K)) if "bwd" in tb.topk \
                else tk_f
        else:
            rec.mark("router", ANALYTIC)
            tk_f = an.memory_time(4.0 * Tsp * g.E * 3, hbm)
            tk_b = tk_f
        perm_f, perm_b = permute_times(tb, rec, g, Tsp, R, b_el, hbm, bool(getattr(prof, "serial_dispatch", False)))
        ffn_loc = sh.ffn_loc
        ex_f, ex_b = expert_times(tb, prof, rec, g, E_loc, tile, etp, peak, hbm)
        ex_act = an.memory_time(b_el * R * ffn_loc * 3, hbm)        # SwiGLU on routed rows
        ex_f, ex_b = ex_f + ex_act, ex_b + 2 * ex_act
        if g.has_shared:
            s1f, s1b = gemm_times(tb, prof, rec, "shared_expert", T, w1 * g.dsh / tp, g.d, peak)
            s2f, s2b = gemm_times(tb, prof, rec, "shared_expert", T, g.d, g.dsh / tp, peak)
            s_act = an.memory_time(b_el * T * g.dsh / tp * 3, hbm)
            sh_f, sh_b = s1f + s2f + s_act, s1b + s2b + 2 * s_act
        # EP all-to-all: dispatch + combine per pass; per-rank buffer R*d*bytes; the EP ranks on one
        # node exchange over NVLink (ParallelLayout.ranks_per_node)
        a2a_one = collective_time(tb, prof, rec, "ep_a2a", "all_to_all", ep, sh.a2a_bytes,
                                  lay.spans_nodes("ep", self.gpn), active=ep > 1,
                                  per_node=lay.ranks_per_node("ep", self.gpn))
        return {"moe_f": rg_f + tk_f + perm_f + ex_f, "moe_b": rg_b + tk_b + perm_b + ex_b,
                "a2a_f": 2 * a2a_one, "a2a_b": 2 * a2a_one, "sh_f": sh_f, "sh_b": sh_b, "E_loc": E_loc,
                "rg_f": rg_f, "rg_b": rg_b, "tk_f": tk_f, "tk_b": tk_b, "perm": perm_f, "perm_b": perm_b, "ex_f": ex_f,
                "ex_b": ex_b}
