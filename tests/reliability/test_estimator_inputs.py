"""Estimator inputs: lookups outside the measured range raise OutOfRangeError (never extrapolate
silently); NaN, negative, zero or fractional device counts are refused before any table lookup.

Uses the recorded B200 tables (router measured for num_experts 32..256, sdpa for n_q_heads 8..64).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("scaleplan.estimator")
from scaleplan.estimator import Estimator  # noqa: E402
from scaleplan.estimator.tables import GridTable  # noqa: E402

from scaleplan.errors import OutOfRangeError, SpecError  # noqa: E402
from scaleplan.specs import Layout, parse_spec  # noqa: E402

PROFILE = "p6-b200.48xlarge"


def _spec(**model) -> dict:
    m = {"n_layers": 4, "hidden_sz": 1024, "inter_sz": 4096, "n_q_heads": 8, "n_kv_heads": 8, "head_dim": 128,
         "vocab_sz": 32000, "moe": {"n_experts": 64, "experts_per_token": 2, "expert_inter_sz": 512}} | model
    return {"model": m, "data": {"gbs": 64, "seqlen": 2048}, "hardware": {"node_type": PROFILE}}


@pytest.fixture(scope="module")
def est(recorded_db):
    return Estimator(PROFILE, db_url=recorded_db)


@pytest.mark.parametrize("model,table,axis,value", [
    ({"moe": {"n_experts": 8, "experts_per_token": 2, "expert_inter_sz": 512}}, "router", "num_experts", 8),
    ({"hidden_sz": 131072, "n_q_heads": 1024, "head_dim": 128, "inter_sz": 524288}, "sdpa", "n_q_heads", 1024),
])
def test_outside_measured_range_raises(est, recorded_db, model, table, axis, value):
    spec = parse_spec(_spec(**model))
    with pytest.raises(OutOfRangeError) as ei:
        Estimator(PROFILE, db_url=recorded_db, extrapolate="error").estimate(spec, 8, [Layout()])
    e = ei.value
    assert (e.table, e.axis, e.value) == (table, axis, value)
    assert not e.lo <= e.value <= e.hi  # the request is really outside what was measured
    assert "\n" not in str(e)
    clamped = Estimator(PROFILE, db_url=recorded_db, extrapolate="clamp").estimate(spec, 8, [Layout()])[0]
    assert clamped.n_clamped > 0 and math.isfinite(clamped.t_iter_s)  # clamping is explicit and counted
    composed = est.estimate(spec, 8, [Layout()])[0]  # the default composes, labelled, with its share
    assert composed.reason in (None, "memory") and "composed" in composed.sources.values()
    assert 0 < composed.composed_share < 1


@pytest.mark.parametrize("n_devices", [math.nan, math.inf, -8, 0, 8.5])
def test_bad_device_counts_refused_before_any_lookup(est, monkeypatch, n_devices):
    def no_lookup(*a, **k):
        raise AssertionError("a table was looked up for an invalid request")

    monkeypatch.setattr(GridTable, "lookup", no_lookup)
    with pytest.raises(SpecError) as ei:
        est.estimate(parse_spec(_spec()), n_devices, [Layout()])
    assert str(ei.value).startswith("n_devices")


def test_negative_sizes_never_reach_the_estimator():
    for field, v in [("hidden_sz", -1024), ("n_layers", 0), ("vocab_sz", float("nan"))]:
        with pytest.raises(SpecError):
            parse_spec(_spec(**{field: v}))


def test_table_lookup_flags_nan_coordinates():
    t = GridTable("gemm", ("m", "n"), [np.array([64.0, 128.0]), np.array([64.0, 256.0])],
                  np.array([1e-5, 2e-5, 3e-5, 4e-5]))
    r = t.lookup(np.array([np.nan, -5.0]), np.array([64.0, 64.0]))
    assert (r.oor_axis >= 0).all()
