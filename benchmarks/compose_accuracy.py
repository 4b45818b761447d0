"""How far to trust --extrapolate compose: each table kind's rule against recorded points it never saw.

For each table kind the top of the recorded B200 range is hidden, the table is rebuilt from the rest,
and the hidden points are looked up through the composition rule (estimator/holdout.py). Prints n,
MAPE, median composed/measured and the worst error per table (tests/estimator/test_compose.py holds
the bounds).

    python benchmarks/compose_accuracy.py --db URL-with-recorded-tables
"""
from __future__ import annotations

import argparse

from scaleplan.estimator import holdout
from scaleplan.estimator.tables import load_frames

from scaleplan.profiles import load_profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=None)
    ap.add_argument("--profile", default="p6-b200.48xlarge")
    a = ap.parse_args()
    frames = load_frames(a.db, a.profile)
    peak = load_profile(a.profile).peak("bf16")
    print(f"{'table':<14}{'hidden':>22}{'n':>6}{'MAPE':>8}{'median c/m':>12}{'worst':>8}")
    rows = holdout.all_holdouts(frames, peak)
    # deeper cuts: the same rules asked to reach further past what they see (2-8x the work)
    rows += [holdout.grouped(frames, peak, 1024), holdout.grouped(frames, peak, 16, "num_gemms"),
             holdout.gemm(frames, peak, 8192), holdout.gemm(frames, peak, 2048), holdout.sdpa(frames, peak, 4096),
             holdout.collectives(frames, peak, 1 / 16)]
    # below the range: the smallest values hidden, composed down from what is left
    rows += [holdout.grouped(frames, peak, 8, "num_gemms", below=True),
             holdout.grouped(frames, peak, 512, below=True), holdout.gemm(frames, peak, 1024, below=True),
             holdout.sdpa(frames, peak, 4096, below=True)]
    for h in rows:
        cut = f"{h.axis} {'<' if h.below else '>'} {h.cut:g}" if h.table != "collectives" else \
            f"size > {h.cut:.3g} x max"
        print(f"{h.table:<14}{cut:>22}{h.n:>6}{100 * h.mape:>7.1f}%{h.median_ratio:>12.3f}{100 * h.max_err:>7.0f}%")


if __name__ == "__main__":
    main()
