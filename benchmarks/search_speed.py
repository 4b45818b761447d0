"""Speed of `scaleplan search` on the paper's full grid (not a test; prints figures).

The paper's envelope: q in {8..18}, its 13 expert counts, K in {1,2,4,6,8}, G in {1,2,4,8}, S >= 0.7, every
layout on 256 devices (32 p6-b200 nodes) with mbs in {1,2,4} and 4 checkpointing modes, 20 days.
Imports ../shared/recorded/dmlc-scaleplan into a temporary SQLite database first (not timed).
Prints wall and CPU seconds per worker count, ms per geometry, the optimum, and the load average
(other processes on the machine inflate the wall time); then the uncertainty pass of ``--samples N``
(the paper law's ridge sampler, then the N draws over every candidate) timed on its own, since the plan
search runs once per candidate whatever N is.

    python benchmarks/search_speed.py [--recorded DIR] [--workers 1,2] [--samples 200]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recorded", default=str(REPO.parent / "shared" / "recorded" / "dmlc-scaleplan"))
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--samples", type=int, default=200)
    a = ap.parse_args()

    from scaleplan.estimator import Estimator

    from scaleplan.db import session as dbs
    from scaleplan.db.importers import import_scaleplan_dir
    from scaleplan.mosaic.ladder import LadderGrid
    from scaleplan.mosaic.search import Envelope, Mosaic

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/speed.db"
        dbs.upgrade(url)
        with dbs.session_scope(url) as s:
            import_scaleplan_dir(s, Path(a.recorded))
        t0 = time.perf_counter()
        est = Estimator("p6-b200.48xlarge", db_url=url)
        print(f"estimator construction (tables load): {time.perf_counter() - t0:.2f} s")
        for w in (int(x) for x in a.workers.split(",")):
            m = Mosaic(est, LadderGrid(), workers=w)
            c0, t0 = os.times(), time.perf_counter()
            res = m.run(Envelope(nodes=a.nodes, days=20))
            wall, c1 = time.perf_counter() - t0, os.times()
            cpu = (c1.user + c1.system + c1.children_user + c1.children_system
                   - c0.user - c0.system - c0.children_user - c0.children_system)
            b = res.best
            n = len(m.geoms)
            print(f"workers={w}: {n} geometries ({m.grid.n_combinations} grid points) on {res.n_devices} devices: "
                  f"wall {wall:.2f} s, CPU {cpu:.2f} s ({1e3 * cpu / n:.1f} ms CPU/geometry), "
                  f"{int(res.table.feasible.sum())} feasible; load average {os.getloadavg()[0]:.1f}")
            print(f"  optimum: L={b.n_layers} E={b.n_experts} K={b.topk} G={b.g} N_act={b.n_act / 1e9:.1f}B "
                  f"S={b.s:.3f} TPP={b.tpp:.0f} MFU={100 * b.mfu_plan:.2f}% loss={b.loss:.4f}")
        if a.samples:
            _uncertainty(res, a.nodes, a.samples)


def _uncertainty(res, nodes: int, n: int) -> None:
    """Time --samples n on a finished search: ridge sampling (first call) and the vectorised draws."""
    from scaleplan.mosaic.law import PAPER_JOINT_LAW
    from scaleplan.mosaic.report import attach_uncertainty
    from scaleplan.mosaic.ridge import ridge_samples
    from scaleplan.mosaic.search import Envelope
    from scaleplan.mosaic.uncertainty import FALLBACK_SIGMA, MfuError

    c0, t0 = os.times(), time.perf_counter()
    ridge_samples(n)
    t_ridge = time.perf_counter() - t0
    unc = attach_uncertainty([(Envelope(nodes=nodes, days=20), res)], PAPER_JOINT_LAW, None, "paper",
                             MfuError(FALLBACK_SIGMA, "fallback"), n)[0]
    wall, c1 = time.perf_counter() - t0, os.times()
    print(f"--samples {n}: ridge sampler {t_ridge:.2f} s, draws over {int(res.table.plan_ok.sum())} candidates "
          f"{wall - t_ridge:.2f} s; total {wall:.2f} s wall, {c1.user + c1.system - c0.user - c0.system:.2f} s CPU; "
          f"{'; '.join(unc['verdicts']['statements'][:2])}")


if __name__ == "__main__":
    main()
