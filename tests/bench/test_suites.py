"""Every in-process suite runs at tiny sizes on CPU and writes its rows with provenance."""

from __future__ import annotations

import pytest
import torch
from scaleplan.bench import runner
from scaleplan.bench.config import parse_preset
from scaleplan.bench.suites import gemm as gemm_suite
from scaleplan.bench.suites import get_suite
from sqlalchemy import func, select

from scaleplan.db import models as m
from scaleplan.db.session import session_scope

from .conftest import TINY_SUITES, tiny_preset

LOCAL_SUITES = list(TINY_SUITES)


def _rows(url, table, run_id):
    with session_scope(url) as s:
        return [r for r in s.scalars(select(table).where(table.run_id == run_id))]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    from scaleplan.db import session as dbs

    url = f"sqlite:///{tmp_path_factory.mktemp('suites') / 'b.db'}"
    dbs.upgrade(url)
    res = runner.run_preset(parse_preset(tiny_preset()), url, device="cpu")
    return url, {r.suite: r for r in res}


@pytest.mark.parametrize("suite", LOCAL_SUITES)
def test_suite_writes_every_point(measured, suite):
    url, res = measured
    r = res[suite]
    mod = get_suite(suite)
    rows = _rows(url, mod.TABLE, r.run_id)
    assert r.status == "complete" and r.points == len(rows) > 0
    assert {row.status for row in rows} == {"OK"}, [(row.status, row.note) for row in rows]
    for row in rows:
        assert row.n_rep and row.n_rep >= 1
    with session_scope(url) as s:
        run = s.get(m.BenchRun, r.run_id)
        assert run.status == "complete" and run.source == "measured" and run.device == "cpu"
        assert run.torch_version == torch.__version__ and run.host and run.config_hash and run.ended_at


def test_gemm_rates_follow_from_times(measured):
    url, res = measured
    from scaleplan.profiles import load_profile

    peak = load_profile("cpu-local").peak("fp32")
    for row in _rows(url, m.GemmPoint, res["gemm"].run_id):
        assert row.t_p10_s <= row.t_s <= row.t_p90_s
        assert row.flops_per_s == pytest.approx(2 * row.m * row.n * row.k / row.t_s)
        assert row.util == pytest.approx(row.flops_per_s / peak)


def test_suite_specific_columns(measured):
    url, res = measured
    gg = _rows(url, m.GroupedGemmPoint, res["grouped_gemm"].run_id)
    assert {(r.proj, r.in_features, r.out_features) for r in gg} == {("fc1", 16, 16), ("fc2", 8, 16)}
    assert all(r.impl in ("torch_grouped_mm", "loop") and r.bwd_s > 0 for r in gg)
    sd = _rows(url, m.SdpaPoint, res["sdpa"].run_id)
    assert {r.backend for r in sd} == {"math", "flash"} and len(sd) == 2 * 2 * 2
    ro = _rows(url, m.RouterPoint, res["router"].run_id)
    assert {r.variant: r.hidden for r in ro} == {
        "topk": 0,
        "router": 16,
        "gumbel": 16,
        "permute": 16,
        "unpermute": 16,
    }
    vo = _rows(url, m.VocabPoint, res["vocab"].run_id)
    assert {(r.op, r.dtype) for r in vo} == {("lm_head_gemm", "bf16"), ("cross_entropy", "fp32")}
    di = _rows(url, m.DispatchPoint, res["dispatch"].run_id)
    assert {r.mode for r in di} == {"gemm", "gemm_relu", "host_overhead"}
    for r in di:
        assert (r.active_per_kernel_s is None) == (r.mode == "host_overhead")


def test_unsupported_and_skip_mem_rows_are_stored(sqlite_url):
    suites = {
        "gemm": {"dtypes": ["tf32", "fp32"], "m": [8, 1 << 20], "n": [1 << 20], "k": [8]},
        "sdpa": {
            "dtypes": ["fp32"],
            "seq_len": [8],
            "n_q_heads": [2],
            "n_kv_heads": [2],
            "head_dim": [8],
            "backends": ["cudnn", "math"],
        },
    }
    res = runner.run_preset(parse_preset(tiny_preset(suites)), sqlite_url, device="cpu")
    gemm_rows = _rows(sqlite_url, m.GemmPoint, res[0].run_id)
    by = {(r.m, r.dtype): r for r in gemm_rows}
    assert by[(8, "tf32")].status == "UNSUPPORTED" and "tf32" in by[(8, "tf32")].note
    assert by[(1 << 20, "fp32")].status == "SKIP_MEM" and by[(1 << 20, "fp32")].t_s is None
    assert by[(8, "fp32")].status == "OK"
    sd = {r.backend: r for r in _rows(sqlite_url, m.SdpaPoint, res[1].run_id)}
    assert sd["cudnn"].status == "UNSUPPORTED" and sd["math"].status == "OK"


def test_oom_is_stored_and_the_sweep_goes_on(sqlite_url, monkeypatch):
    real = gemm_suite.measure

    def flaky(p, ctx):
        if p["m"] == 8:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
        return real(p, ctx)

    monkeypatch.setattr(gemm_suite, "measure", flaky)
    suites = {"gemm": {"dtypes": ["fp32"], "m": [8, 16], "n": [8], "k": [8]}}
    res = runner.run_preset(parse_preset(tiny_preset(suites)), sqlite_url, device="cpu")
    rows = {r.m: r for r in _rows(sqlite_url, m.GemmPoint, res[0].run_id)}
    assert rows[8].status == "OOM" and "out of memory" in rows[8].note and rows[8].t_s is None
    assert rows[16].status == "OK" and res[0].by_status == {"OOM": 1, "OK": 1}
    with session_scope(sqlite_url) as s:
        assert s.scalar(select(func.count()).select_from(m.GemmPoint)) == 2
