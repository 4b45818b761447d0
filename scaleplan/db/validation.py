"""Python-side checks of measurement rows before they reach the database.

Policy for bad measurements: a batch given to
:func:`scaleplan.db.importers.insert_points` is checked whole before anything is written. If any
row is bad, the whole batch is rejected atomically with a one-line :class:`MeasurementError`
naming the table, the row index, the column and the value; nothing of that batch is written and
rows the caller wrote earlier in the same transaction are untouched until the caller decides
(``session_scope`` rolls back on the exception). A rejected batch therefore never half-lands:
a reader sees all of it or none of it, and the caller knows exactly which row to fix.

What is bad:

* a key that is not a column of the table (a typo would otherwise be dropped silently), or a
  required key column missing or NULL;
* a time column (one the table guards with a ``<col>_finite_positive`` CHECK, seconds) that is
  NaN, +-inf, zero or negative; an OK row without its required time (``<col>_present_when_ok``);
* any other float that is NaN or infinite; an integer column given a non-integral, boolean,
  negative or out-of-range value (INTEGER is 32-bit on PostgreSQL: the same limit on both
  dialects); a size the table's ``<x>_dims_positive`` CHECK requires > 0 that is not; a
  ``status`` outside :data:`scaleplan.db.models.STATUSES`.

The database's CHECK constraints enforce the time rules again (defence in depth, e.g. for
writers that bypass Python); this module gives the clear error and the atomicity.
"""
from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from sqlalchemy import BigInteger, Boolean, CheckConstraint, Float, Integer, String

from scaleplan.db import models as m
from scaleplan.errors import ScaleplanError, one_line


class MeasurementError(ScaleplanError):
    """A measurement row that must not be stored (one line: table, row index, column, value)."""

    def __init__(self, table: str, index: int, column: str, value: Any, allowed: str, batch: int):
        self.table, self.index, self.column, self.value = table, index, column, value
        self._args = (table, index, column, value, allowed, batch)
        self.field, self.allowed = f"{table}[{index}].{column}", allowed
        super().__init__(f"{table} row {index}: {one_line(str(column))}={value!r}; {allowed} "
                         f"(batch of {batch} rejected, nothing written)")

    def __reduce__(self):  # picklable across worker processes (the default would call cls(message))
        return type(self), self._args


@lru_cache(maxsize=None)
def _schema(table: type[m.Base]) -> tuple[dict, frozenset, frozenset, frozenset, frozenset]:
    """(columns by name, required columns, time columns, times required when OK, sizes > 0) of a table."""
    t = table.__table__
    cols = {c.name: c for c in t.columns}
    required = frozenset(c.name for c in t.columns if not c.nullable and c.default is None
                         and c.server_default is None and not c.primary_key)
    checks = [c.name for c in t.constraints if isinstance(c, CheckConstraint) and c.name]
    times = frozenset(n.removesuffix("_finite_positive") for n in checks if n.endswith("_finite_positive"))
    when_ok = frozenset(n.removesuffix("_present_when_ok") for n in checks if n.endswith("_present_when_ok"))
    # sizes the table's "<x>_dims_positive" CHECK requires > 0 ("m > 0 AND n > 0 AND k > 0")
    positive = frozenset(name for c in t.constraints if isinstance(c, CheckConstraint)
                         and (c.name or "").endswith("_dims_positive")
                         for name in re.findall(r"(\w+) > 0", str(c.sqltext)))
    return cols, required, times, when_ok, positive


def _plain(v: Any) -> Any:
    """numpy scalars -> Python scalars (psycopg cannot adapt numpy integers)."""
    return v.item() if hasattr(v, "item") and not isinstance(v, (str, bytes)) and callable(v.item) else v


def _check_value(col, name: str, v: Any, is_time: bool) -> str | None:
    """None when ``v`` fits column ``col``; else what is allowed."""
    if isinstance(col.type, Integer):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            return "an integer"
        hi = 2**63 - 1 if isinstance(col.type, BigInteger) else 2**31 - 1  # PostgreSQL INTEGER is 32-bit
        return f"an integer in [0, {hi}]" if not 0 <= v <= hi else None
    if isinstance(col.type, Float):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            return "a number"
        if is_time:
            return None if math.isfinite(v) and v > 0 else "a finite time > 0 seconds (or null when not OK)"
        return None if math.isfinite(v) else "a finite number"
    if isinstance(col.type, Boolean):
        return None if isinstance(v, bool) else "true or false"
    if isinstance(col.type, String):
        if not isinstance(v, str):
            return "a string"
        return "at most %d characters" % col.type.length if col.type.length and len(v) > col.type.length else None
    return None


def validate_rows(table: type[m.Base], rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Check every row of a batch for ``table``; return plain-Python copies.

    Raises:
        MeasurementError: the first bad row (index in the batch, column, value); nothing is written.
    """
    cols, required, times, when_ok, positive = _schema(table)
    rows = list(rows)
    name, n = table.__tablename__, len(rows)
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise MeasurementError(name, i, "<row>", type(row).__name__, "a mapping of column -> value", n)
        clean = {}
        for k, v in row.items():
            if k not in cols or k == "id":
                raise MeasurementError(name, i, str(k), v, f"a column of {name}", n)
            v = _plain(v)
            if v is not None and (why := _check_value(cols[k], k, v, k in times)):
                raise MeasurementError(name, i, k, v, why, n)
            if k in positive and v is not None and v <= 0:
                raise MeasurementError(name, i, k, v, "a size > 0", n)
            clean[k] = v
        for k in required:
            if clean.get(k) is None:
                raise MeasurementError(name, i, k, None, "a value (key column)", n)
        status = clean.get("status", "OK")
        if status not in m.STATUSES:
            raise MeasurementError(name, i, "status", status, f"one of {', '.join(m.STATUSES)}", n)
        for k in when_ok:
            if status == "OK" and clean.get(k) is None:
                raise MeasurementError(name, i, k, None, "a time when status is OK", n)
        out.append(clean)
    return out
