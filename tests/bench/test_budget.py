"""The CPU point budget: a point a cheap probe (or its own first call) says would take longer than the
budget is skipped with a one-line reason and not stored; the others are measured; progress names the
point being measured."""
from __future__ import annotations

import pytest
from scaleplan.bench import harness as h
from scaleplan.bench import runner
from scaleplan.bench.config import parse_preset
from scaleplan.bench.suites import gemm as gemm_suite
from sqlalchemy import select

from scaleplan.db import models as m
from scaleplan.db.session import session_scope

from .conftest import tiny_preset

BIG = {"m": 1024, "n": 1024, "k": 1024, "dtype": "fp32"}  # 2.1 GFLOP a call: far above a 1 ms budget
SMALL = {"m": 4, "n": 4, "k": 4, "dtype": "fp32"}


def _run(url, suites, budget_s, events):
    preset = tiny_preset(suites)
    preset["timing"] = {**preset["timing"], "cpu_point_budget_s": budget_s}
    return runner.run_preset(parse_preset(preset), url, device="cpu",
                             on_event=lambda k, i: events.append((k, i)))


def _gemm_keys(url, run_id):
    with session_scope(url) as s:
        return {(r.m, r.dtype) for r in s.scalars(select(m.GemmPoint).where(m.GemmPoint.run_id == run_id))}


def test_a_point_over_budget_is_skipped_by_its_probe_before_it_runs(sqlite_url, monkeypatch):
    calls = []
    real = gemm_suite.measure
    monkeypatch.setattr(gemm_suite, "measure", lambda p, ctx: calls.append(p["m"]) or real(p, ctx))
    events = []
    (res,) = _run(sqlite_url, {"gemm": {"points": [SMALL, BIG]}}, 0.001, events)
    assert calls == [4]  # the big point never reached its measurement
    assert res.over_budget == 1 and res.measured == 1 and res.by_status == {"OK": 1}
    assert _gemm_keys(sqlite_url, res.run_id) == {(4, "fp32")}  # nothing stored for the skipped one
    (skip,) = [i for k, i in events if k == "skip"]
    assert skip["point"]["m"] == 1024 and "estimated by a probe" in skip["reason"]
    assert "0.001 s CPU point budget" in skip["reason"] and "\n" not in skip["reason"]
    started = [i["point"]["m"] for k, i in events if k == "point_start"]
    assert started == [4, 1024]  # progress names each point as it starts


def test_a_point_without_a_probe_stops_after_its_first_call(sqlite_url):
    """The router suite has no probe: its first warm-up call measures it against the budget."""
    events = []
    suites = {"router": {"dtypes": ["fp32"], "num_tokens": [64], "num_experts": [8], "k": [2], "hidden": [16],
                         "variants": ["topk"]}}
    (res,) = _run(sqlite_url, suites, 1e-9, events)
    assert res.over_budget == 1 and res.measured == 0
    (skip,) = [i for k, i in events if k == "skip"]
    assert "the first call took" in skip["reason"]


def test_the_budget_does_not_skip_what_fits(sqlite_url):
    events = []
    (res,) = _run(sqlite_url, {"gemm": {"points": [SMALL, BIG]}}, 600.0, events)
    assert res.over_budget == 0 and res.by_status == {"OK": 2}
    assert not [i for k, i in events if k == "skip"]


def test_probe_scales_a_partial_product_to_the_whole_point():
    """probe_mm_s on a row subset scales linearly: a product of 64 rows probed on 16 of them is ~4x the
    probe of 16 rows (same per-row cost; generous bounds, the machine may be busy)."""
    import torch

    ctx = h.Context(device=torch.device("cpu"), timing=h.Timing())
    full = min(h.probe_mm_s(64, 512, 512, "fp32", ctx, max_flop=2 * 16 * 512 * 512) for _ in range(3))
    part = min(h.probe_mm_s(16, 512, 512, "fp32", ctx) for _ in range(3))
    assert 4 * part / 3 < full < 4 * part * 3


def test_check_budget_is_a_cpu_rule():
    import torch

    cpu = h.Context(device=torch.device("cpu"), timing=h.Timing(cpu_point_budget_s=1.0))
    h.check_budget(0.2, 4, cpu)  # 0.8 s fits
    with pytest.raises(h.OverBudget, match=r"~1\.2 s \(4 calls x 0\.3 s"):
        h.check_budget(0.3, 4, cpu)
    gpu = h.Context(device=torch.device("cuda", 0), timing=h.Timing(cpu_point_budget_s=1.0))
    assert gpu.budget_s is None
    h.check_budget(1e6, 4, gpu)  # no budget on a GPU
