"""Speed of `scaleplan plan` (not a test; prints figures): the whole answer for 4 platforms x 8 node counts.

The question: the loss `scaleplan search --profile p6-b200.48xlarge --nodes 32 --days 20` reaches on the
paper's grid, asked of H100 (p5), H200 (p5en), B200 (p6) and GB200 NVL72 (p6e) nodes, each at the 8 default
node counts (8 to 1024 GPUs), with P(reaches target) from 200 draws; then the forward question (the best loss
of a 30-day window) on the same plans, and the inverse question again for a second target and a deadline,
which plan nothing new; then both at --confidence (0.9). Imports ../shared/recorded/dmlc-scaleplan into a temporary SQLite database first (not
timed), and runs the plan once untimed first so that the compiled tables and the rule errors of every
platform are cached (as after any first use).

Prints, per pass: wall seconds, CPU seconds of this process and its workers, geometries planned (estimator
evaluations: one geometry's best plan on one platform and node count) against the exhaustive count
(geometries x platforms x node counts), and the load average (other processes inflate the wall time; time it
on a quiet machine).

    python benchmarks/plan_speed.py [--recorded DIR] [--db URL] [--workers 2] [--samples 200] [--confidence 0.9]
"""
from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _pass(label: str, req) -> dict:
    from scaleplan.mosaic.plan import run_plan

    w0, c0 = time.perf_counter(), _cpu()
    out = run_plan(req).out
    wall, cpu = time.perf_counter() - w0, _cpu() - c0
    n = out["counts"]
    full = n["geometries"] * n["node_counts"]
    print(f"{label}: {wall:.2f} s wall, {cpu:.2f} s CPU; {n['estimator_evaluations']} geometries planned of "
          f"{full} ({n['platforms']} platforms x {n['node_counts'] // n['platforms']} node counts x "
          f"{n['geometries']} geometries); load average {os.getloadavg()[0]:.2f}")
    return out


def _speed(a, url: str) -> None:
    from dataclasses import replace

    from scaleplan.mosaic.plan import PlanRequest
    from scaleplan.mosaic.run import SearchRequest, run_search

    base = SearchRequest(profile="p6-b200.48xlarge", nodes=(32,), days=(20.0,), samples=0, workers=a.workers,
                         db_url=url, progress=False, extend_edges=False)
    target = run_search(base).out["best"]["loss"]
    print(f"target: {target:.4f}, the loss of search --nodes 32 --days 20 on p6-b200.48xlarge (paper grid)")
    s = replace(base, samples=a.samples)
    req = PlanRequest(search=s, target_loss=target)
    _pass("warm-up (caches the compiled tables and rule errors of every platform)", req)
    out = _pass("the whole answer (inverse, 4 platforms x 8 node counts)", req)
    for pl in out["platforms"]:
        c = pl["cheapest"]
        print(f"  {pl['profile']}: cheapest " + ("none" if c is None else
              f"{c['nodes']} nodes x {c['days']:.2f} days = {c['gpu_hours']:,.0f} GPU-hours, P(reach) "
              f"{c.get('p_reach', float('nan')):.0%}"))
    _pass("with the forward question (30-day window) too", replace(req, max_days=30.0))
    q = replace(req, max_days=30.0, confidence=a.confidence)
    out = _pass(f"both at --confidence {a.confidence:g} (windows and losses read at that quantile of the draws)", q)
    for pl in out["platforms"]:
        c = pl["cheapest"]
        print(f"  {pl['profile']}: cheapest " + ("none" if c is None else
              f"{c['nodes']} nodes x {c['days']:.2f} days = {c['gpu_hours']:,.0f} GPU-hours, P(reach) "
              f"{c.get('p_reach', float('nan')):.0%}"))
    print("(each pass above starts from nothing planned: run_plan builds its own plan bank)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recorded", default=str(REPO.parent / "shared" / "recorded" / "dmlc-scaleplan"))
    ap.add_argument("--db", default=None, help="a database with the recorded tables (default: import them)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--confidence", type=float, default=0.9)
    a = ap.parse_args()
    if a.db:
        _speed(a, a.db)
        return
    from scaleplan.db import session as dbs
    from scaleplan.db.importers import import_scaleplan_dir
    from scaleplan.db.recorded import default_recorded_dir, import_recorded_dir

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/plan_speed.db"
        dbs.upgrade(url)
        with dbs.session_scope(url) as s:
            import_scaleplan_dir(s, Path(a.recorded))
            import_recorded_dir(s, default_recorded_dir())  # scaleplan's own H100 / H200 tables
        _speed(a, url)


if __name__ == "__main__":
    main()
