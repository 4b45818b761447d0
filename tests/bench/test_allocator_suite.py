"""The allocator-overhead suite: UNSUPPORTED rows on CPU, its training loop and its
prediction on CPU, and the overhead it hands the memory model."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scaleplan.bench import runner
from scaleplan.bench.config import parse_preset
from scaleplan.bench.suites import allocator
from scaleplan.estimator import memory as mm
from sqlalchemy import select

from scaleplan.db import models as m
from scaleplan.db.session import session_scope

from .conftest import tiny_preset

TINY = {"dtypes": ["fp32"], "layers": [1], "hidden": [64], "experts": [4], "k": [2], "seq_len": [16],
        "micro_bs": [1, 2], "ckpt": ["none"], "steps": 2, "warmup": 1}


def test_cpu_rows_are_unsupported_with_the_reason(sqlite_url):
    res = runner.run_preset(parse_preset(tiny_preset({"allocator": TINY})), sqlite_url, device="cpu")
    with session_scope(sqlite_url) as s:
        rows = list(s.scalars(select(m.AllocatorPoint).where(m.AllocatorPoint.run_id == res[0].run_id)))
    assert res[0].status == "complete" and len(rows) == 2
    assert all(r.status == "UNSUPPORTED" and "needs CUDA" in r.note for r in rows)


def test_training_loop_runs_and_the_prediction_grows_with_the_micro_batch():
    p = {"layers": 1, "hidden": 64, "experts": 4, "k": 2, "seq_len": 16, "micro_bs": 1, "ckpt": "none",
         "dtype": "fp32"}
    times = allocator.train_steps(allocator.spec_for(p), "none", torch.device("cpu"), steps=2, warmup=1)
    assert len(times) == 2 and all(t > 0 for t in times)
    p = {**p, "seq_len": 512, "layers": 3}  # long enough that activations, not the optimizer step, set the peak
    one = allocator.predicted_allocated(allocator.spec_for(p), "none")
    two = allocator.predicted_allocated(allocator.spec_for({**p, "micro_bs": 2}), "none")
    full = allocator.predicted_allocated(allocator.spec_for({**p, "micro_bs": 2}), "full")
    assert 0 < one < two and full < two


def test_overhead_from_rows_takes_medians_of_ok_rows_else_none():
    rows = [{"status": "OK", "allocator_fraction": f, "context_bytes": c}
            for f, c in ((0.05, 5e8), (0.2, 7e8), (0.1, 6e8))] + [{"status": "OOM", "allocator_fraction": None}]
    assert allocator.overhead_from_rows(rows) == (pytest.approx(0.1), pytest.approx(6e8))
    assert allocator.overhead_from_rows(rows[3:]) is None
    assert mm.DEFAULT_ALLOCATOR_FRACTION > 0 and np.isfinite(mm.DEFAULT_CONTEXT_BYTES)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_point_measures_reserved_above_allocated():
    ctx = runner.make_context(torch.device("cuda"), "p5.48xlarge", runner.TimingCfg(), 0.8)
    ctx.extra["allocator_steps"] = (2, 1)
    p = {"layers": 2, "hidden": 256, "experts": 8, "k": 2, "seq_len": 256, "micro_bs": 1, "ckpt": "none",
         "dtype": "bf16"}
    row = allocator.measure(p, ctx)
    assert row["max_reserved_bytes"] >= row["max_allocated_bytes"] > 0 and row["allocator_fraction"] >= 0


def test_a_measured_allocator_row_is_stored_ok():
    """measure_point keeps an allocator row OK: its measurement is bytes, not fwd_s (every allocator row
    of the first H200 run was stored ERROR for want of a fwd_s, and validate then used the default 10%)."""
    row = {"step_s": 0.02, "n_rep": 3, "max_allocated_bytes": 3_225_664_000, "max_reserved_bytes": 3_525_312_512,
           "allocator_fraction": 3_525_312_512 / 3_225_664_000 - 1, "context_bytes": 879_558_656,
           "predicted_allocated_bytes": 2.71e9, "note": None}

    class FakeSuite:
        NAME = allocator.NAME

        @staticmethod
        def measure(p, ctx):
            return dict(row)

    ctx = runner.make_context(torch.device("cpu"), "cpu-local", runner.TimingCfg(), 0.5)
    p = {"layers": 4, "hidden": 1024, "experts": 16, "k": 4, "seq_len": 2048, "micro_bs": 1, "ckpt": "none",
         "dtype": "bf16"}
    out = runner.measure_point(FakeSuite, p, ctx)
    assert out["status"] == "OK" and out["max_allocated_bytes"] == row["max_allocated_bytes"]
    assert allocator.overhead_from_rows([out]) == (pytest.approx(row["allocator_fraction"]), 879_558_656)


def test_every_suite_requires_a_column_of_its_table():
    """The value column sanitize requires of an OK row exists in every suite's table."""
    from scaleplan.bench.suites import SUITE_NAMES, get_suite

    for name in SUITE_NAMES:
        cols = {c.key for c in get_suite(name).TABLE.__table__.columns}
        assert runner.REQUIRED.get(name, "fwd_s") in cols, name
