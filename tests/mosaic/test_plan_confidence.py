"""scaleplan plan --confidence q on the recorded B200 tables and the paper's law: the chosen point reaches the target
in at least a share q of the search's draws, counted here forward from the law (the loss each draw's tokens buy,
not the planner's inverse), and nothing one step cheaper on the same platform does; the forward question at q and
the inverse at q agree; the bound that rules geometries out stays exact at q."""
from __future__ import annotations

import numpy as np
import pytest

from scaleplan.mosaic import inverse
from scaleplan.mosaic.goodput import Goodput
from scaleplan.mosaic.law import PAPER_JOINT_LAW, PAPER_SUPPORT, load_law_full
from scaleplan.mosaic.plan import PlanRequest, run_plan
from scaleplan.mosaic.ridge import law_matrix
from scaleplan.mosaic.run import SearchRequest, run_search
from scaleplan.mosaic.search import SECONDS_PER_DAY
from scaleplan.mosaic.uncertainty import make_draws
from scaleplan.profiles import load_profile

B200 = "p6-b200.48xlarge"
GRID = dict(q=(8, 10), experts=(16, 32, 64), topk=(1, 2, 4), g=(1, 2))
NODES = (4, 8, 16, 32)
N_DRAWS, Q = 200, 0.9
pytestmark = pytest.mark.recorded


def _search(db, nodes=(1,), days=(1.0,), **kw) -> SearchRequest:
    kw = {"samples": N_DRAWS, **GRID, **kw}
    return SearchRequest(profile=B200, nodes=nodes, days=days, workers=1, db_url=db, progress=False,
                         extend_edges=False, **kw)


def _plan(db, target=None, **kw):
    kw = {"platforms": (B200,), "nodes": {B200: NODES}, "goodput": Goodput(fixed=1.0), "confidence": Q, **kw}
    return run_plan(PlanRequest(search=_search(db), target_loss=target, **kw)).out


def _target(db) -> float:
    s = _search(db, nodes=(16,), days=(20.0,), samples=0)
    return run_search(s).out["best"]["loss"]


def _p_reach(rows, days: float, nodes: int, sigma: float, target: float) -> np.ndarray:
    """P(loss <= target) of each row (a plan: tokens_per_s, n_act, n_tot, s, g, evidence_sigma) trained for ``days``
    on ``nodes`` B200 nodes, over the plan's draws, forward: draw k's MFU factor exp(sigma_c z_k) (no observed run
    here, so sigma_c = sqrt(sigma^2 + evidence_sigma^2)), the drawn rate at most the peak's (6 N_act tokens/s <=
    F_peak N_dev), the tokens it buys (TPP floor 40 needed, cap 150 counted), the paper law's draw k at them plus
    z_law,k x its held-out scatter x the doublings of TPP and of 1 - S beyond the law's data."""
    scatter = load_law_full(None, None).scatter
    d = make_draws(N_DRAWS, None, 0.0, 1, 0, PAPER_JOINT_LAW, law_scatter=scatter)
    col = lambda k: np.array([float(r[k]) for r in rows])  # noqa: E731
    n_act, n_tot, s, g = col("n_act"), col("n_tot"), col("s"), col("g")
    sig = np.sqrt(sigma ** 2 + col("evidence_sigma") ** 2)
    peak = load_profile(B200).peak("bf16") * nodes * 8 / (6 * n_act)
    rate = np.minimum(col("tokens_per_s")[None, :] * np.exp(sig[None, :] * d.z[:, :1]), peak[None, :])
    tokens = rate * days * SECONDS_PER_DAY
    counted = np.minimum(tokens, 150 * n_act[None, :])
    beyond = (np.maximum(np.log2(counted / n_act / PAPER_SUPPORT.tpp_max), 0)
              + np.maximum(np.log2((1 - PAPER_SUPPORT.s_max) / (1 - s)), 0)[None, :])
    # the planner holds each draw's loss at its least where its error term would make it rise with more tokens,
    # past (beta b ln 2 / (z_law scatter))^(1/beta): far beyond these tokens for the paper law's draws
    with np.errstate(over="ignore", divide="ignore"):
        turn = (d.coefs[:, 6] * d.coefs[:, 1] * np.log(2) / np.maximum(d.z_law * scatter, 0)) ** (1 / d.coefs[:, 6])
    assert (turn[:, None] > counted).all()
    loss = law_matrix(d.coefs, n_tot, s, counted, g) + d.z_law[:, None] * scatter * beyond
    return np.mean((loss <= target) & (tokens >= 40 * n_act[None, :]), axis=0)


def test_the_cheapest_point_reaches_the_target_at_the_confidence_and_one_step_cheaper_does_not(recorded_db):
    target = _target(recorded_db)
    out = _plan(recorded_db, target)
    assert out["confidence"] == Q and "90%" in out["planned_to"]
    pl = out["platforms"][0]
    sigma = pl["evidence"]["mfu_error"]["sigma"]
    c = pl["cheapest"]
    assert c["p_reach"] >= Q
    got = _p_reach([c["plan"]], c["days"], c["nodes"], sigma, target)[0]
    assert got == pytest.approx(c["p_reach"]) and got >= Q
    # one step cheaper on the same cluster: 0.1% less time, for every geometry of the grid (a forward search's
    # plans at that window, each committed to and drawn), reaches the target in less than q of the draws
    shorter = c["days"] * 0.999
    table = run_search(_search(recorded_db, nodes=(c["nodes"],), days=(shorter,), samples=0)).results[0][1].table
    rows = [r for _, r in table[table.plan_ok].iterrows()]
    assert len(rows) > 10
    assert _p_reach(rows, shorter, c["nodes"], sigma, target).max() < Q
    # and no other cluster size of the platform is cheaper at the confidence
    assert all(p["gpu_hours"] >= c["gpu_hours"] for p in pl["points"] if p.get("plan"))
    # the point estimate's plan is cheaper, and short of the confidence
    point = _plan(recorded_db, target, confidence=None)["platforms"][0]["cheapest"]
    assert point["gpu_hours"] < c["gpu_hours"] and point["p_reach"] < Q


def test_the_forward_question_at_the_confidence_is_the_inverse_read_back(recorded_db):
    """The lowest loss 20 days buy in 90% of the draws, asked back at 90%, takes those 20 days on that cluster."""
    fwd = _plan(recorded_db, None, max_days=20.0)["platforms"][0]["best_loss"]
    assert fwd["loss_q"] > fwd["plan"]["loss"]  # the loss reached in 90% of the draws: above the point estimate
    back = _plan(recorded_db, fwd["loss_q"] + 1e-9, nodes={B200: (fwd["nodes"],)})["platforms"][0]["points"][0]
    assert back["days"] == pytest.approx(20.0, rel=1e-6)
    assert back["plan"]["n_experts"] == fwd["plan"]["n_experts"] and back["plan"]["topk"] == fwd["plan"]["topk"]


def test_the_bound_loses_nothing_at_the_confidence(recorded_db, monkeypatch):
    """Planning only the geometries whose q-quantile bound (every draw's rate at most the peak's) is below the best
    window found gives the exhaustive answer (MFU_BOUND = inf: every geometry planned, no cap on the draws). SEED 4,
    GROWTH 2 on a 48-geometry grid: the bound, not the first round's size, decides what is planned."""
    wide = dict(q=(8, 10, 12), experts=(16, 32, 64, 128))
    target = run_search(_search(recorded_db, nodes=(8,), days=(20.0,), samples=0, **wide)).out["best"]["loss"]
    monkeypatch.setattr(inverse, "SEED", 4)
    monkeypatch.setattr(inverse, "GROWTH", 2)

    def plan():
        req = PlanRequest(search=_search(recorded_db, **wide), target_loss=target, platforms=(B200,),
                          nodes={B200: (8, 32)}, goodput=Goodput(fixed=1.0), confidence=Q)
        return run_plan(req).out

    pruned = plan()
    monkeypatch.setattr(inverse, "MFU_BOUND", np.inf)
    full = plan()
    key = lambda o: [(p["nodes"], p["days"], p["plan"]["n_experts"], p["plan"]["topk"], p["plan"]["g"])  # noqa: E731
                     for p in o["platforms"][0]["points"] if p.get("plan")]
    assert key(pruned) == key(full) and len(key(full)) == 2
    assert pruned["counts"]["estimator_evaluations"] < full["counts"]["estimator_evaluations"]
