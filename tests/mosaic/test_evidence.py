"""Confidence that follows the evidence, and one recommendation with its reasons."""
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from fakes import FakeEstimator

from scaleplan.mosaic import evidence
from scaleplan.mosaic.ladder import LadderGrid
from scaleplan.mosaic.law import PAPER_JOINT_LAW
from scaleplan.mosaic.recommend import TIE_P, eligible, recommend
from scaleplan.mosaic.search import Envelope, Mosaic, row_json
from scaleplan.mosaic.uncertainty import (
    MOSTLY_FEASIBLE,
    candidate_sigma,
    family_index,
    make_draws,
    summarise,
    uncertainty_json,
)

GRID = LadderGrid(q=(8, 10), experts=(16, 32, 96, 128, 384), topk=(1, 2, 4), g=(1, 2, 4, 8))


def test_plan_evidence_weights_each_rule_by_its_share():
    res = SimpleNamespace(
        breakdown_s={"experts": 2.0, "ep_a2a": 1.0, "optimizer": 1.0, "sdpa": 4.0, "bubble": 0.0},
        sources={"experts": "composed", "ep_a2a": "analytic", "optimizer": "analytic", "sdpa": "measured",
                 "bubble": "analytic"},
        extrapolated_collectives=["ep_a2a"])
    got = evidence.plan_evidence(res)
    k = math.sqrt(math.pi / 2)
    assert got["analytic_share"] == pytest.approx(1 / 8) and got["extrapolated_share"] == pytest.approx(1 / 8)
    want = (2 / 8 * 0.099 + 1 / 8 * evidence.GROUP_EXTRAPOLATION_MAPE + 1 / 8 * evidence.ANALYTIC_MAPE) * k
    assert got["evidence_sigma"] == pytest.approx(want) and got["extrapolated_collectives"] == "ep_a2a"


def test_rule_errors_are_the_holdouts_of_the_recorded_tables(recorded_db, recorded_holdouts):
    """The search's rule errors on the recorded tables are what the hold-outs measure on them (computed here
    from the hold-outs themselves), and the RECORDED fallback is the same measurement typed in."""
    from scaleplan.db.measurements import load_frames
    from scaleplan.estimator import Estimator, holdout
    from scaleplan.profiles import load_profile

    frames = load_frames(recorded_db, "p6-b200.48xlarge")
    peak = load_profile("p6-b200.48xlarge").peak("bf16")
    # each kind's worst hold-out over both cuts, both sides of the range, computed here from the hold-outs
    worst = {}
    for pair in recorded_holdouts("depth_holdouts", peak):
        for h in pair:
            if h.n:
                worst[h.table] = max(worst.get(h.table, 0.0), h.mape)
    g = holdout.group_sizes(frames, peak)
    assert g.cut == 2.0 and g.n > 20
    got = evidence.errors_for(Estimator("p6-b200.48xlarge", recorded_db, use_calibration=False))
    assert got.composed == pytest.approx(worst) and got.group_extrapolation == pytest.approx(g.mape)
    assert got.analytic == evidence.ANALYTIC_MAPE and got.source == "hold-outs of the tables in use"
    assert set(worst) == set(evidence.COMPOSE_MAPE)
    for table, mape in evidence.COMPOSE_MAPE.items():
        assert worst[table] == pytest.approx(mape, abs=0.005), table
    assert g.mape == pytest.approx(evidence.GROUP_EXTRAPOLATION_MAPE, abs=0.005)


def test_unmeasured_rules_fall_back_to_the_recorded_figures():
    got = evidence.from_measured({"composed": {"gemm": 0.2}, "group_extrapolation": None})
    assert got.composed == {**evidence.COMPOSE_MAPE, "gemm": 0.2}
    assert got.group_extrapolation == evidence.GROUP_EXTRAPOLATION_MAPE and got.analytic == evidence.ANALYTIC_MAPE
    assert "recorded B200 figures for grouped_gemm, sdpa, collectives, group extrapolation" in got.source
    # an analytic-only database measures nothing: every rule is the recorded one
    assert evidence.from_measured({"composed": {}, "group_extrapolation": None}) == evidence.RECORDED
    # tables not read from a database (a stand-in estimator, Estimator.from_frames): the recorded figures
    assert evidence.errors_for(SimpleNamespace(tables=SimpleNamespace(source=None))) is evidence.RECORDED
    assert evidence.errors_for(object()) is evidence.RECORDED


def test_measured_errors_follow_the_rule_errors_in_use():
    res = SimpleNamespace(breakdown_s={"experts": 1.0, "tp_comm": 1.0, "optimizer": 2.0},
                          sources={"experts": "composed", "tp_comm": "analytic", "optimizer": "analytic"},
                          extrapolated_collectives=["tp_comm"])
    errs = evidence.RuleErrors({"grouped_gemm": 0.3, "gemm": 0.1, "sdpa": 0.1, "collectives": 0.1}, 0.5, 0.2, "test")
    k = math.sqrt(math.pi / 2)
    assert evidence.plan_evidence(res, errs)["evidence_sigma"] == pytest.approx((0.25 * 0.3 + 0.25 * 0.5 + 0.5 * 0.2) * k)
    assert evidence.describe(errs)["composed_mape"]["grouped_gemm"] == 0.3 and evidence.describe(errs)["source"] == "test"


def test_rule_errors_are_cached_per_content_of_the_rows(sqlite_url, tmp_path, monkeypatch):
    """Measured once per content: a copy of the database (another file, the same rows) reads the cache."""
    from scaleplan.estimator import holdout

    monkeypatch.setenv("SCALEPLAN_CACHE", str(tmp_path / "cache"))
    holdout.cached_errors.cache_clear()
    first = holdout.cached_errors(sqlite_url, "p6-b200.48xlarge", 2.25e15)
    assert first == {"composed": {}, "group_extrapolation": None}  # no tables: nothing measured
    assert len(list((tmp_path / "cache").glob("rule-errors-*"))) == 1
    copy = tmp_path / "copy.db"
    copy.write_bytes(Path(sqlite_url.removeprefix("sqlite:///")).read_bytes())
    holdout.cached_errors.cache_clear()
    monkeypatch.setattr(holdout, "measured_errors", lambda *a: pytest.fail("measured again"))
    assert holdout.cached_errors(f"sqlite:///{copy}", "p6-b200.48xlarge", 2.25e15) == first
    holdout.cached_errors.cache_clear()


@pytest.fixture(scope="module")
def searched():
    mfu = lambda m, gbs, seqlen, opt: 0.25 / (1.0 + 0.2 * m.moe.experts_per_token)  # noqa: E731
    m = Mosaic(FakeEstimator(mfu_fn=mfu), GRID)
    env = Envelope(nodes=8, days=6)
    return env, m.run(env)


def _summary(t, env, n=200, sigma=0.2):
    index = family_index([t])
    draws = make_draws(n, None, sigma, len(index), seed=3)
    return summarise(t, draws, env.tpp_min, env.tpp_max, index), draws, index


def test_unmeasured_plans_draw_wider(searched):
    env, res = searched
    t = res.table.copy()
    t["evidence_sigma"] = 0.0
    narrow = _summary(t, env)[0]["table"]
    t["evidence_sigma"] = 0.3
    wide = _summary(t, env)[0]["table"]
    assert candidate_sigma(t, 0.2)[0] == pytest.approx(math.hypot(0.2, 0.3))
    ok = t.plan_ok.to_numpy(bool)
    w_n = (narrow.loss_p95 - narrow.loss_p05)[ok]
    w_w = (wide.loss_p95 - wide.loss_p05)[ok]
    # (a candidate whose TPP cap binds in most draws keeps its loss: its band need not widen)
    assert (w_w > w_n).mean() > 0.8 and np.median(w_w / w_n) > 1.3
    assert ((wide.mfu_p95 / wide.mfu_p05)[ok] > (narrow.mfu_p95 / narrow.mfu_p05)[ok]).all()


def test_recommendation_and_near_ties_are_feasible(searched):
    env, res = searched
    summ, draws, index = _summary(res.table, env, sigma=0.35)
    t = summ["table"]
    rec = recommend(summ, draws, PAPER_JOINT_LAW.vector(), index, (env.tpp_min, env.tpp_max), row_json)
    ok = eligible(t)
    assert ok.any() and rec["recommended"] is not None
    # brute force: the eligible row of least mean loss over the draws
    want = t[ok].loss_mean.idxmin()
    r = rec["recommended"]
    assert (r["q"], r["n_experts"], r["topk"], r["g"]) == tuple(int(t.loc[want, k]) for k in ("q", "n_experts", "topk", "g"))
    assert r["p_feasible"] >= MOSTLY_FEASIBLE and rec["statement"].startswith("train L")
    # ties: eligible rows whose loss is lower than the recommendation's in >= TIE_P of the draws
    idx, loss = summ["idx"], summ["loss"]
    j = list(idx).index(t.index.get_loc(want))
    for tie in rec["ties"]:
        c = [i for i, row in enumerate(idx) if int(t.iloc[row]["q"]) == tie["q"] and int(t.iloc[row]["n_experts"]) ==
             tie["n_experts"] and int(t.iloc[row]["topk"]) == tie["topk"] and int(t.iloc[row]["g"]) == tie["g"]][0]
        assert (loss[:, c] < loss[:, j]).mean() >= TIE_P and tie["p_feasible"] >= MOSTLY_FEASIBLE
    u = uncertainty_json(summ, draws, SimpleNamespace(to_dict=lambda: {}), "paper", row_json)
    assert all(x["p_feasible"] >= MOSTLY_FEASIBLE for x in u["near_ties"])
    assert all(x["p_feasible"] < MOSTLY_FEASIBLE or x["tpp"] < env.tpp_min for x in u["infeasible_in_most_draws"])
    mf = u["most_frequent_optimum"]
    assert f"(L{mf['n_layers']} E{mf['n_experts']} K{mf['topk']} G{mf['g']})" in u["verdicts"]["statements"][-1]
    assert mf["p_optimal"] == max(x["p_optimal"] for x in u["near_ties"] + u["infeasible_in_most_draws"])
