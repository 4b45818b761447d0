"""Estimator accuracy on the measured validation sweeps (prints figures; nothing is fitted here).

Per sweep: absolute MFU MAPE against ``real_mfu_pct_est`` and the Spearman rank correlation, beside
the same metrics of the paper's reference estimator (``reference_pred_mfu_pct``). Also prints the
MOSAIC optimum sanity check (q=12, E=96, K=2, G=4 on 256 B200, gbs 1024, seqlen 2048, adamw; the
paper's estimator gives pp=8, ep=8, tp=1, cp=1, mbs=4 at 12.38% MFU) and the four staged runs of
tab:staged-top4 (64 B200, pp=4 ep=8 mbs=4): our MFU and the paper's predicted MFU, each normalised
by its best of the four, against the measured ratios.

    python benchmarks/estimator_accuracy.py --db URL-with-recorded-tables [--no-calibration] [--verbose]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from scaleplan.calibrate.observations import sweeps_of
from scaleplan.estimator import Estimator, PlanConstraints
from scipy.stats import spearmanr

from scaleplan.geometry import ladder_model

VALIDATION = Path(__file__).resolve().parents[1].parent / "shared" / "validation"


def sweep_specs(vdir: Path):
    """(sweep, Spec, n_devices, layouts, measured MFU %, reference MFU %) per validation sweep."""
    for name, spec, n, lays, obs in sweeps_of(vdir / "mfu_sweeps.csv", vdir / "models.yaml"):
        yield (name, spec, n, lays, 100 * np.array([o.measured_mfu for o in obs]),
               100 * np.array([o.reference_mfu for o in obs]))


def _mape(pred: np.ndarray, real: np.ndarray) -> float:
    """Mean absolute percentage error, in percent."""
    return 100 * float(np.mean(np.abs(pred - real) / real))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=None)
    ap.add_argument("--validation", default=str(VALIDATION))
    ap.add_argument("--no-calibration", action="store_true", help="chi_sys = 1 (t_analytic)")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    est = Estimator("p6-b200.48xlarge", db_url=a.db, use_calibration=not a.no_calibration)
    print(f"dispatch law: kappa0={est.dispatch.kappa0:g} kappa1={est.dispatch.kappa1:g} "
          f"t_gap={est.dispatch.t_gap_s * 1e6:.1f} us t_host={est.dispatch.t_host_s * 1e3:.1f} ms "
          f"({est.dispatch.source}); chi_sys calibration: {est.chi.calibration_id}")
    print(f"{'sweep':<14}{'n':>3}  {'ours MAPE':>10}{'ours rho':>10}  {'ref MAPE':>9}{'ref rho':>9}  best-measured rank")
    for name, spec, n, lays, real, ref in sweep_specs(Path(a.validation)):
        res = est.estimate(spec, n, lays)
        pred = np.array([100 * r.mfu for r in res])
        rank = int(np.argsort(np.argsort(-pred))[int(np.argmax(real))]) + 1
        print(f"{name:<14}{len(lays):>3}  {_mape(pred, real):>9.1f}%{spearmanr(pred, real)[0]:>10.2f}  "
              f"{_mape(ref, real):>8.1f}%{spearmanr(ref, real)[0]:>9.2f}  {rank}")
        if a.verbose:
            for lo, r, p, m in zip(lays, res, pred, real):
                top = sorted(r.breakdown_s.items(), key=lambda kv: -kv[1])[:4]
                print(f"   pp={lo.pp} ep={lo.ep} dp={lo.dp}: pred {p:5.2f}% real {m:5.2f}%  "
                      + ", ".join(f"{k} {v:.2f}s" for k, v in top))
    m = ladder_model(12, 96, 2, 4)
    best = est.best_plan(m, 256, 1024, 2048, "adamw", PlanConstraints())
    if best is None:
        print("MOSAIC check q=12 E=96 K=2 G=4 on 256 B200: no feasible plan")
    else:
        lo = best.layout
        print(f"MOSAIC check q=12 E=96 K=2 G=4 on 256 B200, gbs 1024, seqlen 2048: best tp={lo['tp']} cp={lo['cp']} "
              f"pp={lo['pp']} ep={lo['ep']} mbs={lo['mbs']} ckpt={lo['ckpt']} MFU {100 * best.mfu:.2f}% "
              f"(paper's estimator: pp=8 ep=8 tp=1 cp=1 mbs=4, 12.38%)")
    staged_runs(est)


def staged_runs(est: Estimator) -> None:
    """tab:staged-top4 (transcribed once, in tests/paper_tables.py): our MFU at the staged layout and
    the paper's predicted MFU, each normalised by its best of the four, against the measured ratios."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from paper_tables import STAGED_LAYOUT as lay
    from paper_tables import STAGED_RUNS as runs

    fixed = PlanConstraints(**{k: (lay[k],) for k in ("tp", "cp", "pp", "ep", "mbs")})
    ours = []
    for q, E, K, G, _, _ in runs:
        r = est.best_plan(ladder_model(q, E, K, G), lay["n_devices"], lay["gbs"], lay["seqlen"], "adamw", fixed)
        ours.append(float("nan") if r is None else 100 * r.mfu)
    ours_n = np.array(ours) / np.nanmax(ours)
    paper_n = np.array([r[4] for r in runs]) / max(r[4] for r in runs)
    meas = np.array([r[5] for r in runs])
    print("staged runs (tab:staged-top4, 64 B200, pp=4 ep=8 mbs=4; MFU with embedding + LM head as the "
          "validation data counts it, then normalised vs measured):")
    for (q, E, K, G, paper, m), o, on, pn in zip(runs, ours, ours_n, paper_n):
        print(f"   q={q} E={E} K={K} G={G}: ours {o:5.2f}% ({on:.2f})  paper {paper:5.2f}% ({pn:.2f})  measured {m:.2f}")
    print(f"   normalised MAPE vs measured: ours {100 * np.mean(np.abs(ours_n - meas) / meas):.1f}%, "
          f"paper's {100 * np.mean(np.abs(paper_n - meas) / meas):.1f}%; "
          f"Spearman ours {spearmanr(ours, meas)[0]:.2f}, paper's {spearmanr(paper_n, meas)[0]:.2f}")


if __name__ == "__main__":
    main()
