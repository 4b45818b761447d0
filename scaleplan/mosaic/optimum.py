"""The model-FLOPs-only program (eq:compute-only-program, sec:boundary-optimum).

At fixed G and sparsity S, with N_act = (1-S) N_tot and C_model = 6 N_act D, minimise the joint law
over N_tot (D is then C_model / (6 (1-S) N_tot)). In log N_tot the objective is a posynomial, hence
convex (app:hw-optimization, Property 1), so a bounded scalar minimisation finds the optimum.
Over S the optimum L*(S) decreases monotonically in the calibrated range, so the program is
boundary-seeking: S* = s_max.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize_scalar

from scaleplan.errors import SpecError
from scaleplan.mosaic.law import PAPER_JOINT_LAW, JointLaw


@dataclass(frozen=True)
class SparsityOptimum:
    """The model-FLOPs optimum at one sparsity: parameters, tokens (raw counts) and loss (nats)."""

    s: float
    n_tot: float
    n_act: float
    d_tokens: float
    loss: float

    def to_dict(self) -> dict:
        return {"s": self.s, "n_tot": self.n_tot, "n_act": self.n_act, "d_tokens": self.d_tokens,
                "loss": self.loss}


def optimum_at_sparsity(budget: float, s: float, g: float, law: JointLaw = PAPER_JOINT_LAW) -> SparsityOptimum:
    """argmin over N_tot of L(N_tot, s, C/(6(1-s)N_tot), g). budget in FLOP; raises SpecError if s not in [0,1)."""
    if not 0.0 <= s < 1.0:
        raise SpecError("s", s, "a sparsity in [0, 1)")
    r = 1.0 - s

    def loss(log_n):
        n = np.exp(log_n)
        return law(n, s, budget / (6.0 * r * n), g)

    # N_act and D both between 1 and C/6 keep the bracket honest; xatol far below grid resolution
    lo, hi = np.log(1.0 / r), np.log(budget / 6.0 / r)
    res = minimize_scalar(loss, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10, "maxiter": 1000})
    n = float(np.exp(res.x))
    return SparsityOptimum(s=float(s), n_tot=n, n_act=r * n, d_tokens=budget / (6.0 * r * n), loss=float(res.fun))


def sparsity_sweep(budget: float, g: float, s_max: float = 0.985, s_min: float = 0.5, n: int = 50,
                   law: JointLaw = PAPER_JOINT_LAW) -> list[SparsityOptimum]:
    """Optimum per sparsity on an even grid [s_min, s_max] (eq:compute-only-program per S).

    Raises SpecError on a non-positive budget or an empty/invalid range.
    """
    if not budget > 0:
        raise SpecError("--budget", budget, "a positive model-FLOPs budget in FLOP")
    if not (0.0 <= s_min < s_max < 1.0):
        raise SpecError("--s-max", s_max, f"a sparsity in ({s_min}, 1)")
    return [optimum_at_sparsity(budget, float(s), g, law) for s in np.linspace(s_min, s_max, n)]


def boundary_optimum(sweep: list[SparsityOptimum]) -> SparsityOptimum:
    """The best point of a sweep (the program's optimum over S; lands on s_max when boundary-seeking)."""
    return min(sweep, key=lambda o: o.loss)
