"""MOSAIC search (eq:hw-minlp) with a fake estimator of known MFU, and the CLI on real tables."""
import json
import subprocess
import sys

import numpy as np
import pytest
from fakes import FakeResult

from scaleplan.mosaic.ladder import LadderGrid
from scaleplan.mosaic.law import PAPER_JOINT_LAW
from scaleplan.mosaic.search import Envelope, Mosaic
from scaleplan.profiles import load_profile

PEAK_B200 = 2.25e15  # tab:results-envelope, bf16 dense per device


class FakeEstimator:
    """MFU (non-embedding) = mfu_fn(model); None (no feasible plan) when E > 256. Counts best_plan calls."""

    def __init__(self, mfu_fn=None):
        self.profile = load_profile("p6-b200.48xlarge")
        self.mfu_fn = mfu_fn or (lambda m: 0.24 / (m.hidden_sz * m.moe.experts_per_token / m.moe.expert_inter_sz
                                                    / 1.6))
        self.calls = 0

    def best_plans(self, models, n_devices, gbs, seqlen, optimizer="adamw", constraints=None):
        return [self.best_plan(m, n_devices, gbs, seqlen, optimizer, constraints) for m in models]

    def best_plan(self, model, n_devices, gbs, seqlen, optimizer="adamw", constraints=None):
        from scaleplan.geometry import spec_param_counts

        self.calls += 1
        if model.moe.n_experts > 256:
            return None
        pc = spec_param_counts(model)
        mfu = self.mfu_fn(model)
        tps = mfu * self.profile.peak("bf16") * n_devices / (6 * pc.n_act)
        lay = {"tp": 1, "cp": 1, "pp": 4, "ep": 8, "dp": n_devices // 4, "etp": 1, "vpp": 1, "mbs": 2,
               "ckpt": "selective"}
        return FakeResult(lay, mfu, tps, sources={"experts": "measured", "dp_comm": "analytic"})


SMALL = LadderGrid(q=(8, 12), experts=(16, 32, 96, 128, 384), topk=(1, 2, 4), g=(1, 2, 4, 8))


def test_profile_peak_is_the_papers():
    assert load_profile("p6-b200.48xlarge").peak("bf16") == PEAK_B200


def test_dstar_tpp_limits_and_exact_optimum():
    est = FakeEstimator()
    env = Envelope(nodes=8, days=10)
    res = Mosaic(est, SMALL).run(env)
    t = res.table
    c_peak = PEAK_B200 * 64 * 10 * 86400
    assert res.c_peak == pytest.approx(c_peak)
    ok = t.plan_ok.to_numpy(bool)
    # eq:Dstar from the MFU: D* = C_peak MFU eta / (6 N_act)
    d_star = c_peak * t.mfu_plan[ok] / (6 * t.n_act[ok])
    assert np.allclose(t.d_star[ok], d_star, rtol=1e-12)
    assert (t.tpp[ok] <= 150 + 1e-9).all()
    assert np.allclose(t.d_tokens[ok], np.minimum(d_star, 150 * t.n_act[ok]))
    assert ((t.d_star[ok] / t.n_act[ok] < 40) == (t.why[ok] == "tpp_min")).all()
    assert (t.why[~ok] == "no_plan").all() and (t.n_experts[~ok] > 256).all()
    # exact optimum: brute force over feasible rows with the law called one at a time
    best_loss, best_key = np.inf, None
    for r in t[t.feasible].itertuples():
        loss = PAPER_JOINT_LAW(r.n_tot, r.s, min(r.d_star, 150 * r.n_act), r.g)
        if loss < best_loss:
            best_loss, best_key = loss, (r.q, r.n_experts, r.topk, r.g)
    b = res.best
    assert (b.q, b.n_experts, b.topk, b.g) == best_key and b.loss == pytest.approx(best_loss)
    j = res.to_json(top=3)
    assert j["best"]["layout"] == {"tp": 1, "cp": 1, "pp": 4, "ep": 8, "dp": 16, "etp": 1, "vpp": 1, "mbs": 2,
                                   "ckpt": "selective"}
    assert [x["loss"] for x in j["top"]] == sorted(x["loss"] for x in j["top"])
    assert j["n_feasible"] == int(t.feasible.sum()) and j["n_candidates"] == len(t)
    assert j["analytic_components"] == ["dp_comm"]


def test_days_sweep_reuses_plans_and_budget_grows_better():
    est = FakeEstimator()
    m = Mosaic(est, SMALL)
    losses = []
    for days in (10, 20, 40):
        losses.append(m.run(Envelope(nodes=8, days=days)).best.loss)
    assert est.calls == len(m.geoms)        # MFU does not depend on the window
    assert losses[0] > losses[1] > losses[2]
    m.run(Envelope(nodes=16, days=10))
    assert est.calls == 2 * len(m.geoms)    # a new node count re-plans


def test_paper_optimum_at_the_papers_mfu():
    """tab:pareto-B: at 12.38% MFU the q=12, E=96, K=2, G=4 geometry gets TPP 98, D 1.42 T, loss 1.3898."""
    est = FakeEstimator(mfu_fn=lambda m: 0.1238)
    grid = LadderGrid(q=(12,), experts=(96,), topk=(2,), g=(4,))
    b = Mosaic(est, grid).run(Envelope(nodes=32, days=20)).best
    assert b.n_layers == 48
    # D* = 9.95e23 * 0.1238 / (6 * 14.53e9) = 1.413 T, TPP 97.2; the printed 1.42 T / TPP 98 imply the paper's
    # own N_act count is ~0.5% lower (its ladder table sits slightly below scaleplan.geometry too): allow 1%
    assert b.tpp == pytest.approx(98, rel=0.01) and b.d_tokens == pytest.approx(1.42e12, rel=0.01)
    assert b.loss == pytest.approx(1.3898, abs=3e-4)
    assert b.c_model == pytest.approx(1.23e23, rel=0.005)  # "reaches 1.3898 on 1.23e23 model FLOPs"


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-c", "from scaleplan.cli import main; main()", *args],
                          capture_output=True, text=True, check=False)


# the grid as given (--no-extend-edges: the edge extension, tested in test_edges.py, would add values to it)
SMALL_FLAGS = ["--q", "8", "--experts", "32,128", "--topk", "1,2", "--g", "2,4", "--no-extend-edges"]


def test_cli_search_json_on_recorded_tables(recorded_db, tmp_path):
    csv, png = tmp_path / "f.csv", tmp_path / "p.png"
    p = _cli("search", "--profile", "p6-b200.48xlarge", "--nodes", "8", "--days", "10", *SMALL_FLAGS,
             "--db", recorded_db, "--json", "--csv", str(csv), "--plot", str(png))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert set(out) >= {"best", "top", "n_candidates", "n_feasible", "elapsed_s", "analytic_components"}
    assert out["n_candidates"] == 8
    b = out["best"]
    assert set(b) >= {"q", "n_layers", "n_experts", "topk", "g", "n_act", "n_tot", "s", "tpp", "d_tokens",
                      "c_model", "mfu", "loss", "layout"}
    assert set(b["layout"]) == {"tp", "cp", "pp", "ep", "dp", "mbs", "ckpt", "etp", "vpp"}
    assert b["layout"]["etp"] == b["layout"]["vpp"] == 1  # the search's plan constraints fix both at 1
    assert 40 <= b["tpp"] <= 150 and 0 < b["mfu"] < 1
    assert b["c_model"] == pytest.approx(6 * b["n_act"] * b["d_tokens"])
    assert csv.read_text().count("\n") == out["n_feasible"] + 1 and png.stat().st_size > 1000


def test_cli_search_sweep_and_empty_db(tmp_path):
    empty = tmp_path / "empty.db"
    p = _cli("search", "--profile", "p6-b200.48xlarge", "--nodes", "8", "--days", "10,20", *SMALL_FLAGS,
             "--db", str(empty), "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["analytic_components"]            # no tables: the analytic fallback, and it says so
    assert [r["days"] for r in out["sweep"]] == [10, 20]
    assert out["sweep"][1]["best"]["loss"] <= out["sweep"][0]["best"]["loss"]


def test_cli_search_bad_flags_exit_2():
    p = _cli("search", "--profile", "p6-b200.48xlarge", "--nodes", "8", "--days", "10", "--q", "8,x")
    assert p.returncode == 2 and "--q" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = _cli("search", "--profile", "nope", "--nodes", "8", "--days", "10")
    assert p.returncode == 2


def test_search_and_law_do_not_import_torch():
    code = ("import sys; from scaleplan.cli import search, law; from scaleplan.mosaic import search as s, law_fit;"
            "import scaleplan.estimator; print('torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "False"


def test_forked_workers_give_the_same_table():
    one = Mosaic(FakeEstimator(), SMALL, workers=1).run(Envelope(nodes=8, days=10)).table
    two = Mosaic(FakeEstimator(), SMALL, workers=2).run(Envelope(nodes=8, days=10)).table
    assert one.drop(columns=["why"]).equals(two.drop(columns=["why"])) and (one.why.fillna("") == two.why.fillna("")).all()
