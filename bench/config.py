"""Bench presets: YAML files naming the suites to run, their sweep axes and the timing policy.

A preset (``bench/presets/quick.yaml``, ``node.yaml`` or any file) looks like::

    name: quick
    timing: {warmup: 2, reps: 5, max_time_s: 0.3}
    mem_fraction: 0.5          # memory guard: fraction of device (or host) memory a point may use
    cpu_threads: 1             # optional: torch intra-op threads on CPU (default: torch's choice)
    suites:
      gemm: {dtypes: [fp32, bf16], m: [64, 256], n: [256], k: [256]}
      ...

Each suite validates its own block (``Config`` in its module; unknown keys are errors). A block
may list explicit ``points`` (dicts of the table's key columns) instead of grid axes; that is how
``scaleplan bench plan --run`` measures exactly the shapes an estimate looks up.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scaleplan.errors import SpecError
from scaleplan.yamlio import load_yaml


class TimingCfg(BaseModel):
    """Warm-up calls, timed repetitions (median/p10/p90 stored) and a per-point time budget (s)."""

    model_config = ConfigDict(extra="forbid")
    warmup: int = Field(3, ge=0)
    reps: int = Field(20, ge=1)
    min_reps: int = Field(3, ge=1)
    max_time_s: float = Field(5.0, gt=0)
    flush_l2: bool = True
    # the most seconds one point may take on a CPU (warm-up + min_reps calls, from a probe or the
    # first call); a point above it is skipped with a one-line reason and not stored
    cpu_point_budget_s: float = Field(20.0, gt=0)


class SuiteConfig(BaseModel):
    """Base of every suite block: explicit ``points`` override the grid axes when given."""

    model_config = ConfigDict(extra="forbid")
    points: list[dict[str, Any]] | None = None


class Preset(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    timing: TimingCfg = TimingCfg()
    mem_fraction: float = Field(0.8, gt=0, le=1)
    cpu_threads: int | None = Field(None, ge=1)  # torch intra-op threads for CPU runs (None: torch's default)
    suites: dict[str, dict[str, Any]]


def preset_names() -> list[str]:
    return sorted(p.stem for p in Path(str(resources.files("scaleplan.bench.presets"))).glob("*.yaml"))


def load_preset(name_or_path: str) -> Preset:
    """A built-in preset by name (quick, node) or a YAML file path. Raises SpecError."""
    path = Path(name_or_path)
    if not path.is_file():
        path = Path(str(resources.files("scaleplan.bench.presets"))) / f"{name_or_path}.yaml"
        if not path.is_file():
            raise SpecError(
                "--preset", name_or_path, f"one of {', '.join(preset_names())} or a preset YAML file"
            )
    try:
        data = load_yaml(path.read_text())
    except yaml.YAMLError as e:
        raise SpecError("--preset", str(path), f"valid YAML ({str(e).splitlines()[0]})") from None
    return parse_preset(data, str(path))


def parse_preset(data: Any, where: str = "preset") -> Preset:
    try:
        return Preset.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise SpecError(f"{where}: {loc}", err.get("input", "?"), err["msg"]) from None


def validate_suite_config(suite: str, model: type[SuiteConfig], block: dict[str, Any]) -> SuiteConfig:
    try:
        return model.model_validate(block or {})
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise SpecError(f"suites.{suite}.{loc}", err.get("input", "?"), err["msg"]) from None


def grid(**axes: list[Any]) -> list[dict[str, Any]]:
    """The cartesian product of named axes as a list of dicts (axis order = argument order)."""
    names = list(axes)
    return [dict(zip(names, vals)) for vals in itertools.product(*(axes[n] for n in names))]


def explicit_points(points: list[dict[str, Any]], key: tuple[str, ...], suite: str) -> list[dict[str, Any]]:
    """Explicit points reduced to the table's key columns; a missing key column is a SpecError."""
    out = []
    for i, p in enumerate(points):
        missing = [k for k in key if k not in p]
        if missing:
            raise SpecError(f"suites.{suite}.points[{i}]", p, f"a dict with keys {', '.join(key)}")
        out.append({k: p[k] for k in key})
    return out


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a run's config: the identity of a sweep for --resume."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()
