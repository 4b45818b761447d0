"""Uncertainty through the search (--samples) against a brute-force loop, the ridge sampler, the MFU sigma."""
import math

import numpy as np
import pytest
from fakes import FakeEstimator

from scaleplan.mosaic.ladder import LadderGrid
from scaleplan.mosaic.law import NAMES, PAPER_CI95, PAPER_JOINT_LAW, JointLaw
from scaleplan.mosaic.report import attach_uncertainty
from scaleplan.mosaic.ridge import law_matrix, paper_support_grid, ridge_samples
from scaleplan.mosaic.search import Envelope, Mosaic
from scaleplan.mosaic.uncertainty import (
    FALLBACK_SIGMA,
    Draws,
    MfuError,
    family_index,
    mfu_error,
    sigma_from_residuals,
    summarise,
)

GRID = LadderGrid(q=(8, 10), experts=(16, 32, 96, 128, 384), topk=(1, 2, 4), g=(1, 2, 4, 8))


def _mfu(m, gbs, seqlen, opt):
    return 0.25 / (1.0 + 0.2 * m.moe.experts_per_token) * (1.0 - 0.03 * math.log2(m.moe.n_experts / 16 + 1))


@pytest.fixture(scope="module")
def searched():
    m = Mosaic(FakeEstimator(mfu_fn=_mfu), GRID)
    env = Envelope(nodes=8, days=6)
    return env, m.run(env)


def _draws(n_fam: int, n: int = 40, sigma: float = 0.25) -> Draws:
    """Law vectors: the paper law with independent +-3% prefactor and +-2% exponent jitter (not the ridge:
    the brute force only needs distinct laws); MFU log-factors standard normal per family."""
    rng = np.random.default_rng(7)
    v = PAPER_JOINT_LAW.vector()
    coefs = v * (1 + np.concatenate([0.03 * rng.standard_normal((n, 5)), 0.02 * rng.standard_normal((n, 6))], 1))
    return Draws(coefs=coefs, z=rng.standard_normal((n, n_fam)), sigma=sigma)


def test_summary_matches_brute_force(searched):
    env, res = searched
    t = res.table
    index = family_index([t])
    draws = _draws(len(index))
    got = summarise(t, draws, env.tpp_min, env.tpp_max, index)
    # brute force: one draw, one candidate at a time, the law as a JointLaw object, families by hand
    fams = sorted({(int(r.tp), int(r.cp), int(r.pp), int(r.ep)) for r in t[t.plan_ok].itertuples()})
    assert len(fams) >= 3                          # the fake's pp follows G: several families
    rows = [r for r in t.itertuples() if r.plan_ok]
    losses = np.zeros((draws.n, len(rows)))
    feas = np.zeros((draws.n, len(rows)), bool)
    opt = []
    for k in range(draws.n):
        law = JointLaw.from_dict(dict(zip(NAMES, draws.coefs[k])))
        best, best_i = math.inf, None
        for i, r in enumerate(rows):
            f = math.exp(draws.sigma * draws.z[k, fams.index((int(r.tp), int(r.cp), int(r.pp), int(r.ep)))])
            d_star = r.d_star * f
            d = min(d_star, env.tpp_max * r.n_act)
            losses[k, i] = law(r.n_tot, r.s, d, r.g)
            feas[k, i] = d_star >= env.tpp_min * r.n_act
            if feas[k, i] and losses[k, i] < best:
                best, best_i = losses[k, i], i
        opt.append((best, best_i))
    out = got["table"].loc[[r.Index for r in rows]]
    p_opt = np.array([sum(1 for _, j in opt if j == i) for i in range(len(rows))]) / draws.n
    assert np.allclose(out.p_optimal, p_opt)
    assert p_opt.sum() == pytest.approx(1.0) and (p_opt > 0).sum() >= 2   # a contested optimum
    assert np.allclose(out.loss_mean, losses.mean(0), rtol=1e-12)
    assert np.allclose(out.loss_p05, [np.percentile(losses[:, i], 5) for i in range(len(rows))], rtol=1e-12)
    assert np.allclose(out.loss_p95, [np.percentile(losses[:, i], 95) for i in range(len(rows))], rtol=1e-12)
    regret = [np.mean([losses[k, i] - opt[k][0] for k in range(draws.n)]) for i in range(len(rows))]
    assert np.allclose(out.regret, regret, rtol=1e-9, atol=1e-12)
    assert np.allclose(out.p_feasible, feas.mean(0))
    assert list(got["opt"]) == [rows[j].Index for _, j in opt]
    assert got["table"][~got["table"].plan_ok].p_optimal.isna().all()


def test_zero_sigma_and_the_point_law_reproduce_the_search(searched):
    env, res = searched
    index = family_index([res.table])
    n = 5
    draws = Draws(coefs=np.repeat(PAPER_JOINT_LAW.vector()[None, :], n, 0), z=np.ones((n, len(index))), sigma=0.0)
    got = summarise(res.table, draws, env.tpp_min, env.tpp_max, index)
    assert set(got["opt"]) == {res.best.name}
    assert got["table"].loc[res.best.name, "p_optimal"] == 1.0
    assert got["table"].loc[res.best.name, "regret"] == pytest.approx(0.0, abs=1e-15)


def test_attach_uncertainty_json(searched):
    env, res = searched
    import copy

    r2 = copy.copy(res)
    unc = attach_uncertainty([(env, r2)], PAPER_JOINT_LAW, None, "paper", MfuError(0.2, "test"), 50, seed=3)[0]
    assert unc["samples"] == 50
    p = [x["p_optimal"] for x in unc["near_ties"]]
    assert p == sorted(p, reverse=True) and all(x >= 0.05 for x in p)
    v = unc["verdicts"]
    t = r2.table
    # P(G*) from the table's per-candidate P(optimal), summed per G (independent of the verdict code)
    for g, pg in v["p_g"].items():
        assert pg == pytest.approx(t[t.g == int(g)].p_optimal.sum())
    assert sum(v["p_g"].values()) == pytest.approx(1 - v["p_no_feasible"])
    lo, hi = v["s_band90"]
    assert t[t.p_optimal > 0].s.min() <= lo <= hi <= t[t.p_optimal > 0].s.max()
    assert any(s.startswith(f"G={v['g_mode']} in ") for s in v["statements"])
    assert set(unc["near_ties"][0]) >= {"p_optimal", "loss_mean", "loss_p05", "loss_p95", "regret", "extrapolated"}
    assert "sampler" in unc["uncertainty_inputs"]["law_ridge"]
    # a fit's stored ridge: draws come from its rows only (here one row, the paper law: no law spread)
    r3 = copy.copy(res)
    one = PAPER_JOINT_LAW.vector()[None, :]
    u3 = attach_uncertainty([(env, r3)], PAPER_JOINT_LAW, one, "db:1", MfuError(0.0, "test"), 20)[0]
    assert u3["uncertainty_inputs"]["law_ridge"].startswith("1 stored")
    assert r3.table.loc[res.best.name, "p_optimal"] == 1.0 and u3["verdicts"]["p_g_mode"] == 1.0


def test_paper_ridge_samples_stay_within_the_residual_scatter():
    s = ridge_samples(300, seed=0)
    assert s.shape == (300, len(NAMES))
    grid = paper_support_grid()
    ref = np.array([PAPER_JOINT_LAW(n, si, d, g) for n, si, d, g in zip(grid["n_tot"], grid["s"], grid["d"],
                                                                         grid["g"])])
    for row in s[::15]:
        law = JointLaw.from_dict(dict(zip(NAMES, row)))
        pred = np.array([law(n, si, d, g) for n, si, d, g in zip(grid["n_tot"], grid["s"], grid["d"], grid["g"])])
        assert np.sqrt(np.mean((pred - ref) ** 2)) <= 0.00779
    # a ridge: ridge coefficients spread beyond the paper's local BCa interval (app:scaling-law-coeffs)
    for name in ("a", "j", "c"):
        i = NAMES.index(name)
        lo, hi = np.percentile(s[:, i], [5, 95])
        ci = PAPER_CI95[name]
        assert hi - lo > ci[1] - ci[0], name


def test_ridge_samples_deterministic_cached_and_resampled_when_corrupt(tmp_path, monkeypatch):
    from scaleplan.mosaic import ridge

    monkeypatch.setenv("SCALEPLAN_CACHE", str(tmp_path))
    a = ridge_samples(40, seed=4)
    fresh = ridge.cached_samples.__wrapped__(40, 4, PAPER_JOINT_LAW, ridge.PAPER_RMSE, ridge.PAPER_N_RUNS, 16, 2000)
    assert np.array_equal(a, fresh)                      # same seed, same samples, without any cache
    files = list(tmp_path.glob("ridge-*.npy"))
    assert len(files) == 1 and np.array_equal(np.load(files[0]), a)
    files[0].write_bytes(b"not an array")
    ridge.cached_samples.cache_clear()
    assert np.array_equal(ridge_samples(40, seed=4), a)
    assert np.array_equal(np.load(files[0]), a)          # the corrupt entry was rewritten
    assert not np.array_equal(ridge_samples(40, seed=5), a)


def test_law_matrix_matches_the_law_object():
    rng = np.random.default_rng(0)
    coefs = PAPER_JOINT_LAW.vector() * (1 + 0.05 * rng.standard_normal((3, len(NAMES))))
    n_tot, s, d, g = np.array([1e9, 3e11]), np.array([0.7, 0.96]), np.array([1e10, 1.4e12]), np.array([1.0, 4.0])
    got = law_matrix(coefs, n_tot, s, d, g)
    for k in range(3):
        law = JointLaw.from_dict(dict(zip(NAMES, coefs[k])))
        assert got[k] == pytest.approx([law(n_tot[i], s[i], d[i], g[i]) for i in range(2)], rel=1e-12)


def test_mfu_sigma_from_the_newest_dispatch_calibration(tmp_path):
    from scaleplan.db import models as m
    from scaleplan.db import session as dbs

    url = f"sqlite:///{tmp_path / 'cal.db'}"
    dbs.upgrade(url)
    assert mfu_error(url, "p6-b200.48xlarge").sigma == FALLBACK_SIGMA
    old, new = [0.5, -0.4], [0.10, -0.05, 0.20, {"rel_err": -0.10}]
    with dbs.session_scope(url) as s:
        for v, res in ((1, old), (2, new)):
            s.add(m.Calibration(profile="p6-b200.48xlarge", kind="dispatch", version=v, coefficients={},
                                residuals=res, n_obs=len(res)))
        s.add(m.Calibration(profile="p6-b200.48xlarge", kind="chi_sys", version=3, coefficients={},
                            residuals=[0.9], n_obs=1))
    want = math.sqrt(np.mean([math.log(1.10) ** 2, math.log(0.95) ** 2, math.log(1.20) ** 2, math.log(0.90) ** 2]))
    got = mfu_error(url, "p6-b200.48xlarge")
    assert got.sigma == pytest.approx(want) and "calibration" in got.source
    assert mfu_error(url, "p5.48xlarge").sigma == FALLBACK_SIGMA   # another profile: no row, the fallback
    assert sigma_from_residuals(["x", None, float("nan")]) is None


def test_fitted_law_stores_ridge_and_support(tmp_path):
    from synth import synthetic_runs

    from scaleplan.mosaic.law import load_law_full
    from scaleplan.mosaic.law_fit import Runs, fit_joint_law, store_fit

    runs = Runs(synthetic_runs(noise=0.002, seed=2))
    fit = fit_joint_law(runs, n_bootstrap=0, n_restarts=4, seed=0)
    url = f"sqlite:///{tmp_path / 'law.db'}"
    store_fit(url, runs, fit, name="t", dataset="synthetic")
    got = load_law_full(url, "t")
    df = runs.df
    assert got.support.s_max == pytest.approx(df.s.max()) and got.support.s_min == pytest.approx(df.s.min())
    assert got.support.tpp_max == pytest.approx((df.d / df.n_act).max())
    assert got.ridge.shape == (fit.n_near_optimal, len(NAMES)) and fit.n_near_optimal >= 1
    assert np.allclose(got.ridge, fit.ridge)
    # the best fit itself is among the near-optimal solutions
    assert np.min(np.abs(got.ridge - got.law.vector()).max(axis=1)) < 1e-9
