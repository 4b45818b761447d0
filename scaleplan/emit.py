"""Output you can launch: the full geometry of a model, a spec YAML of a chosen model and layout, and the
Megatron-Core training arguments of that pair.

* :func:`geometry_dict` is the ``geometry`` object every planner output (search, layouts, estimate) carries.
* :func:`spec_document` / :func:`write_spec` build a spec (the paper's lst:perf-model-input format, see
  docs/spec.md) that ``scaleplan estimate`` and ``scaleplan validate`` accept unchanged; it is validated with
  :func:`scaleplan.specs.parse_spec` before it is written, so a written file always loads.
* :func:`megatron_args` (scaleplan.megatron.args) maps a spec and a layout to Megatron-LM ``pretrain_gpt.py``
  arguments; the mapping is the one table in docs/megatron.md (a test checks every flag emitted there is documented).

Never imports torch (planner commands use it).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from scaleplan.errors import SpecError
from scaleplan.estimator.layout import FIELDS as LAYOUT_FIELDS
from scaleplan.estimator.layout import SPLIT_FIELDS
from scaleplan.megatron.args import (  # noqa: F401  (Megatron-LM arguments: re-exported from their own module)
    Budget,
    layout_dict,
    megatron_args,
    megatron_notes,
    megatron_optimizer,
    moe_layer_pattern,
    render_megatron,
)
from scaleplan.specs import Layout, ModelBlock, Spec, parse_spec
from scaleplan.stack import Stack
from scaleplan.yamlio import load_yaml


def geometry_dict(m: ModelBlock) -> dict[str, Any]:
    """Every number needed to build ``m``: L, d, d_ff, d_expert, heads, kv heads, head_dim, vocab, E, K, G and
    the shared expert's width (0: none). Widths in elements; a dense model has n_experts = topk = g = None.

    G = d_ff / d_expert (eq:granularity), an int when it divides, else a float.
    """
    moe = m.moe
    g: float | int | None = None
    if moe is not None:
        g = m.inter_sz / moe.expert_inter_sz
        g = int(g) if float(g).is_integer() else g
    return {
        "n_layers": m.n_layers, "d": m.hidden_sz, "d_ff": m.inter_sz,
        "d_expert": moe.expert_inter_sz if moe else None,
        "n_heads": m.n_q_heads, "n_kv_heads": m.n_kv_heads, "head_dim": m.head_dim, "vocab": m.vocab_sz,
        "n_experts": moe.n_experts if moe else None, "topk": moe.experts_per_token if moe else None, "g": g,
        "d_shared_expert": moe.shared_expert_inter_sz if moe else 0,
        "first_dense_layers": moe.first_dense_layers if moe else m.n_layers,
        "moe_frequency": moe.moe_frequency if moe else None,
        "capacity_factor": moe.capacity_factor if moe else None,
        "tie_embeddings": m.tie_embeddings, "precision": m.precision,
        **_features(m),
    }


def _features(m: ModelBlock) -> dict[str, Any]:
    """The model features beyond the paper's architecture that ``m`` uses (none: no keys, so the paper's
    geometries print as before): MLA widths, MTP layers, the sliding window, q/k norms, sinks, biases, router."""
    out: dict[str, Any] = {}
    if m.mla is not None:
        out["mla"] = m.mla.model_dump()
    if m.mtp_layers:
        out["mtp_layers"] = m.mtp_layers
    if m.sliding_window is not None:
        out["sliding_window"] = m.sliding_window.model_dump()
    for k, default in (("qk_norm", False), ("attention_sinks", False), ("linear_bias", "none")):
        if getattr(m, k) != default:
            out[k] = getattr(m, k)
    if m.moe is not None and (m.moe.router_score != "softmax" or m.moe.expert_bias):
        out["router"] = {"score": m.moe.router_score, "expert_bias": m.moe.expert_bias}
    return out


def spec_document(model: ModelBlock, layout: dict[str, Any] | Layout, *, gbs: int, seqlen: int, optimizer: str,
                  node_type: str, n_devices: int, stack: Stack | None = None) -> dict[str, Any]:
    """The spec mapping of ``model`` trained under ``layout`` on ``n_devices`` devices of ``node_type``, on
    training ``stack`` (its ``stack`` block: the fields off the paper's defaults; none for the paper's stack).

    The layout goes to ``parallelism`` (tp, cp, pp, dp, ep, etp, vpp), ``data.microbatch_sz`` (mbs) and
    ``performance.activation_checkpointing_type`` (ckpt). Raises SpecError when the result does not validate.
    """
    lo = layout_dict(layout)
    doc = {
        "model": model.model_dump(mode="json"),
        "search": {"num_devices": int(n_devices)},
        "performance": {"activation_checkpointing_type": lo["ckpt"]},
        "optimizer": {"optimizer_type": optimizer},
        "data": {"gbs": int(gbs), "seqlen": int(seqlen), "microbatch_sz": lo["mbs"]},
        "hardware": {"node_type": node_type},
        "parallelism": {k: lo[k] for k in (*LAYOUT_FIELDS, *SPLIT_FIELDS) if k in lo and k not in ("mbs", "ckpt")},
    }
    block = stack.model_dump(mode="json", exclude_defaults=True) if stack is not None else {}
    if block:
        doc["stack"] = block
    parse_spec(doc, source="emitted spec")  # a written spec must load: fail here, not in the user's estimate
    return doc


def spec_from(spec: Spec, layout: dict[str, Any] | Layout, n_devices: int) -> dict[str, Any]:
    """A copy of ``spec`` with its layout replaced by ``layout`` (for ``layouts --emit-spec``), its stack kept."""
    return spec_document(spec.model, layout, gbs=spec.data.gbs, seqlen=spec.data.seqlen,
                         optimizer=spec.optimizer.optimizer_type, node_type=spec.hardware.node_type,
                         n_devices=n_devices, stack=spec.stack)


def spec_text(doc: dict[str, Any], header: str = "") -> str:
    """``doc`` as YAML in its own key order, ``header`` lines as comments above it."""
    import yaml

    return "".join(f"# {line}\n" for line in header.splitlines()) + yaml.safe_dump(doc, sort_keys=False)


def write_spec(path: str | Path, doc: dict[str, Any], header: str = "", flag: str = "--emit-spec") -> Path:
    """Write ``doc`` as YAML to ``path`` (``header`` lines become comments) and read it back. Raises SpecError
    naming ``flag`` when the file cannot be written or does not read back as written."""
    p, text = Path(path), spec_text(doc, header)
    try:
        p.write_text(text)
        back = p.read_text()
    except OSError as e:
        raise SpecError(flag, str(path), f"a writable file path ({e.strerror})") from None
    if load_yaml(back) != load_yaml(text):
        raise SpecError(flag, str(path), "a file that reads back as written (it changed under the write)")
    return p


# --emit: Megatron-LM's GPTModel arguments (pretrain_gpt.py, the released core_v0.19.0), or its newest HybridModel's
# (pretrain_hybrid.py: the layer order and pipeline segments in --hybrid-layer-pattern)
EMIT_FORMS = ("megatron", "megatron-hybrid")


def check_emit(emit: str | None, optimizer: str | None = None, field: str = "optimizer.optimizer_type",
               files: dict[str, Path | None] | None = None) -> None:
    """Before any work: raises SpecError naming --emit unless it is None or 'megatron', naming ``field`` when
    Megatron-Core has no such optimizer, or naming the flag of an output file whose directory is missing."""
    for flag, path in (files or {}).items():
        if path is not None and not Path(path).resolve().parent.is_dir():
            raise SpecError(flag, str(path), "a file in an existing directory")
    if emit is not None and emit not in EMIT_FORMS:
        raise SpecError("--emit", emit, " or ".join(EMIT_FORMS))
    if emit in EMIT_FORMS and optimizer is not None:
        megatron_optimizer(optimizer, field)


# ------------------------------------------------------------------------------------ search candidates

def ladder_model_of(row: dict[str, Any], grid) -> ModelBlock:
    """The model block of a search candidate (a ``best``/``top`` JSON row: q, n_experts, topk, g) on ``grid``."""
    from types import SimpleNamespace

    from scaleplan.mosaic.ladder import geometry_model

    return geometry_model(SimpleNamespace(q=row["q"], n_experts=row["n_experts"], topk=row["topk"], g=row["g"]),
                          grid)


def add_geometry(row: dict[str, Any] | None, grid) -> None:
    """Give a search candidate row its full ``geometry`` (its layout is complete: the search writes every
    field of :data:`scaleplan.estimator.layout.FIELDS`)."""
    if not row:
        return
    row["geometry"] = geometry_dict(ladder_model_of(row, grid))


def search_spec(row: dict[str, Any], grid, *, gbs: int, seqlen: int, optimizer: str, node_type: str,
                n_devices: int, stack: Stack | None = None) -> dict[str, Any]:
    """The spec document of a search candidate: its ladder model under its best layout, on ``stack``."""
    return spec_document(ladder_model_of(row, grid), row["layout"], gbs=gbs, seqlen=seqlen, optimizer=optimizer,
                         node_type=node_type, n_devices=n_devices, stack=stack)
