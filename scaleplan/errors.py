"""Errors scaleplan raises on purpose.

Every error a user can cause by bad input derives from :class:`ScaleplanError`; the CLI prints
it as one line and exits with status 2 (no traceback unless ``--debug``).
"""
from __future__ import annotations


def one_line(text: str) -> str:
    """``text`` with control characters and line breaks escaped, so an error stays one line."""
    return text if text.isprintable() else repr(text)[1:-1]


def _picklable(value: object) -> object:
    """``value`` if it pickles, else its repr (an error must always reach the parent process)."""
    import pickle

    try:
        pickle.dumps(value)
        return value
    except Exception:
        return repr(value)


class ScaleplanError(Exception):
    """A user-facing error: bad input, missing data, or a refused operation (CLI exit status 2)."""

    exit_code = 2

    def as_dict(self) -> dict:
        """``{"field", "value", "allowed", "message"}`` for ``--json`` errors (field/value/allowed
        are None where the error is not about one input)."""
        return {"field": getattr(self, "field", None), "value": getattr(self, "value", None),
                "allowed": getattr(self, "allowed", None), "message": one_line(str(self))}


class SpecError(ScaleplanError):
    """A model spec, cluster profile, layout string or CSV field is invalid.

    The message names the field path, the value given and what is allowed.
    """

    def __init__(self, field: str, value: object, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{one_line(str(field))}: got {value!r}; {one_line(str(allowed))}")

    def __reduce__(self):
        # the default pickles self.args (the message) and calls cls(message): a worker process's
        # SpecError could not cross the pool back to the parent (TypeError: missing arguments)
        return type(self), (self.field, _picklable(self.value), self.allowed)


class FieldCheck(ValueError):
    """A cross-field check that fails inside a pydantic validator: carries the (relative) field it blames
    and its value, so the one-line SpecError names that field (scaleplan.specs turns it into one)."""

    def __init__(self, field: str, value: object, msg: str):
        self.field, self.value = field, value
        super().__init__(msg)


class OutOfRangeError(ScaleplanError):
    """A measured-table lookup outside the measured range (never extrapolated silently).

    Attributes name the table, the axis, the requested value and the measured ``[lo, hi]``.
    """

    def __init__(self, table: str, axis: str, value: float, lo: float, hi: float):
        self.table, self.axis, self.value, self.lo, self.hi = table, axis, value, lo, hi
        super().__init__(
            f"table {table}: {axis}={value:g} is outside the measured range [{lo:g}, {hi:g}]; "
            "measure it with `scaleplan bench` or pass --extrapolate clamp"
        )

    def __reduce__(self):
        return type(self), (self.table, self.axis, self.value, self.lo, self.hi)

    def as_dict(self) -> dict:
        return {"field": f"{self.table}.{self.axis}", "value": self.value,
                "allowed": f"[{self.lo:g}, {self.hi:g}] (the measured range)", "message": one_line(str(self))}


class NotImplementedYet(ScaleplanError):
    """A command that exists in the CLI but is not built yet (exit 2, never pretends)."""
