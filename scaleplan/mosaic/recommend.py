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

from scaleplan.mosaic.uncertainty import MOSTLY_FEASIBLE, Draws, candidate_sigma, evaluate, families

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
    law_only = Draws(draws.coefs, np.zeros_like(draws.z), draws.sigma, draws.z_law, draws.law_scatter)
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


def beyond_text(r, sigma: float) -> str:
    """Where candidate row ``r`` lies beyond what was measured (its ``beyond`` flags) and how much wider its MFU draw
    is for it than the calibration's ``sigma``, as a clause; "" inside it."""
    flags = [x for x in str(r.get("beyond") or "").split(", ") if x]
    if not flags:
        return ""
    own = float(candidate_sigma(pd.DataFrame([r]), sigma)[0])
    law = float(r.get("law_doublings") or 0.0)
    return (f"beyond what was measured ({'; '.join(flags)}), so its draws are widened: MFU sigma {own:.3f} (the "
            f"calibration's {sigma:.3f}, widened by that distance and its plan's unmeasured parts)"
            + (f", the law's loss by {law:.2f} x its held-out scatter" if law > 0 else ""))


def _score(loss: np.ndarray, ok: np.ndarray, robust: float | None) -> np.ndarray:
    """Per candidate, what the recommendation minimises: the mean loss over the draws, or with ``robust`` q its
    q-quantile (the loss it stays under in a share q of the draws); inf where not eligible."""
    stat = loss.mean(axis=0) if robust is None else np.percentile(loss, 100 * robust, axis=0)
    return np.where(ok, stat, np.inf)


def _what(robust: float | None) -> str:
    return "expected loss" if robust is None else f"{100 * robust:.0f}th-percentile loss"


def recommend(summary: dict, draws: Draws, law_vec: np.ndarray, index: dict, tpp: tuple[float, float],
              row_json, robust: float | None = None) -> dict:
    """The recommendation of one budget. ``summary``: :func:`scaleplan.mosaic.uncertainty.summarise`'s
    output; ``law_vec``: the point law's coefficients (NAMES order); ``tpp``: (tpp_min, tpp_max); ``robust``: a
    quantile q in (0, 1) to minimise the loss at (None: the mean over the draws).

    Returns {"recommended": row or None, "ties": rows, "separate_by": text or None, "guess": bool,
    "criterion": "mean" or "p<q>", "differs_from_point": bool, "differs_from_mean": bool (--robust only),
    "statement": one paragraph saying which model to train and why}.
    """
    t = summary["table"]
    idx, loss = summary["idx"], summary["loss"]
    ok = eligible(t)[idx] if len(idx) else np.zeros(0, bool)
    crit = "mean" if robust is None else f"p{100 * robust:g}"
    if not ok.any():
        return {"recommended": None, "ties": [], "separate_by": None, "guess": False, "criterion": crit,
                "differs_from_point": False, "statement": (f"no candidate delivers the TPP floor ({tpp[0]:g}) in most "
                                                           "draws: lower --tpp-min, lengthen --days or add --nodes")}
    score = _score(loss, ok, robust)
    j = int(np.argmin(score))
    rec = t.iloc[idx[j]]
    text = [f"train {name(rec)} (q={int(rec['q'])}): the lowest {_what(robust)} over {draws.n} draws "
            f"({score[j]:.4f}{'' if robust is None else '; --robust'}) among the {int(ok.sum())} candidates that deliver TPP >= {tpp[0]:g} in most draws; it delivers "
            f"TPP {rec['tpp']:.0f} at MFU {100 * rec['mfu_plan']:.1f}% (90%: {100 * rec['mfu_p05']:.1f}-"
            f"{100 * rec['mfu_p95']:.1f}%), above the floor in {rec['p_feasible']:.0%} of draws, P(optimal) "
            f"{rec['p_optimal']:.0%}; loss {rec['loss']:.4f} at the point estimates, mean {rec['loss_mean']:.4f} "
            f"over the draws (90%: {rec['loss_p05']:.4f}-{rec['loss_p95']:.4f})"]
    far = beyond_text(rec, draws.sigma)
    if far:
        text.append(far)
    order, separate = _ties(t, idx, loss, ok, score, j, draws, law_vec, index, tpp, text)
    out = {"recommended": row_json(rec), "ties": [row_json(t.iloc[idx[c]]) for c in order], "separate_by": separate,
           "criterion": crit}
    out.update(_against_others(t, idx, loss, ok, j, robust, text))
    unmeasured = float(rec.get("unmeasured_kernel_share", 0.0) or 0.0)
    out["guess"] = unmeasured >= GUESS_SHARE
    if out["guess"]:
        step = float(rec.get("analytic_share", 0.0) or 0.0) + float(rec.get("extrapolated_share", 0.0) or 0.0)
        text.insert(0, f"a guess: {unmeasured:.0%} of this plan's kernel and communication time ({step:.0%} of its "
                       "step time, which also holds the host dispatch law and the pipeline bubble that no table "
                       f"costs) has no measured table behind it ({BENCH_HINT})")
    out["statement"] = "; ".join(text)
    return out


def _ties(t, idx, loss, ok, score, j, draws, law_vec, index, tpp, text) -> tuple[list[int], str | None]:
    """The statistical ties of candidate ``j`` (lower loss in at least TIE_P of the draws) and what would separate
    them, appended to ``text``; else how often it beats the runner-up."""
    beats = (loss < loss[:, [j]]).mean(axis=0)
    order = [int(c) for c in np.argsort(score, kind="stable") if ok[c] and c != j and beats[c] >= TIE_P][:3]
    if not order:
        runner = [int(c) for c in np.argsort(score, kind="stable") if ok[c] and c != j][:1]
        if runner:
            text.append(f"it beats the runner-up {name(t.iloc[idx[runner[0]]])} in {1 - beats[runner[0]]:.0%} "
                        "of draws")
        return [], None
    sd = [_spreads(t, [idx[j], idx[c]], draws, law_vec, index, tpp) for c in order]
    separate = _separator(max(s[0] for s in sd), max(s[1] for s in sd))
    rivals = ", ".join(f"{name(t.iloc[idx[c]])} (lower loss in {beats[c]:.0%} of draws)" for c in order)
    text.append(f"a statistical tie with {rivals}; what would separate them: {separate}")
    return order, separate


def _against_others(t, idx, loss, ok, j, robust, text) -> dict:
    """Whether the recommendation differs from the point optimum (least loss at the point estimates) and, with
    ``robust``, from the least expected loss; each difference said in ``text``."""
    out = {"differs_from_point": False}
    feas = t["feasible"].to_numpy(bool)
    if feas.any():
        pt = t[feas].sort_values(["loss", "c_model"], ascending=[True, False], kind="stable").index[0]
        if pt != t.index[idx[j]]:
            p = t.loc[pt]
            out["differs_from_point"] = True
            why = "" if robust is None else f", {100 * robust:.0f}th percentile " \
                f"{np.percentile(loss[:, int(np.flatnonzero(t.index[idx] == pt)[0])], 100 * robust):.4f}"
            text.append(f"the point optimum {name(p)} (loss {p['loss']:.4f} at the point estimates) is not "
                        f"recommended: expected loss {p['loss_mean']:.4f}{why}, above the TPP floor in "
                        f"{p['p_feasible']:.0%} of draws")
        elif robust is not None:
            text.append("it is also the point optimum (the least loss at the point estimates)")
    if robust is not None:
        m = int(np.argmin(_score(loss, ok, None)))
        out["differs_from_mean"] = m != j
        text.append(f"without --robust the recommendation is {name(t.iloc[idx[m]])} (least expected loss)"
                    if m != j else "the same plan has the least expected loss")
    return out
