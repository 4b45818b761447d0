"""What each candidate cost of deep pipelines and cross-node expert groups does to each sweep (prints figures).

Every mechanism is fitted on two of the three published sweeps and predicts the third, all three ways, as
benchmarks/estimator_accuracy.py's leave-one-sweep-out (LOSO) column does (calibrate/joint.py, each run
weighed by its sweep's scatter), and in-sample on each sweep for reference. Per sweep: step-time MAPE,
Spearman rho, rank of the measured fastest layout in ours (1 = top), then the coefficient the other two
sweeps gave it. Structural forms have no coefficient:

* ``pacing ramp``: every 1F1B fill and drain slot lasts a pacing period, (n_mb + PP - 1) x the slowest
  stage's (eq:bubble's f_bubble x t_block with the LM head in t_block; the time model's form);
* ``classic ramp``: the fill and drain at the other stages' own periods, (n_mb - 1) max p + sum p, what
  a 1F1B schedule with fixed op times gives (estimator/exchanges.py's discrete-event check).

Linear costs, each with a coefficient fitted with the host scale (the BIC test of calibrate/joint.py decides
whether the runs support it) and alone (forced), added to the model with the pacing ramp:

* ``ep_skew``: per 1F1B slot, (H_EP - 1) ms x c, serial with compute: the expected wait of each slot's
  first all-to-all for the last of EP pipelines that arrive with i.i.d. exponential skews of c ms;
* ``slot``: c ms per slot of a pipelined layout, whatever its EP (a fixed cost of each exchange round);
* ``exchange``: c ms per blocking exchange on the 1F1B critical path (estimator/exchanges.py's count);
* ``a2a_hidden``: the share c of the all-to-all wire time of an expert group across nodes that runs
  beside compute instead of between it (Megatron-Core's alltoall dispatcher leaves only the shared
  expert beside it).

    python benchmarks/pipeline_mechanisms.py --db URL-with-recorded-tables
"""
from __future__ import annotations

import argparse
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import scaleplan.estimator.model as time_model
import scaleplan.estimator.pipeline as pipeline
from estimator_accuracy import VALIDATION, _metrics, fill_ratio_18b, staged_runs, sweep_specs
from scaleplan.calibrate.joint import BOUNDS, IDENTITY, PRIOR_SD, Terms, estimator_t_pred, fit_joint
from scaleplan.estimator import Estimator
from scaleplan.estimator.exchanges import critical_exchanges
from scipy.special import digamma

PROFILE = "p6-b200.48xlarge"
#: linear mechanisms: prior sd and upper bound of the coefficient (ms, or a share for a2a_hidden)
LINEAR = {"ep_skew": (50.0, 500.0), "slot": (50.0, 500.0), "exchange": (20.0, 200.0), "a2a_hidden": (0.5, 1.0)}


def _classic(pp, first, middle, last, vocab, serial=False):
    """The model's stage periods with the fill and drain at the other stages' own periods (module docstring):
    the first stage's, the middle ones' summed and the last one's, less the pacing period."""
    st = _ORIGINAL(pp, first, middle, last, vocab, serial)
    pp = np.asarray(pp)
    first_p, last_p, _ = pipeline.end_periods(first, last, vocab, serial)
    d0, l0 = first.period(serial), last.period(serial)
    mid_p = middle.mean.period(serial)
    mid_sum = np.where(np.asarray(middle.n) > 0, middle.n * mid_p, 0.0)
    ramp = np.where(pp > 1, first_p + mid_sum + last_p - st.period, 0.0)
    after = np.where(mid_p == l0, (pp - 1) * l0, mid_sum + l0)
    ramp_disp = np.where(pp > 1, d0 + after - st.period_disp, 0.0)
    return pipeline.StagePeriods(st.period, st.period_disp, ramp, ramp_disp)


def _pacing(pp, *args, **kw):
    st = _ORIGINAL(pp, *args, **kw)
    pp = np.asarray(pp)
    return pipeline.StagePeriods(st.period, st.period_disp, np.where(pp > 1, (pp - 1) * st.period, 0.0),
                                 np.where(pp > 1, (pp - 1) * st.period_disp, 0.0))


_ORIGINAL = pipeline.stage_periods
RAMPS = {"pacing ramp": _pacing, "classic ramp": _classic}


@contextmanager
def ramp(form: str):
    """The time model with the ramp ``form`` (RAMPS), in this process only."""
    time_model.stage_periods = RAMPS[form]
    try:
        yield
    finally:
        time_model.stage_periods = _ORIGINAL


def excess(mech: str, spec, lays, res) -> np.ndarray:
    """Seconds per unit coefficient of ``mech`` per layout (``res``: the estimator's results for them)."""
    n_mb = np.array([spec.data.gbs // (lo.dp * lo.mbs) for lo in lays], float)
    pp = np.array([lo.pp for lo in lays], float)
    ep = np.array([lo.ep for lo in lays], float)
    slots = n_mb + pp - 1
    if mech == "ep_skew":
        return 1e-3 * slots * (digamma(ep + 1.0) + np.euler_gamma - 1.0)  # H_EP - 1
    if mech == "slot":
        return 1e-3 * slots * (pp > 1)
    if mech == "exchange":
        return 1e-3 * critical_exchanges(pp, n_mb)
    across = np.array([r.chi_inputs["ep_nodes"] > 1 for r in res])
    return -np.array([r.breakdown_s.get("ep_a2a", 0.0) for r in res]) * slots / n_mb * across


def loso(db: str, sw: dict, mech: str | None, forced: bool = False) -> list[str]:
    """Per sweep: LOSO and in-sample metrics with ``mech``'s coefficient fitted beside the runtime terms."""
    est = Estimator(PROFILE, db_url=db, use_calibration=False)
    ex = {name: (excess(mech, spec, lays, est.estimate(spec, n, lays)) if mech else np.zeros(len(lays)))
          for name, (spec, n, lays, _) in sw.items()}
    if mech:  # the host scale and the mechanism; ``forced``: the mechanism alone (no BIC test of one term)
        names = (mech,) if forced else ("host_scale", mech)
        terms = Terms(names, {**IDENTITY, mech: 0.0}, {**BOUNDS, mech: (0.0, LINEAR[mech][1])},
                      {**PRIOR_SD, mech: LINEAR[mech][0]})
    else:
        terms = Terms()

    def t_pred(names):
        base = estimator_t_pred(PROFILE, db, [sw[o][:3] for o in names])
        add = np.concatenate([ex[o] for o in names])
        return lambda p: base(p) + p.get(mech, 0.0) * add if mech else base(p)

    rows = []
    for name, (*_, real) in sw.items():
        train = [o for o in sw if o != name]
        fit = fit_joint(t_pred(train), np.concatenate([sw[o][3] for o in train]),
                        np.repeat(train, [len(sw[o][3]) for o in train]), terms=terms)
        ins = fit_joint(t_pred([name]), real, terms=terms)
        c = (f" {mech}={fit.params[mech]:.3g}" + (f" [{fit.unidentified[mech]}]" if mech in fit.unidentified else "")
             if mech else "")
        rows.append(f"{name} LOSO {_metrics(t_pred([name])(fit.params), real).strip()}{c}"
                    f" (in-sample {_metrics(t_pred([name])(ins.params), real).strip()})")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=None)
    ap.add_argument("--validation", default=str(VALIDATION))
    a = ap.parse_args()
    from _db import tables_db  # benchmarks/_db.py: a database without tables is refused in one line

    db = tables_db(a.db)
    sw = {name: (spec, n, lays, real) for name, spec, n, lays, real, _ in sweep_specs(Path(a.validation))}
    for form in RAMPS:
        with ramp(form):
            print(f"== {form}: " + ";  ".join(loso(db, sw, None)))
            est = Estimator(PROFILE, db_url=db, use_calibration=False)
            staged_runs(est)
            fill_ratio_18b(est, Path(a.validation))
    with ramp("pacing ramp"):
        for mech in LINEAR:
            print(f"== pacing ramp + {mech} with host_scale: " + ";  ".join(loso(db, sw, mech)))
            print(f"== pacing ramp + {mech} alone (forced): " + ";  ".join(loso(db, sw, mech, forced=True)))


if __name__ == "__main__":
    main()
