"""Table interpolation inside the range, OutOfRangeError outside, clamp counting, the vocab axis."""
from dataclasses import replace

import numpy as np
import pytest
from scaleplan.estimator import Estimator
from scaleplan.estimator.model_dims import geometry, padded_vocab
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.kernels import layer_kernels
from scaleplan.estimator.sources import Recorder
from scaleplan.estimator.tables import GridTable

from scaleplan.errors import OutOfRangeError, SpecError
from scaleplan.specs import Layout, parse_spec

from .conftest import frame, moe_spec


def test_power_law_is_interpolated_exactly_in_log_space():
    m = n = k = np.array([256.0, 1024.0, 4096.0])
    vals = 1e-12 * np.einsum("i,j,k->ijk", m, n, k).ravel()  # t = c m n k (a pure power law)
    tab = GridTable("gemm", ("m", "n", "k"), [m, n, k], vals)
    r = tab.lookup(np.array([512.0, 1024.0, 3000.0]), 2048.0, np.array([256.0, 700.0, 4096.0]))
    assert np.allclose(r.t, 1e-12 * np.array([512 * 2048 * 256, 1024 * 2048 * 700, 3000 * 2048 * 4096]))
    assert (r.oor_axis == -1).all()
    assert list(r.code) == [1, 1, 1]  # interpolated (off-grid n)
    exact = tab.lookup(1024.0, 1024.0, 256.0)
    assert int(exact.code) == 0 and float(exact.t) == pytest.approx(1e-12 * 1024 * 1024 * 256)


def test_out_of_range_reports_axis_and_range():
    g = np.array([1.0, 10.0])
    tab = GridTable("t", ("a", "b"), [g, g], np.ones(4))
    r = tab.lookup(np.array([5.0, 20.0, 5.0]), np.array([5.0, 5.0, 0.5]))
    assert list(r.oor_axis) == [-1, 0, 1]
    assert r.oor_value[1] == 20.0 and r.lo[1] == 1.0 and r.hi[1] == 10.0
    assert r.oor_value[2] == 0.5


def _sdpa_frame():
    rows = []
    for s in (2048, 4096, 8192, 16384):
        for b in (1, 2, 4):
            for q in (8, 16, 32, 64):
                for hd in (64, 128):
                    t = 1e-12 * s * s * b * q * hd
                    rows.append(dict(seq_len=s, micro_bs=b, n_q_heads=q, n_kv_heads=8, head_dim=hd, causal=True,
                                     dtype="bf16", backend="te", fwd_s=t, bwd_s=2.5 * t))
    return frame(rows)


def test_estimate_raises_out_of_range_and_clamp_counts():
    est = Estimator.from_frames("p6-b200.48xlarge", {"sdpa": _sdpa_frame()}, extrapolate="error")
    spec = parse_spec(moe_spec(data={"seqlen": 32768, "gbs": 256}))
    with pytest.raises(OutOfRangeError) as ei:
        est.estimate(spec, 32, [Layout(pp=2, ep=8)])
    e = ei.value
    assert (e.table, e.axis, e.value, e.lo, e.hi) == ("sdpa", "seq_len", 32768, 2048, 16384)
    assert "2048" in str(e) and "16384" in str(e)
    clamp = Estimator.from_frames("p6-b200.48xlarge", {"sdpa": _sdpa_frame()}, extrapolate="clamp")
    r = clamp.estimate(spec, 32, [Layout(pp=2, ep=8)])[0]
    assert r.sources["sdpa"] == "clamped"
    assert r.n_clamped == 2  # the forward and the backward lookup
    assert any("clamped" in w for w in r.warnings)


def test_plan_search_marks_out_of_range_plans_infeasible():
    est = Estimator.from_frames("p6-b200.48xlarge", {"sdpa": _sdpa_frame()}, extrapolate="error")
    spec = parse_spec(moe_spec())
    res = est.layouts(spec, 32, top=None)
    # n_q_heads per TP rank below the measured 8 (TP >= 4 on 16 heads) is out of range, never extrapolated
    assert res.infeasible_counts.get("out_of_range:sdpa.n_q_heads", 0) > 0
    assert all(r.layout["tp"] <= 2 for r in res.ranked)
    assert all(r.feasible for r in res.ranked)


def test_rejects_nonpositive_and_nan_sizes(sqlite_url):
    est = Estimator("p6-b200.48xlarge", db_url=sqlite_url)
    m = parse_spec(moe_spec()).model
    for bad in (0, -4, float("nan")):
        with pytest.raises(SpecError):
            est.best_plan(m, 32, bad, 8192)
        with pytest.raises(SpecError):
            est.best_plan(m, bad, 256, 8192)


def test_megatron_vocab_padding():
    assert padded_vocab(257540) == 257664  # the recorded table's vocab_padded
    assert padded_vocab(257536) == 257536  # already a multiple of 128
    assert padded_vocab(257540, 2) == 257792 and padded_vocab(257536, 8) == 252 * 1024  # 257536/1024 = 251.5


def _vocab_frame():
    rows = []
    for op in ("lm_head_gemm", "cross_entropy"):
        for tok in (4096, 8192, 16384, 32768):
            for h in (2048, 4096, 6144):
                rows.append(dict(op=op, tokens=tok, hidden=h, vocab=257664, dtype="bf16",
                                 fwd_s=1e-9 * tok * (h if op == "lm_head_gemm" else 1000), bwd_s=None))
    df = frame(rows)
    df["bwd_s"] = df["fwd_s"]
    return df


@pytest.mark.parametrize("vocab,tp,logit_ratio", [(257540, 1, 1.0), (257536, 1, 257536 / 257664),
                                                   (257540, 2, 257792 / 2 / 257664)])
def test_single_valued_vocab_axis_maps_to_logit_count(vocab, tp, logit_ratio):
    # the table has one vocab (257664, Megatron-padded); both kernels scale with the logit count,
    # so a request is looked up at tokens * V_local_padded / 257664 (linear data: exact ratio)
    est = Estimator.from_frames("p6-b200.48xlarge", {"vocab": _vocab_frame()})
    spec = parse_spec(moe_spec(model={**moe_spec()["model"], "vocab_sz": vocab}))
    g = geometry(spec.model)
    pl = ParallelLayout.from_specs([Layout(tp=tp, pp=2, ep=8)], 32)
    ctx = replace(est.model.context(g, pl, spec.data.seqlen), rec=Recorder(1, "error"))
    rec = ctx.rec
    k = layer_kernels(ctx)
    expect = 2 * 1e-9 * 8192 * logit_ratio * (2048 + 1000) * 2 / 2  # (gemm + ce) x (fwd + bwd)
    assert float((k.t_last_f + k.t_last_b)[0]) == pytest.approx(expect, rel=1e-9)
    assert not rec.has_oor.any()


def test_one_measured_point_is_a_table():
    """`bench plan` measures exactly the points one layout looks up: a single vocab, router or
    element-wise row is a table whose lookup at that point is measured (not a GEMM-table fallback
    out of range), and a collective measured at one size answers that size."""
    from scaleplan.estimator.table_build import build_tables

    fr = {"vocab": frame([dict(op=op, tokens=64, hidden=64, vocab=512, dtype="fp32", fwd_s=f, bwd_s=2 * f)
                          for op, f in (("lm_head_gemm", 4e-5), ("cross_entropy", 1e-5))]),
          "router": frame([dict(variant="topk", num_tokens=64, num_experts=8, k=2, dtype="fp32", fwd_s=3e-6,
                                bwd_s=5e-6)]),
          "elementwise": frame([dict(op="rmsnorm", tokens=64, hidden=64, dtype="fp32", fwd_s=2e-6, bwd_s=4e-6)]),
          "collectives": frame([dict(collective="all_reduce", group_size=2, layout="contiguous", inter_node=False,
                                     size_bytes=4096, dtype="fp32", t_s=7e-5)])}
    tb = build_tables("cpu-local", fr, 1e12)
    res = tb.view("fp32").vocab[("lm_head_gemm", "bwd")].lookup(64, 64)
    from scaleplan.estimator.tables import MEASURED

    assert float(np.ravel(res.t)[0]) == pytest.approx(8e-5) and int(np.ravel(res.code)[0]) == MEASURED
    assert float(np.ravel(tb.topk["fwd"].lookup(64, 8, 2).t)[0]) == pytest.approx(3e-6)
    assert float(np.ravel(tb.elementwise[("rmsnorm", "bwd")].lookup(64, 64).t)[0]) == pytest.approx(4e-6)
    t, lo, hi, _ = tb.collectives[("all_reduce", "contiguous", False)].time(np.array([2.0]), np.array([4096.0]))
    assert float(t[0]) == pytest.approx(7e-5) and (lo[0], hi[0]) == (4096, 4096)
    # another point is out of range, reported, not extrapolated
    assert int(np.ravel(tb.view("fp32").vocab[("lm_head_gemm", "fwd")].lookup(128, 64).oor_axis)[0]) == 0


def test_a_collective_point_slower_than_a_larger_message_is_interpolated_across():
    """Timing noise only adds: where a message takes longer than a larger one of the same curve, the
    smaller point is dropped and the curve interpolates (log-log) across it; the larger points keep
    their measured times (a running maximum raised them to the slow point instead)."""
    from scaleplan.estimator.table_build import build_tables

    pts = {1e6: 1e-4, 2e6: 8e-4, 4e6: 4e-4, 8e6: 8e-4}  # 2 MB slower than 4 MB
    fr = {"collectives": frame([dict(collective="all_to_all", group_size=16, layout="contiguous", inter_node=True,
                                     size_bytes=s, dtype="bf16", t_s=t) for s, t in pts.items()])}
    tab = build_tables("cpu-local", fr, 1e12).collectives[("all_to_all", "contiguous", True)]
    t, *_ = tab.time(np.full(3, 16.0), np.array([2e6, 4e6, 8e6]))
    # between 1 MB (1e-4 s) and 4 MB (4e-4 s) the curve is t ~ size: 2 MB -> 2e-4 s
    assert t == pytest.approx([2e-4, 4e-4, 8e-4], rel=1e-9)


def test_recorded_two_node_all_to_all_is_monotone_at_the_18b_message(recorded_db):
    # the recorded 16-rank inter-node all-to-all: 256 MB 2.99 ms, 302 MB 7.46 ms (twice), 512 MB 5.68 ms;
    # the 18B's dispatch message at mbs 1 is 302 MB: its time lies between its neighbours' now
    est = Estimator("p6-b200.48xlarge", db_url=recorded_db)
    tab = est.tables.collectives[("all_to_all", "contiguous", True)]
    t, *_ = tab.time(np.full(3, 16.0), np.array([256e6, 302e6, 512e6]))
    assert t[0] == pytest.approx(2.985e-3, rel=0.01) and t[2] == pytest.approx(5.68e-3, rel=0.01)
    assert t[0] < t[1] < t[2]


def test_compose_is_the_default_and_labels_what_it_composed():
    # seqlen 32768 on a table measured to 16384: composed quadratically (t ~ s^2 in the synthetic
    # table, so exact), labelled, with its rule in the warnings and its share of the step time
    spec = parse_spec(moe_spec(data={"seqlen": 32768, "gbs": 256}))
    est = Estimator.from_frames("p6-b200.48xlarge", {"sdpa": _sdpa_frame()})
    r = est.estimate(spec, 32, [Layout(pp=2, ep=8)])[0]
    assert r.feasible and r.sources["sdpa"] == "composed"
    assert any("quadratic in seq_len" in w for w in r.warnings)
    # the warning names the axis the lookup left and the measured range it was composed from
    assert any("seq_len measured" in w and "..16384" in w for w in r.warnings), r.warnings
    assert r.composed_share == pytest.approx(r.breakdown_s["sdpa"] / r.t_analytic_s, rel=1e-9)
    half = Estimator.from_frames("p6-b200.48xlarge", {"sdpa": _sdpa_frame()}).estimate(
        parse_spec(moe_spec(data={"seqlen": 16384, "gbs": 512})), 32, [Layout(pp=2, ep=8)])[0]
    # same tokens per step, twice the sequence: SDPA work per step doubles (quadratic per sequence)
    assert r.breakdown_s["sdpa"] == pytest.approx(2 * half.breakdown_s["sdpa"], rel=1e-6)


def test_elementwise_table_is_read_where_it_has_the_op():
    # fwd = 1 ns per element, bwd = 3 ns per element: the model must read these, not the HBM roofline
    rows = [dict(op=op, tokens=t, hidden=h, dtype="bf16", fwd_s=1e-9 * t * h, bwd_s=3e-9 * t * h)
            for op in ("rmsnorm", "residual_add", "rope") for t in (1024, 16384) for h in (1024, 8192)]
    est = Estimator.from_frames("p6-b200.48xlarge", {"elementwise": frame(rows)})
    spec = parse_spec(moe_spec(performance={"activation_checkpointing_type": "none"}))
    r = est.estimate(spec, 8, [Layout(pp=1, ep=1, mbs=1, ckpt="none")])[0]
    assert r.sources["elementwise"] in ("measured", "interpolated")
    T, d, L, n_mb = 8192, 2048, 16, 256 / 8
    rope_w = (16 + 16) * 128  # local q + kv heads x head_dim at TP = 1
    per_elem = 4 * T * d + T * rope_w  # 2 norms + 2 residual adds on [T, d], RoPE on [T, rope_w]
    gate = 2 * T * 16 * 128 * 3 / 7.7e12  # the head gate has no table: bf16 bytes through HBM (fwd)
    expect = n_mb * L * ((1e-9 + 3e-9) * per_elem + 3 * gate)  # backward: twice the gate's forward
    assert r.breakdown_s["elementwise"] == pytest.approx(expect, rel=1e-6)


def test_multilinear_agrees_with_scipy_regular_grid_interpolator():
    # the lookup interpolator is ours (start-up time); scipy's linear RegularGridInterpolator is the
    # reference, inside the grid and on the edge cells' linear extension
    from scaleplan.estimator.lookup_points import Multilinear
    from scipy.interpolate import RegularGridInterpolator

    rng = np.random.default_rng(7)
    for nd in (1, 2, 3, 4):
        grid = [np.sort(rng.uniform(0, 10, rng.integers(2, 7))) for _ in range(nd)]
        vals = rng.normal(size=[len(g) for g in grid])
        pts = np.stack([rng.uniform(g[0] - 1, g[-1] + 1, 400) for g in grid], axis=-1)
        ref = RegularGridInterpolator(grid, vals, method="linear", bounds_error=False, fill_value=None)(pts)
        np.testing.assert_allclose(Multilinear(grid, vals)(pts), ref, rtol=0, atol=1e-12)


def test_distinct_points_partition_the_requested_points():
    """The points of a large lookup are interpolated once per distinct tuple: each point's tuple is its
    representative's, two distinct tuples never share a code (NaN is one value), and a request of more
    distinct values than an int64 can combine at once (2000^6 > 2^62) still is partitioned exactly."""
    from scaleplan.estimator.lookup_points import distinct_points as _distinct_points

    rng = np.random.default_rng(0)
    few = [rng.choice(np.r_[rng.random(9) * 1e6, np.nan], 30000) for _ in range(3)]
    many = [np.tile(rng.random(2000), 3) for _ in range(6)]
    for cs in (few, many):
        rep, code = _distinct_points(cs)
        pts = np.stack(cs, 1)
        assert np.array_equal(pts, pts[rep[code]], equal_nan=True)
        assert len(rep) == len(np.unique(np.nan_to_num(pts, nan=-1.0), axis=0))
    assert _distinct_points([rng.random(5000), rng.random(5000)]) is None  # under half repeat


def test_on_grid_is_numpys_isin():
    """lookup_points.on_grid (which avoids np.isin's import of numpy.ma) answers as np.isin does: random
    values drawn partly from the grid, NaN, +-0, infinities, duplicates in the grid and an empty grid."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from scaleplan.estimator.lookup_points import on_grid

    vals = st.sampled_from([0.0, -0.0, 1.0, 2.5, 1e-9, 1e12, float("nan"), float("inf"), -float("inf"), 7.0])

    @settings(max_examples=300, deadline=None)
    @given(st.lists(vals | st.floats(), max_size=30), st.lists(vals | st.floats(), max_size=8))
    def check(x, grid):
        x, grid = np.array(x, dtype=float), np.array(grid, dtype=float)
        assert (on_grid(x, grid) == np.isin(x, grid)).all()
        assert on_grid(x.reshape(-1, 1), grid).shape == (len(x), 1)

    check()
