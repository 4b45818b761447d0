"""Reliability figures for scaleplan's calibration database, from a real test run.

Runs ``pytest tests/reliability`` with ``SCALEPLAN_RELIABILITY_FIGURES`` set, so each test logs
what it exercised (writers x rows held per dialect, crash trials survived, migrations checked,
fuzz examples tried, rows lost), then prints the totals. Nothing here is typed in: a figure is
only printed if a passing test recorded it. Exit status 1 when a test failed or a row was lost.

    python benchmarks/reliability_report.py            # SQLite; PostgreSQL too when
    SCALEPLAN_TEST_PG_URL=postgresql+psycopg://postgres@127.0.0.1:5432/scaleplan_test \\
        python benchmarks/reliability_report.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_tests(figures: Path, extra: list[str]) -> tuple[int, float, str]:
    env = {**os.environ, "SCALEPLAN_RELIABILITY_FIGURES": str(figures)}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pytest", "tests/reliability", "-q", "-p", "no:cacheprovider",
                        "-o", "addopts=", *extra], cwd=REPO, env=env, capture_output=True, text=True)
    tail = (r.stdout.strip().splitlines() or [""])[-1]
    return r.returncode, time.perf_counter() - t0, tail


def totals(figures: Path) -> Counter:
    c: Counter = Counter()
    if figures.exists():
        for line in figures.read_text().splitlines():
            c.update(json.loads(line))
    return c


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        fig = Path(d) / "figures.jsonl"
        code, wall, tail = run_tests(fig, sys.argv[1:])
        c = totals(fig)
    pg = "postgresql" if c.get("writers_postgresql") else "postgresql (skipped: no SCALEPLAN_TEST_PG_URL)"
    rows = [
        ("tests", f"{tail} ({wall:.0f} s wall)"),
        ("concurrent writers, SQLite", f"{c['writers_sqlite']} writers x 2000 rows (+200 shared): "
                                       f"{c['rows_held_sqlite']} rows held exactly once"),
        (f"concurrent writers, {pg}", f"{c['writers_postgresql']} writers x 2000 rows (+200 shared): "
                                     f"{c['rows_held_postgresql']} rows held exactly once"),
        ("writer retries (with_retry)", str(c["writer_retries"])),
        ("crash trials (SIGKILL + --resume)", f"{c['crash_trials_survived']} of {c['crash_trials']} survived "
                                              f"({c['crash_kills_mid_sweep']} killed mid-sweep)"),
        ("migrations checked", f"{c['migrations_checked']} (revision->head->revision with data, and "
                               f"base<->head; {c['migration_rows_checked']} rows compared)"),
        ("fuzz examples tried", str(c["fuzz_examples"])),
        ("SQL-injection attempts", str(c["injection_attempts"])),
        ("rows lost", str(c["rows_lost"])),
    ]
    width = max(len(k) for k, _ in rows)
    print("scaleplan reliability report")
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    return 1 if code != 0 or c["rows_lost"] else 0


if __name__ == "__main__":
    sys.exit(main())
