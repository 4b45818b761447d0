"""The chi_sys fit recovers known coefficients, refuses too little data, and names unidentifiable terms."""
import numpy as np
import pytest
from scaleplan.calibrate.chi_sys import ChiData, chi_from, features, fit_chi, identifiability

from scaleplan.errors import ScaleplanError

TRUE = {"c_a2a": 1.3, "c_pp": 0.4, "c_ovl": -0.2}


def _synthetic(n=48, noise=0.01, seed=0, sweep_offsets=(0.0, 0.0)):
    """A fake predictor: t_analytic and t_a2a drawn at random; the 'measured' step time is
    chi_true * t_analytic * (1 + noise), optionally scaled per sweep (only ratios known)."""
    rng = np.random.default_rng(seed)
    ep_nodes = rng.choice([1, 2, 4], n)
    pp_nodes = rng.choice([1, 1, 2, 3], n)
    deep = (pp_nodes == 1) & (rng.random(n) < 0.4)
    sweep = np.where(np.arange(n) < n // 2, "a", "b")
    t_an = rng.uniform(1.0, 3.0, n)
    t_a2a = rng.uniform(0.1, 0.8, n) * t_an
    d = ChiData(t_analytic_s=t_an, t_a2a_s=t_a2a, ep_nodes=ep_nodes, pp_nodes=pp_nodes, deep_pp_in_node=deep,
                y=np.zeros(n), sweep=sweep)
    # chi by hand from eq:desync, independent of chi_from
    chi = (1 + TRUE["c_a2a"] * np.where(ep_nodes > 1, t_a2a / t_an, 0) + TRUE["c_pp"] * (pp_nodes - 1)
           + TRUE["c_ovl"] * deep)
    t_meas = chi * t_an * np.exp(rng.normal(0, noise, n))
    t_meas *= np.exp(np.where(sweep == "a", sweep_offsets[0], sweep_offsets[1]))
    d.y = np.log(t_meas / t_an)
    return d


def test_chi_from_matches_hand_formula():
    d = ChiData(t_analytic_s=[2.0, 2.0, 2.0], t_a2a_s=[0.5, 0.5, 0.5], ep_nodes=[2, 1, 1], pp_nodes=[1, 3, 1],
                deep_pp_in_node=[False, False, True], y=[0, 0, 0], sweep=["s"] * 3)
    # 1 + 1.3*0.25 = 1.325 ; 1 + 0.4*2 = 1.8 ; 1 - 0.2 = 0.8
    np.testing.assert_allclose(chi_from(TRUE, d), [1.325, 1.8, 0.8])


def test_fit_recovers_known_coefficients_absolute():
    fit = fit_chi(_synthetic(), mode="absolute")
    for t, v in TRUE.items():
        assert fit.coefficients[t] == pytest.approx(v, abs=0.05), t
    assert sorted(fit.free) == sorted(TRUE)


def test_fit_recovers_known_coefficients_scale_free():
    # each sweep measured on its own unknown scale: the absolute fit is biased, the normalized one is not
    d = _synthetic(sweep_offsets=(0.3, -0.5))
    fit = fit_chi(d, mode="normalized")
    for t, v in TRUE.items():
        assert fit.coefficients[t] == pytest.approx(v, abs=0.05), t
    assert abs(np.mean(fit.residuals[d.sweep == "a"])) < 1e-9


def test_robust_loss_resists_one_outlier():
    d = _synthetic(noise=0.005)
    d.y[0] += 1.0  # one run 2.7x slower than physics (a bad node)
    fit = fit_chi(d, mode="absolute")
    for t, v in TRUE.items():
        assert fit.coefficients[t] == pytest.approx(v, abs=0.06), t


def test_bounds_keep_the_physics():
    d = _synthetic()
    d.y = np.log(1.0 / (1 + features(d) @ np.array([1.0, 0.5, 0.3])))  # data wanting c<0 / c_ovl>0
    fit = fit_chi(d, mode="absolute")
    assert fit.coefficients["c_a2a"] >= 0 and fit.coefficients["c_pp"] >= 0 and fit.coefficients["c_ovl"] <= 0


def test_refuses_fewer_observations_than_parameters():
    d = _synthetic(n=48)
    small = d.subset(np.arange(len(d)) < 2)
    with pytest.raises(ScaleplanError, match="refused: 2 observation"):
        fit_chi(small, mode="absolute")


def test_unidentifiable_a2a_named_and_fixed_at_zero():
    d = _synthetic()
    d = d.subset(d.ep_nodes == 1)  # no EP group spans nodes
    fit = fit_chi(d, mode="absolute")
    assert fit.coefficients["c_a2a"] == 0.0
    assert "c_a2a" not in fit.free
    assert "EP group spanning more than one node" in fit.unidentified["c_a2a"]
    assert any(n.startswith("c_a2a fixed at 0") for n in fit.notes)
    assert fit.coefficients["c_pp"] == pytest.approx(TRUE["c_pp"], abs=0.05)


def test_term_constant_within_sweeps_unidentifiable_in_normalized_mode():
    n = 10
    d = ChiData(t_analytic_s=np.ones(n), t_a2a_s=np.full(n, 0.2), ep_nodes=np.ones(n, int),
                pp_nodes=np.r_[np.full(5, 2), np.ones(5, int)], deep_pp_in_node=np.r_[np.zeros(5), np.ones(5)],
                y=np.zeros(n), sweep=np.r_[["a"] * 5, ["b"] * 5])
    free, why = identifiability(d, "normalized")
    assert free == []
    assert "absorbs it" in why["c_pp"] and "absorbs it" in why["c_ovl"]
    free_abs, _ = identifiability(d, "absolute")
    assert free_abs == ["c_pp", "c_ovl"]
    with pytest.raises(ScaleplanError, match="no term is identifiable"):
        fit_chi(d, mode="normalized")


def test_pinned_term_is_not_fitted():
    """A pinned term stays out of the fit: pinned at its true value the free terms recover theirs; pinned at a
    wrong value the fit cannot move it back, so its residuals grow."""
    d = _synthetic()
    right = fit_chi(d, mode="absolute", fixed={"c_pp": TRUE["c_pp"]})
    assert sorted(right.free) == ["c_a2a", "c_ovl"]
    for t in right.free:
        assert right.coefficients[t] == pytest.approx(TRUE[t], abs=0.05), t
    wrong = fit_chi(d, mode="absolute", fixed={"c_pp": 0.0})
    assert "c_pp" not in wrong.free
    assert np.sum(np.square(wrong.residuals)) > 10 * np.sum(np.square(right.residuals))


def test_prior_only_for_unidentifiable_terms():
    """On runs inside one node c_a2a touches no run: it comes from the prior, whichever it is, and moves
    nothing else; c_pp is identified, so the data win over its prior."""
    d = _synthetic()
    d = d.subset(d.ep_nodes == 1)  # c_a2a unidentifiable, c_pp and c_ovl identifiable
    fits = {v: fit_chi(d, mode="absolute", prior={"c_a2a": v, "c_pp": 9.0}) for v in (1.2, 0.3)}
    for v, fit in fits.items():
        assert fit.coefficients["c_pp"] == pytest.approx(TRUE["c_pp"], abs=0.05)  # the data win
        assert "c_a2a" not in fit.free and any(n.startswith(f"c_a2a fixed at {v:g} (prior)") for n in fit.notes)
    a, b = fits.values()
    np.testing.assert_allclose(a.residuals, b.residuals)
    assert a.coefficients["c_ovl"] == pytest.approx(b.coefficients["c_ovl"])
