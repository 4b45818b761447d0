"""What-if check of a per-slot EP cost (docs/accuracy.md, "Where the EP cost sits in a slot").

The 700M sweep's slot law (benchmarks/estimator_accuracy.py) puts its EP cost per 1F1B slot, where the
dispatch law charges t_ep_host per MoE layer. This script swaps the law's EP host term, in this process
only, for one of these, per stage and micro-batch in the checkpoint mode's kernel units u:

* ``model``:   n_moe t_ep_host u (the estimator as it is);
* ``replace``: c f(EP) u, a floor per slot in place of the per-layer term;
* ``max``:     max(n_moe t_ep_host, c f(EP)) u;
* ``add``:     (n_moe t_ep_host + c f(EP)) u;

with f = log2 EP or H_EP - 1 (the expected maximum over EP peers of exponential delays, less one
peer's), c in ms (``--c-ms``). For each it prints the leave-one-sweep-out step-time MAPE, Spearman and
rank of the measured fastest layout on the two validation sweeps (the joint runtime fit, as
estimator_accuracy.py), the staged runs of tab:staged-top4 and the 18B PP = 16 r_fill line. Nothing
here is in the time model: no mechanism is known for any of the three.

    python benchmarks/ep_slot_floor.py --db URL-with-recorded-tables [--c-ms 25] [--form log2|harmonic]
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np
import scaleplan.estimator.stages as time_model  # the stage work reads dispatch_time from there
from estimator_accuracy import VALIDATION, _metrics, fill_ratio_18b, staged_runs, sweep_specs
from scaleplan.calibrate.joint import estimator_t_pred, fit_joint
from scaleplan.estimator import Estimator
from scaleplan.estimator.ckpt import kernel_units
from scaleplan.estimator.dispatch import dispatch_time
from scipy.special import digamma

PROFILE = "p6-b200.48xlarge"
# H_EP - 1 = digamma(EP + 1) + Euler's gamma - 1
FORMS = {"log2": np.log2, "harmonic": lambda ep: digamma(ep + 1.0) + np.euler_gamma - 1.0}


def law(variant: str, c_s: float, form):
    """A dispatch_time with the EP host term of ``variant`` (module docstring)."""
    def timed(disp, L_stage, E_loc, ckc, n_moe_stage, ep):
        base = dispatch_time(disp, L_stage, E_loc, ckc, n_moe_stage, ep)
        if variant == "model":
            return base
        u = kernel_units(ckc) / 4.0
        ep = np.asarray(ep, dtype=float)
        # the law's own per-MoE-layer EP term: what it adds over the same law without it
        per_layer = base - dispatch_time(replace(disp, t_ep_host_s=0.0), L_stage, E_loc, ckc, n_moe_stage, ep)
        floor = np.where((ep > 1) & (np.asarray(n_moe_stage) > 0), c_s * form(np.maximum(ep, 1.0)) * u, 0.0)
        ep_term = {"replace": floor, "max": np.maximum(per_layer, floor), "add": per_layer + floor}[variant]
        return base - per_layer + ep_term
    return timed


def loso(db: str | None) -> str:
    """Leave-one-sweep-out figures per sweep, fitted as estimator_accuracy.py fits them."""
    sw = list(sweep_specs(VALIDATION))
    cells = []
    for name, spec, n, lays, real, _ in sw:
        train = [s for s in sw if s[0] != name]
        tp = estimator_t_pred(PROFILE, db, [(s[1], s[2], s[3]) for s in train])
        fit = fit_joint(tp, np.concatenate([s[4] for s in train]), np.repeat([s[0] for s in train],
                                                                            [len(s[4]) for s in train]))
        pred = estimator_t_pred(PROFILE, db, [(spec, n, lays)])(fit.params)
        cells.append(f"{name} {_metrics(pred, real).strip()}")
    return ";  ".join(cells)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=None)
    ap.add_argument("--c-ms", type=float, default=25.0)
    ap.add_argument("--form", choices=sorted(FORMS), default="log2")
    a = ap.parse_args()
    from _db import tables_db  # benchmarks/_db.py: a database without tables is refused in one line

    a.db = tables_db(a.db)
    for variant in ("model", "replace", "max", "add"):
        time_model.dispatch_time = law(variant, a.c_ms * 1e-3, FORMS[a.form])
        print(f"== {variant} (c = {a.c_ms:g} ms, f = {a.form}); LOSO MAPE, Spearman, rank: {loso(a.db)}")
        est = Estimator(PROFILE, db_url=a.db, use_calibration=False)
        staged_runs(est)
        fill_ratio_18b(est, Path(VALIDATION))
    time_model.dispatch_time = dispatch_time


if __name__ == "__main__":
    main()
