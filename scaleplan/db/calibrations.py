"""The calibration rows in force for a profile: the one query the estimator needs (SQL stays in
scaleplan/db; the estimator receives plain rows). A Core query, not the ORM: planner commands read it
on every start, and the ORM models cost ~0.1 s to import."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from scaleplan.errors import SpecError

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


def calibrations_in_force(url: str | None, profile: str, cal_id: int | None = None) -> dict[str, CalibrationRow]:
    """``{kind: CalibrationRow}`` for ``profile``: the row ``cal_id`` for its kind, the newest version of
    every other kind. Empty when the schema has no calibration table yet.

    Raises:
        SpecError: ``cal_id`` names no calibration of ``profile``.
    """
    import sqlalchemy as sa

    from scaleplan.db.session import get_engine, resolve_url

    eng = get_engine(resolve_url(url))
    if "calibration" not in sa.inspect(eng).get_table_names():
        return {}
    cols = "id, profile, kind, version, coefficients, created_at"
    typed = {"coefficients": sa.JSON, "created_at": sa.DateTime(timezone=True)}  # by name, not position
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
