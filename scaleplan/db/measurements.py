"""The measurement rows a profile's tables are built from (estimator/table_build.py builds them): one
frame per bench suite, OK points of the runs of this profile's hardware only."""
from __future__ import annotations

from scaleplan.lazy import lazy_module

pd = lazy_module("pandas")

SUITE_TABLE = {"gemm": "gemm_point", "grouped_gemm": "grouped_gemm_point", "sdpa": "sdpa_point",
               "router": "router_point", "elementwise": "elementwise_point", "vocab": "vocab_point",
               "collectives": "collective_point", "dispatch": "dispatch_point",
               "allocator": "allocator_point"}


def _read_suite(conn, table: str, profile: str, run_cols: str = "") -> pd.DataFrame:
    from sqlalchemy import text

    from scaleplan.db.identity import same_hardware

    q = text(f"SELECT p.*, r.started_at AS run_started, r.id AS run_order{run_cols} FROM {table} p "
             "JOIN bench_run r ON p.run_id = r.id WHERE r.profile = :prof AND p.status = 'OK'")
    # only runs of this profile's hardware (or forced with --as-profile): CPU timings stored under
    # a B200 profile must not replace its tables however new they are (scaleplan/db/identity.py)
    return same_hardware(pd.read_sql(q, conn, params={"prof": profile}), profile)


def load_frames(url: str | None, profile: str) -> dict[str, pd.DataFrame]:
    """Read every measurement table of ``profile`` (OK rows). Missing schema -> empty frames."""
    from sqlalchemy import inspect

    from scaleplan.db.session import get_engine, resolve_url

    eng = get_engine(resolve_url(url))
    names = set(inspect(eng).get_table_names())
    out: dict[str, pd.DataFrame] = {}
    from scaleplan.db.identity import run_columns_sql

    run_cols = run_columns_sql({c["name"] for c in inspect(eng).get_columns("bench_run")}) \
        if "bench_run" in names else ""
    with eng.connect() as conn:
        for suite, table in SUITE_TABLE.items():
            have = table in names and "bench_run" in names
            out[suite] = _read_suite(conn, table, profile, run_cols) if have else pd.DataFrame()
    return out
