"""Calibration rows: the one module that reads and writes them (SQL stays in scaleplan/db; callers receive
rows). Versioned: one new version per fit, per (profile, kind); the newest is in force.

:func:`calibrations_in_force` is what the estimator and the search read: a Core query, not the ORM, since
planner commands read it on every start and the ORM models cost ~0.1 s to import. The one writer of
each kind (calibrate/writers.py) writes through :func:`store_calibration`; the fitters read their own
history through :func:`newest` / :func:`by_id`, inside the caller's ORM session."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from scaleplan.errors import ScaleplanError, SpecError

KINDS = ("chi_sys", "dispatch")


@dataclass(frozen=True)
class CalibrationRow:
    """The fields of a stored Calibration the estimator reads."""

    id: int
    profile: str
    kind: str
    version: int
    coefficients: dict[str, Any]
    created_at: dt.datetime | None
    residuals: list | None = None  # the fit's residuals (the search's MFU error reads a 'dispatch' row's)
    cv_error: float | None = None  # the fit's held-out MAPE (what `calibrate list` shows)


def calibrations_in_force(url: str | None, profile: str, cal_id: int | None = None) -> dict[str, CalibrationRow]:
    """``{kind: CalibrationRow}`` for ``profile``: the row ``cal_id`` for its kind, the newest version of
    every other kind. Empty when the schema has no calibration table yet. Read once per state of an
    SQLite database (:mod:`scaleplan.db.state_cache`: the next planner command reads the rows from
    the cache without importing SQLAlchemy).

    Raises:
        SpecError: ``cal_id`` names no calibration of ``profile``.
    """
    from scaleplan.db.session import resolve_url
    from scaleplan.db.state_cache import cached_read

    url = resolve_url(url)
    return cached_read("calibrations", url, (profile, cal_id), (__name__,),
                       lambda: _read_in_force(url, profile, cal_id), valid=lambda v: isinstance(v, dict))


def _read_in_force(url: str, profile: str, cal_id: int | None) -> dict[str, CalibrationRow]:
    """:func:`calibrations_in_force` from the database (a Core query)."""
    import sqlalchemy as sa

    from scaleplan.db.session import get_engine

    eng = get_engine(url)
    if "calibration" not in sa.inspect(eng).get_table_names():
        return {}
    cols = "id, profile, kind, version, coefficients, created_at, residuals, cv_error"
    typed = {"coefficients": sa.JSON, "created_at": sa.DateTime(timezone=True),  # by name, not position
             "residuals": sa.JSON}
    out: dict[str, CalibrationRow] = {}
    with eng.connect() as c:
        if cal_id is not None:
            r = c.execute(sa.text(f"SELECT {cols} FROM calibration WHERE id = :i").columns(**typed),
                          {"i": int(cal_id)}).first()
            if r is None or r.profile != profile:
                raise SpecError("--calibration", cal_id, f"the id of a calibration of profile {profile}")
            out[r.kind] = CalibrationRow(*r)
        for kind in KINDS:
            if kind in out:
                continue
            r = c.execute(sa.text(f"SELECT {cols} FROM calibration WHERE profile = :p AND kind = :k "
                                  "ORDER BY version DESC, created_at DESC LIMIT 1").columns(**typed),
                          {"p": profile, "k": kind}).first()
            if r is not None:
                out[kind] = CalibrationRow(*r)
    return out


def store_calibration(sess, profile: str, kind: str, coefficients: dict[str, float], *, inputs: dict[str, Any],
                      residuals: list[float], cv_error: float | None, n_obs: int, notes: str) -> Any:
    """Insert a Calibration with version = previous max + 1 for (profile, kind); returns the row."""
    from sqlalchemy import func, select

    from scaleplan.db import models as m

    if kind not in KINDS:
        raise ScaleplanError(f"calibration kind: got {kind!r}; one of {', '.join(KINDS)}")
    prev = sess.scalar(select(func.max(m.Calibration.version))
                       .where(m.Calibration.profile == profile, m.Calibration.kind == kind))
    row = m.Calibration(profile=profile, kind=kind, version=(prev or 0) + 1, coefficients=coefficients,
                        inputs=inputs, residuals=residuals, cv_error=cv_error, n_obs=n_obs, notes=notes)
    sess.add(row)
    sess.flush()
    return row


def newest(sess, profile: str, kind: str) -> Any | None:
    """The newest Calibration of (profile, kind), or None."""
    from sqlalchemy import select

    from scaleplan.db import models as m

    return sess.scalar(select(m.Calibration).where(m.Calibration.profile == profile, m.Calibration.kind == kind)
                       .order_by(m.Calibration.version.desc()).limit(1))


def by_id(sess, cal_id: int) -> Any:
    """The Calibration with this id. Raises ScaleplanError when there is none."""
    from scaleplan.db import models as m

    row = sess.get(m.Calibration, cal_id)
    if row is None:
        raise ScaleplanError(f"--calibration: no calibration with id {cal_id} (see `scaleplan calibrate list`)")
    return row


def list_calibrations(sess, profile: str | None = None) -> list[Any]:
    """Every Calibration (of ``profile`` when given), by profile, kind and version."""
    from sqlalchemy import select

    from scaleplan.db import models as m

    q = select(m.Calibration).order_by(m.Calibration.profile, m.Calibration.kind, m.Calibration.version)
    if profile:
        q = q.where(m.Calibration.profile == profile)
    return list(sess.scalars(q))


def as_dict(row) -> dict[str, Any]:
    return {"id": row.id, "profile": row.profile, "kind": row.kind, "version": row.version,
            "coefficients": row.coefficients, "n_obs": row.n_obs, "cv_error": row.cv_error, "notes": row.notes,
            "created_at": row.created_at.isoformat() if row.created_at else None}
