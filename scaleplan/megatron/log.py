"""A plan read back from a Megatron-LM training log, as Megatron-LM prints it (the reverse of :mod:`.args`).

What is read (formats of Megatron-LM :data:`scaleplan.megatron.MEGATRON_LM_VERSION`):

* the argument dump at start-up (megatron/training/arguments.py ``_print_args``): a line
  ``---- arguments ----``, then ``  name ...... value`` per argument (``str()`` of the value), then
  ``---- end of arguments ----``. It gives the model, layout, batch, precision, recompute and optimizer;
* the per-iteration lines (megatron/training/training.py ``training_log``): `` iteration N/ M |`` followed by
  ``name: value |`` fields, among them ``elapsed time per iteration (ms)``, ``throughput per GPU (TFLOP/s/GPU)``
  (with --log-throughput; Megatron-LM's own FLOP count), ``number of skipped iterations`` and
  ``number of nan iterations`` (both per logging interval);
* the memory report lines (megatron/training/utils ``report_memory``): ``memory (MB) | allocated: ... |
  max allocated: ... | reserved: ... | max reserved: ...`` (MiB).

:func:`read_log` returns a :class:`MegatronRun`: the spec (scaleplan.specs), the layout, the step time (median over
the logged intervals after warm-up, skipping intervals with skipped or NaN iterations; seconds) with its spread,
the median logged TFLOP/s per GPU, peak memory, and the provenance (file, sha256, iteration range). Every error is
a one-line SpecError naming the file and what is wrong.
"""
from __future__ import annotations

import ast
import hashlib
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaleplan.errors import SpecError
from scaleplan.megatron.args import moe_layer_pattern
from scaleplan.stack import RECOMPUTE_MODULES
from scaleplan.megatron.features import features_of_args, router_of_args
from scaleplan.megatron.hybrid import block_window_list, read_pattern
from scaleplan.megatron.pipeline_split import stated_split

_ARGS_START = re.compile(r"^-+ arguments -+$")
_ARGS_END = re.compile(r"^-+ end of arguments -+$")
_ARG = re.compile(r"^\s+(\w+) \.+ (.*)$")
_ITER = re.compile(r"\biteration\s+(\d+)/\s*(\d+|None) \|(.*)$")
# what training_log's line starts with, or its step-time field: a line with either is an iteration line, and one
# that does not parse as such (separators lost, a field garbled) is an error, never skipped
_LOOKS_LIKE_ITER = re.compile(r"\biteration\s+\d+\s*/\s*(\d+|None)\b|elapsed time per iteration")
_FIELD = re.compile(r"\s*([^|:]+?):\s*([^|]*?)\s*\|")
_MEM = re.compile(r"memory \(MB\) \| allocated: ([\d.]+) \| max allocated: ([\d.]+) \| reserved: ([\d.]+) \| "
                  r"max reserved: ([\d.]+)")
MIB = 1024.0 * 1024.0


@dataclass
class MegatronRun:
    """One Megatron-LM training run as its log shows it (times in seconds, memory in GB = 1e9 bytes)."""

    file: str
    sha256: str
    spec: Any                      # scaleplan.specs.Spec
    layout: dict[str, Any]         # scaleplan.estimator.layout.FIELDS
    n_devices: int
    step_s: float                  # median elapsed time per iteration after warm-up
    step_spread_s: tuple[float, float]  # (min, max) of the intervals the median is over
    iterations: tuple[int, int]    # first and last logged iteration the median is over
    n_intervals: int
    tflops_per_gpu: float | None = None  # median logged throughput (Megatron-LM's FLOP count)
    peak_mem_gb: float | None = None     # max 'max reserved' of the memory reports
    peak_alloc_gb: float | None = None   # max 'max allocated'
    notes: list[str] = field(default_factory=list)


def _value(text: str) -> Any:
    """A dumped value back as Python: None/True/False, numbers, lists; else the string."""
    text = text.strip()
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_args_dump(lines: list[str], where: str) -> dict[str, Any]:
    """The ``name: value`` mapping of the (first) argument dump. Raises SpecError when it is missing or cut off."""
    start = next((i for i, ln in enumerate(lines) if _ARGS_START.match(ln.strip())), None)
    if start is None:
        raise SpecError(where, "no argument dump", "a Megatron-LM log with its '---- arguments ----' block")
    args: dict[str, Any] = {}
    for ln in lines[start + 1:]:
        if _ARGS_END.match(ln.strip()):
            return args
        m = _ARG.match(ln.rstrip("\n"))
        if m:
            args[m.group(1)] = _value(m.group(2))
    raise SpecError(where, "argument dump cut off", "a log whose '---- end of arguments ----' line is present")


@dataclass
class _Interval:
    iteration: int
    step_s: float
    tflops: float | None
    bad: bool  # skipped or NaN iterations in the interval


def parse_iterations(lines: list[str], where: str) -> list[_Interval]:
    """The per-iteration lines. Raises SpecError naming the line of a malformed one: a line that looks like an
    iteration line (``iteration N/ M`` or the step-time field) but does not parse, so no interval is dropped."""
    out = []
    for i, ln in enumerate(lines, 1):
        m = _ITER.search(ln)
        if not m:
            if _LOOKS_LIKE_ITER.search(ln):
                raise SpecError(f"{where}: line {i}", ln.strip()[:80], "an iteration line as Megatron-LM's "
                                "training_log prints it: ' iteration N/ M | name: value | ...'")
            continue
        fields = {k.strip(): v for k, v in _FIELD.findall(" " + m.group(3))}
        try:
            step = float(fields["elapsed time per iteration (ms)"]) / 1e3
            tflops = fields.get("throughput per GPU (TFLOP/s/GPU)")
            bad = int(fields.get("number of skipped iterations", 0)) + int(fields.get("number of nan iterations", 0))
            out.append(_Interval(int(m.group(1)), step, float(tflops) if tflops else None, bad > 0))
        except (KeyError, ValueError):
            raise SpecError(f"{where}: line {i}", ln.strip()[:80],
                            "an iteration line with 'elapsed time per iteration (ms): X'") from None
    return out


def _pattern_shape(pattern: list[int], where: str) -> tuple[int, int]:
    """(first_dense_layers, moe_frequency) of a Megatron-LM MoE layer pattern. Raises SpecError when the pattern
    is not dense blocks followed by every k-th block MoE (what a spec can describe)."""
    if 1 not in pattern:
        raise SpecError(f"{where}: moe_layer_freq", pattern, "at least one MoE layer")
    first = pattern.index(1)
    ones = [i for i, v in enumerate(pattern) if v]
    freq = ones[1] - ones[0] if len(ones) > 1 else len(pattern) - first
    # a spec's pattern puts the MoE block at the end of each group of `freq`: first dense = index - (freq - 1)
    first_dense = first - (freq - 1)
    if first_dense < 0 or moe_layer_pattern(len(pattern), first_dense, freq) != list(pattern):
        raise SpecError(f"{where}: moe_layer_freq", pattern,
                        "leading dense blocks, then every k-th block MoE (a spec's first_dense_layers, moe_frequency)")
    return first_dense, freq


def _megatron_pattern(a: dict[str, Any]) -> list[int]:
    """--moe-layer-freq as Megatron-LM expands it: a list as given, an int k: layer i is MoE when i % k == 0."""
    freq, L = a.get("moe_layer_freq", 1), int(a["num_layers"])
    return list(freq) if isinstance(freq, list) else [int(i % int(freq) == 0) for i in range(L)]


# the argument (its dest in the dump) that carries each layout degree; the rest: dp = world_size over the
# model-parallel product, ckpt from the recompute arguments (_ckpt)
LAYOUT_ARGS = {"tp": "tensor_model_parallel_size", "cp": "context_parallel_size", "pp": "pipeline_model_parallel_size",
               "ep": "expert_model_parallel_size", "etp": "expert_tensor_parallel_size",
               "vpp": "virtual_pipeline_model_parallel_size", "mbs": "micro_batch_size",
               "decoder_first_pipeline_num_layers": "decoder_first_pipeline_num_layers",
               "decoder_last_pipeline_num_layers": "decoder_last_pipeline_num_layers"}
_NEEDED = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "seq_length", "micro_batch_size",
           "global_batch_size", "tensor_model_parallel_size", "pipeline_model_parallel_size", "world_size")


def _get(a: dict[str, Any], key: str, where: str, default: Any = ...) -> Any:
    v = a.get(key, default)
    if v is ... or (v is None and default is ...):
        raise SpecError(f"{where}: {key}", None, "present in the argument dump")
    return v


def _base_dtype(a: dict[str, Any]) -> str:
    """The run's parameter/activation dtype (--bf16, --fp16, else fp32), which --fp8/--fp4 runs keep too."""
    return "bf16" if a.get("bf16") else "fp16" if a.get("fp16") else "fp32"


def _precision(a: dict[str, Any]) -> str:
    if a.get("fp8"):
        return "fp8"
    if a.get("fp4"):
        return "fp4"
    return _base_dtype(a)


def _ckpt(a: dict[str, Any], where: str) -> str:
    """scaleplan's checkpointing mode of Megatron-LM's recompute arguments (docs/megatron.md, both ways)."""
    gran = a.get("recompute_granularity")
    if gran in (None, "None"):
        return "none"
    if gran == "full":
        return "full"
    mods = set(a.get("recompute_modules") or ["core_attn"])
    if mods == {"core_attn", "layernorm", "moe_act"}:
        return "super-selective"
    unknown = mods - set(RECOMPUTE_MODULES)
    if unknown:
        raise SpecError(f"{where}: recompute_modules", sorted(unknown), f"among {', '.join(RECOMPUTE_MODULES)}")
    return "selective"  # any other set: the stack's recompute_modules (stack_args.recompute_modules_of)


_OPTIMIZERS = {"adam": "adamw", "sgd": "sgd", "muon": "muon", "dist_muon": "muon"}


def _blocks(a: dict[str, Any], where: str) -> tuple[int, list[int], dict[str, Any]]:
    """(GPT blocks, their MoE pattern, the dump as the GPT form reads it) of a GPT or a HybridModel run: a hybrid
    run's blocks, MoE layers and MTP depth are its --hybrid-layer-pattern's, its window list runs over hybrid
    layers (:mod:`.hybrid`)."""
    text = a.get("hybrid_layer_pattern")
    if text in (None, "None"):
        return int(a["num_layers"]), _megatron_pattern(a), a
    hy = read_pattern(str(text), where)
    L, a = len(hy["blocks"]), dict(a)
    a["mtp_num_layers"] = hy["mtp_layers"]
    a["multi_latent_attention"] = a.get("multi_latent_attention") or hy["mla"]
    if isinstance(a.get("window_attn_skip_freq"), list):
        a["window_attn_skip_freq"] = block_window_list(a["window_attn_skip_freq"], L)
    return L, [int(b) for b in hy["blocks"]], a


def _model(a: dict[str, Any], where: str) -> dict[str, Any]:
    """The spec's model block of an argument dump (GPTModel's or HybridModel's)."""
    L, pattern, a = _blocks(a, where)
    heads = int(_get(a, "num_attention_heads", where))
    vocab = a.get("vocab_size") or a.get("padded_vocab_size")  # a tokenizer's run dumps only the padded size
    if not vocab:
        raise SpecError(f"{where}: vocab_size", None, "a vocabulary size in the argument dump (--vocab-size)")
    m = {"n_layers": L, "hidden_sz": int(a["hidden_size"]), "inter_sz": int(a["ffn_hidden_size"]),
         "n_q_heads": heads,
         "n_kv_heads": int(a["num_query_groups"]) if a.get("group_query_attention") else heads,
         "head_dim": int(a.get("kv_channels") or int(a["hidden_size"]) // heads),
         "vocab_sz": int(vocab),
         # FP8 attention (TransformerConfig.fp8_dot_product_attention) has no command-line flag: core_v0.19.0's
         # arguments.py excludes it from the TransformerConfig arguments, so under --fp8/--fp4 Transformer
         # Engine's DotProductAttention runs in the base dtype
         "precision": _precision(a), "sdpa_precision": _base_dtype(a), "glu": bool(a.get("swiglu") or a.get("quick_geglu")),
         "rotary_embeds": a.get("position_embedding_type") == "rope",
         "dropout": float(a.get("hidden_dropout") or 0.0) > 0.0,
         "tie_embeddings": not a.get("untie_embeddings_and_output_weights"),
         "attn_gate": "element" if a.get("attention_output_gate") else False}
    m.update(features_of_args(a, L, where))
    if m.get("mla"):
        m["n_kv_heads"] = heads
    if a.get("num_experts"):
        first, freq = _pattern_shape(pattern, where)
        m["moe"] = {"n_experts": int(a["num_experts"]), "experts_per_token": int(a["moe_router_topk"]),
                    "expert_inter_sz": int(a.get("moe_ffn_hidden_size") or a["ffn_hidden_size"]),
                    "shared_expert_inter_sz": int(a.get("moe_shared_expert_intermediate_size") or 0),
                    "capacity_factor": float(a.get("moe_expert_capacity_factor") or 1.0),
                    "first_dense_layers": first, "moe_frequency": freq,
                    "expert_tp_degree": int(a.get("expert_tensor_parallel_size") or a["tensor_model_parallel_size"]),
                    **router_of_args(a)}
    return m


def spec_and_layout(a: dict[str, Any], where: str, node_type: str) -> tuple[Any, dict[str, Any], int]:
    """(Spec, layout, N_dev) of an argument dump on ``node_type``. Raises SpecError naming a missing or unusable
    argument (or the spec field it fails)."""
    from pydantic import ValidationError

    from scaleplan.estimator.layout import ParallelLayout
    from scaleplan.megatron.stack_args import stack_from_dump
    from scaleplan.specs import Layout, ParallelismBlock, parse_spec

    for k in _NEEDED:
        _get(a, k, where)
    opt = _OPTIMIZERS.get(str(a.get("optimizer", "adam")))
    if opt is None:
        raise SpecError(f"{where}: optimizer", a.get("optimizer"), f"one of {', '.join(_OPTIMIZERS)}")
    n = int(a["world_size"])
    lo = {f: int(a.get(arg) or 0) for f, arg in LAYOUT_ARGS.items()}
    lo = {**{f: v for f, v in lo.items() if v}, "ckpt": _ckpt(a, where)}
    lo.setdefault("etp", lo.get("tp", 1))  # Megatron-Core: expert TP defaults to TP
    # a split stated by a HybridModel pattern's segments, a pipeline layout string or the accounting flags
    first, last = stated_split(a, lo.get("pp", 1), where)
    lo.update({k: v for k, v in (("decoder_first_pipeline_num_layers", first),
                                 ("decoder_last_pipeline_num_layers", last)) if v})
    try:
        spec_layout = Layout(**lo)
    except ValidationError as e:  # a degree out of range: name Megatron's argument
        err = e.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "layout"
        raise SpecError(f"{where}: {LAYOUT_ARGS.get(field, field)}", err.get("input"), err["msg"]) from None
    lay = ParallelLayout.from_specs([spec_layout], n)  # dp = world_size / (tp cp pp)
    if n % lay.model_parallel[0]:
        raise SpecError(f"{where}: world_size", n, f"a multiple of tp*cp*pp = {lay.model_parallel[0]}")
    lay = lay.row(0)
    doc = {"model": _model(a, where), "search": {"num_devices": n},
           "performance": {"activation_checkpointing_type": lay["ckpt"]}, "optimizer": {"optimizer_type": opt},
           "data": {"gbs": int(a["global_batch_size"]), "seqlen": int(a["seq_length"]),
                    "microbatch_sz": lay["mbs"]},
           "hardware": {"node_type": node_type},
           "parallelism": {k: lay[k] for k in ParallelismBlock.model_fields if k in lay}}
    block = stack_from_dump(a, where)
    if block:  # a run on the paper's stack keeps the spec (and dedup key) it had before stacks were read
        doc["stack"] = block
    return parse_spec(doc, source=where), lay, n


def read_log(path: str | Path, node_type: str, warmup: int = 10) -> MegatronRun:
    """One Megatron-LM log: spec, layout, step time after the first ``warmup`` iterations (module docstring).
    Raises SpecError (one line, naming the file) on an unreadable, truncated or malformed log."""
    p = Path(path)
    raw, lines = _read(p)
    where = p.name
    spec, lay, n = spec_and_layout(parse_args_dump(lines, where), where, node_type)
    intervals = parse_iterations(lines, where)
    kept = [iv for iv in intervals if iv.iteration > warmup and not iv.bad]
    if not kept:
        raise SpecError(where, f"{len(intervals)} iteration lines",
                        f"at least one logged iteration after the {warmup} warm-up iterations without skipped or "
                        "NaN iterations")
    times = [iv.step_s for iv in kept]
    tfl = [iv.tflops for iv in kept if iv.tflops is not None]
    mem = [tuple(float(x) for x in m.groups()) for m in map(_MEM.search, lines) if m]
    run = MegatronRun(file=str(p), sha256=hashlib.sha256(raw).hexdigest(), spec=spec, layout=lay, n_devices=n,
                      step_s=statistics.median(times), step_spread_s=(min(times), max(times)),
                      iterations=(kept[0].iteration, kept[-1].iteration), n_intervals=len(kept),
                      tflops_per_gpu=statistics.median(tfl) if tfl else None,
                      peak_mem_gb=max(m[3] for m in mem) * MIB / 1e9 if mem else None,
                      peak_alloc_gb=max(m[1] for m in mem) * MIB / 1e9 if mem else None)
    dropped = len(intervals) - len(kept)
    if dropped:
        run.notes.append(f"{dropped} logged intervals left out (warm-up up to iteration {warmup}, or skipped/NaN)")
    return run


def _read(p: Path) -> tuple[bytes, list[str]]:
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise SpecError("--megatron-log", str(p), f"a readable file ({e.strerror})") from None
    return raw, raw.decode("utf-8", errors="replace").splitlines()


def read_plan(path: str | Path, node_type: str) -> tuple[Any, dict[str, Any], int]:
    """(Spec, layout, N_dev) from a Megatron-LM log's argument dump alone (no iteration lines needed).
    Raises SpecError as :func:`read_log`."""
    p = Path(path)
    return spec_and_layout(parse_args_dump(_read(p)[1], p.name), p.name, node_type)
