"""Output you can launch: the full geometry of a model, a spec YAML of a chosen model and layout, and the
Megatron-Core training arguments of that pair.

* :func:`geometry_dict` is the ``geometry`` object every planner output (search, layouts, estimate) carries.
* :func:`spec_document` / :func:`write_spec` build a spec (the paper's lst:perf-model-input format, see
  docs/spec.md) that ``scaleplan estimate`` and ``scaleplan validate`` accept unchanged; it is validated with
  :func:`scaleplan.specs.parse_spec` before it is written, so a written file always loads.
* :func:`megatron_args` maps a spec and a layout to Megatron-Core ``pretrain_gpt.py`` arguments; the mapping is
  the one table in docs/megatron.md (a test checks every flag emitted there is documented).

Never imports torch (planner commands use it).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from scaleplan.errors import SpecError
from scaleplan.specs import LAYOUT_FIELDS, Layout, ModelBlock, Spec, parse_spec


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
    }


def _layout(layout: dict[str, Any] | Layout) -> dict[str, Any]:
    d = layout.model_dump() if isinstance(layout, Layout) else dict(layout)
    d.setdefault("etp", 1)
    d.setdefault("vpp", 1)
    missing = [k for k in LAYOUT_FIELDS if d.get(k) is None]
    if missing:
        raise SpecError("layout", d, f"all of {', '.join(LAYOUT_FIELDS)} (missing {', '.join(missing)})")
    return {k: (str(d[k]) if k == "ckpt" else int(d[k])) for k in LAYOUT_FIELDS}


def spec_document(model: ModelBlock, layout: dict[str, Any] | Layout, *, gbs: int, seqlen: int, optimizer: str,
                  node_type: str, n_devices: int) -> dict[str, Any]:
    """The spec mapping of ``model`` trained under ``layout`` on ``n_devices`` devices of ``node_type``.

    The layout goes to ``parallelism`` (tp, cp, pp, dp, ep, etp, vpp), ``data.microbatch_sz`` (mbs) and
    ``performance.activation_checkpointing_type`` (ckpt). Raises SpecError when the result does not validate.
    """
    lo = _layout(layout)
    doc = {
        "model": model.model_dump(mode="json"),
        "search": {"num_devices": int(n_devices)},
        "performance": {"activation_checkpointing_type": lo["ckpt"]},
        "optimizer": {"optimizer_type": optimizer},
        "data": {"gbs": int(gbs), "seqlen": int(seqlen), "microbatch_sz": lo["mbs"]},
        "hardware": {"node_type": node_type},
        "parallelism": {k: lo[k] for k in LAYOUT_FIELDS if k not in ("mbs", "ckpt")},
    }
    parse_spec(doc, source="emitted spec")  # a written spec must load: fail here, not in the user's estimate
    return doc


def spec_from(spec: Spec, layout: dict[str, Any] | Layout, n_devices: int) -> dict[str, Any]:
    """A copy of ``spec`` with its layout replaced by ``layout`` (for ``layouts --emit-spec``)."""
    return spec_document(spec.model, layout, gbs=spec.data.gbs, seqlen=spec.data.seqlen,
                         optimizer=spec.optimizer.optimizer_type, node_type=spec.hardware.node_type,
                         n_devices=n_devices)


def write_spec(path: str | Path, doc: dict[str, Any], header: str = "") -> Path:
    """Write ``doc`` as YAML to ``path`` (``header`` lines become comments). Raises SpecError when the file
    cannot be written."""
    import yaml

    p = Path(path)
    text = "".join(f"# {line}\n" for line in header.splitlines()) + yaml.safe_dump(doc, sort_keys=False)
    try:
        p.write_text(text)
    except OSError as e:
        raise SpecError("--emit-spec", str(path), f"a writable file path ({e.strerror})") from None
    return p


# --------------------------------------------------------------------------------- Megatron-Core arguments

_PRECISION = {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp8": ["--bf16", "--fp8-format", "hybrid"],
              "fp4": ["--bf16", "--fp4-format", "e2m1"], "tf32": [], "fp32": []}
_RECOMPUTE = {
    "none": [],
    "selective": ["--recompute-granularity", "selective", "--recompute-modules", "core_attn"],
    "super-selective": ["--recompute-granularity", "selective", "--recompute-modules", "core_attn", "layernorm",
                        "moe_act"],
    "full": ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"],
}
# muon -> dist_muon: Megatron-Core's layer-wise distributed optimizer (LayerWiseDistributedOptimizer), which
# shards whole weight matrices over DP - the optimizer the estimator models (estimator.compute._optimizer).
# Plain --optimizer muon keeps every matrix's state and Newton-Schulz step on every DP rank.
_OPTIMIZER = {"adam": "adam", "adamw": "adam", "sgd": "sgd", "muon": "dist_muon", "scion": None}


def check_emit(emit: str | None, optimizer: str | None = None, field: str = "optimizer.optimizer_type",
               files: dict[str, Path | None] | None = None) -> None:
    """Before any work: raises SpecError naming --emit unless it is None or 'megatron', naming ``field`` when
    Megatron-Core has no such optimizer, or naming the flag of an output file whose directory is missing."""
    for flag, path in (files or {}).items():
        if path is not None and not Path(path).resolve().parent.is_dir():
            raise SpecError(flag, str(path), "a file in an existing directory")
    if emit is not None and emit != "megatron":
        raise SpecError("--emit", emit, "megatron")
    if emit == "megatron" and optimizer is not None:
        megatron_optimizer(optimizer, field)


def megatron_optimizer(name: str, field: str = "optimizer.optimizer_type") -> str:
    """Megatron-Core's --optimizer for ``name``. Raises SpecError naming ``field`` where it has none (Scion)."""
    opt = _OPTIMIZER.get(name)
    if opt is None:
        raise SpecError(field, name, "an optimizer Megatron-Core's --optimizer offers (adam, adamw, sgd, muon)")
    return opt


def moe_layer_pattern(n_layers: int, first_dense: int, frequency: int) -> list[int]:
    """Megatron-Core's --moe-layer-freq list: 1 for an MoE block, 0 for a dense one. The first ``first_dense``
    blocks are dense, then every ``frequency``-th block is MoE (the count scaleplan.geometry uses)."""
    return [0 if i < first_dense else int((i - first_dense + 1) % frequency == 0) for i in range(n_layers)]


def megatron_args(spec: Spec, layout: dict[str, Any] | Layout) -> list[list[str]]:
    """Megatron-Core ``pretrain_gpt.py`` arguments for ``spec`` under ``layout``, one flag (with its values)
    per item. The mapping is docs/megatron.md's table. Raises SpecError for an optimizer Megatron-Core lacks."""
    m, lo = spec.model, _layout(layout)
    out: list[list[str]] = [
        ["--num-layers", str(m.n_layers)], ["--hidden-size", str(m.hidden_sz)],
        ["--ffn-hidden-size", str(m.inter_sz)], ["--num-attention-heads", str(m.n_q_heads)],
        ["--kv-channels", str(m.head_dim)],
    ]
    if m.n_kv_heads != m.n_q_heads:
        out += [["--group-query-attention"], ["--num-query-groups", str(m.n_kv_heads)]]
    out += [["--vocab-size", str(m.vocab_sz)], ["--make-vocab-size-divisible-by", "1"],
            ["--seq-length", str(spec.data.seqlen)], ["--max-position-embeddings", str(spec.data.seqlen)],
            ["--normalization", "RMSNorm"], ["--disable-bias-linear"]]
    if m.glu:
        out.append(["--swiglu"])
    out.append(["--position-embedding-type", "rope" if m.rotary_embeds else "learned_absolute"])
    if not m.tie_embeddings:
        out.append(["--untie-embeddings-and-output-weights"])
    if not m.dropout:
        out += [["--attention-dropout", "0.0"], ["--hidden-dropout", "0.0"]]
    if m.attn_gate:
        out.append(["--attention-output-gate"])
    if _PRECISION[m.precision]:
        out.append(_PRECISION[m.precision])
    if m.moe is not None:
        out += _moe_args(m)
    out += [["--tensor-model-parallel-size", str(lo["tp"])], ["--pipeline-model-parallel-size", str(lo["pp"])],
            ["--context-parallel-size", str(lo["cp"])], ["--expert-model-parallel-size", str(lo["ep"])],
            ["--expert-tensor-parallel-size", str(lo["etp"])]]
    if lo["tp"] > 1:
        out.append(["--sequence-parallel"])
    if lo["vpp"] > 1:
        out.append(["--num-layers-per-virtual-pipeline-stage", str(m.n_layers // (lo["pp"] * lo["vpp"]))])
    out += [["--micro-batch-size", str(lo["mbs"])], ["--global-batch-size", str(spec.data.gbs)]]
    if _RECOMPUTE[lo["ckpt"]]:
        out.append(_RECOMPUTE[lo["ckpt"]])
    opt = megatron_optimizer(spec.optimizer.optimizer_type)
    out.append(["--optimizer", opt])
    if opt == "adam":  # dist_muon shards on its own and wants the distributed-optimizer options off
        out.append(["--use-distributed-optimizer"])
    out.append(["--cross-entropy-loss-fusion"])
    return out


def _moe_args(m: ModelBlock) -> list[list[str]]:
    moe = m.moe
    pattern = moe_layer_pattern(m.n_layers, moe.first_dense_layers, moe.moe_frequency)
    out = [["--num-experts", str(moe.n_experts)], ["--moe-router-topk", str(moe.experts_per_token)],
           ["--moe-ffn-hidden-size", str(moe.expert_inter_sz)],
           ["--moe-layer-freq", "[" + ",".join(map(str, pattern)) + "]"],
           ["--moe-grouped-gemm"], ["--moe-token-dispatcher-type", "alltoall"], ["--moe-router-dtype", "fp32"]]
    if moe.shared_expert_inter_sz:
        out += [["--moe-shared-expert-intermediate-size", str(moe.shared_expert_inter_sz)],
                ["--moe-shared-expert-overlap"]]
    if moe.capacity_factor != 1.0:  # 1.0: balanced routing, Megatron's dropless default
        out += [["--moe-expert-capacity-factor", f"{moe.capacity_factor:g}"], ["--moe-pad-expert-input-to-capacity"]]
    return out


def render_megatron(args: list[list[str]], n_devices: int, gpus_per_node: int) -> str:
    """Shell text: a torchrun comment line and one flag per line, joined with backslashes."""
    import shlex

    nodes = max(1, n_devices // max(1, gpus_per_node))
    head = (f"# {n_devices} GPUs = {nodes} nodes x {gpus_per_node}: torchrun --nnodes {nodes} "
            f"--nproc-per-node {gpus_per_node} pretrain_gpt.py \\")
    lines = [head]
    lines += ["  " + " ".join(shlex.quote(a) for a in flag) + " \\" for flag in args]
    lines[-1] = lines[-1].removesuffix(" \\")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ search candidates

def ladder_model_of(row: dict[str, Any], grid) -> ModelBlock:
    """The model block of a search candidate (a ``best``/``top`` JSON row: q, n_experts, topk, g) on ``grid``."""
    from types import SimpleNamespace

    from scaleplan.mosaic.ladder import geometry_model

    return geometry_model(SimpleNamespace(q=row["q"], n_experts=row["n_experts"], topk=row["topk"], g=row["g"]),
                          grid)


def add_geometry(row: dict[str, Any] | None, grid) -> None:
    """Give a search candidate row its full ``geometry`` (its layout is complete: the search writes every
    field of :data:`scaleplan.specs.LAYOUT_FIELDS`)."""
    if not row:
        return
    row["geometry"] = geometry_dict(ladder_model_of(row, grid))


def search_spec(row: dict[str, Any], grid, *, gbs: int, seqlen: int, optimizer: str, node_type: str,
                n_devices: int) -> dict[str, Any]:
    """The spec document of a search candidate: its ladder model under its best layout."""
    return spec_document(ladder_model_of(row, grid), row["layout"], gbs=gbs, seqlen=seqlen, optimizer=optimizer,
                         node_type=node_type, n_devices=n_devices)
