"""One model to train, and why: the search's recommendation over the --samples draws.

The point optimum is the argmin of the loss at the point estimates; the draws say how far to trust it.
A candidate is eligible when it is feasible at the point estimates and delivers the TPP floor in most draws
(p_feasible >= MOSTLY_FEASIBLE): a candidate under the floor in most draws wins only the draws in which its
MFU came out high, so its P(optimal) measures luck, not a choice. The recommendation is the eligible
candidate of least expected loss over the draws (= least expected regret: each draw's optimum is the same for
every candidate). Another eligible candidate whose loss is lower than the recommendation's in at least
TIE_P of the draws is a statistical tie; what would separate the two is read from the spread of their loss
difference under the MFU draws alone (law at its point) against the law draws alone (MFU at its point):
the larger one names the measurement that would.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from scaleplan.mosaic.uncertainty import MOSTLY_FEASIBLE, Draws, evaluate, families

#: another candidate beating the recommendation in at least this share of draws is a statistical tie
TIE_P = 1 / 3
#: a plan with at least this share of its table-read time (evidence.NOT_TABLE_READ aside) costed without a
#: measured table is a guess
GUESS_SHARE = 0.5
BENCH_HINT = "run `scaleplan bench` (or `scaleplan bench plan --search s.json --run`) for measured tables"


def name(r) -> str:
    """A candidate's short name: L E K G."""
    return f"L{int(r['n_layers'])} E{int(r['n_experts'])} K{int(r['topk'])} G{int(r['g'])}"


def eligible(t: pd.DataFrame) -> np.ndarray:
    """Rows feasible at the point estimates and delivering the TPP floor in most draws. [rows] bool"""
    return t["feasible"].to_numpy(bool) & (t["p_feasible"].fillna(0).to_numpy(float) >= MOSTLY_FEASIBLE)


def _spreads(t: pd.DataFrame, pair: list[int], draws: Draws, law_vec: np.ndarray, index, tpp) -> tuple[float, float]:
    """Std of loss(pair[1]) - loss(pair[0]) under the MFU draws alone and under the law draws alone."""
    sub = t.iloc[pair]
    fam = families(sub, index)
    mfu_only = Draws(np.repeat(law_vec[None, :], draws.n, axis=0), draws.z, draws.sigma)
    law_only = Draws(draws.coefs, np.zeros_like(draws.z), draws.sigma)
    out = []
    for d in (mfu_only, law_only):
        _, loss, _ = evaluate(sub, d, tpp[0], tpp[1], fam)
        out.append(float(np.std(loss[:, 1] - loss[:, 0])))
    return out[0], out[1]


def _separator(sd_mfu: float, sd_law: float) -> str:
    if sd_mfu >= sd_law:
        return (f"their MFU (the loss difference spreads {sd_mfu:.4f} from the MFU error, {sd_law:.4f} from the "
                "law): measure the tables their plans read (`scaleplan bench plan --search s.json --run`) or "
                "calibrate on runs of their layouts (`scaleplan calibrate fit`)")
    return (f"the scaling law (the loss difference spreads {sd_law:.4f} from the law's ridge, {sd_mfu:.4f} from "
            "the MFU error): only training runs near these geometries separate them (`scaleplan law fit` on them)")


def recommend(summary: dict, draws: Draws, law_vec: np.ndarray, index: dict, tpp: tuple[float, float],
              row_json) -> dict:
    """The recommendation of one budget. ``summary``: :func:`scaleplan.mosaic.uncertainty.summarise`'s
    output; ``law_vec``: the point law's coefficients (NAMES order); ``tpp``: (tpp_min, tpp_max).

    Returns {"recommended": row or None, "ties": rows, "separate_by": text or None, "guess": bool,
    "statement": one paragraph saying which model to train and why}.
    """
    t = summary["table"]
    idx, loss = summary["idx"], summary["loss"]
    ok = eligible(t)[idx] if len(idx) else np.zeros(0, bool)
    if not ok.any():
        return {"recommended": None, "ties": [], "separate_by": None, "guess": False,
                "statement": (f"no candidate delivers the TPP floor ({tpp[0]:g}) in most draws: lower --tpp-min, "
                              "lengthen --days or add --nodes")}
    mean = np.where(ok, loss.mean(axis=0), np.inf)
    j = int(np.argmin(mean))
    beats = (loss < loss[:, [j]]).mean(axis=0)
    order = [int(c) for c in np.argsort(mean, kind="stable") if ok[c] and c != j and beats[c] >= TIE_P][:3]
    rec = t.iloc[idx[j]]
    text = [f"train {name(rec)} (q={int(rec['q'])}): the lowest expected loss ({mean[j]:.4f}) over {draws.n} draws "
            f"among the {int(ok.sum())} candidates that deliver TPP >= {tpp[0]:g} in most draws; it delivers TPP "
            f"{rec['tpp']:.0f} at MFU {100 * rec['mfu_plan']:.1f}% (90%: {100 * rec['mfu_p05']:.1f}-"
            f"{100 * rec['mfu_p95']:.1f}%), above the floor in {rec['p_feasible']:.0%} of draws, P(optimal) "
            f"{rec['p_optimal']:.0%}"]
    separate = None
    if order:
        sd = [_spreads(t, [idx[j], idx[c]], draws, law_vec, index, tpp) for c in order]
        sd_mfu, sd_law = max(s[0] for s in sd), max(s[1] for s in sd)
        separate = _separator(sd_mfu, sd_law)
        rivals = ", ".join(f"{name(t.iloc[idx[c]])} (lower loss in {beats[c]:.0%} of draws)" for c in order)
        text.append(f"a statistical tie with {rivals}; what would separate them: {separate}")
    else:
        runner = [int(c) for c in np.argsort(mean, kind="stable") if ok[c] and c != j][:1]
        if runner:
            text.append(f"it beats the runner-up {name(t.iloc[idx[runner[0]]])} in {1 - beats[runner[0]]:.0%} "
                        "of draws")
    feas = t["feasible"].to_numpy(bool)
    if feas.any():
        pt = t[feas].sort_values(["loss", "c_model"], ascending=[True, False], kind="stable").index[0]
        if pt != t.index[idx[j]]:
            p = t.loc[pt]
            text.append(f"the point optimum {name(p)} (loss {p['loss']:.4f} at the point estimates) is not "
                        f"recommended: expected loss {p['loss_mean']:.4f}, above the TPP floor in "
                        f"{p['p_feasible']:.0%} of draws")
    unmeasured = float(rec.get("unmeasured_kernel_share", 0.0) or 0.0)
    guess = unmeasured >= GUESS_SHARE
    if guess:
        text.insert(0, f"a guess: {unmeasured:.0%} of this plan's kernel and communication time has no measured "
                       f"table behind it ({BENCH_HINT})")
    return {"recommended": row_json(rec), "ties": [row_json(t.iloc[idx[c]]) for c in order],
            "separate_by": separate, "guess": guess, "statement": "; ".join(text)}
