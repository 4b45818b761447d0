"""estimator/compute.py: routed experts whose shape is not in the grouped-GEMM table (a loop of measured dense GEMMs).

Synthetic tables check the arithmetic exactly (a pure power-law GEMM table interpolates exactly in
log space, so the expected times are hand-derived); the recorded B200 tables check the physics at the
shapes the grouped table does measure.
"""
import numpy as np
import pytest
from scaleplan.estimator import Estimator
from scaleplan.estimator.comm import collective_time
from scaleplan.estimator.compute import expert_times
from scaleplan.estimator.context import Lookups
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.sources import Recorder
from scaleplan.estimator.tables import ANALYTIC, CLAMPED, INTERPOLATED

from scaleplan.geometry import ladder_model
from scaleplan.specs import Layout, parse_spec

from .conftest import context, frame, grouped_frame, moe_spec

C = 1e-15  # seconds per (m n k): t = C m n k, a pure power law
AX = [2.0 ** i for i in range(6, 19)]  # 64 .. 262144 on every axis


def _gemm_frame(lo=6):
    ax = [2 ** i for i in range(lo, 19)]
    rows = [dict(m=m, n=n, k=k, dtype="bf16", t_s=C * m * n * k) for m in ax for n in ax for k in ax]
    return frame(rows)


def _experts(est, g, E_loc, tile, etp=1.0, clamp=False):
    E_loc, tile, etp = (np.atleast_1d(np.asarray(x, dtype=float)) for x in (E_loc, tile, etp))
    P = max(len(E_loc), len(tile), len(etp))
    ctx = context(est, g, ParallelLayout.of(etp=np.broadcast_to(etp, (P,)), tp=np.broadcast_to(etp, (P,))),
                  mode="clamp" if clamp else "error", E_loc=E_loc, tile=tile)
    f, b = expert_times(ctx)
    return f, b, ctx.rec


def test_dense_loop_equals_hand_computed_gemm_sum():
    # grouped table only for another shape (4096 x 1280): the 700M model's 2048 x 1280 experts fall back
    est = Estimator.from_frames("p6-b200.48xlarge", {"gemm": _gemm_frame(),
                                                     "grouped_gemm": grouped_frame(4096, 1280, lambda n, t: 1e-3)})
    g = geometry(parse_spec(moe_spec()).model)        # d = 2048, d_expert = 1280, SwiGLU
    E_loc, tile = np.array([16.0, 128.0]), np.array([1536.0, 300.0])
    f, b, rec = _experts(est, g, E_loc, tile)
    d, ff = 2048, 1280
    # per local expert: fc1 [tile, d] x [d, 2 ff] (tile d 2ff) + fc2 [tile, ff] x [ff, d] (tile ff d) = 3 tile d ff;
    # the backward is dgrad + wgrad of each, the same products again twice
    want_f = E_loc * C * 3 * tile * d * ff
    assert np.allclose(f, want_f, rtol=1e-9)
    assert np.allclose(b, 2 * want_f, rtol=1e-9)
    assert (rec.src["experts"] == INTERPOLATED).all()   # derived from the table even at grid points
    assert any("experts from dense GEMM table" in m and "2048x1280" in m for m in rec.notes)


def test_measured_shape_keeps_the_grouped_table():
    law = lambda ng, tpe: 1e-7 * ng * tpe
    est = Estimator.from_frames("p6-b200.48xlarge", {"gemm": _gemm_frame(),
                                                     "grouped_gemm": grouped_frame(2048, 1280, law)})
    g = geometry(parse_spec(moe_spec()).model)
    f, b, rec = _experts(est, g, [16.0], [512.0])
    assert f[0] == pytest.approx(law(16, 512)) and b[0] == pytest.approx(2 * law(16, 512))
    assert not rec.notes


def test_no_tables_is_analytic():
    est = Estimator.from_frames("p6-b200.48xlarge", {})
    g = geometry(parse_spec(moe_spec()).model)
    _, _, rec = _experts(est, g, [16.0], [512.0])
    assert (rec.src["experts"] == ANALYTIC).all()


def test_dense_loop_lookups_are_range_checked():
    # the GEMM grid starts at 1024: a 768-row tile is out of range on m, never extrapolated
    est = Estimator.from_frames("p6-b200.48xlarge", {"gemm": _gemm_frame(lo=10)}, extrapolate="error")
    g = geometry(parse_spec(moe_spec()).model)
    _, _, rec = _experts(est, g, [16.0, 16.0], [768.0, 4096.0])
    assert list(rec.oor.reason) == ["out_of_range:gemm.m", None]
    assert rec.oor.table[0] == "gemm" and rec.oor.value[0] == 768.0 and rec.oor.lo[0] == 1024.0
    clamp = Estimator.from_frames("p6-b200.48xlarge", {"gemm": _gemm_frame(lo=10)}, extrapolate="clamp")
    _, _, rec = _experts(clamp, g, [16.0], [768.0], clamp=True)
    assert rec.src["experts"][0] == CLAMPED and rec.n_clamped[0] >= 1


def test_dense_loop_stays_inside_the_grouped_kernels_measured_envelope():
    # grouped rows (any shape) span num_gemms 4..128 and tokens_per_expert 64..4096: the fallback for an
    # unmeasured shape is range-checked on those axes too, like a measured shape would be
    est = Estimator.from_frames("p6-b200.48xlarge", {"gemm": _gemm_frame(),
                                                     "grouped_gemm": grouped_frame(4096, 1280, lambda n, t: 1e-3)})
    g = geometry(parse_spec(moe_spec()).model)
    _, _, rec = _experts(est, g, [2.0, 16.0, 16.0], [512.0, 8192.0, 512.0])
    assert list(rec.oor.reason) == ["out_of_range:grouped_gemm.num_gemms",
                                    "out_of_range:grouped_gemm.tokens_per_expert", None]
    assert rec.oor.hi[1] == 4096.0 and rec.oor.lo[0] == 4.0
    # no grouped table at all: only the dense GEMM grid bounds the loop
    dense_only = Estimator.from_frames("p6-b200.48xlarge", {"gemm": _gemm_frame()})
    _, _, rec = _experts(dense_only, g, [2.0, 16.0], [512.0, 8192.0])
    assert not rec.has_oor.any()


def test_estimate_reports_the_fallback_in_sources_and_warnings():
    est = Estimator.from_frames("p6-b200.48xlarge", {"gemm": _gemm_frame()})
    r = est.estimate(parse_spec(moe_spec()), 32, [Layout(pp=2, ep=8)])[0]
    assert r.sources["experts"] == "interpolated"
    assert any("experts from dense GEMM table" in w for w in r.warnings)
    assert "experts" not in est.layouts(parse_spec(moe_spec()), 32, top=1).analytic_components


@pytest.fixture(scope="module")
def recorded(recorded_db):
    return Estimator("p6-b200.48xlarge", db_url=recorded_db, use_calibration=False)


def test_recorded_loop_vs_grouped_kernel_at_measured_shapes(recorded):
    """At the shapes the grouped table measures, cost the same expert MLP both ways.

    Compute-bound tiles (where the grouped rows themselves reach >= 40% of the datasheet peak): both
    implementations do the same FLOPs near their GEMM efficiency, so their times agree within 2x.
    Every tile: the loop issues one kernel per GEMM, so it can beat neither the datasheet peak nor
    E_loc x (2 forward kernels) x the fastest GEMM the dense table measured.
    """
    tb = recorded.tables
    peak = recorded.profile.peak("bf16")
    axes = np.meshgrid(*tb.gemm.grid, indexing="ij")  # every measured (m, n, k): the table's own points
    t_min = float(tb.gemm.lookup(*(a.ravel() for a in axes)).t.min())
    n_checked = 0
    for (dirn, h, ff), tab in tb.grouped.items():
        if dirn != "fwd":
            continue
        # a geometry with that expert shape (only d, d_expert and GLU matter to the expert GEMMs)
        moe = {**moe_spec()["model"]["moe"], "expert_inter_sz": ff, "shared_expert_inter_sz": ff}
        g = geometry(parse_spec(moe_spec(model={"hidden_sz": h, "n_q_heads": h // 128, "n_kv_heads": h // 128,
                                                "moe": moe})).model)
        ng, tpe = np.meshgrid(tab.grid[0], tab.grid[1], indexing="ij")
        ng, tpe = ng.ravel(), tpe.ravel()
        grouped_f = tab.lookup(ng, tpe).t
        grouped_b = tb.grouped[("bwd", h, ff)].lookup(ng, tpe).t
        saved = dict(tb.grouped)
        try:
            tb.grouped.pop(("fwd", h, ff))   # hide the shape: the dense loop is used
            f, b, rec = _experts(recorded, g, ng, tpe)
        finally:
            tb.grouped.clear()
            tb.grouped.update(saved)
        assert not rec.has_oor.any()
        flops = 2.0 * ng * tpe * 3 * h * ff
        assert (f >= flops / peak).all() and (b >= 2 * flops / peak).all()
        assert (f >= 2 * ng * t_min * (1 - 1e-9)).all()
        big = flops / grouped_f >= 0.4 * peak
        n_checked += int(big.sum())
        assert np.all((f[big] / grouped_f[big] > 0.5) & (f[big] / grouped_f[big] < 2.0)), (h, ff)
        assert np.all((b[big] / grouped_b[big] > 0.5) & (b[big] / grouped_b[big] < 2.0)), (h, ff)
    assert n_checked >= 10


def test_recorded_ladder_shapes_are_costed_from_measurements(recorded):
    # q=12, G=2: d_expert = 7680 is not a grouped-table shape; no component of the experts is analytic
    r = recorded.best_plan(ladder_model(12, 32, 2, 2), 256, 1024, 2048, "adamw")
    # (composed: tiles beyond the grouped tables' measured envelope, costed by the same dense loop)
    assert r is not None and r.sources["experts"] in ("interpolated", "composed")
    assert any("6144x7680" in w for w in r.warnings)


def test_inter_node_all_to_all_keeps_inter_node_bytes_per_rank():
    # a table that obeys the NIC-bound law t = S (n - 8) / n / BW on 8-GPU nodes, measured at 16 and 32
    # ranks: a 128-rank all-to-all is S (120/128) / BW, not the busbw-invariant S (127/128) / busbw(32)
    BW = 40e9
    sizes = [1e6 * 2 ** i for i in range(12)]
    rows = [dict(collective="all_to_all", group_size=n, layout="contiguous", inter_node=True, size_bytes=s,
                 dtype="bf16", t_s=s * (n - 8) / n / BW) for n in (16, 32) for s in sizes]
    est = Estimator.from_frames("p6-b200.48xlarge", {"collectives": frame(rows)})
    rec = Recorder(3, "error")
    n = np.array([16.0, 128.0, 64.0])
    S = np.array([1e8, 1e8, 4e8])
    t = collective_time(Lookups(est.tables, est.profile, rec), "ep_a2a", "all_to_all", n, S, True,
                        per_node=np.array([8.0, 8.0, 4.0]))
    # 64 ranks 4 per node (TP = 2): 60 of 64 peers are remote
    assert np.allclose(t, S * np.array([8 / 16, 120 / 128, 60 / 64]) / BW, rtol=1e-9)


def test_slower_all_to_all_never_shortens_an_iteration(recorded_db):
    # the DP collectives hide behind compute, not behind the EP all-to-all on the same links: making the
    # all-to-all slower can only lengthen every plan (it used to shrink the exposed DP time)
    from scaleplan.db.measurements import load_frames

    frames = load_frames(recorded_db, "p6-b200.48xlarge")
    slow = dict(frames)
    c = frames["collectives"].copy()
    c.loc[c["collective"] == "all_to_all", "t_s"] *= 2.0
    slow["collectives"] = c
    m = ladder_model(12, 256, 1, 4)
    out = []
    for fr in (frames, slow):
        est = Estimator.from_frames("p6-b200.48xlarge", fr)
        _, plans, ev, *_ = est.evaluate_arrays(m, 256, 1024, 2048, "adamw")
        out.append(ev.t_iter)
    assert len(out[0]) > 100
    assert (out[1] >= out[0] * (1 - 1e-12)).all()
    assert (out[1] > out[0]).any()
