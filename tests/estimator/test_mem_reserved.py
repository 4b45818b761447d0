"""The estimator predicts allocated and reserved memory apart, with no fixed 5 GB reserve."""
import dataclasses

import pytest
from scaleplan.estimator import Estimator
from scaleplan.estimator.memory import RESERVE_BYTES

from scaleplan.specs import Layout, parse_spec

from .conftest import moe_spec

GB = 1e9


def test_gpu_profile_without_allocator_rows_keeps_the_fixed_reserve(sqlite_url):
    r = Estimator("p6-b200.48xlarge", db_url=sqlite_url).estimate(parse_spec(moe_spec()), 32,
                                                                   [Layout(pp=2, ep=8, mbs=1, ckpt="full")])[0]
    assert r.mem_breakdown_gb["reserve"] == pytest.approx(RESERVE_BYTES / GB)
    assert r.mem_reserved_gb == pytest.approx(r.mem_allocated_gb + RESERVE_BYTES / GB, rel=1e-9)
    assert r.mem_per_device_gb == pytest.approx(r.mem_reserved_gb, rel=1e-9)


def test_measured_allocator_overhead_replaces_the_defaults(sqlite_url):
    est = Estimator("p6-b200.48xlarge", db_url=sqlite_url)
    # as the bench suite 'allocator' would have measured (a copy: the cached tables stay as built)
    est.tables = dataclasses.replace(est.tables, allocator=(0.25, 2e9))
    r = est.estimate(parse_spec(moe_spec()), 32, [Layout(pp=2, ep=8, mbs=1, ckpt="full")])[0]
    assert r.mem_reserved_gb == pytest.approx(1.25 * r.mem_allocated_gb, rel=1e-9)
    assert r.mem_per_device_gb == pytest.approx(r.mem_reserved_gb + 2.0, rel=1e-9)
