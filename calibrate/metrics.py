"""Accuracy metrics of step-time predictions (paper sec:mfu-pred), in step time.

All functions take 1-D arrays of equal length n (predicted, measured), positive values, of an
MFU-like quantity (higher is better; within one FLOP count, proportional to 1 / step time).
- MAPE: mean |pred - meas| / meas, as a fraction (not percent) of the values given.
- step-time MAPE: mean |t_pred - t_meas| / t_meas = mean |meas / pred - 1| for MFU-like values;
  the error every report prints (a step time carries no FLOP convention).
- Spearman rank correlation (scipy.stats.spearmanr; NaN when either side is constant).
- top-k overlap: rank layouts by predicted and by measured MFU; |top-k(pred) & top-k(meas)| / k,
  k capped at n (the paper's "Top-5 overlap is 100%").
- top-1 in top-k: is the best measured layout among the k best predicted ones.
- scale-free comparison for sweeps known only as ratios: predictions rescaled by the geometric
  mean of meas/pred, which is the scale removed by the scale-free fit objective.
"""
from __future__ import annotations

import numpy as np
from scipy import stats


def _arrays(pred, meas) -> tuple[np.ndarray, np.ndarray]:
    p, m = np.asarray(pred, dtype=float), np.asarray(meas, dtype=float)
    if p.shape != m.shape or p.ndim != 1 or p.size == 0:
        raise ValueError(f"pred and meas must be 1-D of equal non-zero length, got {p.shape} and {m.shape}")
    return p, m


def mape(pred, meas) -> float:
    """Mean absolute percentage error as a fraction: mean(|pred - meas| / meas)."""
    p, m = _arrays(pred, meas)
    return float(np.mean(np.abs(p - m) / m))


def step_time_mape(pred, meas) -> float:
    """MAPE of the step time, as a fraction, from MFU-like values: mean(|meas / pred - 1|)."""
    p, m = _arrays(pred, meas)
    return float(np.mean(np.abs(m / p - 1.0)))


def spearman(pred, meas) -> float:
    """Spearman rank correlation of pred vs meas (NaN for n < 2 or a constant side)."""
    p, m = _arrays(pred, meas)
    if p.size < 2 or np.ptp(p) == 0 or np.ptp(m) == 0:
        return float("nan")
    return float(stats.spearmanr(p, m).statistic)


def _top(x: np.ndarray, k: int) -> set[int]:
    # stable sort on -x: ties keep input order, so the result is deterministic
    return set(np.argsort(-x, kind="stable")[:k].tolist())


def topk_overlap(pred, meas, k: int) -> float:
    """|top-k by pred & top-k by meas| / k with k capped at n (a fraction in [0, 1])."""
    p, m = _arrays(pred, meas)
    k = min(k, p.size)
    return len(_top(p, k) & _top(m, k)) / k


def top1_in_topk(pred, meas, k: int = 2) -> bool:
    """True when the best measured layout is among the k best predicted layouts."""
    p, m = _arrays(pred, meas)
    return int(np.argmax(m)) in _top(p, min(k, p.size))


def geomean_scale(pred, meas) -> float:
    """exp(mean(log(meas / pred))): the scale that makes the scale-free log residuals zero-mean."""
    p, m = _arrays(pred, meas)
    return float(np.exp(np.mean(np.log(m) - np.log(p))))


def sweep_metrics(pred, meas, normalized: bool = False) -> dict[str, float | bool]:
    """Step-time MAPE ("mape"), Spearman, top-k overlaps (k = 1, 5, 10) and top-1-in-top-2 of one sweep.

    With ``normalized`` the predictions are first rescaled by :func:`geomean_scale` (only ratios
    are known, so the absolute level is not a prediction error).
    """
    p, m = _arrays(pred, meas)
    if normalized:
        p = p * geomean_scale(p, m)
    return {"mape": step_time_mape(p, m), "spearman": spearman(p, m), "top1_overlap": topk_overlap(p, m, 1),
            "top5_overlap": topk_overlap(p, m, 5), "top10_overlap": topk_overlap(p, m, 10),
            "top1_in_top2": top1_in_topk(p, m, 2)}
