"""scaleplan's own recorded tables: CSV files, one per measurement table, exported from a bench run.

Format: ``<suite>.csv`` with the measurement table's key and value columns plus the provenance
columns ``profile``, ``host``, ``gpu_name``, ``gpu_uuid``, ``driver_version``, ``cuda_version``,
``torch_version``, ``nccl_version``, ``te_version``, ``git_rev`` and ``run_started_at`` (files
without the optional ones still import). Written by ``scaleplan bench export``, read by
``scaleplan db import-recorded``.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

import pandas as pd
from sqlalchemy import Integer, select
from sqlalchemy.orm import Session

from scaleplan.db import models as m
from scaleplan.db.importers import ImportResult, insert_points
from scaleplan.errors import ScaleplanError

# first = the profile the rows belong to, last = when the run started; the ones between are copied to
# the imported BenchRun's columns of the same name
PROVENANCE = ("profile", "host", "gpu_name", "gpu_uuid", "driver_version", "cuda_version", "torch_version",
              "nccl_version", "te_version", "git_rev", "run_started_at")


def default_recorded_dir() -> Path:
    return Path(str(resources.files("scaleplan.cluster_profiles"))) / "recorded"


def _cell(table: type[m.Base], column: str, v):
    """A CSV cell as the column wants it: NaN -> None; an integer column read as float (pandas does
    that when the column has an empty cell, e.g. n_rep of an UNSUPPORTED row) -> int."""
    if pd.isna(v):
        return None
    if isinstance(table.__table__.columns[column].type, Integer) and isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def import_recorded_dir(sess: Session, directory: str | Path) -> list[ImportResult]:
    """Import every ``<suite>.csv`` in ``directory`` (idempotent). Raises ScaleplanError if none."""
    d = Path(directory)
    files = sorted(d.glob("*.csv")) if d.is_dir() else []
    results = []
    for p in files:
        suite = p.stem.split(".")[0]
        table = m.MEASUREMENT_TABLES.get(suite)
        if table is None:
            continue
        try:
            df = pd.read_csv(p)
            if "profile" not in df.columns:
                raise KeyError("profile column missing")
        except Exception as e:  # corrupt or foreign file: refuse the import (the transaction rolls back)
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise ScaleplanError(f"{p.name}: not a readable {suite} table ({type(e).__name__}: {first})") from None
        cols = {c.key for c in table.__table__.columns} - {"id", "run_id", "created_at"}
        run_ids = []
        inserted = 0
        for prof, g in df.groupby("profile"):
            key = f"scaleplan-recorded/{p.name}#{prof}"
            run = sess.scalar(select(m.BenchRun).where(m.BenchRun.source_file == key, m.BenchRun.suite == suite))
            if run is None:
                first = g.iloc[0]
                run = m.BenchRun(suite=suite, profile=str(prof), source="imported", source_file=key,
                                 status="imported", **{c: (None if pd.isna(first.get(c)) else str(first.get(c)))
                                                       for c in PROVENANCE[1:-1] if c in g.columns})
                sess.add(run)
                sess.flush()
            run_ids.append(run.id)
            rows = [{k: _cell(table, k, v) for k, v in r.items() if k in cols} | {"run_id": run.id}
                    for r in g.to_dict("records")]
            inserted += insert_points(sess, table, rows)
        results.append(ImportResult(p.name, suite, len(df), len(df), inserted, run_ids))
    if not results:
        raise ScaleplanError(f"DIR: no recorded <suite>.csv tables in {str(directory)!r}")
    return results


def own_tables_db() -> str:
    """The URL of a new temporary SQLite database holding scaleplan's own recorded tables
    (:func:`default_recorded_dir`, every profile), for scripts that read them without a user database."""
    import tempfile

    from scaleplan.db import session as dbs

    url = f"sqlite:///{tempfile.mkdtemp(prefix='scaleplan-own-')}/own.db"
    dbs.upgrade(url)
    with dbs.session_scope(url) as s:
        import_recorded_dir(s, default_recorded_dir())
    return url
