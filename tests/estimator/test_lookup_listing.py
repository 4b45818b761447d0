"""The table points an evaluation looks up are recorded while the model runs (estimator/lookup_listing.py):
the list bench plan measures is the model's own lookups, including those a hand-kept list had dropped."""
import numpy as np
import pytest
from scaleplan.estimator import Estimator
from scaleplan.estimator.lookup_listing import RecordingTables

from scaleplan.specs import Layout, parse_spec
from tests.estimator.conftest import moe_spec

# the 700M model: d 2048, 16 query / 16 KV heads of 128, seqlen 8192, bf16 (2 bytes)
D, NQ, NKV, HD, SEQ, B_EL = 2048, 16, 16, 128, 8192, 2


def _points(layout: Layout, n: int = 32, frames=None):
    est = Estimator.from_frames("p6-b200.48xlarge", frames or {})
    return est.lookups(parse_spec(moe_spec()), n, [layout])


def test_cp_plan_records_the_kv_exchange_and_the_elementwise_points():
    # TP=2, CP=2, MBS=1: a rank holds T = 8192 / 2 = 4096 tokens, 2048 on its sequence-parallel shard;
    # K and V of the 8 local KV heads travel over the 2 CP ranks of one node (forward all-gather,
    # backward reduce-scatter): seqlen x mbs x 2 x 8 x 128 x 2 bytes
    pts = _points(Layout(tp=2, cp=2, pp=2, ep=4, mbs=1, ckpt="selective"))
    T, kv_loc = SEQ // 2, NKV // 2
    kv_bytes = SEQ * 1 * 2 * kv_loc * HD * B_EL
    colls = {(p["collective"], p["group_size"], p["layout"], p["inter_node"], p["size_bytes"])
             for p in pts["collectives"]}
    assert ("all_gather", 2, "contiguous", False, kv_bytes) in colls
    assert ("reduce_scatter", 2, "contiguous", False, kv_bytes) in colls
    # 2 RMSNorms and 2 residual adds on [T/TP, d]; RoPE on the local q and k heads [T, (16/2 + 8) 128]
    ew = {(p["op"], p["tokens"], p["hidden"]) for p in pts["elementwise"]}
    assert ew == {("rmsnorm", T // 2, D), ("residual_add", T // 2, D), ("rope", T, (NQ // 2 + kv_loc) * HD)}


def test_no_cp_no_kv_exchange_and_one_point_per_key():
    pts = _points(Layout(pp=2, ep=8, mbs=1, ckpt="full"))
    kv_bytes = SEQ * 2 * NKV * HD * B_EL
    assert not [p for p in pts["collectives"] if p["size_bytes"] == kv_bytes]
    for rows in pts.values():  # each point once
        keys = [tuple(sorted(r.items())) for r in rows]
        assert len(keys) == len(set(keys))


def test_a_profile_without_tables_lists_what_the_model_would_read():
    # no GEMM table: the model would cost attention analytically; the recording still asks for its GEMMs,
    # QKV (+ the head-wise gate, one column per query head) [T, d] x [d, (16 + 2 x 16) 128 + 16] forward,
    # dgrad and wgrad
    pts = _points(Layout(pp=1, ep=8, mbs=1, ckpt="full"))
    gemms = {(p["m"], p["n"], p["k"]) for p in pts["gemm"]}
    n_qkv = (NQ + 2 * NKV) * HD + NQ
    assert {(SEQ, n_qkv, D), (SEQ, D, n_qkv), (D, n_qkv, SEQ)} <= gemms


def test_recording_answers_placeholders_and_keeps_the_wrapped_attributes():
    est = Estimator.from_frames("p6-b200.48xlarge", {})
    from scaleplan.estimator.model_dims import geometry
    rt = RecordingTables(est.tables, geometry(parse_spec(moe_spec()).model))
    res = rt.gemm.lookup(np.array([64.0, 64.0]), 128.0, 256.0)
    assert res.t.shape == (2,) and (res.oor_axis == -1).all()
    assert rt.points == {"gemm": [{"m": 64, "n": 128, "k": 256, "dtype": "bf16"}]}
    assert rt.t_kernel_min_s == est.tables.t_kernel_min_s
    with pytest.raises(AttributeError):
        _ = rt.no_such_table


@pytest.mark.parametrize("precision, wire", [("fp32", "fp32"), ("bf16", "bf16"), ("fp8", "bf16")])
def test_collectives_are_asked_in_the_dtype_on_the_wire(precision, wire):
    # an fp32 model (a CPU model) exchanges fp32 tensors: its bench must not ask for bf16 collectives;
    # bf16 and fp8-GEMM models exchange bf16 activations and gradients
    spec = moe_spec()
    spec["model"]["precision"] = precision
    est = Estimator.from_frames("p6-b200.48xlarge", {})
    pts = est.lookups(parse_spec(spec), 32, [Layout(tp=2, pp=2, ep=4, mbs=1, ckpt="full")])
    assert pts["collectives"] and {p["dtype"] for p in pts["collectives"]} == {wire}
