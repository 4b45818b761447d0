"""Estimator.best_plans: the plans of many geometries evaluated as one batch give each geometry the plan
and the numbers it gets alone, and the plan the full ranking (``evaluate_arrays``, no memory pre-filter,
one scalar geometry) puts first."""
import math

import numpy as np
import pytest
from scaleplan.estimator import Estimator

from scaleplan.geometry import ladder_model
from scaleplan.specs import parse_spec

from .conftest import moe_spec

# (q, E, K, G) of the paper's ladder: small and large seeds, few and many experts, every G
LADDER = [(8, 16, 1, 1), (12, 32, 2, 2), (12, 128, 1, 2), (14, 64, 4, 4), (16, 256, 8, 8), (10, 8, 2, 1)]
N_DEV, GBS, SEQ = 256, 1024, 2048


def _models():
    dense = parse_spec(moe_spec()).model.model_copy(update={"moe": None})
    # another structure (a dense model; tied embeddings) in the same call: batched apart from the ladder
    return [ladder_model(*z) for z in LADDER] + [dense, parse_spec(moe_spec(model={"tie_embeddings": True})).model]


def _close(a, b, where=""):
    """Equal within 1e-12 relative (numbers), exactly otherwise; recursing into dicts and lists."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0), (where, a, b)
    else:
        assert a == b, (where, a, b)


@pytest.fixture(scope="module")
def est(recorded_db):
    return Estimator("p6-b200.48xlarge", db_url=recorded_db)


def test_batched_equals_one_at_a_time(est):
    models = _models()
    together = est.best_plans(models, N_DEV, GBS, SEQ, "adamw")
    alone = [est.best_plan(m, N_DEV, GBS, SEQ, "adamw") for m in models]
    assert sum(r is not None for r in alone) >= 6  # most have a feasible plan: the comparison has content
    for i, (a, b) in enumerate(zip(alone, together)):
        assert (a is None) == (b is None), i
        if a is not None:
            da, db = a.to_dict(), b.to_dict()
            # warnings: the same set (their order follows the batch's first occurrence)
            assert sorted(da.pop("warnings")) == sorted(db.pop("warnings")), i
            _close(da, db, f"model {i}")
    # small batches (chunks of 2) give the same as one batch
    for a, b in zip(together, est.best_plans(models, N_DEV, GBS, SEQ, "adamw", chunk=2)):
        assert (a is None) == (b is None)
        if a is not None:
            _close(a.to_dict(), b.to_dict())


def test_batched_best_is_the_full_rankings_first(est):
    """Independent path: every plan evaluated with the scalar geometry, feasibility by memory and range
    afterwards, ranked by MFU (stable): its first plan is the batch's pick, with the same numbers."""
    models = _models()
    together = est.best_plans(models, N_DEV, GBS, SEQ, "adamw")
    for i, (m, res) in enumerate(zip(models, together)):
        _, plans, ev, mem, feasible, *_ = est.evaluate_arrays(m, N_DEV, GBS, SEQ, "adamw")
        idx = np.nonzero(feasible)[0] if ev is not None else np.zeros(0, int)
        if len(idx) == 0:
            assert res is None, i
            continue
        top = idx[np.argsort(-ev.mfu[idx], kind="stable")][0]
        assert res.layout == plans.row(top), i
        for name, got, want in (("mfu", res.mfu, ev.mfu[top]), ("t_iter", res.t_iter_s, ev.t_iter[top]),
                                ("hfu", res.hfu, ev.hfu[top]),
                                ("mem", res.mem_per_device_gb * 1e9, sum(v[top] for v in mem.values()))):
            assert math.isclose(got, float(want), rel_tol=1e-12), (i, name, got, want)
        for k, v in res.breakdown_s.items():
            assert math.isclose(v, float(ev.components[k][top]), rel_tol=1e-12, abs_tol=0.0), (i, k)


def test_first_max_per_group_is_what_a_stable_sort_puts_first():
    """The head of each geometry's plans: the first of highest MFU, as a stable sort by (geometry, -MFU)
    orders them; ties, a -0.0 against a 0.0 and NaN (a group of NaN alone gives its first) included."""
    from scaleplan.estimator.best_plans import first_max_per_group as _first_max_per_group

    rng = np.random.default_rng(0)
    for _ in range(500):
        n = int(rng.integers(0, 40))
        group = np.sort(rng.integers(0, 6, n))
        value = rng.choice([0.1, 0.2, 0.3, np.nan, 0.5, -0.0, 0.0], n)
        where = np.arange(n) * 3 + 1
        order = np.lexsort((-value, group))
        heads = where[order][np.r_[True, group[order][1:] != group[order][:-1]]] if n else where[:0]
        assert _first_max_per_group(value, group, where).tolist() == heads.tolist()
    assert _first_max_per_group(np.array([np.nan, np.nan, 0.2, np.nan, 0.7, 0.7]), np.array([0, 0, 1, 1, 1, 1]),
                                np.arange(6)).tolist() == [0, 4]


def test_pieces_of_a_batch_give_the_same_best_plans(est, monkeypatch):
    """A batch's plans are evaluated in pieces of whole geometries (best_plans.EVAL_PLANS, bounding a worker's
    memory): pieces of ~one geometry give every result the batch in one piece gives, warnings too."""
    from scaleplan.estimator import best_plans

    models = _models()
    whole = est.best_plans(models, N_DEV, GBS, SEQ, "adamw")
    monkeypatch.setattr(best_plans, "EVAL_PLANS", 500)
    for a, b in zip(whole, est.best_plans(models, N_DEV, GBS, SEQ, "adamw")):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.to_dict() == b.to_dict()
    assert best_plans.pieces([3, 2, 1, 4, 1], 4) == [(0, 1), (1, 3), (3, 4), (4, 5)]
    assert best_plans.pieces([9], 4) == [(0, 1)] and best_plans.pieces([0, 2, 0, 2], 4) == [(0, 4)]


def test_the_t_iter_floor_bounds_every_plan_and_prunes_most(est):
    """TimeModel.t_iter_floor, what the search skips plans by: at or below every plan's t_iter (here with
    every eq:desync coefficient non-zero, so chi_sys > 1 varies with the plan), and above the best t_iter for
    most plans of a geometry (the skipping has content); finishing a selection of the plans gives what
    finishing them all gives for them."""
    from dataclasses import replace

    from scaleplan.estimator.model import ChiCoefficients
    from scaleplan.estimator.model_dims import geometry
    from scaleplan.estimator.plans import PlanConstraints, enumerate_plans

    g = geometry(ladder_model(12, 32, 2, 2))
    plans = enumerate_plans(g, N_DEV, GBS, PlanConstraints(), SEQ)[0]
    for chi in (ChiCoefficients(), ChiCoefficients(c_a2a=0.3, c_pp=0.02, c_ovl=0.05, c_level=0.04)):
        tm = est.model
        old, tm.chi_c = tm.chi_c, chi
        try:
            part = tm.pipelined(g, plans, GBS, SEQ)
            floor = tm.t_iter_floor(part)
            whole = tm.finish(part, "adamw")
            assert whole.chi.min() > (1.0 if chi != ChiCoefficients() else 0.999)
            assert (floor <= whole.t_iter).all()
            assert (floor > whole.t_iter.min()).mean() > 0.5
            idx = np.arange(3, len(plans), 7)
            some = tm.finish(part.take(idx), "adamw")
            for name in ("t_iter", "t_analytic", "mfu", "chi"):
                assert np.array_equal(getattr(some, name), getattr(whole, name)[idx]), name
            for k, v in whole.sources.items():
                assert np.array_equal(some.sources[k], v[idx]), k
        finally:
            tm.chi_c = old


def test_probe_rounds_order_each_geometry_by_floor():
    """best_plans.probe_rounds: the plans grouped by geometry in their order, by floor within each (ties, NaN and
    infinite floors included), and the round of each place: 0 for a geometry's first PROBE_ROUNDS[0] plans,
    then 1, 2, ... (so every plan is probed in one round at most)."""
    from scaleplan.estimator.best_plans import PROBE_ROUNDS, probe_rounds as _probe_rounds

    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(1, 400))
        owner = np.sort(rng.integers(0, 5, n)) + 3
        floor = rng.choice([0.5, 1.0, 2.0, 7.5, np.inf, -np.inf, np.nan, 1e-3], n) * rng.random(n)
        order, rnd = _probe_rounds(floor, owner)
        assert sorted(order.tolist()) == list(range(n)) and np.array_equal(owner[order], owner)
        for o in np.unique(owner):
            mine = order[owner[order] == o]
            f = np.nan_to_num(floor[mine], nan=np.inf, posinf=np.inf, neginf=-np.inf)
            assert (f[1:] >= f[:-1]).all()
            want = np.searchsorted(PROBE_ROUNDS, np.arange(len(mine)), side="right")
            assert np.array_equal(rnd[owner[order] == o], want)


@pytest.mark.parametrize("name", ["deepseek-v3", "gpt-oss-120b", "qwen3-235b-a22b"])
def test_the_t_iter_floor_bounds_todays_models(est, name):
    """The floor's closed form (the layer terms adding up to n_mb t_cmp) holds for the features of today's
    models too: multi-latent attention and MTP, sliding windows and biases, uneven stages and folded expert
    meshes, each on its own training stack (FP8 where it trains so)."""
    from scaleplan.estimator.model_dims import geometry
    from scaleplan.estimator.plans import PlanConstraints, enumerate_plans
    from scaleplan.specs import load_spec

    spec = load_spec(name)
    e = est.for_stack(spec.stack, spec.model.precision)
    g = geometry(spec.model)
    c = PlanConstraints(pp=(1, 2, 4, 8, 16), vpp=(1, 2), mbs=(1, 2), fold_experts=True, uneven_stages=True)
    plans = enumerate_plans(g, 256, spec.data.gbs, c, spec.data.seqlen)[0]
    assert len(plans) > 100
    part = e.model.pipelined(g, plans, spec.data.gbs, spec.data.seqlen, stack=e.training_stack)
    floor, t = e.model.t_iter_floor(part), e.model.finish(part, spec.optimizer.optimizer_type).t_iter
    assert (floor <= t).all() and (floor > 0.9 * t).mean() > 0.2
