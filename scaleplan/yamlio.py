"""Reading YAML documents (specs, profiles, the catalogue, bench configs, observed runs).

PyYAML's safe loader on libyaml's parser where PyYAML was built with it (its wheels are): the same documents
and errors (yaml.YAMLError, with ``problem_mark``) as ``yaml.safe_load``, parsed about ten times faster; a
planner command reads its spec twice and a profile once, 6 ms of its start with the pure-Python parser.
"""
from __future__ import annotations

from typing import Any

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str) -> Any:
    """The document in ``text`` as ``yaml.safe_load`` builds it (dicts, lists, scalars). Raises
    yaml.YAMLError for text that is not YAML."""
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 (a safe loader)
