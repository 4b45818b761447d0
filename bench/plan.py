"""``scaleplan bench plan``: the exact table points an estimate looks up, and measuring just those.

The points come from ``Estimator(profile).lookups(spec, n_devices, layouts)`` (the estimator owns
which shapes it reads). ``run_lookups`` turns them into a preset whose suite blocks list explicit
``points`` and runs it like any other preset (resumable, provenance, same tables), with the
``node`` preset's timing policy. Points a machine cannot measure (a collective group larger than
the processes launched here, inter-node groups on one node) are counted, not stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scaleplan.bench.config import load_preset, parse_preset


def lookups(
    spec_path: Path, n_devices: int, layouts: list[str] | None, profile: str | None, url: str | None,
    stack: str = "megatron",
) -> tuple[dict[str, list[dict[str, Any]]], str]:
    """(suite -> key dicts, target profile) for a spec on ``n_devices``. ``stack`` as
    :class:`scaleplan.estimator.Estimator`'s: "reference" (a ``scaleplan validate`` run) also asks,
    on a GPU profile, for the reference model's host rows ``ops:*`` of each checkpoint mode.
    Raises SpecError (also for an unknown stack)."""
    from scaleplan.estimator import Estimator

    from scaleplan.db.session import ensure_schema, resolve_url
    from scaleplan.specs import load_spec, parse_layout

    spec = load_spec(spec_path)
    prof = profile or spec.hardware.node_type
    url = resolve_url(url)
    ensure_schema(url)
    parsed = [parse_layout(x) for x in layouts] if layouts else None
    est = Estimator(profile=prof, db_url=url, extrapolate="clamp", stack=stack)
    return est.lookups(spec, n_devices, parsed), prof


def lookups_preset(points: dict[str, list[dict[str, Any]]], label: str):
    """A preset measuring exactly ``points`` (suite blocks with explicit points)."""
    base = load_preset("node")
    suites: dict[str, dict[str, Any]] = {}
    for suite, pts in points.items():
        if not pts:
            continue
        block: dict[str, Any] = {"points": pts}
        dtypes = sorted({p["dtype"] for p in pts if "dtype" in p and p["dtype"] != "fp32"}) or ["fp32"]
        if suite in ("vocab",):
            block["dtypes"] = dtypes  # the cross-entropy input precision
        if suite == "collectives":
            block["timeout_s"] = base.suites.get("collectives", {}).get("timeout_s", 3600)
        suites[suite] = block
    return parse_preset(
        {
            "name": label,
            "description": "points looked up by an estimate",
            "timing": base.timing.model_dump(),
            "mem_fraction": base.mem_fraction,
            "suites": suites,
        }
    )


def run_lookups(
    points: dict[str, list[dict[str, Any]]],
    spec_path: Path,
    url: str | None,
    profile: str | None = None,
    device: str | None = None,
    on_event=None,
    as_profile: bool = False,
):
    """Measure the looked-up points on this machine; returns the runner's SuiteResults.

    Raises SpecError when ``profile``'s GPU is not this device (unless ``as_profile``)."""
    from scaleplan.bench.runner import run_preset

    preset = lookups_preset(points, f"plan:{Path(spec_path).name}")
    return run_preset(
        preset, url, profile=profile, device=device, preset_label=preset.name, on_event=on_event,
        as_profile=as_profile,
    )
