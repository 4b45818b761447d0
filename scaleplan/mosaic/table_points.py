"""The table points that decide a search's answer: the lookups of its near-tie set (``bench plan --search``).

A search's answer is only as good as the tables behind the candidates that could be optimal. Measuring the
points their best plans look up (and nothing else) is the cheapest way to firm the answer up: this module
reads a ``scaleplan search --json`` result, rebuilds each near-tie candidate (P(optimal) >= 5%; the optimum
alone when the search ran without --samples) as a spec with its best plan's layout, and asks the estimator
which table points that plan looks up (``Estimator.lookups``). Points are deduplicated across candidates.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scaleplan.errors import SpecError
from scaleplan.estimator.layout import FIELDS as LAYOUT_FIELDS


def read_search(path: Path) -> dict:
    """A search JSON (``scaleplan search --json`` output). Raises SpecError on a missing or unusable file."""
    path = Path(path)
    try:
        out = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SpecError("--search", str(path), f"a readable `scaleplan search --json` output ({e})") from None
    if not isinstance(out, dict) or "envelope" not in out or "best" not in out:
        raise SpecError("--search", str(path), "a `scaleplan search --json` output (with 'best' and 'envelope')")
    return out


def deciding_candidates(search: dict) -> list[dict]:
    """The near-tie set (``near_ties``), else the optimum alone; [] when the search found nothing feasible."""
    near = search.get("near_ties") or []
    return near if near else ([search["best"]] if search.get("best") else [])


def candidate_spec(c: dict, env: dict, profile: str):
    """(Spec, Layout) of one search candidate: its ladder geometry with the search's vocab and kv heads (the
    row's ``geometry``, else the envelope's, else the ladder defaults), the envelope's batch and optimizer,
    its best plan's layout."""
    from scaleplan.geometry import DEFAULT_KV_HEADS, DEFAULT_VOCAB, ladder_model
    from scaleplan.specs import DataBlock, HardwareBlock, Layout, OptimizerBlock, Spec

    geo = c.get("geometry") or {}
    vocab = geo.get("vocab") or env.get("vocab") or DEFAULT_VOCAB
    kv = geo.get("n_kv_heads") or env.get("kv_heads") or DEFAULT_KV_HEADS
    model = ladder_model(int(c["q"]), int(c["n_experts"]), int(c["topk"]), int(c["g"]), vocab=int(vocab),
                         kv_heads=int(kv))
    spec = Spec(model=model, data=DataBlock(gbs=int(env["gbs"]), seqlen=int(env["seqlen"])),
                optimizer=OptimizerBlock(optimizer_type=env["optimizer"]), hardware=HardwareBlock(node_type=profile))
    return spec, Layout(**{k: c["layout"][k] for k in LAYOUT_FIELDS if k in c["layout"]})


def deciding_points(search: dict, est) -> dict[str, Any]:
    """Suite -> deduplicated points (each with ``needed_by``: the candidates, as 'q/E/K/G', that look it up),
    and the candidates. ``est``: an Estimator of the search's profile."""
    env = search["envelope"]
    suites: dict[str, dict[str, dict]] = {}
    names = []
    for c in deciding_candidates(search):
        spec, layout = candidate_spec(c, env, search["profile"])
        name = f"q{c['q']}/E{c['n_experts']}/K{c['topk']}/G{c['g']}"
        names.append(name)
        for suite, pts in est.lookups(spec, int(search["n_devices"]), [layout]).items():
            seen = suites.setdefault(suite, {})
            for p in pts:
                key = json.dumps(p, sort_keys=True, default=str)
                seen.setdefault(key, {**p, "needed_by": []})["needed_by"].append(name)
    return {"candidates": names, "lookups": {s: list(v.values()) for s, v in suites.items()},
            "counts": {s: len(v) for s, v in suites.items()}}
