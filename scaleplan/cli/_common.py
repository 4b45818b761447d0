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
from typer.core import TyperCommand

from scaleplan.lazy import lazy_module  # noqa: F401  (re-exported for the CLI modules)
from scaleplan.units import MEM_FRACTION  # the shared headroom default; units.py says why

# every checkpointing mode (scaleplan.specs.CKPT_MODES, spelled out so --help need not import pydantic)
CKPT_ALL = "none,selective,super-selective,full"



class _LazyConsole:
    """A rich Console made on first use: importing rich's console (markup, emoji table) is a fifth of
    the start-up budget, and `scaleplan --help` prints nothing through it. ``get()`` is the Console."""

    def __init__(self, **kw: Any) -> None:
        self._kw, self._console = kw, None

    def get(self):
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._kw)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.get(), name)


def escape(text: str) -> str:
    """``text`` (a warning, a stack key, a note) made literal inside rich markup: a stack key's "[...]" would
    otherwise be read as a style tag and dropped. Imports rich's markup on use, as the consoles do."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


stdout = _LazyConsole(soft_wrap=True)
stderr = _LazyConsole(stderr=True, soft_wrap=True)
MemFractionOpt = typer.Option(MEM_FRACTION, "--mem-fraction", help=f"Usable fraction of HBM per device (default "
                              f"{MEM_FRACTION}, the same for estimate, layouts and search: headroom for transient "
                              "buffers the memory model does not count; docs/estimate.md).")
StackOpt = typer.Option(None, "--stack", help="The training stack, over the spec's stack block: key=value pairs, "
                        "e.g. fp8_recipe=mxfp8,dispatcher=deepep,cuda_graphs=attn+moe_router (docs/spec.md).")


def check_mem_fraction(x: float) -> None:
    """Raises SpecError naming --mem-fraction unless 0 < x <= 1."""
    from scaleplan.errors import SpecError

    if not 0 < x <= 1:
        raise SpecError("--mem-fraction", x, "a fraction in (0, 1]")


DbOpt = typer.Option(None, "--db", help="Database URL or SQLite file (default: $SCALEPLAN_DB or the user data dir).")
JsonOpt = typer.Option(False, "--json", help="Machine-readable JSON on stdout.")
LawOpt = typer.Option(None, "--law", help="Name of a stored law fit (default: the paper's coefficients).")
# one option and one check for every command that reads the tables (estimator.tables.COMPOSE_RULES)
EXTRAPOLATE_HELP = ("Table lookups outside the measured range: compose (default: each table's physical "
                    "rule, labelled 'composed'), error (the plan is infeasible) or clamp (the edge value).")
ExtrapOpt = typer.Option("compose", "--extrapolate", help=EXTRAPOLATE_HELP)


def int_list(flag: str, text: str | None) -> tuple[int, ...] | None:
    """``"1,2,4"`` -> (1, 2, 4) for a list option named ``flag`` (None stays None). Raises SpecError naming
    ``flag`` unless every item is a positive integer and there is at least one."""
    return _list(flag, text, int, "a comma-separated list of positive integers")


def float_list(flag: str, text: str | None) -> tuple[float, ...] | None:
    """``"10,20.5"`` -> (10.0, 20.5); as :func:`int_list` for positive numbers."""
    return _list(flag, text, float, "a comma-separated list of positive numbers")


def _list(flag: str, text: str | None, kind: type, allowed: str) -> tuple | None:
    from scaleplan.errors import SpecError

    if text is None:
        return None
    try:
        vals = tuple(kind(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise SpecError(flag, text, allowed) from None
    if not vals or any(not v > 0 for v in vals):
        raise SpecError(flag, text, allowed)
    return vals


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


# --- bounds of every numeric option -------------------------------------------------------------
# (kind, lo, hi, lo_open, hi_open, allowed): kind "int"/"float" for one value, "ints"/"floats" for a
# comma-separated list. A value outside [lo, hi] (or NaN/inf, or an end that is open) is a
# one-line SpecError before the command does any work. Keys are "command.param" or "param".
# The caps are physical (docs/database.md "Input bounds"): see scaleplan.specs and scaleplan.profiles.
MAX_DAYS = 3650.0  # a ten-year training window; C_peak and every token count stay finite floats
# the largest token budget --tokens takes: 1e17 tokens, far beyond any training run, small enough that every
# sample count formed from it stays exact
MAX_TOKENS = 1e17
_BIG = 2**63 - 1   # database ids
Bound = tuple[str, float, float, bool, bool, str]


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _b(kind: str, lo: float, hi: float, lo_open: bool = False, allowed: str = "",
       hi_open: bool = False) -> Bound:
    lo_s = f"({_fmt(lo)}" if lo_open else f"[{_fmt(lo)}"
    hi_s = f"{_fmt(hi)})" if hi_open else f"{_fmt(hi)}]"
    noun = "numbers" if "float" in kind else "integers"
    return kind, lo, hi, lo_open, hi_open, allowed or f"{noun} in {lo_s}, {hi_s}"


def _sparsity() -> Bound:
    return _b("float", 0, 1, allowed="a sparsity in [0, 1)", hi_open=True)


def _bounds() -> dict[str, Bound]:
    from scaleplan.profiles import MAX_NODES
    from scaleplan.specs import (
        MAX_DEGREE,
        MAX_EXPERTS,
        MAX_GBS,
        MAX_HEADS,
        MAX_MBS,
        MAX_SEQLEN,
        MAX_TOPK,
        MAX_VOCAB,
        MAX_VPP,
    )

    return {
        "devices": _b("int", 1, MAX_DEGREE), "top": _b("int", 1, 100_000),
        "max_tp": _b("int", 1, MAX_DEGREE), "max_pp": _b("int", 1, MAX_DEGREE),
        "max_ep": _b("int", 1, MAX_DEGREE), "max_cp": _b("int", 1, MAX_DEGREE),
        "mbs": _b("ints", 1, MAX_MBS), "vpp": _b("ints", 1, MAX_VPP),
        "mem_fraction": _b("float", 0, 1, True, "a fraction in (0, 1]"),
        "nodes": _b("ints", 1, MAX_NODES), "days": _b("floats", 0, MAX_DAYS, True,
                                                     f"days in (0, {MAX_DAYS:g}] (finite)"),
        "goodput": _b("float", 0, 1, True, "a fraction in (0, 1]"),
        "gbs": _b("int", 1, MAX_GBS), "seqlen": _b("int", 1, MAX_SEQLEN),
        "q": _b("ints", 1, 256, allowed="ladder seeds in [1, 256] (L = 4q <= 1024 layers)"),
        "experts": _b("ints", 1, MAX_EXPERTS), "topk": _b("ints", 1, MAX_TOPK),
        "search.g": _b("ints", 1, 1024), "g": _b("float", 1, 1024),
        "s_min": _sparsity(), "s_max": _sparsity(), "s": _sparsity(),
        "tpp_min": _b("float", 0, 1e6, True), "tpp_max": _b("float", 0, 1e6, True),
        "vocab": _b("int", 1, MAX_VOCAB), "kv_heads": _b("int", 1, MAX_HEADS),
        "workers": _b("int", 0, 1024, allowed="0 (auto) or a process count up to 1024"),
        "calibration": _b("int", 1, _BIG, allowed="a calibration id (see `scaleplan calibrate list`)"),
        "resume": _b("ints", 1, _BIG, allowed="run ids (see `scaleplan bench runs`)"),
        "run_ids": _b("ints", 1, _BIG, allowed="run ids (see `scaleplan bench runs`)"),
        "steps": _b("int", 1, 100_000), "warmup": _b("int", 0, 100_000),
        "nproc": _b("int", 1, 1024), "threads": _b("int", 1, 4096), "size": _b("int", 1, 65_536),
        "n_tot": _b("float", 0, 1e16, True, "a parameter count in (0, 1e16]"),
        "d": _b("float", 0, 1e18, True, "a token count in (0, 1e18]"),
        "tokens": _b("float", 0, MAX_TOKENS, True, f"a token count in (0, {MAX_TOKENS:.0e}]"),
        "budget": _b("floats", 0, 1e32, True, "FLOP budgets in (0, 1e32]"),
        "points": _b("int", 2, 10_000), "bootstrap": _b("int", 0, 100_000), "starts": _b("int", 1, 100_000),
        "restarts": _b("int", 0, 100_000), "seed": _b("int", 0, 2**32 - 1),
        "samples": _b("int", 0, 100_000, allowed="0 (none) to 100000 draws"),
        "prescription": _b("float", 0, 1e32, True, "a FLOP count in (0, 1e32]"),
        "s_step": _b("float", 0, 0.5, True, "a sparsity bin width in (0, 0.5]"),
        # search --robust's quantile, checked whether or not --robust is given (run.check_request's range)
        "robust_quantile": _b("float", 0.5, 1, allowed="a quantile in [0.5, 1)", hi_open=True),
        # scaleplan plan: the target, the constraints and the goodput model
        "target_loss": _b("float", 0, 100, True, "a loss in nats in (0, 100]"),
        "max_days": _b("float", 0, MAX_DAYS, True, f"days in (0, {MAX_DAYS:g}]"),
        "max_gpu_hours": _b("float", 0, 1e12, True, "GPU-hours in (0, 1e12]"),
        "max_cost": _b("float", 0, 1e13, True, "USD in (0, 1e13]"),
        "max_gpus": _b("int", 1, 2**24, allowed="a GPU count in [1, 16777216]"),
        "failure_rate": _b("float", 0, 1, allowed="failures per GPU-hour in [0, 1]"),
        "restart_min": _b("float", 0, 43200, allowed="minutes in [0, 43200]"),
        "ckpt_save_s": _b("float", 0, 86400, allowed="seconds in [0, 86400]"),
        "ckpt_interval_min": _b("float", 0, 43200, True, "minutes in (0, 43200]"),
    }


def _numbers(kind: str, value: Any) -> list[float] | None:
    """The numbers in ``value`` (None where a non-numeric list is left to the command's own parser)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for x in value for v in (_numbers(kind, x) or [])]
    try:
        return [int(x) if "int" in kind else float(x) for x in str(value).replace(" ", "").split(",") if x]
    except ValueError:
        return None


def check_bounds(command: str, params: dict[str, Any]) -> None:
    """Raise SpecError for the first option of ``command`` whose value is outside its bound
    (table above), or a device/node count beyond what the profile's node count can mean."""
    from scaleplan.errors import SpecError

    bounds = _bounds()
    for name, value in params.items():
        b = bounds.get(f"{command}.{name}") or bounds.get(name)
        if b is None or value is None:
            continue
        kind, lo, hi, lo_open, hi_open, allowed = b
        flag = "--" + name.replace("_", "-")
        for v in _numbers(kind, value) or []:
            ok = math.isfinite(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
            if not ok or ("int" in kind and v != int(v)):
                raise SpecError(flag, v, allowed)
    _check_profile_size(params)


def _check_profile_size(params: dict[str, Any]) -> None:
    """--devices within max_nodes * gpus_per_node of the profile (--profile, else the spec's node type);
    --nodes within its max_nodes."""
    from scaleplan.errors import SpecError
    from scaleplan.profiles import max_devices, profile_file

    devices, nodes = params.get("devices"), params.get("nodes")
    name, field = params.get("profile"), "--devices"
    spec = params.get("spec_path") or params.get("spec")
    if "devices" in params and spec is not None and (devices is None or not name):
        from scaleplan.specs import load_spec

        sp = load_spec(spec)
        name = name or sp.hardware.node_type
        if devices is None:  # the command falls back to the spec's device count: same bound
            devices, field = sp.device_count(), "search.num_devices"
    if not name or (devices is None and nodes is None):
        return
    if devices is not None and devices > max_devices(name):
        raise SpecError(field, devices, f"1 to {max_devices(name)} devices on {name}")
    prof = profile_file(name)
    for n in _numbers("ints", nodes) or []:
        if n > prof.max_nodes or (prof.measure_peak and n > 1):
            cap = 1 if prof.measure_peak else prof.max_nodes
            raise SpecError("--nodes", n, f"1 to {cap} nodes of {name}")


def debug_option():
    """A ``--debug`` flag for a leaf command (sets STATE.debug; the command never sees it).

    Built the way typer builds a parameter from a signature, through the one typer function that does it
    in every release scaleplan supports: ``_get_param`` (typer >= 0.2x) or ``get_click_param``, which
    returns (param, convertor), before it (the private ``_get_params_name_from_function`` used here
    earlier does not exist in the typer of a CUDA image, where every command failed to start)."""
    import typer.main as tm
    from typer.models import ParamMeta

    meta = ParamMeta(name="debug", annotation=bool,
                     default=typer.Option(False, "--debug", help="Show tracebacks.", is_eager=True))
    make = getattr(tm, "_get_param", None)
    opt = make(meta) if make is not None else tm.get_click_param(meta)[0]
    opt.expose_value = False
    opt.callback = set_debug
    return opt


def set_debug(ctx, param, value):
    if value:
        STATE.debug = True
    return value


class ScaleplanCommand(TyperCommand):
    """Every leaf command: accepts ``--debug`` and checks its numeric options' bounds
    (:func:`check_bounds`) after parsing, before any work."""

    def __init__(self, *args: Any, params: list | None = None, **kw: Any) -> None:
        params = list(params or [])
        if not any(p.name == "debug" for p in params):
            params.append(debug_option())
        super().__init__(*args, params=params, **kw)

    def parse_args(self, ctx, args):
        rest = super().parse_args(ctx, args)
        if not ctx.resilient_parsing:
            check_bounds(self.name or "", ctx.params)
        return rest


def use_scaleplan_commands(app: typer.Typer) -> None:
    """Make every command of ``app`` (and of its sub-apps) a :class:`ScaleplanCommand`."""
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):  # typer fills in its own class as the default
            info.cls = ScaleplanCommand
    for group in app.registered_groups:
        if group.typer_instance is not None:
            use_scaleplan_commands(group.typer_instance)
