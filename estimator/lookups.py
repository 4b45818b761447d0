"""The table points an evaluation looks up, keyed by measurement-table column names.

Used by ``scaleplan bench plan`` to measure exactly what a spec needs. The shapes come from
:func:`scaleplan.estimator.shapes.rank_shapes`, the same function the time model reads, and the
collectives from the same group/bucket helpers, so the two cannot drift apart.
"""
from __future__ import annotations

import numpy as np

from scaleplan.estimator.ckpt import CkptMode
from scaleplan.estimator.geom import Geometry
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.shapes import rank_shapes


def _one(x) -> float:
    """The value of a one-plan array."""
    return float(np.ravel(x)[0])


def _add(out: dict[str, list[dict]], suite: str, row: dict) -> None:
    lst = out.setdefault(suite, [])
    if row not in lst:
        lst.append(row)


def _gemm3(out, m, n, k, dtype):
    for a, b, c in ((m, n, k), (m, k, n), (k, n, m)):
        _add(out, "gemm", {"m": int(round(a)), "n": int(round(b)), "k": int(round(c)), "dtype": dtype})


def _ops_points(out, g: Geometry, ckpt: str, tokens: int) -> None:
    """Host-dispatch rows of serial-dispatch profiles (bench/suites/model_ops.py), keyed by the
    widths the uncosted ops run at: m = tokens per micro-batch, n = hidden, k = experts."""
    probe = {"m": int(tokens), "n": int(g.d), "k": int(g.E) if g.is_moe else 1}
    modes = [f"ops:moe:{ckpt}"] if g.is_moe else []
    modes += [f"ops:dense:{ckpt}", f"ops:microbatch:{ckpt}", "ops:step_dense", "ops:step"]
    modes += ["ops:step_moe"] if g.is_moe else []
    for mode in modes:
        _add(out, "dispatch", {"mode": mode, **probe, "dtype": g.precision, "chain_len": 1})


# the launch-bound GEMM chain of the dispatch gap t_gap (bench/suites/dispatch.py): m = 8 rows through
# n = k = 2048 weights, 512 kernels, as the recorded GPU rows; narrower and in the model's own dtype
# where the model is (a bf16 chain at 2048 on a CPU without bf16 units takes minutes per repetition)
CHAIN_M, CHAIN_MAX_WIDTH, CHAIN_LEN = 8, 2048, 512
CHAIN_DTYPES = ("fp32", "bf16", "fp16")  # dtypes a plain matmul chain runs in (fp8/fp4 need scaled GEMMs)


def _chain_point(g: Geometry) -> dict:
    """The dispatch-gap chain point of a model: width min(d, 2048), the model's precision (bf16 where a
    plain matmul cannot run it)."""
    width = int(min(g.d, CHAIN_MAX_WIDTH))
    dtype = g.precision if g.precision in CHAIN_DTYPES else "bf16"
    return {"mode": "gemm", "m": CHAIN_M, "n": width, "k": width, "dtype": dtype, "chain_len": CHAIN_LEN}


def table_points(g: Geometry, pl: ParallelLayout, gbs: int, seqlen: int, gpn: int, table_vocab: int | None,
                 serial_dispatch: bool = False, optimizer: str = "adamw") -> dict[str, list[dict]]:
    """Points per suite; ``serial_dispatch`` adds the host-dispatch rows (``ops:*``) of the model;
    ``optimizer`` picks the DP collectives (muon/scion all-reduce + all-gather, sgd all-reduce, else
    reduce-scatter + all-gather)."""
    from scaleplan.estimator.comm import bias_sync

    out: dict[str, list[dict]] = {}
    dt = g.precision
    for i in range(len(pl)):
        lay = pl.take([i])
        tp, cp, ep, etp, mbs = (int(getattr(lay, f)[0]) for f in ("tp", "cp", "ep", "etp", "mbs"))
        sh = rank_shapes(g, lay, seqlen)
        T, kv_loc, b_el = int(round(_one(sh.T))), int(round(_one(sh.kv_loc))), sh.b_el
        _gemm3(out, T, _one(sh.n_qkv), g.d, dt)
        _gemm3(out, T, g.d, _one(sh.n_attn_out), dt)
        w1 = 2 if g.glu else 1
        if g.n_dense:
            _gemm3(out, T, w1 * g.dff // tp, g.d, dt)
            _gemm3(out, T, g.d, g.dff // tp, dt)
        _add(out, "sdpa", {"seq_len": seqlen, "micro_bs": mbs, "n_q_heads": g.nq // tp, "n_kv_heads": kv_loc,
                           "head_dim": g.hd, "causal": True, "dtype": g.sdpa_precision})
        V_loc = int(round(_one(sh.V_loc)))
        for op in ("lm_head_gemm", "cross_entropy"):
            _add(out, "vocab", {"op": op, "tokens": T, "hidden": g.d, "vocab": V_loc * 1,
                                "dtype": dt if op == "lm_head_gemm" else "fp32"})
        for coll in ("all_gather", "reduce_scatter"):
            if tp > 1:
                _add(out, "collectives", {"collective": coll, "group_size": tp, "layout": "contiguous",
                                          "inter_node": bool(lay.spans_nodes("tp", gpn)[0]),
                                          "size_bytes": T * g.d * b_el, "dtype": dt})
        if g.is_moe:
            tile = int(round(_one(sh.tile)))
            _add(out, "router", {"variant": "topk", "num_tokens": int(round(_one(sh.Tsp))), "num_experts": g.E, "k": g.K,
                                 "hidden": 0, "dtype": "fp32"})
            _gemm3(out, _one(sh.Tsp), g.E, g.d, dt)
            for proj in ("fc1", "fc2"):
                _add(out, "grouped_gemm", {"proj": proj, "distribution": "balanced", "num_gemms": g.E // ep,
                                           "tokens_per_expert": max(tile, 1), "hidden": g.d,
                                           "ffn": int(round(_one(sh.ffn_loc))), "dtype": dt})
            if g.dsh:
                _gemm3(out, T, w1 * g.dsh // tp, g.d, dt)
                _gemm3(out, T, g.d, g.dsh // tp, dt)
            if ep > 1:
                _add(out, "collectives", {"collective": "all_to_all", "group_size": ep, "layout": "contiguous",
                                          "inter_node": bool(lay.spans_nodes("ep", gpn)[0]),
                                          "size_bytes": int(round(_one(sh.a2a_bytes))), "dtype": dt})
        _dp_points(out, g, lay, gpn, optimizer)
        n_bias, group, inter, size = (float(x[0]) for x in bias_sync(g, lay, gpn))
        if n_bias > 0 and group > 1:
            _add(out, "collectives", {"collective": "all_reduce", "group_size": int(group), "layout": "contiguous",
                                      "inter_node": bool(inter), "size_bytes": int(size), "dtype": "bf16"})
        _add(out, "dispatch", _chain_point(g))
        if serial_dispatch:
            _ops_points(out, g, CkptMode(int(pl.ckpt[i])).spec_name, T)
    del table_vocab
    return out


def _dp_points(out: dict, g: Geometry, lay: ParallelLayout, gpn: int, optimizer: str) -> None:
    """The DP collectives of every pipeline stage of the one-plan layout ``lay`` (:func:`comm.dp_buckets`)."""
    from scaleplan.estimator.comm import dp_buckets, dp_collectives, dp_stages

    for present, s in dp_stages(lay.pp):
        if not present[0]:
            continue
        for params, group, layout, inter, nb in dp_buckets(g, lay, gpn, s):
            params, group, inter, nb = float(params[0]), float(group[0]), bool(inter[0]), float(nb[0])
            if group <= 1 or params <= 0:
                continue
            # a strided group with several ranks per node is also bounded by the contiguous table
            rails = float(lay.ranks_per_node("edp", gpn)[0]) if layout == "strided" else 1
            layouts = (layout, "contiguous") if (inter and rails > 1) else (layout,)
            for coll, nbytes in dp_collectives(optimizer):
                for tab_layout in layouts:
                    _add(out, "collectives", {"collective": coll, "group_size": int(group), "layout": tab_layout,
                                              "inter_node": bool(inter), "size_bytes": int(params / nb * nbytes),
                                              "dtype": "bf16"})
