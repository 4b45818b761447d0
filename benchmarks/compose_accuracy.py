"""How far to trust --extrapolate compose: each table kind's rule against recorded points it never saw.

For each table kind the top (or bottom) of the recorded B200 range is hidden at its present cut and at
one twice as deep (estimator/holdout.py DEPTHS), the table is rebuilt from the rest, and the hidden
points are looked up through the composition rule (tables.COMPOSE_RULES, estimator/compose.py).
Prints n, MAPE, median composed/measured and the worst error per hold-out, flags those over 10%, and
ends with each table kind's composed-lookup uncertainty (its worst hold-out MAPE,
holdout.rule_errors). tests/estimator/test_compose.py holds the bounds.

    python benchmarks/compose_accuracy.py --db URL-with-recorded-tables
    python benchmarks/compose_accuracy.py --profile h200-single --own-tables   # one H200, scaleplan's own

``--own-tables`` reads scaleplan's own recorded tables (cluster_profiles/recorded, one NVIDIA H200 with
held-out points above the single-gpu preset: grouped GEMM at 4096 and 8192 tokens per expert, SDPA at
32k tokens) from a temporary database instead of ``--db``.
"""
from __future__ import annotations

import argparse

from scaleplan.estimator import holdout
from scaleplan.db.measurements import load_frames
from scaleplan.db.recorded import own_tables_db

from scaleplan.profiles import load_profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=None)
    ap.add_argument("--profile", default="p6-b200.48xlarge")
    ap.add_argument("--own-tables", action="store_true",
                    help="scaleplan's own recorded tables (cluster_profiles/recorded) in a temporary database")
    a = ap.parse_args()
    if not a.own_tables:
        from _db import tables_db  # benchmarks/_db.py: a database without tables is refused in one line

        a.db = tables_db(a.db, a.profile)
    frames = load_frames(own_tables_db() if a.own_tables else a.db, a.profile)
    peak = load_profile(a.profile).peak("bf16")
    print(f"{'table':<14}{'hidden':>22}{'n':>6}{'MAPE':>8}{'median c/m':>12}{'worst':>8}   (present cut, then twice as deep)")
    errs: dict[str, float] = {}
    for pair in holdout.depth_holdouts(frames, peak):
        for h in pair:
            cut = f"{h.axis} {'<' if h.below else '>'} {h.cut:g}" if h.table != "collectives" else \
                f"size > {h.cut:.3g} x max"
            if not h.n:
                print(f"{h.table:<14}{cut:>22}{0:>6}   (nothing measured beyond the cut)")
                continue
            flag = "" if h.mape <= 0.10 else "  > 10%"
            print(f"{h.table:<14}{cut:>22}{h.n:>6}{100 * h.mape:>7.1f}%{h.median_ratio:>12.3f}{100 * h.max_err:>7.0f}%{flag}")
            errs[h.table] = max(errs.get(h.table, 0.0), h.mape)
    print("composed-lookup uncertainty per table kind (worst hold-out MAPE above; estimator.holdout.rule_errors): "
          + ", ".join(f"{k} {100 * v:.1f}%" for k, v in errs.items()))


if __name__ == "__main__":
    main()
