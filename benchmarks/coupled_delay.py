"""Leave-one-sweep-out check of per-rank delays coupled through the EP all-to-all and 1F1B.

estimator/jitter_ep.py gives, per layout, the step's excess per unit delay of the EP x PP block
(a count of segments: exponential delays of scale sigma per segment, or rare stalls of mean q D per
segment). This adds ``theta`` x that count (theta in ms, one coefficient over all sweeps, prior sd
and bounds below) to the estimator's step time and refits the runtime calibration (calibrate/joint.py)
with (a) eq:desync's c_pp as today, (b) theta instead of c_pp, (c) both, (d) neither, printing each
given sweep's leave-one-sweep-out MAPE, Spearman and the rank of its measured fastest layout (as
benchmarks/estimator_accuracy.py does), the in-sample figures, and what each fit freed.

    python benchmarks/coupled_delay.py --db URL-with-recorded-tables [--prior-ms 0.3]
"""
from __future__ import annotations

import argparse
import functools
from pathlib import Path

import numpy as np
from estimator_accuracy import VALIDATION, _metrics, sweep_specs
from scaleplan.calibrate.joint import PARAMS, Terms, estimator_t_pred, fit_joint
from scaleplan.estimator.jitter_ep import stall_exponential, stall_rare

PROFILE = "p6-b200.48xlarge"
KINDS = {"exponential": stall_exponential, "rare": stall_rare}
VARIANTS = {"(a) c_pp": (True, False), "(b) theta": (False, True), "(c) both": (True, True),
            "(d) neither": (False, False)}


@functools.cache
def _count(kind: str, ep: int, pp: int, n_mb: int, n_moe: int) -> float:
    return KINDS[kind](ep, pp, n_mb, n_moe)


def counts(kind: str, spec, lays) -> np.ndarray:
    """Step excess per unit delay (segments) of every layout: non-interleaved 1F1B, all layers MoE."""
    return np.array([_count(kind, lo.ep, lo.pp, spec.data.gbs // (lo.dp * lo.mbs), spec.model.n_layers // lo.pp)
                     for lo in lays])


def terms_of(use_cpp: bool, use_theta: bool, prior_ms: float) -> Terms:
    t = Terms(names=tuple(n for n in PARAMS if use_cpp or n != "c_pp"))
    return t.with_term("theta", 0.0, (0.0, 20.0), prior_ms) if use_theta else t


def t_pred_of(db: str, groups: list, count: np.ndarray):
    """The estimator's t_pred (calibrate/joint.py) plus theta (ms) x count seconds."""
    base = estimator_t_pred(PROFILE, db, groups)
    return lambda p: base(p) + 1e-3 * p.get("theta", 0.0) * count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=None)
    ap.add_argument("--validation", default=str(VALIDATION))
    ap.add_argument("--prior-ms", type=float, default=1.0, help="prior sd of theta about 0, ms")
    a = ap.parse_args()
    from _db import tables_db  # benchmarks/_db.py: a database without tables is refused in one line

    a.db = tables_db(a.db)
    sw = {name: (spec, n, lays, real) for name, spec, n, lays, real, _ in sweep_specs(Path(a.validation))}
    for kind in KINDS:
        cnt = {name: counts(kind, spec, lays) for name, (spec, _, lays, _) in sw.items()}
        print(f"{kind} delays, theta prior sd {a.prior_ms:g} ms; per layout (pp, ep): excess per unit delay")
        for name, (_, _, lays, _) in sw.items():
            cells = (f"({lo.pp},{lo.ep}) {np.round(c) + 0.0:.0f}" for lo, c in zip(lays, cnt[name]))
            print(f"   {name}: " + ", ".join(cells))
        for label, (use_cpp, use_theta) in VARIANTS.items():
            terms = terms_of(use_cpp, use_theta, a.prior_ms)
            for name, (spec, n, lays, real) in sw.items():
                train = [o for o in sw if o != name]
                tp = t_pred_of(a.db, [sw[o][:3] for o in train], np.concatenate([cnt[o] for o in train]))
                labels = np.repeat(train, [len(sw[o][3]) for o in train])  # each run weighed by its sweep
                fit = fit_joint(tp, np.concatenate([sw[o][3] for o in train]), labels, terms=terms)
                own = t_pred_of(a.db, [(spec, n, lays)], cnt[name])
                ins = fit_joint(own, real, terms=terms)
                print(f"   {label:<12}{name:<13} LOSO {_metrics(own(fit.params), real)}  in-sample "
                      f"{_metrics(own(ins.params), real)}  | fit on the other sweep: "
                      + ", ".join(f"{k}={fit.params[k]:.3g}" for k in fit.free)
                      + "".join(f" | {k}: {v}" for k, v in fit.unidentified.items() if k in ("theta", "c_pp")))


if __name__ == "__main__":
    main()
