"""The catalogue of well-known models: a spec by name wherever a spec file is accepted
(``scaleplan estimate deepseek-v3 --devices 256 ...``).

One YAML file per model in this folder: ``title``, ``aliases`` (other names it answers to, such as its Hugging Face
repository id), ``sources`` (where each figure comes from: ``architecture``, ``parameters`` as its card publishes
them, ``run``: which of the data/optimizer/hardware blocks are the published run's and which planning defaults)
and ``spec`` (a spec mapping, docs/spec.md). The Hugging Face families' model blocks are what ``scaleplan spec
from-hf`` writes from their public config.json (tests/cli/test_catalogue.py checks both, and the parameter counts
against the cards).
"""
from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

from scaleplan.yamlio import load_yaml


@lru_cache(maxsize=1)
def _entries() -> dict[str, dict[str, Any]]:
    out = {}
    for f in sorted(resources.files(__name__).iterdir(), key=lambda p: p.name):
        if f.name.endswith(".yaml"):
            out[f.name.removesuffix(".yaml")] = load_yaml(f.read_text())
    return out


def names() -> list[str]:
    """The catalogue's model names (the file names), sorted."""
    return list(_entries())


def resolve(name: str) -> str | None:
    """The catalogue name ``name`` stands for (case-insensitive; a name or an alias), else None."""
    key = str(name).strip().lower()
    for n, e in _entries().items():
        if key == n or key in (a.lower() for a in e.get("aliases") or ()):
            return n
    return None


def entry(name: str) -> dict[str, Any]:
    """The whole entry (title, aliases, sources, spec) of a catalogue name or alias. Raises KeyError."""
    n = resolve(name)
    if n is None:
        raise KeyError(name)
    return _entries()[n]


def spec_data(name: str) -> dict[str, Any] | None:
    """A copy of the spec mapping of a catalogue name or alias, or None when ``name`` is none of them."""
    import copy

    n = resolve(name)
    return None if n is None else copy.deepcopy(_entries()[n]["spec"])
