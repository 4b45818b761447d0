"""Shared CLI plumbing: global options, JSON vs human output, one-line errors.

Conventions every command follows: ``--json`` prints one JSON document on stdout (nothing else
goes to stdout); human tables go to stdout without ``--json`` and progress/banners to stderr.
User errors are :class:`~scaleplan.errors.ScaleplanError`: one line on stderr, exit status 2.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import typer
from rich.console import Console

stdout = Console(soft_wrap=True)
stderr = Console(stderr=True, soft_wrap=True)

DbOpt = typer.Option(None, "--db", help="Database URL or SQLite file (default: $SCALEPLAN_DB or the user data dir).")
JsonOpt = typer.Option(False, "--json", help="Machine-readable JSON on stdout.")
LawOpt = typer.Option(None, "--law", help="Name of a stored law fit (default: the paper's coefficients).")
# one option and one check for every command that reads the tables (estimator.tables.COMPOSE_RULES)
EXTRAPOLATE_HELP = ("Table lookups outside the measured range: compose (default: each table's physical "
                    "rule, labelled 'composed'), error (the plan is infeasible) or clamp (the edge value).")
ExtrapOpt = typer.Option("compose", "--extrapolate", help=EXTRAPOLATE_HELP)


def check_extrapolate(x: str) -> None:
    """Raises SpecError naming --extrapolate unless ``x`` is one of compose, error, clamp."""
    from scaleplan.errors import SpecError

    if x not in ("compose", "error", "clamp"):
        raise SpecError("--extrapolate", x, "compose, error or clamp")


@dataclass
class State:
    db: str | None = None
    json: bool = False
    debug: bool = False
    url_in_use: str | None = None  # the --db a command resolved, for masked error messages


STATE = State()


def db_url(local: str | None) -> str | None:
    """The --db given to the command, else the global --db (remembered for error messages)."""
    STATE.url_in_use = local or STATE.db
    return STATE.url_in_use


def want_json(local: bool) -> bool:
    return local or STATE.json


def _clean(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if hasattr(o, "item") and callable(o.item):  # numpy scalars
        return _clean(o.item())
    return o


def print_json(obj: Any) -> None:
    """Print ``obj`` as JSON on stdout (NaN/inf become null; numpy scalars become numbers)."""
    typer.echo(json.dumps(_clean(obj), indent=2, default=str))


def progress(**kw):
    """A rich progress bar on stderr (transient), for anything over a second."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=stderr, transient=True, disable=kw.pop("disable", False), **kw)
