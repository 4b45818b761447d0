"""The ``scaleplan`` command line: a typer app; each subcommand lives in its own module.

The planner commands (estimate, layouts, search, law) never import torch, so they start fast.
"""
from __future__ import annotations

import math
import os
import sys

# OpenMP threads that sleep when idle, unless the user chose a policy: on a CPU that other processes
# share, spinning threads wait at every small op's barrier for a core another process holds (an
# 8x64x64 matmul took 12 ms instead of 30 us at load 8 on 2 cores), which stretched a CPU
# `validate --bench` of the 4-layer d=256 model from 87 s to over 10 minutes. The bench
# and the validate run it predicts both start from here, so their CPU timings share the policy.
# libgomp reads it once, when torch first loads, which is always after this line.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import typer  # noqa: E402

from scaleplan.cli._common import STATE, print_json, stderr, use_scaleplan_commands  # noqa: E402
from scaleplan.errors import ScaleplanError, one_line  # noqa: E402

#: the top-level commands: name -> (module under scaleplan.cli, its typer app or command function, whether that is
#: a group of subcommands, the help line)
COMMANDS: dict[str, tuple[str, str, bool, str]] = {
    "db": ("db", "app", True, "Create, migrate and inspect the calibration database; import tables."),
    "bench": ("bench", "app", True, "Measure kernels and collectives into the database."),
    "estimate": ("estimate", "estimate", False, "Predict t_iter, MFU and memory of a spec under given layouts."),
    "layouts": ("estimate", "layouts", False, "Rank the feasible execution plans of a spec on N devices."),
    "calibrate": ("calibrate", "app", True, "Fit chi_sys and the dispatch law from observed runs; report accuracy."),
    "law": ("law", "app", True, "Evaluate, fit and optimise the joint MoE scaling law."),
    "search": ("search", "search", False,
               "MOSAIC: the loss-optimal MoE geometry, tokens and layout for a cluster and window."),
    "spec": ("spec", "app", True, "Write a spec from a Hugging Face config; list the catalogue's models and published runs."),
    "plan": ("plan", "plan", False, "The cheapest and fastest cluster, window and platform that reach a target loss "
             "(or train a model on D tokens), the frontier between, and the best loss a budget buys."),
    "validate": ("validate", "validate", False, "Run real training steps of a spec and compare with the prediction."),
}


def _globals(
    db: str = typer.Option(None, "--db", help="Database URL or SQLite file (default: $SCALEPLAN_DB or user data dir)."),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable JSON on stdout."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    STATE.db, STATE.json, STATE.debug = db, json_out, debug or STATE.debug


def build_app(only: str | None = None) -> typer.Typer:
    """The typer app of every command in :data:`COMMANDS`, or of the command ``only`` alone (with the global
    options): typer turns each registered command's signature into click options whenever the app runs
    (about 15 ms for all of them, 1.5 ms for one), and each command's module is imported here."""
    from importlib import import_module

    # rich_markup_mode=None: click's plain help; typer's rich help imports rich.markdown (markdown-it),
    # 0.15-0.2 s of a 0.25 s start-up budget (benchmarks/startup.py). Output tables stay rich.
    a = typer.Typer(name="scaleplan", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                    rich_markup_mode=None,
                    help="Plan sparse-MoE architecture, tokens and parallel layout for your cluster (MOSAIC).")
    a.callback()(_globals)
    for name, (module, attr, group, help_) in COMMANDS.items():
        if only in (None, name):
            obj = getattr(import_module(f"scaleplan.cli.{module}"), attr)
            if group:
                a.add_typer(obj, name=name, help=help_)
            else:
                a.command(name, help=help_)(obj)
    use_scaleplan_commands(a)  # --debug and the numeric bounds on every command
    return a


def __getattr__(name: str):
    """``scaleplan.cli.app``: the whole app (in-process callers, tests), built on first use."""
    if name == "app":
        globals()["app"] = built = build_app()
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _command_name(argv: list[str]) -> str | None:
    """The top-level command ``argv`` names (the first word that is not a global option or its value), if it
    is one of :data:`COMMANDS`; None otherwise (no command, --help, a misspelt one: the whole app answers)."""
    args = iter(argv)
    for word in args:
        if word == "--db":
            next(args, None)
        elif word == "--" or not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def _is_db_error(e: BaseException) -> bool:
    exc = sys.modules.get("sqlalchemy.exc")
    return exc is not None and isinstance(e, exc.DBAPIError)


def _json_wanted(argv: list[str]) -> bool:
    """--json anywhere before a bare '--' (the error may come before the option is parsed)."""
    args = argv[: argv.index("--")] if "--" in argv else argv
    return STATE.json or "--json" in args


def _fail(argv: list[str], message: str, detail: dict | None = None, code: int = 2) -> None:
    """One line on stderr, or ``{"error": {field, value, allowed, message}}`` on stdout under --json."""
    if _json_wanted(argv):
        d = {"field": None, "value": None, "allowed": None, "message": message, **(detail or {})}
        v = d["value"]
        if isinstance(v, float) and not math.isfinite(v) or not isinstance(v, (int, float, str, type(None))):
            d["value"] = str(v)  # inf/nan (JSON has neither) and tuples stay visible as text
        print_json({"error": d})
    else:
        from rich.markup import escape

        stderr.print(f"[red]error:[/red] {escape(message)}", highlight=False, markup=True)
    sys.exit(code)


def _traceback_exit(code: int) -> None:
    """--debug: the whole traceback on stderr, and the same exit status as without --debug."""
    import traceback

    traceback.print_exc()
    sys.exit(code)


def _skip_exit_collection() -> None:
    """Have the interpreter's exit leave the objects alive then to the operating system: at exit they go out
    of the cyclic collector's reach (gc.freeze), whose final collections over every imported module's
    objects (pandas, SQLAlchemy, numpy, the estimator) took 0.15-0.2 s of a search's wall time.
    Reference counting still frees them, files are still flushed and closed; only unreachable cycles are
    left to the process's end. Not for in-process callers, whose process goes on."""
    import atexit
    import gc

    atexit.register(gc.freeze)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app; user errors become one line on stderr (or a JSON ``error`` object
    on stdout under --json) and exit status 2; ``--debug`` prints the traceback instead (same status)."""
    if argv is None:  # the console script: this process ends with the command
        _skip_exit_collection()
    argv = list(sys.argv[1:] if argv is None else argv)
    STATE.json, STATE.debug = False, "--debug" in argv  # in-process callers (tests) run main many times
    try:
        rv = build_app(_command_name(argv))(args=argv, standalone_mode=False)
        if isinstance(rv, int) and rv:  # typer.Exit(n) and Ctrl-C come back as a return value here
            sys.exit(rv)
    except ScaleplanError as e:
        if STATE.debug:
            _traceback_exit(e.exit_code)
        _fail(argv, one_line(str(e)), e.as_dict(), e.exit_code)
    except KeyboardInterrupt:
        stderr.print("interrupted")
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as e:  # database errors, click usage errors and aborts
        if _is_db_error(e):  # sqlalchemy is imported only if a command used it
            if STATE.debug:
                _traceback_exit(2)
            from scaleplan.db.session import mask_url, resolve_url

            first = str(e.orig).strip().splitlines()[0] if e.orig else str(e).splitlines()[0]
            where = mask_url(resolve_url(STATE.url_in_use or STATE.db))
            _fail(argv, one_line(f"database {where}: {first}"), {"field": "--db", "value": where})
        try:  # typer >= 0.16 vendors click as typer._click; its exceptions are not click's
            from typer._click import exceptions as cx
        except ImportError:
            from click import exceptions as cx

        if isinstance(e, cx.NoArgsIsHelpError):
            sys.exit(2)  # typer has already printed the help
        if isinstance(e, typer.Exit):
            sys.exit(e.exit_code)
        if isinstance(e, cx.ClickException):  # one line, like every other user error
            if STATE.debug:
                _traceback_exit(2)
            ctx = getattr(e, "ctx", None)
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            msg = " ".join(e.format_message().split())
            param = getattr(e, "param", None)
            opt = param.opts[0] if param is not None and param.opts else None
            field = getattr(e, "param_hint", None) or opt
            value = argv[argv.index(field) + 1] if field in argv[:-1] else None
            _fail(argv, one_line(msg + hint), {"field": field, "value": value, "allowed": msg})
        if isinstance(e, typer.Abort):
            sys.exit(130)
        raise
