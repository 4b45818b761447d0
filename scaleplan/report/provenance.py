"""What a planner answer was computed from: the calibration in force and the measured table runs.

Every planner output (estimate, layouts, search) carries :func:`provenance`'s dict under ``provenance``,
so the same question asked before and after ``calibrate fit`` says why the answer moved.
Reads only the public Estimator attributes (``chi.calibration_id``, ``dispatch.source``, ``profile``,
``extrapolate``, ``db_url``) and the database rows; never imports torch.
"""
from __future__ import annotations

import re
from typing import Any

# measurement tables (and the suite that fills each): the runs a profile's tables read
POINT_TABLES = {"gemm_point": "gemm", "grouped_gemm_point": "grouped_gemm", "sdpa_point": "sdpa",
                "router_point": "router", "elementwise_point": "elementwise", "vocab_point": "vocab",
                "collective_point": "collectives", "dispatch_point": "dispatch"}


def calibration_option(value: str | None) -> tuple[int | None, bool]:
    """Parse ``--calibration ID|none`` into (calibration_id, use_calibration). None: the newest of each kind.

    Raises SpecError naming --calibration unless the value is a positive integer or 'none'."""
    from scaleplan.errors import SpecError

    if value is None:
        return None, True
    if str(value).strip().lower() == "none":
        return None, False
    try:
        n = int(str(value).strip())
    except ValueError:
        n = 0
    if not 0 < n < 2**63:  # a database id
        raise SpecError("--calibration", value, "a calibration id (see `scaleplan calibrate list`) or 'none'")
    return n, True


def _fitted_on(inputs: dict[str, Any] | None, n_obs: int | None) -> str:
    """A short phrase for what a calibration was fitted on, from its stored inputs."""
    inputs = inputs or {}
    parts = [f"{n_obs} observations" if n_obs is not None else "unknown observations"]
    ids = inputs.get("observation_ids")
    if ids:
        parts.append(f"observed runs {min(ids)}..{max(ids)}" if len(ids) > 3 else f"observed runs {ids}")
    if inputs.get("rows"):
        parts.append(f"{len(inputs['rows'])} measured dispatch rows")
    if inputs.get("mode"):
        parts.append(f"mode {inputs['mode']}")
    return ", ".join(parts)


def _calibration_ids(est) -> list[int]:
    ids = []
    cid = getattr(getattr(est, "chi", None), "calibration_id", None)
    if cid is not None:
        ids.append(int(cid))
    m = re.match(r"calibration (\d+)", str(getattr(getattr(est, "dispatch", None), "source", "")))
    if m and int(m.group(1)) not in ids:
        ids.append(int(m.group(1)))
    return ids


def calibrations(url: str | None, ids: list[int]) -> list[dict[str, Any]]:
    """Calibration rows by id: id, kind, version, fitted_at (ISO), fitted_on, n_obs, cv_error, notes.
    Read once per state of an SQLite database (:mod:`scaleplan.db.state_cache`)."""
    if not ids:
        return []
    from scaleplan.db.session import resolve_url
    from scaleplan.db.state_cache import cached_read

    url = resolve_url(url)
    return cached_read("provenance-calibrations", url, tuple(ids), (__name__,), lambda: _read_calibrations(url, ids))


def _read_calibrations(url: str, ids: list[int]) -> list[dict[str, Any]]:
    from sqlalchemy import select

    from scaleplan.db.models import Calibration
    from scaleplan.db.session import session_scope

    with session_scope(url) as s:
        rows = s.scalars(select(Calibration).where(Calibration.id.in_(ids)).order_by(Calibration.id)).all()
        return [{"id": r.id, "kind": r.kind, "version": r.version, "profile": r.profile,
                 "fitted_at": r.created_at.isoformat() if r.created_at else None,
                 "fitted_on": _fitted_on(r.inputs, r.n_obs), "n_obs": r.n_obs, "cv_error": r.cv_error,
                 "notes": r.notes} for r in rows]


def table_runs(url: str | None, profile: str) -> list[dict[str, Any]]:
    """The bench runs with OK points under ``profile``: id, suite, source, gpu_name, started_at, source_file,
    n_points. A point measured in several runs is read from the newest (estimator/table_build.py).
    Read once per state of an SQLite database (:mod:`scaleplan.db.state_cache`)."""
    from scaleplan.db.session import resolve_url
    from scaleplan.db.state_cache import cached_read

    url = resolve_url(url)
    return cached_read("table-runs", url, profile, (__name__,), lambda: _read_table_runs(url, profile))


def _read_table_runs(url: str, profile: str) -> list[dict[str, Any]]:
    from sqlalchemy import inspect, text

    from scaleplan.db.session import get_engine

    eng = get_engine(url)
    names = set(inspect(eng).get_table_names())
    if "bench_run" not in names:
        return []
    counts: dict[int, int] = {}
    with eng.connect() as c:
        for table in POINT_TABLES:
            if table not in names:
                continue
            q = text(f"SELECT p.run_id, COUNT(*) FROM {table} p JOIN bench_run r ON p.run_id = r.id "
                     "WHERE r.profile = :prof AND p.status = 'OK' GROUP BY p.run_id")
            for run_id, n in c.execute(q, {"prof": profile}):
                counts[int(run_id)] = counts.get(int(run_id), 0) + int(n)
        if not counts:
            return []
        rows = c.execute(text("SELECT id, suite, source, gpu_name, started_at, source_file FROM bench_run "
                              "WHERE profile = :prof ORDER BY id"), {"prof": profile}).all()
    return [{"id": r[0], "suite": r[1], "source": r[2], "gpu_name": r[3], "started_at": str(r[4]),
             "source_file": r[5], "n_points": counts[r[0]]} for r in rows if r[0] in counts]


def provenance(est) -> dict[str, Any]:
    """What ``est`` computes from: profile, extrapolate mode, calibration rows in force (empty list:
    uncalibrated, chi_sys = 1 and the profile's dispatch law), the dispatch law's source, the table runs, and
    ``borrowed``: the other profiles its tables may read rows of (measurements.BORROWED_ROWS), each with how and
    its runs."""
    from scaleplan.db.measurements import BORROWED_ROWS
    from scaleplan.db.session import resolve_url

    url = resolve_url(est.db_url)
    cals = calibrations(url, _calibration_ids(est))
    first = getattr(est.profile, "device_tables_first", ())
    how_of = {**BORROWED_ROWS, "device_tables": BORROWED_ROWS["device_tables"]
              + (f" (in place of its own: {', '.join(first)})" if first else "")}
    borrowed = [{"profile": other, "how": how_of[field], "table_runs": table_runs(url, other)}
                for field in BORROWED_ROWS for other in getattr(est.profile, field, ())]
    return {"profile": est.profile.name, "extrapolate": est.extrapolate,
            "calibration": cals, "calibration_used": bool(cals),
            "dispatch_law": str(getattr(est.dispatch, "source", "default")),
            "table_runs": table_runs(url, est.profile.name), "borrowed": borrowed}


def provenance_line(p: dict[str, Any]) -> str:
    """One human line: calibration ids with when and on what, and the table runs by suite."""
    if p["calibration"]:
        cal = "; ".join(f"{c['kind']} #{c['id']} v{c['version']} fitted {str(c['fitted_at'])[:16]} on "
                        f"{c['fitted_on']}" for c in p["calibration"])
    else:
        cal = "none (chi_sys = 1)"
    runs: dict[str, list[str]] = {}
    for r in p["table_runs"]:
        runs.setdefault(r["suite"], []).append(str(r["id"]))
    lent = [f"{b['profile']} ({b['how']})" for b in p.get("borrowed", ()) if b["table_runs"]]
    tab = ", ".join(f"{s} {'/'.join(ids)}" for s, ids in sorted(runs.items())) or ("none" if lent else
                                                                                   "none (all analytic)")
    return (f"calibration: {cal}; dispatch law: {p['dispatch_law']}; table runs: {tab}"
            + (f"; rows of {', '.join(lent)}" if lent else ""))
