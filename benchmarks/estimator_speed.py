"""Plan-search speed of the estimator (a benchmark that prints figures, not a test).

All plans of one architecture on 512 devices (TP <= 8, every PP/EP/CP divisor, micro-batch 1/2/4,
4 checkpointing modes) evaluated vectorised, after the tables are loaded. Prints the best of N runs
in ms and plans/s.

    python benchmarks/estimator_speed.py [--db URL] [--devices 512] [--q 8] [--repeat 20]
"""
from __future__ import annotations

import argparse
import time

from scaleplan.estimator import Estimator, PlanConstraints

from scaleplan.geometry import ladder_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=None, help="database with the recorded tables (default: the default DB)")
    ap.add_argument("--profile", default="p6-b200.48xlarge")
    ap.add_argument("--devices", type=int, default=512)
    ap.add_argument("--q", type=int, default=8, help="ladder seed of the architecture (E=128, K=3, G=4)")
    ap.add_argument("--gbs", type=int, default=2048)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    from _db import tables_db  # benchmarks/_db.py: a database without tables is refused in one line

    a.db = tables_db(a.db, a.profile)

    t0 = time.perf_counter()
    est = Estimator(a.profile, db_url=a.db)
    t_load = time.perf_counter() - t0
    model = ladder_model(a.q, 128, 3, 4)
    c = PlanConstraints(max_tp=8, mbs=(1, 2, 4))
    # cold: table lookups are memoised, so the first evaluation of an architecture is the honest figure
    t0 = time.perf_counter()
    est.evaluate_arrays(model, a.devices, a.gbs, a.seqlen, "adamw", c)
    t_cold = time.perf_counter() - t0
    best, out = float("inf"), None
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        out = est.evaluate_arrays(model, a.devices, a.gbs, a.seqlen, "adamw", c)
        best = min(best, time.perf_counter() - t0)
    _, plans, _, _, feasible, _, counts, total = out
    t0 = time.perf_counter()
    top = est.best_plan(model, a.devices, a.gbs, a.seqlen, "adamw", c)
    t_best = time.perf_counter() - t0
    print(f"tables loaded in {t_load * 1e3:.0f} ms (profile {a.profile}; empty={est.tables.empty})")
    print(f"q={a.q} on {a.devices} devices: {total} candidate plans, {len(plans)} in P_disc, "
          f"{int(feasible.sum())} feasible")
    print(f"evaluate all plans, first call (cold lookup cache): {t_cold * 1e3:.1f} ms = "
          f"{len(plans) / t_cold:,.0f} plans/s")
    print(f"evaluate all plans: {best * 1e3:.1f} ms (best of {a.repeat}, lookups memoised) = "
          f"{len(plans) / best:,.0f} plans/s")
    print(f"best_plan (incl. ranking and result objects): {t_best * 1e3:.1f} ms")
    if top is not None:
        print(f"best: {top.layout} MFU {100 * top.mfu:.2f}%")


if __name__ == "__main__":
    main()
