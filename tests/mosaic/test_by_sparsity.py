"""--by-sparsity (fig:mosaic-solution), the extrapolated flags and the --s-max guard."""
import json

import numpy as np
import inproc
import pytest
from fakes import FakeEstimator

from scaleplan.mosaic.ladder import LadderGrid, enumerate_geometries
from scaleplan.mosaic.law import PAPER_SUPPORT, LawSupport
from scaleplan.mosaic.search import Envelope, Mosaic, row_json
from scaleplan.mosaic.sparsity import by_sparsity

GRID = LadderGrid(q=(8, 10), experts=(16, 32, 96, 128, 384, 512), topk=(1, 2, 4), g=(1, 2, 4, 8))


def _mfu(m, gbs, seqlen, opt):
    # falls with the expert count, so high sparsity delivers fewer model FLOPs (the paper's mechanism)
    return 0.3 / (1.0 + 0.25 * np.log2(m.moe.n_experts / 8)) / (1.0 + 0.1 * m.moe.experts_per_token)


@pytest.fixture(scope="module")
def res():
    return Mosaic(FakeEstimator(mfu_fn=_mfu, max_experts=1024), GRID).run(Envelope(nodes=4, days=5))


def test_by_sparsity_brute_force(res):
    t = res.table
    step, rx = 0.01, 2e21
    out = by_sparsity(t, PAPER_SUPPORT, rx, s_step=step)
    # independent: loop over candidates, bin by floor(S / step)
    best, deliver = {}, {}
    for r in t.itertuples():
        b = int(np.floor(r.s / step))
        if r.plan_ok:
            deliver[b] = max(deliver.get(b, 0.0), 6 * r.n_act * r.d_star)
        if r.feasible and (b not in best or r.loss < best[b].loss):
            best[b] = r
    rows = out["by_sparsity"]
    assert [x["s"] for x in rows] == sorted(r.s for r in best.values())
    for x in rows:
        b = int(np.floor(x["s"] / step))
        assert x["loss"] == best[b].loss and x["n_experts"] == best[b].n_experts and x["g"] == best[b].g
        assert x["c_deliverable"] == pytest.approx(deliver[b])
        assert x["prescription_feasible"] == (deliver[b] >= rx)
        assert x["c_model"] == pytest.approx(6 * best[b].n_act * best[b].d_tokens)
    star = min(best.values(), key=lambda r: r.loss)
    assert out["s_star_cluster"] == star.s
    assert star.loss == res.best.loss                       # the search's optimum is L*_hw's minimiser
    edge = max((r for r in best.values() if r.s <= 0.985), key=lambda r: r.s)
    assert out["gain_nats"] == pytest.approx(edge.loss - star.loss)
    feas = [x["s"] for x in rows if deliver[int(np.floor(x["s"] / step))] >= rx]
    assert out["s_feas_max"] == max(feas)
    assert out["s_max"] == 0.985
    assert {"s", "loss", "q", "n_experts", "topk", "g", "mfu", "c_model", "prescription_feasible"} <= set(rows[0])


def test_extrapolated_flags_and_s_max_guard(res):
    t = res.table
    sup = PAPER_SUPPORT
    for _, r in t[t.plan_ok].iterrows():
        want = ([] if sup.s_min <= r.s <= sup.s_max else ["S"]) + \
               ([] if sup.tpp_min <= r.tpp <= sup.tpp_max else ["TPP"])
        assert row_json(r)["extrapolated"] == want
    assert (t.s > 0.985).any() and (t.tpp > 70).any()    # both flags occur on this grid
    guarded = enumerate_geometries(LadderGrid(**{**GRID.__dict__, "s_max": 0.95}))
    full = enumerate_geometries(GRID)
    assert guarded.s.max() <= 0.95 and len(guarded) == int((full.s <= 0.95).sum())
    # a fitted law's own support moves the flags
    m = Mosaic(FakeEstimator(mfu_fn=_mfu, max_experts=1024), GRID, support=LawSupport(0.5, 0.9, 10, 200))
    t2 = m.run(Envelope(nodes=4, days=5)).table
    assert (t2.extrap_s == ((t2.s < 0.5) | (t2.s > 0.9))).all()


def _cli(*args):
    # in-process (tests/inproc.py); one search worker: the test process is not forked (the forked
    # workers are checked by the real processes of test_search.py)
    args = (*args, "--workers", "1") if args[0] == "search" else args
    return inproc.cli(*args)


def test_cli_by_sparsity_and_samples_json(recorded_db, tmp_path):
    png = tmp_path / "bs.png"
    p = _cli("search", "--profile", "p6-b200.48xlarge", "--nodes", "4", "--days", "5", "--q", "8",
             "--experts", "16,32,128", "--topk", "1,2", "--g", "2,4", "--db", recorded_db, "--json",
             "--by-sparsity", "--prescription", "1e21", "--samples", "30", "--plot", str(png))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert {"by_sparsity", "s_star_cluster", "s_max", "gain_nats", "s_feas_max", "samples", "near_ties",
            "verdicts"} <= set(out)
    assert out["samples"] == 30 and out["s_max"] == 0.985
    assert out["s_star_cluster"] == out["best"]["s"]
    for k in ("p_optimal", "loss_mean", "loss_p05", "loss_p95", "regret", "extrapolated"):
        assert k in out["best"]
    assert out["best"]["loss_p05"] <= out["best"]["loss_mean"] <= out["best"]["loss_p95"]
    assert png.stat().st_size > 1000


def test_cli_s_max_bad_value_exit_2():
    p = _cli("search", "--profile", "p6-b200.48xlarge", "--nodes", "4", "--days", "5", "--s-min", "0.8",
             "--s-max", "0.7")
    assert p.returncode == 2 and "--s-max" in p.stderr and "Traceback" not in p.stderr


def test_cli_sweep_rows_carry_p_g_and_s_band(recorded_db):
    p = _cli("search", "--profile", "p6-b200.48xlarge", "--nodes", "8", "--days", "10,20", "--q", "8",
             "--experts", "16,32,128", "--topk", "1,2", "--g", "2,4", "--db", recorded_db, "--json", "--samples", "30")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    for row in out["sweep"]:
        assert row["p_g_star"] == row["p_g"][str(row["best"]["g"])]
        assert sum(row["p_g"].values()) <= 1 + 1e-9 and 0 < row["s_band90"][0] <= row["s_band90"][1] < 1
        assert row["best"]["p_optimal"] is not None


def test_measured_only_says_when_the_optimum_changes(res):
    from scaleplan.mosaic.report import measured_only

    m = Mosaic(FakeEstimator(mfu_fn=_mfu, max_experts=1024), GRID)
    env = Envelope(nodes=4, days=5)
    best = row_json(m.run(env).best)
    same = measured_only(m, FakeEstimator(mfu_fn=_mfu, max_experts=1024), env, best)
    assert same["optimum_changes"] is False and same["best"]["loss"] == best["loss"]
    # measured tables that cover only E <= 32: the optimum must move to a geometry with E <= 32
    other = measured_only(m, FakeEstimator(mfu_fn=_mfu, max_experts=32), env, best)
    assert best["n_experts"] > 32 and other["optimum_changes"] is True and other["best"]["n_experts"] <= 32
    t = res.table
    assert other["best"]["loss"] == t[t.feasible & (t.n_experts <= 32)].loss.min()


def test_cli_compare_measured(recorded_db):
    p = _cli("search", "--profile", "p6-b200.48xlarge", "--nodes", "8", "--days", "10", "--q", "8",
             "--experts", "16,32,128", "--topk", "1,2", "--g", "2,4", "--db", recorded_db, "--json", "--samples", "0",
             "--compare-measured")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    mo = out["measured_only"]
    key = ("q", "n_experts", "topk", "g")
    if mo["best"] is not None:
        assert mo["optimum_changes"] == any(mo["best"][k] != out["best"][k] for k in key)
    assert "samples" not in out and "p_optimal" not in out["best"]
