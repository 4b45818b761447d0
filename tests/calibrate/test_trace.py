"""`calibrate trace` (calibrate/trace.py): a profiler trace read into kernels, launches, syncs and busy time,
set beside the dispatch law, and fitted into a 'dispatch' calibration. The traces are written by a
discrete-event host/device simulation (tests/calibrate/trace_gen.py) that keeps its own totals."""
from __future__ import annotations

import json

import numpy as np
import pytest
from scaleplan.calibrate.trace import Trace, compare, fit_law, peer_waits, read_trace, stage_of, store_law

from scaleplan.errors import SpecError
from tests.calibrate.trace_gen import Rank, collective_group, host_bound_rank

PROFILE = "p6-b200.48xlarge"
DISPATCHER = "megatron/core/transformer/moe/token_dispatcher.py(412): preprocess"
LOSS = "megatron/training/training.py(1510): loss_func"


def _device_bound_step(r: Rank) -> None:
    for i in range(40):
        r.kernel(dur_us=20.0, gap_us=8.0)
        if i == 19:
            r.sync(DISPATCHER)
    r.sync(LOSS, copy_us=2.0)


def test_reader_recovers_what_the_simulation_launched_waited_and_ran(tmp_path):
    r = Rank(rank=3)
    for n in (1, 2, 3):
        r.step(n, _device_bound_step)
    tr = read_trace(r.write(tmp_path / "rank3.pt.trace.json"))
    tot, k = r.tot, 3
    assert (tr.rank, tr.world_size, len(tr.steps)) == (3, 8, k)
    for s, wall in zip(tr.steps, tot.step_us):
        assert (s.kernels, s.copies, s.launches, s.syncs) == (tot.kernels / k, tot.copies / k, tot.launches / k,
                                                               tot.syncs / k)
        assert s.wall_s == pytest.approx(wall * 1e-6)
        assert s.sync_s == pytest.approx(tot.sync_us / k * 1e-6)
        assert s.device_busy_s == pytest.approx(tot.device_us / k * 1e-6)  # one stream: the sum of durations
        assert s.host_busy_s == pytest.approx((wall - tot.sync_us / k) * 1e-6)
    got = {c["caller"]: (c["per_step"], c["seconds_per_step"]) for c in tr.causes()}
    assert got.keys() == tot.causes.keys()
    for caller, (n, us) in tot.causes.items():
        assert got[caller] == pytest.approx((n / k, us / k * 1e-6))
    # device-bound: the host waits at the dispatcher's count read for the kernels it ran ahead of
    assert got[DISPATCHER][1] > 19 * (20.0 - 8.0) * 1e-6


def test_overlap_bounds_split_the_step_at_its_syncs(tmp_path):
    """A host-bound segment (20 kernels of 2 us issued 20 us apart) then a device-bound one (20 of 40 us
    issued 2 us apart), a sync after each: the law's max(host, device) over the whole step is the device's
    840 us, but the sync between them lets nothing overlap, so the step lasts 400 + 800 us."""
    def body(r):
        for _ in range(20):
            r.kernel(dur_us=2.0, gap_us=20.0)
        r.sync(DISPATCHER)
        for _ in range(20):
            r.kernel(dur_us=40.0, gap_us=2.0)

    r = Rank()
    r.step(1, body)
    s = read_trace(r.write(tmp_path / "t.json")).steps[0]
    assert s.overlap_bound_s == pytest.approx((20 * 2 + 20 * 40) * 1e-6, rel=0.02)
    assert s.serial_bound_s == pytest.approx((20 * 20 + 20 * 40) * 1e-6, rel=0.03)
    assert s.wall_s == pytest.approx(s.serial_bound_s, rel=0.03)


def test_nccl_kernels_on_their_own_stream_overlap_compute_and_are_counted_apart(tmp_path):
    """A 100 us all-to-all on the communication stream beside ten 20 us GEMMs on the compute stream: the
    device is busy for the union (the GEMMs' 200 us cover the all-to-all), NCCL for its own 100 us."""
    def body(r):
        r.kernel(dur_us=100.0, gap_us=5.0, op="c10d::alltoall_base_", name="ncclDevKernel_SendRecv", stream=13)
        for _ in range(10):
            r.kernel(dur_us=20.0, gap_us=5.0)

    r = Rank()
    r.step(1, body)
    tr = read_trace(r.write(tmp_path / "t.json"))
    s = tr.steps[0]
    assert len(tr.steps) == 1 and s.kernels == 11
    assert s.nccl_s == pytest.approx(100e-6)
    assert s.device_busy_s == pytest.approx((10 * 20.0 + 5.0) * 1e-6)  # the GEMMs start one gap after it


def test_gzip_and_a_trace_without_step_annotations_read_as_one_step(tmp_path):
    r = Rank(rank=None)
    _device_bound_step(r)
    tr = read_trace(r.write(tmp_path / "t.json.gz", gz=True))
    assert len(tr.steps) == 1 and tr.rank is None
    assert tr.steps[0].kernels == r.tot.kernels and tr.steps[0].syncs == r.tot.syncs


@pytest.mark.parametrize("content, why", [
    ("not json", "Chrome trace"),
    (b"\x1f\x8b\x08\x00 a cut gzip stream", "Chrome trace"),
    (json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5}]}),
     "CUDA activity"),
    (json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0, "dur": 5}]}),
     "host activity"),
    (json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "gemm", "ts": "soon", "dur": 5}]}),
     "CUDA activity"),
])
def test_a_file_that_is_no_gpu_trace_is_refused_in_one_line(tmp_path, content, why):
    p = tmp_path / "x.json"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(SpecError, match=why):
        read_trace(p)


def _spec():
    from scaleplan.specs import parse_spec

    return parse_spec({"model": {"n_layers": 2, "hidden_sz": 1024, "inter_sz": 2048, "n_q_heads": 8,
                                 "n_kv_heads": 8, "head_dim": 128, "vocab_sz": 32000,
                                 "moe": {"n_experts": 32, "experts_per_token": 2, "expert_inter_sz": 512,
                                         "first_dense_layers": 0}},
                       "data": {"gbs": 4, "seqlen": 2048}, "hardware": {"node_type": PROFILE}})


def test_compare_recovers_the_simulated_kernel_count_and_gap(tmp_path):
    from scaleplan.estimator import Estimator

    est = Estimator(PROFILE, use_calibration=False)
    law = est.dispatch
    layout = {"tp": 1, "cp": 1, "pp": 1, "dp": 2, "ep": 2, "etp": 1, "vpp": 1, "mbs": 1, "ckpt": "full"}
    n_mb, layers, kappa, gap = 4 // 2, 2, 300, 30.0  # gbs / dp micro-batches; every layer MoE
    fixed_us = (layers * law.t_ep_host_s + law.t_host_s) * 1e6
    r = host_bound_rank(kappa, gap, n_mb, layers, fixed_us)
    row = compare(read_trace(r.write(tmp_path / "t.json")), _spec(), layout, 2, est)
    assert (row["n_mb"], row["L_stage"], row["n_moe_stage"], row["E_loc"], row["kernel_units"]) == (2, 2, 2, 16, 1.0)
    assert row["stage"] == 0 and "rank 1" in row["stage_from"]
    assert row["kappa_measured"] == pytest.approx(kappa)
    assert row["kappa_law"] == pytest.approx(law.kappa0 + law.kappa1 * 16)
    # the host time is the simulated gaps and fixed work (the closing sync and step padding add ~10 us)
    assert row["t_gap_implied_s"] == pytest.approx(gap * 1e-6, rel=1e-3)
    assert row["host_per_mb_s"] == pytest.approx((layers * kappa * gap + fixed_us) * 1e-6, rel=1e-3)


def _row(e_loc, kappa, t_gap, fixed=0.03, L=4.0, n_mb=8.0, u=1.0):
    return {"file": f"e{e_loc}.json", "sha256": "0", "E_loc": e_loc, "kappa_measured": kappa, "kernel_units": u,
            "L_stage": L, "n_mb": n_mb, "law_fixed_per_mb_s": fixed, "kernels": kappa * L * n_mb * u,
            "host_per_mb_s": L * kappa * u * t_gap + fixed}


def test_fit_law_takes_both_kappa_terms_from_two_expert_counts_and_the_gap_from_the_host_time():
    k0, k1, gap = 640.0, 7.5, 25e-6
    fitted, notes = fit_law([_row(e, k0 + k1 * e, gap) for e in (4, 16, 64)], kappa1_prior=99.0)
    assert fitted == pytest.approx({"kappa0": k0, "kappa1": k1, "t_gap_s": gap})
    assert notes == []
    one, notes = fit_law([_row(16, k0 + 2.0 * 16, gap)], kappa1_prior=2.0)
    assert one == pytest.approx({"kappa0": k0, "kappa1": 2.0, "t_gap_s": gap}) and "kept" in notes[0]


def test_fit_law_refuses_counts_that_fall_with_local_experts_and_host_time_inside_the_fixed_terms():
    with pytest.raises(SpecError, match="grow with E_loc"):
        fit_law([_row(4, 700.0, 2e-5), _row(64, 600.0, 2e-5)], 7.0)
    with pytest.raises(SpecError, match="kappa0"):
        fit_law([_row(128, 500.0, 2e-5)], 7.29)  # 500 kernels cannot hold 128 x 7.29 per-expert ones
    with pytest.raises(SpecError, match="fixed per-micro-batch"):
        fit_law([{**_row(16, 700.0, 2e-5), "host_per_mb_s": 0.01}], 7.0)


def test_stored_trace_law_is_the_law_the_estimator_then_uses(sqlite_url):
    from scaleplan.estimator import Estimator

    law = Estimator(PROFILE, db_url=sqlite_url).dispatch
    rows = [_row(e, 600.0 + 8.0 * e, 20e-6, fixed=law.t_host_s) for e in (16, 32)]
    out = store_law(sqlite_url, PROFILE, rows, law)
    after = Estimator(PROFILE, db_url=sqlite_url)
    assert (after.dispatch.kappa0, after.dispatch.kappa1, after.dispatch.t_gap_s) == pytest.approx((600.0, 8.0, 20e-6))
    assert after.host_scale == 1.0 and after.dispatch.t_host_s == pytest.approx(law.t_host_s)
    assert f"calibration {out['calibration_id']}" in after.dispatch.source
    assert max(abs(x) for x in out["host_time_rel_err"]) < 1e-9


def test_stage_follows_megatrons_rank_order_pipeline_outermost():
    lay = {"tp": 4, "cp": 1, "pp": 2, "dp": 8}
    tr = Trace("f", "0", 40, 64, [])
    assert stage_of(tr, lay)[0] == 40 // (4 * 8)
    assert stage_of(tr, lay, stage=0)[0] == 0
    with pytest.raises(SpecError, match="--stage"):
        stage_of(tr, lay, stage=2)


def test_peer_waits_recover_each_collectives_wait_for_the_last_rank(tmp_path):
    """Four ranks, six all-to-alls, each rank late by its own delay before each: a rank's kernel lasts the
    transfer plus the time from its arrival to the last one's, so the mean wait of collective j is
    mean_r (max_q delay_qj - delay_rj), whatever the clocks."""
    rng = np.random.default_rng(7)
    delays = rng.exponential(50.0, size=(4, 6))
    traces = [read_trace(r.write(tmp_path / f"rank{i}.json")) for i, r in
              enumerate(collective_group(delays.tolist(), transfer_us=200.0, compute_us=300.0))]
    out = peer_waits(traces)
    expect = float((delays.max(axis=0) - delays).mean(axis=0).sum()) * 1e-6
    assert out["steps"] == 1 and out["unmatched"] == 0 and out["ranks"] == [0, 1, 2, 3]
    assert out["wait_s"] == pytest.approx(expect)
    (k,) = out["by_kernel"]
    assert k["calls_per_step"] == 6 and k["mean_wait_s"] == pytest.approx(expect / 6)
    assert out["nccl_s"] == pytest.approx(float(np.mean([6 * 200.0 + (delays.max(axis=0) - d).sum()
                                                          for d in delays])) * 1e-6)


def test_peer_waits_need_two_ranks_with_a_common_step(tmp_path):
    a = Rank(rank=0)
    a.step(1, lambda r: r.kernel(5.0, 5.0))
    b = Rank(rank=1)
    b.step(2, lambda r: r.kernel(5.0, 5.0))
    ta, tb = (read_trace(x.write(tmp_path / f"{i}.json")) for i, x in enumerate((a, b)))
    with pytest.raises(SpecError, match="two or more"):
        peer_waits([ta])
    with pytest.raises(SpecError, match="in common"):
        peer_waits([ta, tb])


def test_a_host_scale_keeps_the_stack_a_trace_law_counted(sqlite_url):
    from scaleplan.estimator import Estimator
    from scaleplan.stack import Stack

    stack = Stack(permute_fusion=True, router_fusion=True)
    law = Estimator(PROFILE, db_url=sqlite_url).dispatch
    store_law(sqlite_url, PROFILE, [_row(e, 500.0 + 8.0 * e, 20e-6, fixed=law.t_host_s) for e in (16, 32)], law,
              stack=stack.key())
    traced = Estimator(PROFILE, db_url=sqlite_url).for_stack(stack, "bf16")
    scaled = Estimator(PROFILE, db_url=sqlite_url, host_scale=0.5).for_stack(stack, "bf16")
    assert traced.dispatch.kappa_stack == stack.key()
    assert scaled.dispatch.kappa_stack == stack.key()  # the scale changes the host seconds, not whose kernels
    assert scaled.dispatch.t_gap_s == pytest.approx(0.5 * traced.dispatch.t_gap_s)
