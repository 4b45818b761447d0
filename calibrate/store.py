"""Versioned Calibration rows: one new version per fit, per (profile, kind); the newest is in force."""
from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from scaleplan.db.calibrations import KINDS  # the one list of calibration kinds
from scaleplan.errors import ScaleplanError


def store_calibration(sess, profile: str, kind: str, coefficients: dict[str, float], *, inputs: dict[str, Any],
                      residuals: list[float], cv_error: float | None, n_obs: int, notes: str) -> Any:
    """Insert a Calibration with version = previous max + 1 for (profile, kind); returns the row."""
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
    from scaleplan.db import models as m

    q = select(m.Calibration).order_by(m.Calibration.profile, m.Calibration.kind, m.Calibration.version)
    if profile:
        q = q.where(m.Calibration.profile == profile)
    return list(sess.scalars(q))


def as_dict(row) -> dict[str, Any]:
    return {"id": row.id, "profile": row.profile, "kind": row.kind, "version": row.version,
            "coefficients": row.coefficients, "n_obs": row.n_obs, "cv_error": row.cv_error, "notes": row.notes,
            "created_at": row.created_at.isoformat() if row.created_at else None}
