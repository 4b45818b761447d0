"""compute.permute_times: the token permute and unpermute read from the router suite's measured
``permute`` / ``unpermute`` rows where they cover the geometry, else (out of range, or a serial-dispatch
profile whose host rows already hold that compute) the analytic bytes-at-HBM form, never extrapolated;
and ``bench plan`` asks for exactly the points the model reads."""
from dataclasses import replace

import numpy as np
import pytest
from scaleplan.estimator import Estimator
from scaleplan.estimator import analytic as an
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.kernels import layer_kernels
from scaleplan.estimator.sources import Recorder
from scaleplan.estimator.tables import ANALYTIC, INTERPOLATED, MEASURED

from scaleplan.profiles import load_profile
from scaleplan.specs import Layout, parse_spec

from .conftest import frame, moe_spec

TOKENS, EXPERTS, KS, HIDDEN = (4096, 8192, 16384, 32768), (64, 128, 256), (2, 3, 4), (1024, 2048, 4096)


def _law(variant: str, dirn: str):
    """A distinct law per (variant, direction), seconds: each lookup's share is recoverable."""
    c = {("permute", "fwd"): 1.0, ("permute", "bwd"): 2.0, ("unpermute", "fwd"): 3.0, ("unpermute", "bwd"): 5.0}
    return lambda t, e, k, h: c[(variant, dirn)] * 1e-12 * t * k * h


def _router_frame() -> "frame":
    rows = [dict(variant=v, num_tokens=t, num_experts=e, k=k, hidden=h, dtype="bf16",
                 fwd_s=_law(v, "fwd")(t, e, k, h), bwd_s=_law(v, "bwd")(t, e, k, h))
            for v in ("permute", "unpermute") for t in TOKENS for e in EXPERTS for k in KS for h in HIDDEN]
    return frame(rows)


def _kernels(profile: str, spec_over: dict, lays):
    est = Estimator.from_frames(profile, {"router": _router_frame()})
    spec = parse_spec(moe_spec(**spec_over))
    g = geometry(spec.model)
    pl = ParallelLayout.from_specs(lays, 32)
    ctx = est.model.context(g, pl, spec.data.seqlen)
    ctx = replace(ctx, rec=Recorder(len(pl), "error"))
    rec = ctx.rec
    return layer_kernels(ctx), rec, g


def test_measured_rows_give_the_permute_and_unpermute_each_way():
    # 700M geometry: d 2048, E 128, K 3, seqlen 8192; mbs 1 and 2 -> 8192 and 16384 tokens, on the grid
    k, rec, _ = _kernels("p6-b200.48xlarge", {}, [Layout(pp=2, ep=8, mbs=1), Layout(pp=2, ep=8, mbs=2)])
    T = np.array([8192.0, 16384.0])
    f = _law("permute", "fwd")(T, 128, 3, 2048) + _law("unpermute", "fwd")(T, 128, 3, 2048)
    b = _law("permute", "bwd")(T, 128, 3, 2048) + _law("unpermute", "bwd")(T, 128, 3, 2048)
    assert np.allclose(k.perm, f, rtol=1e-9) and np.allclose(k.perm_b, b, rtol=1e-9)
    assert (rec.src["permute"] == MEASURED).all() and not rec.has_oor.any()


def test_between_measured_points_the_lookup_interpolates():
    # K = 3 is on the grid but hidden 3072 is not: log-log between 2048 and 4096 of a law linear in h
    k, rec, _ = _kernels("p6-b200.48xlarge", {"model": {"hidden_sz": 3072, "n_q_heads": 24, "n_kv_heads": 24}},
                         [Layout(pp=2, ep=8, mbs=1)])
    want = (1.0 + 3.0) * 1e-12 * 8192 * 3 * 3072
    assert k.perm[0] == pytest.approx(want, rel=1e-9)
    assert rec.src["permute"][0] == INTERPOLATED


def test_outside_the_measured_range_the_analytic_form_is_kept_not_extrapolated():
    # K = 8 lies above the measured k (2..4): no extrapolation, no refusal, the bytes-at-HBM form
    moe = {**moe_spec()["model"]["moe"], "experts_per_token": 8}
    k, rec, _ = _kernels("p6-b200.48xlarge", {"model": {"moe": moe}}, [Layout(pp=2, ep=8, mbs=1)])
    prof = load_profile("p6-b200.48xlarge")
    R = 8192 * 8  # balanced routed rows on a rank (EP cancels: EP ranks each send T K / EP)
    want = an.memory_time(2 * (8192 + R) * 2048 * 2 * 2, prof.hbm_bandwidth)
    assert k.perm[0] == pytest.approx(want, rel=1e-9) and k.perm_b[0] == k.perm[0]
    assert rec.src["permute"][0] == ANALYTIC and not rec.has_oor.any()


def test_a_serial_dispatch_profile_keeps_the_analytic_form():
    # cpu-local: the measured host rows (ops:*) already hold the permutation ops' compute
    k, rec, _ = _kernels("cpu-local", {"hardware": {"node_type": "cpu-local"}}, [Layout(pp=1, ep=1, mbs=1)])
    assert rec.src["permute"][0] == ANALYTIC
    assert k.perm[0] == k.perm_b[0]


def test_the_breakdown_charges_forward_recompute_and_backward():
    est = Estimator.from_frames("p6-b200.48xlarge", {"router": _router_frame()})
    spec = parse_spec(moe_spec(performance={"activation_checkpointing_type": "none"}))
    lays = [Layout(pp=1, ep=8, mbs=1, ckpt="none"), Layout(pp=1, ep=8, mbs=1, ckpt="super-selective")]
    res = est.estimate(spec, 32, lays)
    T = 8192.0
    f = (1.0 + 3.0) * 1e-12 * T * 3 * 2048
    b = (2.0 + 5.0) * 1e-12 * T * 3 * 2048
    n_mb = spec.data.gbs // 32  # pp = tp = cp = 1 on 32 GPUs: dp = 32, mbs = 1
    n_moe = spec.model.n_layers - spec.model.moe.first_dense_layers
    # no recompute: forward + backward; super-selective re-runs the permutation's forward
    assert res[0].breakdown_s["permute"] == pytest.approx(n_mb * n_moe * (f + b), rel=1e-9)
    assert res[1].breakdown_s["permute"] == pytest.approx(n_mb * n_moe * (2 * f + b), rel=1e-9)


def test_bench_plan_asks_for_the_points_the_model_reads(sqlite_url):
    est = Estimator("p6-b200.48xlarge", db_url=sqlite_url)
    spec = parse_spec(moe_spec())
    pts = est.lookups(spec, 32, [Layout(pp=2, ep=8, mbs=2)])["router"]
    perm = {(p["variant"], p["num_tokens"], p["num_experts"], p["k"], p["hidden"], p["dtype"]) for p in pts
            if p["variant"] in ("permute", "unpermute")}
    assert perm == {(v, 16384, 128, 3, 2048, "bf16") for v in ("permute", "unpermute")}
