"""Each candidate carries how far it lies from what was measured (the law's data, the observed runs),
its draws widen with that distance, and --robust recommends at a loss quantile."""
import math

import numpy as np
import pandas as pd
import pytest
from fakes import FakeEstimator

from scaleplan.mosaic.evidence import NO_RUNS, RunRange, doublings, observed_range, reach
from scaleplan.mosaic.ladder import LadderGrid
from scaleplan.mosaic.law import PAPER_JOINT_LAW, LawSupport
from scaleplan.mosaic.recommend import recommend
from scaleplan.mosaic.search import Envelope, Mosaic, row_json
from scaleplan.mosaic.uncertainty import Draws, candidate_sigma, families, family_index, make_draws, summarise

SUPPORT = LawSupport(s_min=0.499, s_max=0.985, tpp_min=10.0, tpp_max=70.0)
RUNS = RunRange(3, {"mfu_plan": (0.05, 0.10), "ep_nodes": (1, 4), "mbs": (1, 4), "pp": (1, 4),
                    "n_act": (1e9, 2e10)}, "three runs")


def test_distance_in_doublings_and_the_flags_by_hand():
    t = pd.DataFrame({"mfu_plan": [0.08, 0.20], "ep_nodes": [2, 16], "mbs": [4, 8], "pp": [2, 1],
                      "n_act": [5e9, 1e10], "tpp": [50.0, 140.0], "s": [0.9, 0.9925], "plan_ok": [True, True]})
    got = reach(t, RUNS, SUPPORT)
    # row 1: MFU 0.20 / 0.10 = 2 (1 doubling), EP nodes 16 / 4 (2), micro-batch 8 / 4 (1); PP, N_act inside
    assert got["perf_doublings"] == pytest.approx([0.0, 4.0])
    # TPP 140 / 70 (1); 1 - S = 0.0075 against the data's smallest 1 - 0.985 = 0.015 (1)
    assert got["law_doublings"] == pytest.approx([0.0, 2.0])
    assert got["beyond"][0] == ""
    assert got["beyond"][1].split(", ") == ["S 0.993 > 0.985", "TPP 140 > 70", "MFU 20.0% > 10.0%",
                                            "EP nodes 16 > 4", "micro-batch 8 > 4"]
    assert doublings([0.5, 3.0, np.nan], 1.0, 2.0) == pytest.approx([1.0, math.log2(1.5), 0.0])
    # no observed run: the law's distance only, nothing claimed about the performance
    none = reach(t, NO_RUNS, SUPPORT)
    assert none["perf_doublings"] == pytest.approx([0, 0]) and none["beyond"][1] == "S 0.993 > 0.985, TPP 140 > 70"


GRID = LadderGrid(q=(8,), experts=(16, 32), topk=(1, 2), g=(1, 2))


@pytest.fixture(scope="module")
def table():
    m = Mosaic(FakeEstimator(mfu_fn=lambda *a: 0.2), GRID)
    return m.run(Envelope(nodes=8, days=6)).table


def _twins(table, perf: float, law: float) -> pd.DataFrame:
    """A feasible candidate twice, the copy ``perf`` and ``law`` doublings from the evidence (same plan family)."""
    row = table[table.feasible].iloc[[0]]
    two = pd.concat([row, row], ignore_index=True)
    return two.assign(perf_doublings=[0.0, perf], law_doublings=[0.0, law], evidence_sigma=0.0)


def test_a_far_plan_draws_wider(table):
    t = _twins(table, perf=3.0, law=2.0)
    sigma = 0.2
    assert candidate_sigma(t, sigma) == pytest.approx([sigma, sigma * 2.0])  # sqrt(1 + 3) = 2
    index = family_index([t])
    d = make_draws(400, None, sigma, len(index), seed=3, law=PAPER_JOINT_LAW, law_scatter=0.01)
    s = summarise(t, d, 1.0, 1e9, index)["table"]
    near, far = s.iloc[0], s.iloc[1]
    # one z per family: the far twin's MFU factor is exp(2 sigma z) where the near one's is exp(sigma z)
    z = d.z[:, families(t, index)[0]]
    assert far.mfu_p95 == pytest.approx(far.mfu_plan * np.percentile(np.exp(2 * sigma * z), 95), rel=1e-12)
    assert near.mfu_p95 == pytest.approx(near.mfu_plan * np.percentile(np.exp(sigma * z), 95), rel=1e-12)
    assert far.loss_p95 - far.loss_p05 > near.loss_p95 - near.loss_p05
    # the law term alone: the same MFU draws, the loss spread grows by the law's scatter x its distance
    law_only = _twins(table, perf=0.0, law=2.0)
    flat = Draws(d.coefs[:1].repeat(d.n, 0), np.zeros_like(d.z), sigma, d.z_law, 0.01)
    s2 = summarise(law_only, flat, 1.0, 1e9, index)["table"]
    assert s2.iloc[1].loss_mean == pytest.approx(s2.iloc[0].loss_mean + 0.02 * d.z_law.mean(), abs=1e-12)


def test_robust_recommends_the_plan_best_at_the_quantile(table):
    t = table[table.feasible].iloc[:2].reset_index(drop=True)
    index = family_index([t])
    d = make_draws(100, None, 0.1, len(index), law=PAPER_JOINT_LAW)
    summ = summarise(t, d, 1.0, 1e9, index)
    # A: 0.95 in 80 draws, 1.2 in 20 (mean 1.0, 90th percentile 1.2); B: 1.01 in every draw
    a = np.where(np.arange(100) < 80, 0.95, 1.2)
    summ["loss"] = np.stack([a, np.full(100, 1.01)], axis=1)
    name = lambda r: f"L{r['n_layers']} E{r['n_experts']}"  # noqa: E731
    mean = recommend(summ, d, PAPER_JOINT_LAW.vector(), index, (1.0, 1e9), row_json)
    rob = recommend(summ, d, PAPER_JOINT_LAW.vector(), index, (1.0, 1e9), row_json, robust=0.9)
    assert name(mean["recommended"]) == name(t.iloc[0]) and mean["criterion"] == "mean"
    assert name(rob["recommended"]) == name(t.iloc[1]) and rob["criterion"] == "p90"
    assert rob["differs_from_mean"] and "without --robust the recommendation is" in rob["statement"]
    assert "90th-percentile loss over 100 draws (1.0100; --robust)" in rob["statement"]


def test_observed_range_from_the_database(sqlite_url):
    """One observed run: its MFU is the estimator's MFU x predicted / measured step time (eq:mfu both ways), its
    EP group of 16 ranks 1 apart spans 2 nodes of 8 GPUs."""
    from scaleplan.db import models as m
    from scaleplan.db import session as dbs
    from scaleplan.estimator import Estimator
    from scaleplan.specs import Layout, parse_spec
    from tests.cli.conftest import SPEC  # the 700M validation model

    lay = dict(tp=1, cp=1, pp=2, dp=16, ep=16, etp=1, vpp=1, mbs=2, ckpt="full")
    with dbs.session_scope(sqlite_url) as s:
        s.add(m.ObservedRun(dedup_key="k", source="test", spec=SPEC, profile="p6-b200.48xlarge", n_devices=32,
                            gbs=256, seqlen=8192, measured_t_iter_s=3.0, **lay))
    est = Estimator("p6-b200.48xlarge", db_url=sqlite_url)
    [res] = est.estimate(parse_spec(SPEC), 32, [Layout(**lay)])
    got = observed_range(sqlite_url, "p6-b200.48xlarge", est.profile.peak("bf16"), 8)
    assert got.n == 1 and got.ranges["ep_nodes"] == (2.0, 2.0) and got.ranges["mbs"] == (2.0, 2.0)
    want = res.mfu * res.t_iter_s / 3.0
    assert got.ranges["mfu_plan"][0] == pytest.approx(want, rel=1e-9)
    assert observed_range(sqlite_url, "p5.48xlarge", 1e15, 8) is NO_RUNS
