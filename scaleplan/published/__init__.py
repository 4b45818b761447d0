"""Published training runs of the catalogue's models, as specs: what each ran (model, system, devices, layout,
global batch, training stack) and what its publisher measured (``runs.yaml`` in this folder, its header says the
fields). They are the out-of-sample checks of docs/accuracy.md ("Published runs of today's models"), printed by
benchmarks/stack_examples.py, and a user's starting point: a run's id is a spec name wherever a spec is accepted
(``scaleplan estimate qwen3-30b-a3b-fp8-published-stack``), and ``scaleplan spec published`` lists them.

Never imports torch.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from scaleplan.yamlio import load_yaml


@dataclass(frozen=True)
class PublishedRun:
    """One run of ``runs.yaml``: ``id`` (its spec name), ``name`` (its label in benchmarks and docs), ``group`` (the
    label of the set it was published or added in), ``model`` (a catalogue name), ``system`` (a cluster profile),
    ``devices``, ``layout`` (the degrees, mbs and ckpt as :class:`~scaleplan.specs.Layout` fields, the end stages'
    layers as the run's ``split`` states them), ``doc`` (its whole spec mapping) and ``published_step_s`` (seconds per step its publisher
    measured; None on a comparison row that reruns a published job on another stack)."""

    id: str
    name: str
    group: str
    model: str
    system: str
    devices: int
    layout: dict[str, Any]
    doc: dict[str, Any]
    published_step_s: float | None


def _run(entry: dict, group: str) -> PublishedRun:
    """A runs.yaml entry as a :class:`PublishedRun`: the catalogue model's spec with the run's precision, batch,
    optimizer, system, device count, layout (its ``parallelism`` block, micro-batch and checkpointing) and stack."""
    from scaleplan import catalogue

    doc = catalogue.spec_data(entry["model"])
    if doc is None:
        raise KeyError(f"published run {entry['id']}: no catalogue model {entry['model']}")
    lay = dict(entry["layout"])
    if "precision" in entry:
        doc["model"]["precision"] = entry["precision"]
    doc["data"] = {**doc["data"], **entry["data"], "microbatch_sz": lay["mbs"]}
    if "optimizer" in entry:
        doc["optimizer"] = {**doc.get("optimizer", {}), "optimizer_type": entry["optimizer"]}
    doc["hardware"] = {"node_type": entry["system"]}
    doc["search"] = {**doc.get("search", {}), "num_devices": entry["devices"]}
    doc["performance"] = {**doc.get("performance", {}), "activation_checkpointing_type": lay["ckpt"]}
    doc["parallelism"] = {k: v for k, v in lay.items() if k not in ("mbs", "ckpt")}
    if entry["stack"]:
        doc["stack"] = dict(entry["stack"])
    pub = entry.get("published") or {}
    tok = pub.get("tokens_per_gpu_s")
    step = doc["data"]["gbs"] * doc["data"]["seqlen"] / (entry["devices"] * tok) if tok else pub.get("step_s")
    return PublishedRun(entry["id"], entry["name"], group, entry["model"], entry["system"], int(entry["devices"]),
                        lay, doc, None if step is None else float(step))


@lru_cache(maxsize=1)
def _file() -> tuple[tuple[tuple[str, str], ...], tuple[PublishedRun, ...]]:
    data = load_yaml(resources.files(__name__).joinpath("runs.yaml").read_text())
    groups = tuple((g["label"], g["about"]) for g in data["groups"])
    return groups, tuple(_run(e, g["label"]) for g in data["groups"] for e in g["runs"])


def runs() -> tuple[PublishedRun, ...]:
    """Every run, in the file's order (the order benchmarks/stack_examples.py prints them)."""
    return _file()[1]


def groups() -> tuple[tuple[str, str], ...]:
    """(label, about) of each set of runs, in the file's order: where its runs and their stacks come from."""
    return _file()[0]


def find(name: str) -> PublishedRun | None:
    """The run whose id or name is ``name`` (ids case-insensitive), else None."""
    key = str(name).strip()
    return next((r for r in runs() if key.lower() == r.id or key == r.name), None)


def spec_data(name: str) -> dict[str, Any] | None:
    """A copy of the spec mapping of run ``name`` (id or name), or None when no run has it."""
    r = find(name)
    return None if r is None else copy.deepcopy(r.doc)
