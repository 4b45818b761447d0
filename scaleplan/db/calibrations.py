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
PAPER_STACK_KEY = "megatron"  # a row without a stack (stored before migration 0006) was fitted on it


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
    stack: str = PAPER_STACK_KEY  # the training stack the fit's runs ran (scaleplan.stack.Stack.key)


def calibrations_in_force(url: str | None, profile: str, cal_id: int | None = None,
                          stack: str = PAPER_STACK_KEY) -> dict[str, CalibrationRow]:
    """``{kind: CalibrationRow}`` for ``profile`` and the training ``stack`` (its :meth:`Stack.key`): the row
    ``cal_id`` for its kind, the newest version of every other kind fitted on that stack; a calibration of
    another stack is never in force. Empty when the schema has no calibration table yet. Read once per
    state of an SQLite database (:mod:`scaleplan.db.state_cache`: the next planner command reads the rows
    from the cache without importing SQLAlchemy).

    Raises:
        SpecError: ``cal_id`` names no calibration of ``profile`` and ``stack``.
    """
    from scaleplan.db.session import resolve_url
    from scaleplan.db.state_cache import cached_read

    url = resolve_url(url)
    return cached_read("calibrations", url, (profile, cal_id, stack), (__name__,),
                       lambda: _read_in_force(url, profile, cal_id, stack), valid=lambda v: isinstance(v, dict))


def _row(r) -> CalibrationRow:
    return CalibrationRow(*r[:-1], stack=r[-1] or PAPER_STACK_KEY)


def _read_in_force(url: str, profile: str, cal_id: int | None, stack: str) -> dict[str, CalibrationRow]:
    """:func:`calibrations_in_force` from the database (a Core query)."""
    import sqlalchemy as sa

    from scaleplan.db.session import get_engine

    eng = get_engine(url)
    if "calibration" not in sa.inspect(eng).get_table_names():
        return {}
    have_stack = "stack" in {c["name"] for c in sa.inspect(eng).get_columns("calibration")}
    cols = "id, profile, kind, version, coefficients, created_at, residuals, cv_error, " + \
        ("stack" if have_stack else "NULL AS stack")
    typed = {"coefficients": sa.JSON, "created_at": sa.DateTime(timezone=True),  # by name, not position
             "residuals": sa.JSON}
    # the paper's stack is also every row stored before the column existed (NULL)
    same = "(stack = :s OR stack IS NULL)" if (have_stack and stack == PAPER_STACK_KEY) else \
        ("stack = :s" if have_stack else ("1 = 1" if stack == PAPER_STACK_KEY else "1 = 0"))
    out: dict[str, CalibrationRow] = {}
    with eng.connect() as c:
        if cal_id is not None:
            r = c.execute(sa.text(f"SELECT {cols} FROM calibration WHERE id = :i").columns(**typed),
                          {"i": int(cal_id)}).first()
            if r is None or r.profile != profile or (r.stack or PAPER_STACK_KEY) != stack:
                raise SpecError("--calibration", cal_id, f"the id of a calibration of profile {profile} fitted on "
                                f"stack {stack}")
            out[r.kind] = _row(r)
        for kind in KINDS:
            if kind in out:
                continue
            r = c.execute(sa.text(f"SELECT {cols} FROM calibration WHERE profile = :p AND kind = :k AND {same} "
                                  "ORDER BY version DESC, created_at DESC LIMIT 1").columns(**typed),
                          {"p": profile, "k": kind, "s": stack}).first()
            if r is not None:
                out[kind] = _row(r)
    return out


def store_calibration(sess, profile: str, kind: str, coefficients: dict[str, float], *, inputs: dict[str, Any],
                      residuals: list[float], cv_error: float | None, n_obs: int, notes: str,
                      stack: str = PAPER_STACK_KEY) -> Any:
    """Insert a Calibration with version = previous max + 1 for (profile, kind), fitted on ``stack`` (a
    :meth:`Stack.key`; the paper's is stored as NULL, as rows before migration 0006 are); returns the row."""
    from sqlalchemy import func, select

    from scaleplan.db import models as m

    if kind not in KINDS:
        raise ScaleplanError(f"calibration kind: got {kind!r}; one of {', '.join(KINDS)}")
    prev = sess.scalar(select(func.max(m.Calibration.version))
                       .where(m.Calibration.profile == profile, m.Calibration.kind == kind))
    row = m.Calibration(profile=profile, kind=kind, version=(prev or 0) + 1, coefficients=coefficients,
                        inputs=inputs, residuals=residuals, cv_error=cv_error, n_obs=n_obs, notes=notes,
                        stack=None if stack == PAPER_STACK_KEY else stack)
    sess.add(row)
    sess.flush()
    return row


def newest(sess, profile: str, kind: str, stack: str = PAPER_STACK_KEY) -> Any | None:
    """The newest Calibration of (profile, kind) fitted on ``stack``, or None."""
    from sqlalchemy import or_, select

    from scaleplan.db import models as m

    same = or_(m.Calibration.stack == stack, m.Calibration.stack.is_(None)) if stack == PAPER_STACK_KEY \
        else m.Calibration.stack == stack
    return sess.scalar(select(m.Calibration).where(m.Calibration.profile == profile, m.Calibration.kind == kind, same)
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
            "stack": row.stack or PAPER_STACK_KEY,
            "coefficients": row.coefficients, "n_obs": row.n_obs, "cv_error": row.cv_error, "notes": row.notes,
            "created_at": row.created_at.isoformat() if row.created_at else None}
