"""Accuracy report of a chi_sys calibration, per sweep, before and after (paper sec:mfu-pred).

For each sweep: MAPE of the step time (the measurement; on the sweep's own scale when only ratios are known, see
:func:`scaleplan.calibrate.metrics.sweep_metrics`), Spearman, top-k overlap (k = 1, 5, 10), whether
the best measured layout is in the predicted top 2, and the leave-one-sweep-out (LOSO) MAPE: the
chi_sys fit redone without that sweep, then applied to it. With one sweep only, leave-one-out over
its runs. A peer estimator's predictions get the same metrics: its step time (``reference_step_s``)
where known, else its MFU on ratios only (its FLOP count is its own).

Scale-free sweeps (only ratios known, or ``--mode normalized``): predictions are rescaled by the
geometric mean of measured / predicted over the sweep before MAPE (``"normalization": "geomean"``),
the same per-sweep scale the fit removes. Note a chart normalised by one common factor (as in
mfu_sweeps.csv) leaves MAPE unchanged, so absolute-mode MAPE is comparable with the paper's.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scaleplan.calibrate import metrics as M
from scaleplan.calibrate.chi_sys import chi_from, fit_chi, identifiability
from scaleplan.calibrate.evaluate import Observed, Prediction, SweepBasis, chi_data, measured_mfu

KS = (1, 5, 10)


def _pred_after(d_coeffs: dict[str, float], obs: Sequence[Observed], preds: Sequence[Prediction],
                bases: dict[str, SweepBasis]) -> np.ndarray:
    d = chi_data(obs, preds, bases)
    return np.array([p.mfu_analytic for p in preds]) / chi_from(d_coeffs, d)


def _held_out(obs, preds, bases, mode, fixed, prior, hold: np.ndarray) -> np.ndarray:
    """MFU predictions for the runs in ``hold`` from a fit on the others (chi = 1 if nothing identifiable)."""
    train = [i for i in range(len(obs)) if not hold[i]]
    d = chi_data([obs[i] for i in train], [preds[i] for i in train], bases)
    coeffs = fit_chi(d, mode, fixed, allow_identity=True, prior=prior).coefficients if len(d) else dict(prior or {})
    held = [i for i in range(len(obs)) if hold[i]]
    return _pred_after(coeffs, [obs[i] for i in held], [preds[i] for i in held], bases)


def _metrics(pred: np.ndarray, meas: np.ndarray, normalized: bool) -> dict[str, Any]:
    return M.sweep_metrics(pred, meas, normalized)


def _reference(rows: list[Observed], meas: np.ndarray, normalized: bool) -> dict[str, Any] | None:
    """The peer's metrics: on its step time where known (one count: the measured value scaled by
    t_meas / t_ref), else on ratios of its MFU (its own FLOP count is not ours: only ratios compare)."""
    if all(o.reference_step_s is not None and o.t_iter_s is not None for o in rows):
        ratio = np.array([o.t_iter_s / o.reference_step_s for o in rows])
        return _metrics(meas * ratio, meas, normalized)
    if all(o.reference_mfu is not None for o in rows):
        return _metrics(np.array([o.reference_mfu for o in rows]), meas, True)
    if all(o.reference_mfu_norm is not None for o in rows):  # a ratio-only peer: compare on ratios
        return _metrics(np.array([o.reference_mfu_norm for o in rows]), meas, True)
    return None


def sweep_report(obs: Sequence[Observed], preds: Sequence[Prediction], bases: dict[str, SweepBasis],
                 coeffs: dict[str, float], mode: str, fixed: dict[str, float] | None = None,
                 prior: dict[str, float] | None = None, preds_before: Sequence[Prediction] | None = None
                 ) -> tuple[list[dict[str, Any]], dict[str, dict[str, np.ndarray]]]:
    """Per-sweep metrics (the report's "sweeps" list) and the arrays behind them (for the parity plot).
    ``preds_before``: the uncalibrated predictions "before" reads (default: ``preds`` at chi_sys = 1)."""
    if len(obs) != len(preds):
        raise ValueError(f"obs and preds must align: {len(obs)} vs {len(preds)}")
    preds_before = preds if preds_before is None else preds_before
    keep = [i for i, o in enumerate(obs) if o.sweep in bases]
    obs, preds, preds_before = ([x[i] for i in keep] for x in (obs, preds, preds_before))
    sweeps = list(dict.fromkeys(o.sweep for o in obs))
    after_all = _pred_after(coeffs, obs, preds, bases)
    out, arrays = [], {}
    for s in sweeps:
        idx = np.array([o.sweep == s for o in obs])
        rows = [o for o, k in zip(obs, idx) if k]
        prs = [p for p, k in zip(preds, idx) if k]
        basis = bases[s]
        meas = np.array([measured_mfu(o, p, basis.quantity) for o, p in zip(rows, prs)])
        before = np.array([p.mfu_analytic for p, k in zip(preds_before, idx) if k])
        after = after_all[idx]
        if len(sweeps) > 1:
            loso, cv = _held_out(obs, preds, bases, mode, fixed, prior, idx), "loso"
        else:  # one sweep: leave one run out
            loso = np.array([_held_out(obs, preds, bases, mode, fixed, prior, np.arange(len(obs)) == i)[0]
                             for i in np.flatnonzero(idx)])
            cv = "loo"
        mb, ma, ml = (_metrics(x, meas, basis.scale_free) for x in (before, after, loso))
        ref = _reference(rows, meas, basis.scale_free)
        alone = chi_data(rows, prs, bases)  # which eq:desync terms this sweep pins down by itself
        identifies = identifiability(alone, "normalized" if basis.scale_free else "absolute")[0]
        out.append({
            "sweep": s, "n": int(idx.sum()), "mape_before": mb["mape"], "mape_after": ma["mape"],
            "loso_mape": ml["mape"], "spearman": ma["spearman"], "top1_in_top2": bool(ma["top1_in_top2"]),
            "reference_mape": ref["mape"] if ref else None,
            "normalized": basis.scale_free, "normalization": "geomean" if basis.scale_free else None,
            "quantity": basis.quantity, "cv": cv, "identifies": identifies,
            "spearman_before": mb["spearman"], "loso_spearman": ml["spearman"],
            "top1_in_top2_before": bool(mb["top1_in_top2"]), "loso_top1_in_top2": bool(ml["top1_in_top2"]),
            "topk_overlap": {name: {str(k): m[f"top{k}_overlap"] for k in KS}
                             for name, m in (("before", mb), ("after", ma), ("loso", ml), ("reference", ref)) if m},
            "reference_spearman": ref["spearman"] if ref else None,
            "reference_top1_in_top2": bool(ref["top1_in_top2"]) if ref else None,
        })
        scale = M.geomean_scale(after, meas) if basis.scale_free else 1.0
        scale_b = M.geomean_scale(before, meas) if basis.scale_free else 1.0
        scale_l = M.geomean_scale(loso, meas) if basis.scale_free else 1.0
        arrays[s] = {"measured": meas, "after": after * scale, "before": before * scale_b,
                     "loso": loso * scale_l, "normalized": np.array(basis.scale_free),
                     "layouts": [o.layout for o in rows], "ids": [o.id for o in rows],
                     "reference": np.array([o.reference_mfu if o.reference_mfu is not None else np.nan
                                            for o in rows])}
    return out, arrays


def pooled(arrays: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Step-time MAPE over every run of every sweep (ratio-only sweeps on their rescaled level), before and after:
    the figures `calibrate fit` prints for the same runs ("step-time MAPE before -> after (in-sample)")."""
    if not arrays:
        return {"n": 0, "mape_before": None, "mape_after": None}
    meas = np.concatenate([a["measured"] for a in arrays.values()])
    return {"n": int(meas.size),
            **{f"mape_{k}": M.step_time_mape(np.concatenate([a[k] for a in arrays.values()]), meas)
               for k in ("before", "after")}}


def run_rows(arrays: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-run MFU (fractions; ratio-only sweeps on the measured scale): measured, before, after, LOSO, reference."""
    out = []
    for s, a in arrays.items():
        for i, lay in enumerate(a["layouts"]):
            ref = float(a["reference"][i])
            out.append({"sweep": s, "id": a["ids"][i], "layout": lay, "measured": float(a["measured"][i]),
                        "before": float(a["before"][i]), "after": float(a["after"][i]), "loso": float(a["loso"][i]),
                        "reference": None if np.isnan(ref) else ref})
    return out


def parity_plot(arrays: dict[str, dict[str, np.ndarray]], path: str, title: str = "") -> str:
    """Predicted vs measured MFU, one colour per sweep (filled: calibrated, hollow: chi = 1); PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5.0))
    lo, hi = np.inf, 0.0
    for i, (s, a) in enumerate(arrays.items()):
        c = f"C{i % 10}"
        label = s + (" (ratios, rescaled)" if bool(a["normalized"]) else "")
        # the hollow (uncalibrated) rings are drawn larger and on top, so a filled point at the same place
        # shows inside its ring instead of hiding it
        ax.scatter(a["measured"] * 100, a["after"] * 100, color=c, label=f"{label} calibrated", s=22, zorder=2,
                   alpha=0.8)
        ax.scatter(a["measured"] * 100, a["before"] * 100, facecolors="none", edgecolors=c, s=70, linewidths=1.4,
                   zorder=3, label=f"{label} uncalibrated")
        vals = np.concatenate([a["measured"], a["after"], a["before"]]) * 100
        lo, hi = min(lo, vals.min()), max(hi, vals.max())
    pad = 0.05 * (hi - lo if hi > lo else 1.0)
    lim = (lo - pad, hi + pad)
    ax.plot(lim, lim, color="grey", lw=1, ls="--", zorder=1)
    ax.set_xlim(lim)
    ax.set_ylim(lim)
    ax.set_xlabel("measured MFU (%)")
    ax.set_ylabel("predicted MFU (%)  (filled: calibrated, rings: uncalibrated)")
    ax.set_title(title or "MFU parity")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
