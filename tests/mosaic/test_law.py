"""Joint law (eq:joint-law), per-G law (eq:abnar-law) and the model-FLOPs program (eq:compute-only-program)."""
import json
import math
import re

import numpy as np
import inproc
import pytest

from scaleplan.mosaic.ladder import LadderGrid, enumerate_geometries
from scaleplan.mosaic.law import NAMES, PAPER_JOINT_LAW, JointLaw, per_g_law
from scaleplan.mosaic.optimum import boundary_optimum, optimum_at_sparsity, sparsity_sweep


def test_paper_optimum_loss_in_raw_counts():
    """tab:pareto-B: q=12, E=96, K=2, G=4 at D = 1.42 T tokens has loss 1.3898 (N_tot, D in raw counts)."""
    r = enumerate_geometries(LadderGrid(q=(12,), experts=(96,), topk=(2,), g=(4,), s_min=0)).iloc[0]
    # D is printed to 3 significant digits (1.415..1.425 T): the loss moves by about +-0.0002 over that range
    losses = [PAPER_JOINT_LAW(r.n_tot, r.s, d, 4) for d in (1.415e12, 1.425e12)]
    assert min(losses) - 5e-5 <= 1.3898 <= max(losses) + 5e-5


def test_law_by_hand_and_limits():
    law = JointLaw(a=2, b=3, c=0.5, j=1, e=0.25, alpha=0.5, beta=0.5, lam=1, delta=1, gamma=0.5, eta=1)
    # N=4, D=9, S=0.5, G=2: 2/2 + 3/3 + 0.5/0.5 + 1/(0.5*2*2) + 0.25 = 3.75
    assert law(4, 0.5, 9, 2) == pytest.approx(3.75)
    big = law(1e30, 0.0, 1e30, 1e30)
    assert big == pytest.approx(0.25 + 0.5, rel=1e-9)  # e + c in the dense limit (sec:joint-NtSDG-law)
    x = law(np.array([4, 16]), 0.5, 9, 2)
    assert x.shape == (2,) and x[1] < x[0]


def test_monotone_in_n_d_g_and_convex_in_s():
    L = PAPER_JOINT_LAW
    assert L(1e10, 0.9, 1e11, 4) > L(2e10, 0.9, 1e11, 4)
    assert L(1e10, 0.9, 1e11, 4) > L(1e10, 0.9, 2e11, 4)
    assert L(1e10, 0.9, 1e11, 2) > L(1e10, 0.9, 1e11, 4) > L(1e10, 0.9, 1e11, 8)
    s = np.linspace(0.1, 0.99, 30)
    assert np.all(np.diff(L(1e10, s, 1e11, 4), 2) > 0)


def test_per_g_law_equals_joint_at_that_g():
    for g in (1, 2, 4, 8):
        pg = per_g_law(g)
        assert pg.eta == 0
        assert pg(5e9, 0.95, 6e9, 123.0) == pytest.approx(PAPER_JOINT_LAW(5e9, 0.95, 6e9, g), rel=1e-12)


def _paper_coefficients(tex: str) -> dict[str, float]:
    """tab:joint-law-coeffs as the paper prints it: {symbol name: value}, ``$\\lambda$`` -> "lambda"."""
    table = tex[:tex.index(r"\label{tab:joint-law-coeffs}")].rsplit(r"\begin{tabular}", 1)[1]
    rows = re.findall(r"^\$\\?(\w+)\$\s*&\s*\$(?:\\mathbf\{)?\+?([0-9.]+)", table, flags=re.M)
    return {name: float(value) for name, value in rows}


def test_dict_round_trip_uses_paper_names(paper_tex):
    """to_dict names each coefficient as tab:joint-law-coeffs does and carries the value printed there;
    from_dict reads it back, and a law whose coefficients all differ survives the round trip."""
    paper = _paper_coefficients(paper_tex)
    assert len(paper) == 11 and PAPER_JOINT_LAW.to_dict() == paper
    assert tuple(PAPER_JOINT_LAW.to_dict()) == NAMES
    distinct = JointLaw(*(float(i) for i in range(1, 12)))
    assert JointLaw.from_dict(distinct.to_dict()) == distinct and JointLaw.from_dict(paper) == PAPER_JOINT_LAW


@pytest.mark.parametrize("budget", [3e19, 6e19, 1e20, 3e20, 6e20])
def test_compute_only_program_trends(budget):
    """fig:figure3-abnar-repro: N_tot* up with S, N_act* down, L* down; optimum at s_max (boundary)."""
    sw = sparsity_sweep(budget, 4, s_max=0.985, s_min=0.5, n=12)
    n_tot, n_act, loss = (np.array([getattr(o, k) for o in sw]) for k in ("n_tot", "n_act", "loss"))
    assert np.all(np.diff(n_tot) > 0) and np.all(np.diff(n_act) < 0) and np.all(np.diff(loss) < 0)
    assert boundary_optimum(sw).s == pytest.approx(0.985)
    for o in sw:  # every point spends the budget exactly
        assert 6 * o.n_act * o.d_tokens == pytest.approx(budget, rel=1e-9)


def test_sparsity_optimum_is_a_minimum():
    o = optimum_at_sparsity(1e20, 0.9, 4)
    for f in (0.98, 1.02):
        n = o.n_tot * f
        assert PAPER_JOINT_LAW(n, 0.9, 1e20 / (6 * 0.1 * n), 4) >= o.loss - 1e-12


def _cli(*args):
    return inproc.cli(*args)  # in-process (tests/inproc.py)


def test_cli_eval_and_optimum_json():
    p = _cli("law", "eval", "--n-tot", "3.272e11", "--s", "0.9556", "--d", "1.42e12", "--g", "4", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["loss"] == pytest.approx(PAPER_JOINT_LAW(3.272e11, 0.9556, 1.42e12, 4))
    assert math.isclose(sum(out["terms"].values()), out["loss"], rel_tol=1e-12)
    p = _cli("law", "optimum", "--budget", "1e20", "--g", "4", "--points", "5", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["at_boundary"] and len(out["sweep"]) == 5


def test_cli_bad_input_one_line_exit_2():
    p = _cli("law", "eval", "--n-tot", "1e9", "--s", "1.5", "--d", "1e9")
    assert p.returncode == 2 and "--s" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_cli_optimum_five_budgets_and_plot(tmp_path):
    png = tmp_path / "opt.png"
    p = _cli("law", "optimum", "--budget", "3e19,6e19,1e20,3e20,6e20", "--g", "4", "--points", "4", "--plot", str(png),
             "--json")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)["results"]
    assert [r["budget"] for r in res] == [3e19, 6e19, 1e20, 3e20, 6e20] and all(r["at_boundary"] for r in res)
    best = [r["best"]["loss"] for r in res]
    assert best == sorted(best, reverse=True)  # more budget, lower optimal loss
    assert png.stat().st_size > 1000
