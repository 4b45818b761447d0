"""The calibration rows in force for a profile: the one query the estimator needs (SQL stays in
scaleplan/db; the estimator receives detached rows)."""
from __future__ import annotations

from typing import Any

from scaleplan.errors import SpecError

KINDS = ("chi_sys", "dispatch")


def calibrations_in_force(url: str | None, profile: str, cal_id: int | None = None) -> dict[str, Any]:
    """``{kind: Calibration}`` for ``profile``: the row ``cal_id`` for its kind, the newest version of
    every other kind. Empty when the schema has no calibration table yet.

    Raises:
        SpecError: ``cal_id`` names no calibration of ``profile``.
    """
    from sqlalchemy import inspect, select

    from scaleplan.db.models import Calibration
    from scaleplan.db.session import get_engine, resolve_url, session_scope

    url = resolve_url(url)
    if "calibration" not in inspect(get_engine(url)).get_table_names():
        return {}
    out: dict[str, Any] = {}
    with session_scope(url) as s:
        if cal_id is not None:
            row = s.get(Calibration, int(cal_id))
            if row is None or row.profile != profile:
                raise SpecError("--calibration", cal_id, f"the id of a calibration of profile {profile}")
            out[row.kind] = row
        for kind in KINDS:
            if kind in out:
                continue
            row = s.scalars(select(Calibration).where(Calibration.profile == profile, Calibration.kind == kind)
                            .order_by(Calibration.version.desc(), Calibration.created_at.desc())).first()
            if row is not None:
                out[kind] = row
        for r in out.values():
            s.expunge(r)
    return out
