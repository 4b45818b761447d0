"""How sure a point of ``scaleplan plan`` is, and the plans made to a confidence: the search's draws over its plans.

Draw k (:func:`scaleplan.mosaic.uncertainty.make_draws`, as the search draws): law coefficients theta_k on the
ridge, a standard normal z_k for the MFU error and one, z_law,k, for the law beyond its data. A geometry Z
planned on a cluster (tokens/s, MFU, evidence_sigma) delivers tokens/s x f_k in draw k,

    f_k = exp(sigma_c z_k),   sigma_c = sqrt(sigma^2 (1 + D_perf) + sigma_evidence^2)    (candidate_sigma)

with D_perf its plan's distance from the platform's observed runs in doublings (MFU, EP nodes, micro-batch, PP,
N_act: :mod:`scaleplan.mosaic.evidence`) and sigma the calibration's error, the drawn rate capped at the peak's
(6 N_act tokens/s <= MFU_BOUND F_peak N_dev: eq:mfu, the bound of :mod:`scaleplan.mosaic.inverse`). Draw k's
loss after D tokens is the law's plus its error beyond its data (s_law, the law's held-out scatter, per doubling
D_law of TPP or 1 - S beyond the data):

    loss_k(D) = R_k(Z) + b_k D^(-beta_k) + z_law,k s_law D_law(D / N_act, S)

with D_law at draw k's own tokens (the search reads it at the point estimate's TPP for every draw; here the
inverse and the forward question must agree draw by draw, so both read it at the tokens in question). Where
z_law,k > 0 that term grows with D beyond the data, and loss_k would turn up past D_turn = (beta_k b_k ln 2 /
(z_law,k s_law))^(1/beta_k); training longer never costs loss, so loss_k is held at its least from there on.
Draw k reaches L* with D_need,k, the fewest tokens at which loss_k <= L* (at least tpp_min N_act, none beyond
tpp_max N_act; bisection in log D), so Z reaches L* in days_k = D_need,k / (tokens/s f_k eta_good), P(reach in T)
= P_k(days_k <= T); a window of T days buys loss_k(min(D*_k, tpp_max N_act)), D*_k the tokens draw k delivers
(at the confidence, a draw below the TPP floor reaches no loss: the plan is not feasible there, as the inverse
question's window is never shorter than the floor's).

At a confidence q a cluster's window is min over Z of Q_q(days_k(Z)), Q_q the smallest T with P_k(days_k <= T)
>= q (an order statistic of the draws, not interpolated), and its argmin the geometry committed to; a window's
loss is min_Z Q_q(loss_k). The bounds that rule geometries out hold draw by draw, so stay exact; nothing is
planned per draw. Days, tokens, seconds.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from scaleplan.mosaic import inverse
from scaleplan.mosaic.evidence import NO_RUNS, doublings, law_doublings, perf_doublings, reach
from scaleplan.mosaic.law import NAMES
from scaleplan.mosaic.ridge import law_matrix
from scaleplan.mosaic.search import SECONDS_PER_DAY
from scaleplan.mosaic.uncertainty import Draws, candidate_sigma

_B, _BETA = NAMES.index("b"), NAMES.index("beta")
#: bisection steps in log D: the bracket [tpp_min, tpp_max] N_act spans ln(150 / 40) = 1.3 at the defaults, so
#: 40 halvings leave D_need exact to ~1e-12 relative
BISECTIONS = 40


@dataclass(frozen=True)
class LawNeed:
    """What draw k's law needs of each geometry to reach a target: ``tokens`` [N, G] (D_need,k, inf where it cannot
    within the TPP cap), ``tpp`` [G] (the point estimate's: where the flags say the law is asked) and ``at_q`` [G]
    (Q_q of the tokens: what the bound of mosaic.inverse reads)."""

    tokens: np.ndarray
    tpp: np.ndarray
    at_q: np.ndarray


@dataclass
class PlanDraws:
    """The draws (None: --samples 0; ``draws.z[:, 0]`` the MFU normals), the ``confidence`` planned to (None: the
    point estimates), and what distance is measured against: per platform the calibration's ``sigma`` and its
    observed ``runs`` (evidence.RunRange), the law's data ``support``; the TPP window."""

    draws: Draws | None
    confidence: float | None
    sigma: dict
    runs: dict
    support: object
    tpp_min: float
    tpp_max: float

    def quantile(self, x: np.ndarray) -> np.ndarray:
        """Q_q over the draws (axis 0): the smallest value a share >= q of the draws is at or below (q: the
        confidence, the median without one)."""
        q = 0.5 if self.confidence is None else self.confidence
        return np.quantile(x, q, axis=0, method="inverted_cdf")

    # -- the law -------------------------------------------------------------------------------------------
    def law(self, geoms: pd.DataFrame) -> _Law:
        """Draw by draw, the law of each geometry (n_tot, s, g, n_act) and its error beyond the data."""
        n_tot, s, g, n_act = (geoms[k].to_numpy(float) for k in ("n_tot", "s", "g", "n_act"))
        d = self.draws
        zs = d.z_law[:, None] * d.law_scatter if d.z_law is not None and d.law_scatter > 0 else np.zeros((d.n, 1))
        d_s = law_doublings(pd.DataFrame({"tpp": np.full(len(s), self.support.tpp_min), "s": s}), self.support)
        rest = law_matrix(d.coefs, n_tot, s, np.full((d.n, 1), np.inf), g) + zs * d_s[None, :]
        return _Law(rest, d.coefs[:, _B, None], d.coefs[:, _BETA, None], zs, n_act, self.support.tpp_min,
                    self.support.tpp_max)

    def law_need(self, geoms: pd.DataFrame, law, target: float) -> LawNeed:
        """:class:`LawNeed` of every geometry (n_tot, s, g, n_act) for the loss ``target``."""
        n_tot, s, g, n_act = (geoms[k].to_numpy(float) for k in ("n_tot", "s", "g", "n_act"))
        lo, hi = self.tpp_min * n_act, self.tpp_max * n_act
        tpp = np.clip(inverse.tokens_for_loss(law, n_tot, s, g, target), lo, hi) / n_act
        tokens = self.law(geoms).tokens_for(target, lo, hi)
        return LawNeed(tokens, tpp, self.quantile(tokens))

    # -- the throughput ------------------------------------------------------------------------------------
    def sigma_c(self, name: str, rows: pd.DataFrame) -> np.ndarray:
        """Per row (a plan: mfu_plan, ep_nodes, mbs, pp, n_act, evidence_sigma), its MFU draw's sigma. [rows]"""
        perf = perf_doublings(rows, self.runs.get(name, NO_RUNS))
        return candidate_sigma(rows.assign(perf_doublings=perf), self.sigma[name])

    @staticmethod
    def peak_rate(n_act, peak_flops: float, n_dev: int) -> np.ndarray:
        """Tokens/s at MFU_BOUND (6 N_act tokens/s = MFU_BOUND F_peak N_dev), per row."""
        return inverse.MFU_BOUND * peak_flops * n_dev / (6.0 * np.asarray(n_act, dtype=float))

    def rates(self, name: str, rows: pd.DataFrame, peak_flops: float, n_dev: int) -> np.ndarray:
        """Drawn tokens/s [N, rows]: tokens/s x f_k, at most the peak's (:meth:`peak_rate`)."""
        f = np.exp(self.sigma_c(name, rows)[None, :] * self.draws.z[:, :1])
        cap = self.peak_rate(rows["n_act"], peak_flops, n_dev)
        return np.minimum(rows["tokens_per_s"].to_numpy(float)[None, :] * f, cap[None, :])

    def days(self, name: str, rows: pd.DataFrame, tokens: np.ndarray, eta: float, peak_flops: float,
             n_dev: int) -> np.ndarray:
        """days_k [N, rows] of planned ``rows`` needing ``tokens`` [N, rows]."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return tokens / (self.rates(name, rows, peak_flops, n_dev) * eta) / SECONDS_PER_DAY

    # -- the questions at the confidence -------------------------------------------------------------------
    def windows(self, name: str, plans: pd.DataFrame, geoms: pd.DataFrame, need: LawNeed, eta: float,
                peak_flops: float, n_dev: int) -> np.ndarray:
        """Q_q of days_k per geometry on one cluster (inf without a plan). [G]"""
        out = np.full(len(geoms), np.inf)
        idx = np.flatnonzero(plans["plan_ok"].to_numpy(bool))
        if len(idx):
            rows = pd.concat([plans.iloc[idx].reset_index(drop=True),
                              geoms.iloc[idx][["n_act"]].reset_index(drop=True)], axis=1)
            out[idx] = self.quantile(self.days(name, rows, need.tokens[:, idx], eta, peak_flops, n_dev))
        return out

    def losses(self, name: str, table: pd.DataFrame, t_days: float, eta: float, peak_flops: float,
               n_dev: int) -> tuple[np.ndarray, np.ndarray]:
        """(loss_k, feasible_k) [N, rows] of a scored table's rows (mosaic.search.score at ``t_days``): the loss at
        the tokens draw k delivers, and whether they clear the TPP floor."""
        n_act = table["n_act"].to_numpy(float)
        d_star = self.rates(name, table, peak_flops, n_dev) * t_days * SECONDS_PER_DAY * eta
        loss = self.law(table).loss_at(d_star, self.tpp_min * n_act, self.tpp_max * n_act)
        return loss, d_star >= self.tpp_min * n_act[None, :]

    def window_losses(self, name: str, table: pd.DataFrame, t_days: float, eta: float, peak_flops: float,
                      n_dev: int) -> np.ndarray:
        """Q_q of loss_k per row of a scored table, a draw below the TPP floor counted as not reaching any loss
        (inf where infeasible at the point estimates, as the search). [G]"""
        out = np.full(len(table), np.inf)
        idx = np.flatnonzero(table["feasible"].to_numpy(bool))
        if len(idx):
            loss, ok = self.losses(name, table.iloc[idx], t_days, eta, peak_flops, n_dev)
            out[idx] = self.quantile(np.where(ok, loss, np.inf))
        return out

    def loss_bound(self, geoms: pd.DataFrame, d_ub: np.ndarray) -> np.ndarray:
        """Per geometry, a loss its Q_q cannot undercut when no draw delivers more than ``d_ub`` tokens [G] (the
        peak's): loss_k never rises with tokens, so Q_q of loss_k(d_ub); inf where d_ub misses the TPP floor."""
        n_act = geoms["n_act"].to_numpy(float)
        d = np.broadcast_to(d_ub, (self.draws.n, len(n_act)))
        low = self.law(geoms).loss_at(d, self.tpp_min * n_act, self.tpp_max * n_act)
        return np.where(d_ub >= self.tpp_min * n_act, self.quantile(low), np.inf)

    def lowest_loss(self, geoms: pd.DataFrame) -> float:
        """The lowest Q_q of the loss any geometry reaches within tpp_max N_act (the law's range, at the
        confidence)."""
        n_act = geoms["n_act"].to_numpy(float)
        d = np.broadcast_to(self.tpp_max * n_act, (self.draws.n, len(n_act)))
        loss = self.law(geoms).loss_at(d, self.tpp_min * n_act, self.tpp_max * n_act)
        return float(np.min(self.quantile(loss), initial=np.inf))

    # -- one point -----------------------------------------------------------------------------------------
    def flags(self, name: str, row: pd.Series, tpp: float | None) -> dict:
        """The point's distance from what was measured: evidence.reach's perf_doublings, law_doublings and beyond
        (``tpp``: where the law is asked, None: no law, a fixed model) and its MFU draw's sigma."""
        one = row.to_frame().T.assign(plan_ok=True, tpp=np.nan if tpp is None else tpp)
        if tpp is None:
            one = one.assign(s=np.nan)
        r = reach(one, self.runs.get(name, NO_RUNS), self.support)
        return {"beyond": r["beyond"][0], "perf_doublings": float(r["perf_doublings"][0]),
                "law_doublings": float(r["law_doublings"][0]), "mfu_sigma": float(self.sigma_c(name, one)[0])}


@dataclass(frozen=True)
class _Law:
    """Draw k's loss over C geometries (module docstring): ``rest`` [N, C] (R_k plus the error of the sparsity
    beyond the data), ``b``, ``beta``, ``zs`` (z_law,k s_law) [N, 1], ``n_act`` [C], the law's TPP data range."""

    rest: np.ndarray
    b: np.ndarray
    beta: np.ndarray
    zs: np.ndarray
    n_act: np.ndarray
    tpp_lo: float
    tpp_hi: float

    def _loss(self, d: np.ndarray, rows=slice(None)) -> np.ndarray:
        """loss_k at tokens ``d`` without the hold past D_turn: ``d`` holds the flattened [N, C] entries ``rows``."""
        def full(x):
            return np.broadcast_to(x, self.rest.shape).reshape(-1)[rows]

        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return (full(self.rest) + full(self.b) * d ** -full(self.beta)
                    + full(self.zs) * doublings(d / full(self.n_act[None, :]), self.tpp_lo, self.tpp_hi))

    def turn(self, lo, hi) -> np.ndarray:
        """Where loss_k stops falling within [lo, hi] tokens [N, C]: D_turn beyond the data where z_law,k > 0."""
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            d_turn = (self.b * self.beta * np.log(2.0) / self.zs) ** (1.0 / self.beta)
        m = np.where(self.zs > 0, np.maximum(d_turn, self.tpp_hi * self.n_act[None, :]), np.inf)
        return np.clip(m, lo, hi)

    def loss_at(self, d, lo, hi) -> np.ndarray:
        """loss_k at ``d`` tokens [N, C], the TPP cap ``hi`` applied and held at its least past D_turn."""
        d = np.minimum(np.minimum(d, hi), self.turn(lo, hi))
        return self._loss(d.reshape(-1)).reshape(self.rest.shape)

    def tokens_for(self, target: float, lo, hi) -> np.ndarray:
        """D_need,k [N, C]: the fewest tokens in [lo, hi] with loss_k <= ``target`` (inf where none)."""
        lo_f = np.broadcast_to(lo, self.rest.shape).reshape(-1)
        m = self.turn(lo, hi).reshape(-1)
        out = np.where(self._loss(lo_f) <= target, lo_f, np.where(self._loss(m) <= target, np.nan, np.inf))
        rows = np.flatnonzero(np.isnan(out))  # loss_k falls from above the target at lo to at most it at m
        a, z = np.log(lo_f[rows]), np.log(m[rows])
        for _ in range(BISECTIONS):
            mid = 0.5 * (a + z)
            ok = self._loss(np.exp(mid), rows) <= target
            a, z = np.where(ok, a, mid), np.where(ok, mid, z)
        out[rows] = np.exp(z)  # the bracket's end at which loss_k <= target
        return out.reshape(self.rest.shape)
