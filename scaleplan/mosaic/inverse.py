"""The inverse question of MOSAIC, exactly: per platform and node count, the shortest window that reaches a
target loss, and (the forward question on the same plans) the lowest loss a window reaches.

Inverse. The joint law (eq:joint-law) falls monotonically in D, so the tokens a geometry Z needs to reach a
target L* come in closed form:

    D_need(Z) = (b / (L* - R(Z)))^(1/beta),   R(Z) = the law without its data term,

(none where L* <= R(Z): no token count reaches it). A run trains D* = tokens/s x T x eta_good tokens
(eq:Dstar), at least tpp_min N_act of them to be feasible and at most tpp_max N_act counted (the search's
TPP window, sec:minlp-implementation). So Z reaches L* in the window

    T(Z) = max(D_need, tpp_min N_act) / (tokens/s x eta_good),   provided D_need <= tpp_max N_act,

and on n nodes the target is reached first by argmin_Z T(Z): the MOSAIC optimum of that window
(eq:hw-minlp), which then predicts exactly L* (or less, where the TPP floor binds). A forward search at any
window >= T reaches L* too; one at a shorter window does not (tests/mosaic/test_plan_roundtrip.py).

Which geometries are planned. No plan delivers more model FLOPs than the peak (MFU <= 1, eq:mfu), so
T(Z) >= 6 N_act D_need / (F_peak N_dev eta_good) for every plan: the geometries are planned in the order
of that bound, a few first, and then only those whose bound is below the best window found (and the
deadline). That is exact: a geometry left out cannot beat the answer. The forward question is bounded the same
way (loss at the tokens an MFU of 1 would deliver). Seconds, tokens, FLOP.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from scaleplan.mosaic.search import SECONDS_PER_DAY, Envelope, score

#: the MFU no plan exceeds (eq:mfu: model FLOPs over the peak): the bound that rules geometries out
MFU_BOUND = 1.0
#: geometries planned first per (platform, nodes), those of the best bound: an incumbent to prune with;
#: each later round plans GROWTH times as many (those of the next best bounds still below the best found).
#: Few rounds: each is one batch of the estimator per key (its per-call overhead) and a barrier of the workers
SEED = 64
GROWTH = 4


def tokens_for_loss(law, n_tot, s, g, target: float) -> np.ndarray:
    """D_need of the module docstring per geometry (tokens; inf where the target is at or below R(Z))."""
    n_tot, s, g = (np.asarray(x, dtype=float) for x in (n_tot, s, g))
    rest = np.asarray(law(n_tot, s, np.inf, g), dtype=float)  # the data term vanishes at D = inf
    gap = target - rest
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = np.where(gap > 0, (law.b / np.where(gap > 0, gap, 1.0)) ** (1.0 / law.beta), np.inf)
    return d


def need(geoms: pd.DataFrame, law, target: float, tpp_min: float, tpp_max: float) -> dict[str, np.ndarray]:
    """What each geometry needs to reach ``target`` whatever the platform: ``d_need`` (tokens, the TPP floor
    applied), ``reach`` (the law reaches the target within the TPP cap), ``c_need`` (6 N_act d_need, FLOP)."""
    n_act = geoms["n_act"].to_numpy(float)
    d = tokens_for_loss(law, geoms["n_tot"], geoms["s"], geoms["g"], target)
    reach = d <= tpp_max * n_act
    d_need = np.where(reach, np.maximum(d, tpp_min * n_act), np.inf)
    return {"d_need": d_need, "reach": reach, "c_need": 6.0 * n_act * d_need}


def _days(plans: pd.DataFrame, nd: dict, eta: float) -> np.ndarray:
    """Days each planned geometry needs (inf without a plan or out of reach)."""
    tps = plans["tokens_per_s"].to_numpy(float)
    ok = plans["plan_ok"].to_numpy(bool) & nd["reach"]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ok, nd["d_need"] / (np.where(ok, tps, 1.0) * eta) / SECONDS_PER_DAY, np.inf)


def solve_inverse(bank, keys: list[tuple[str, int]], nd: dict, eta: dict, day_cap: dict, window=None) -> dict:
    """Per key (platform, nodes): the days each geometry needs to reach the target (inf where it cannot or was
    ruled out), planning only what the bound of the module docstring leaves. ``eta``, ``day_cap``: per key
    eta_good and the longest window of interest (inf: none). ``window(key)``: the days per geometry in place of
    the point estimate's (a plan at a confidence, :mod:`scaleplan.mosaic.plan_draws`), with ``nd`` the tokens
    whose bound it cannot undercut."""
    lb = {k: _day_bound(bank, k, nd, eta[k]) for k in keys}
    days = window or (lambda k: _days(bank.plans(*k), nd, eta[k]))

    _rounds(bank, keys, lb, lambda k: min(float(np.min(days(k), initial=np.inf)), day_cap[k]))
    return {k: days(k) for k in keys}


def _rounds(bank, keys, lb: dict, cap) -> None:
    """Plan, per key, the geometries whose bound ``lb[key]`` is below ``cap(key)`` (the best found so far, or a
    constraint), in the bound's order and in growing batches (SEED, GROWTH SEED, ...), so that the best found
    tightens the cap before most geometries are planned. Stops when no key has such a geometry left."""
    order = {k: np.argsort(lb[k], kind="stable") for k in keys}
    size = SEED
    while True:
        wants = {}
        for k in keys:
            o = order[k]
            left = o[~bank.done(*k)[o] & (lb[k][o] < cap(k))]
            if len(left):
                wants[k] = left[:size]
        if not wants:
            return
        bank.ensure(wants)
        size *= GROWTH


def _day_bound(bank, key, nd: dict, eta: float) -> np.ndarray:
    """Days each geometry needs at least on ``key`` (MFU_BOUND); inf where the law cannot reach the target."""
    name, nodes = key
    prof = bank.ests[name].profile
    rate = prof.peak("bf16") * nodes * prof.gpus_per_node * eta * MFU_BOUND  # model FLOP/s at best
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(nd["reach"] & (rate > 0), nd["c_need"] / rate / SECONDS_PER_DAY, np.inf)


def solve_forward(bank, keys: list[tuple[str, int]], days: dict, eta: dict, law, support, env: Envelope,
                  at_q=None) -> dict:
    """Per key (platform, nodes): the scored table (:func:`~scaleplan.mosaic.search.score`) of the window
    ``days[key]`` at ``eta[key]``, every geometry that could have the lowest loss planned (bound: the loss at
    the tokens MFU_BOUND would deliver, TPP window applied). Its ``frontier`` first row is the optimum.
    ``at_q``: (bound(key, d_ub) -> [G], losses(key, table) -> [G]) of a plan at a confidence
    (:mod:`scaleplan.mosaic.plan_draws`): the loss each geometry reaches in that share of the draws, column
    ``loss_q``, in place of the point estimate's."""
    if at_q is None:
        lb = {k: _loss_bound(bank, k, days[k], eta[k], law, env) for k in keys}
    else:
        lb = {k: at_q[0](k, tokens_bound(bank, k, days[k], eta[k])) for k in keys}

    def table(k):
        t = _scored(bank, k, days[k], eta[k], law, support, env)
        return t if at_q is None else t.assign(loss_q=at_q[1](k, t))

    def best(k):
        t = table(k)
        col = t.loss if at_q is None else t.loss_q
        return float(col[t.feasible].min()) if t.feasible.any() else np.inf

    _rounds(bank, keys, lb, best)
    return {k: table(k) for k in keys}


def tokens_bound(bank, key, days: float, eta: float) -> np.ndarray:
    """The most tokens each geometry can train on ``key`` in ``days`` (MFU_BOUND, eq:Dstar). [G]"""
    name, nodes = key
    prof, n_act = bank.ests[name].profile, bank.geoms["n_act"].to_numpy(float)
    return prof.peak("bf16") * nodes * prof.gpus_per_node * days * SECONDS_PER_DAY * eta * MFU_BOUND / (6 * n_act)


def _loss_bound(bank, key, days: float, eta: float, law, env: Envelope) -> np.ndarray:
    """The lowest loss each geometry could reach in ``days`` (MFU_BOUND); inf where even that misses the TPP floor."""
    g = bank.geoms
    n_act = g["n_act"].to_numpy(float)
    d_ub = tokens_bound(bank, key, days, eta)
    with np.errstate(invalid="ignore"):
        loss = law(g["n_tot"].to_numpy(float), g["s"].to_numpy(float), np.minimum(d_ub, env.tpp_max * n_act),
                   g["g"].to_numpy(float))
    return np.where(d_ub >= env.tpp_min * n_act, loss, np.inf)


def _scored(bank, key, days: float, eta: float, law, support, env: Envelope) -> pd.DataFrame:
    name, nodes = key
    prof = bank.ests[name].profile
    e = Envelope(nodes=nodes, days=days, goodput=eta, gbs=env.gbs, seqlen=env.seqlen, optimizer=env.optimizer,
                 tpp_min=env.tpp_min, tpp_max=env.tpp_max)
    return score(bank.geoms, bank.plans(*key), e, prof.peak("bf16"), nodes * prof.gpus_per_node, law, support)
