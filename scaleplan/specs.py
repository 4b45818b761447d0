"""Model specs (the paper's appendix "Performance Model Input/Outputs" format) and layouts.

A spec is YAML with the blocks ``model`` (with ``model.moe``), ``search``, ``performance``,
``optimizer``, ``data``, ``hardware`` and an optional ``parallelism`` block. Field names are the
paper's listing (lst:perf-model-input). :func:`load_spec` validates and raises
:class:`~scaleplan.errors.SpecError` naming the field path, value and what is allowed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from scaleplan.errors import FieldCheck, SpecError
from scaleplan.stack import Stack, check_for_model
from scaleplan.yamlio import load_yaml

PRECISIONS = ("bf16", "fp16", "fp8", "fp4", "tf32", "fp32")
OPTIMIZERS = ("adam", "adamw", "muon", "scion", "sgd")
CKPT_MODES = ("none", "selective", "super-selective", "full")

Precision = Literal["bf16", "fp16", "fp8", "fp4", "tf32", "fp32"]
Optimizer = Literal["adam", "adamw", "muon", "scion", "sgd"]
CkptMode = Literal["none", "selective", "super-selective", "full"]

_Strict = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

# Physical bounds of every spec field (docs/database.md, "Input bounds"). Generous beyond any published
# model (largest: ~126 layers, d = 16384, 256 experts, 256k vocabulary) yet small enough that every
# product the estimator forms (FLOPs, bytes, N_tot) stays a finite float and every loop is short.
MAX_LAYERS = 1024
MAX_WIDTH = 2**20          # hidden_sz, inter_sz, expert_inter_sz
MAX_HEADS = 4096           # n_q_heads, n_kv_heads
MAX_HEAD_DIM = 4096
MAX_VOCAB = 2**24
MAX_EXPERTS = 2**16
MAX_TOPK = 1024
MAX_CAPACITY = 64.0
MAX_SEQLEN = 2**24         # tokens per sequence
MAX_GBS = 2**24            # sequences per global batch
MAX_MBS = 2**16            # sequences per micro-batch
MAX_DEGREE = 2**22         # any parallel degree (and N_dev before the profile's own cap)
MAX_VPP = 1024


_FieldCheck = FieldCheck  # a cross-field check naming the field it blames


class MoESpec(BaseModel):
    """``model.moe``: routed experts E, top-K, expert width d_expert, shared expert, ETP."""

    model_config = _Strict
    n_experts: int = Field(gt=0, le=MAX_EXPERTS)
    experts_per_token: int = Field(gt=0, le=MAX_TOPK)
    capacity_factor: float = Field(default=1.0, gt=0, le=MAX_CAPACITY)
    expert_inter_sz: int = Field(gt=0, le=MAX_WIDTH)
    shared_expert_inter_sz: int = Field(default=0, ge=0, le=MAX_WIDTH)
    moe_frequency: int = Field(default=1, gt=0, le=MAX_LAYERS)
    expert_tp_degree: int = Field(default=1, gt=0, le=MAX_DEGREE)
    first_dense_layers: int = Field(default=1, ge=0, le=MAX_LAYERS)
    # the router's score: softmax over the experts, or a sigmoid per expert (DeepSeek-V3); expert_bias: the
    # aux-loss-free balancing bias added to the scores for the top-K choice (a buffer, not a trained parameter)
    router_score: Literal["softmax", "sigmoid"] = "softmax"
    expert_bias: bool = False

    @model_validator(mode="after")
    def _k_le_e(self) -> MoESpec:
        if self.experts_per_token > self.n_experts:
            raise _FieldCheck("experts_per_token", self.experts_per_token,
                              f"experts_per_token={self.experts_per_token} must be <= n_experts={self.n_experts}")
        if self.expert_bias and self.router_score != "sigmoid":
            raise _FieldCheck("expert_bias", True, "expert_bias needs router_score: sigmoid (Megatron-Core's rule)")
        return self


class MLASpec(BaseModel):
    """``model.mla``: multi-latent attention (DeepSeek-V2/V3). Q is projected through a rank-``q_lora_rank``
    latent (None: directly), K and V through one rank-``kv_lora_rank`` latent; each q/k head is ``head_dim``
    wide, of which ``qk_rope_head_dim`` carry RoPE (one rotary key shared by the heads) and the rest none; each
    value head is ``v_head_dim`` wide."""

    model_config = _Strict
    q_lora_rank: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    kv_lora_rank: int = Field(gt=0, le=MAX_WIDTH)
    qk_rope_head_dim: int = Field(gt=0, le=MAX_HEAD_DIM)
    v_head_dim: int = Field(gt=0, le=MAX_HEAD_DIM)


class SlidingWindowSpec(BaseModel):
    """``model.sliding_window``: causal attention over the last ``size`` tokens before each query (and itself)
    on the blocks ``pattern`` marks S, full causal attention on those it marks F; the pattern repeats over the
    blocks from the first (GPT-OSS: size 128, pattern SF)."""

    model_config = _Strict
    size: int = Field(gt=0, le=MAX_SEQLEN)
    pattern: str = Field(default="S", min_length=1, max_length=MAX_LAYERS)

    @model_validator(mode="after")
    def _pattern(self) -> SlidingWindowSpec:
        if set(self.pattern) - {"S", "F"} or "S" not in self.pattern:
            raise _FieldCheck("pattern", self.pattern, "S (sliding) and F (full) per block, at least one S")
        return self


class ModelBlock(BaseModel):
    """``model``: the dense transformer geometry and precision."""

    model_config = _Strict
    n_layers: int = Field(gt=0, le=MAX_LAYERS)
    hidden_sz: int = Field(gt=0, le=MAX_WIDTH)
    inter_sz: int = Field(gt=0, le=MAX_WIDTH)
    n_q_heads: int = Field(gt=0, le=MAX_HEADS)
    n_kv_heads: int = Field(gt=0, le=MAX_HEADS)
    head_dim: int = Field(gt=0, le=MAX_HEAD_DIM)
    vocab_sz: int = Field(gt=0, le=MAX_VOCAB)
    precision: Precision = "bf16"
    sdpa_precision: Precision | None = None  # the dtype SDPA runs in; unset (None): the model's precision
    glu: bool = True
    rotary_embeds: bool = True
    dropout: bool = False
    tie_embeddings: bool = False
    # the attention output gate: true = the paper's head-wise gate (one sigmoid per head, a d x n_q_heads
    # projection), "element" = Megatron-LM's --attention-output-gate (one per channel, d x n_q_heads*head_dim)
    attn_gate: bool | Literal["element"] = True
    moe: MoESpec | None = None
    mla: MLASpec | None = None          # multi-latent attention instead of GQA
    mtp_layers: int = Field(default=0, ge=0, le=MAX_LAYERS)  # multi-token prediction layers (on the last stage)
    sliding_window: SlidingWindowSpec | None = None
    # RMSNorm of q and k: true per head (head_dim wide; with MLA the q and kv latents), "projection" over the
    # whole q and k projections (OLMoE)
    qk_norm: bool | Literal["projection"] = False
    attention_sinks: bool = False       # one learned softmax logit per query head (GPT-OSS)
    linear_bias: Literal["none", "qkv", "all"] = "none"  # biases on the Q/K/V projections, or on every linear
    swiglu_limit: float | None = Field(default=None, gt=0, le=1e4)  # GPT-OSS's clamped SwiGLU (alpha 1.702, +1)

    @model_validator(mode="before")
    @classmethod
    def _sdpa_default(cls, data):
        """An unset sdpa_precision is the model's precision (attention runs in the model dtype)."""
        if isinstance(data, dict) and data.get("sdpa_precision") is None:
            data = {**data, "sdpa_precision": data.get("precision", cls.model_fields["precision"].default)}
        return data

    @model_validator(mode="after")
    def _heads(self) -> ModelBlock:
        # n_q_heads * head_dim may differ from hidden_sz (Megatron-LM's --kv-channels: Qwen3-30B-A3B 32 x 128 on
        # d 2048, GPT-OSS-120B 64 x 64 on d 2880); the projections are costed at their own widths
        if self.n_q_heads % self.n_kv_heads:
            raise _FieldCheck("n_kv_heads", self.n_kv_heads,
                              f"n_kv_heads={self.n_kv_heads} must divide n_q_heads={self.n_q_heads}")
        if self.moe is not None and self.moe.first_dense_layers > self.n_layers:
            raise _FieldCheck("moe.first_dense_layers", self.moe.first_dense_layers,
                              f"moe.first_dense_layers must be <= n_layers={self.n_layers}")
        _check_features(self)
        return self


def _check_features(m: ModelBlock) -> None:
    """The cross-field rules of MLA, MTP, the sliding window and the biases (raises _FieldCheck)."""
    if m.mla is not None:
        rope = m.mla.qk_rope_head_dim
        if rope >= m.head_dim or rope % 2:
            raise _FieldCheck("mla.qk_rope_head_dim", rope, f"an even width below head_dim={m.head_dim} (the "
                              "q/k head: no-position part head_dim - qk_rope_head_dim, rotary part this)")
        if m.n_kv_heads != m.n_q_heads:
            raise _FieldCheck("n_kv_heads", m.n_kv_heads, f"n_q_heads={m.n_q_heads}: MLA gives every head its own "
                              "key and value from the shared latent (no GQA)")
        for name, bad, why in (("rotary_embeds", not m.rotary_embeds, "true (MLA's rotary part needs RoPE)"),
                               ("linear_bias", m.linear_bias != "none", "none with MLA"),
                               ("qk_norm", m.qk_norm == "projection", "true or false with MLA (its latent norms)"),
                               ("attn_gate", m.attn_gate is not False,
                                "false with MLA (the default true is the paper's head-wise gate on GQA)")):
            if bad:
                raise _FieldCheck(name, getattr(m, name), why)
    if m.mtp_layers and not m.rotary_embeds:
        raise _FieldCheck("mtp_layers", m.mtp_layers, "0 without rotary_embeds (Megatron-LM's MTP needs RoPE)")
    if m.sliding_window is not None and len(m.sliding_window.pattern) > m.n_layers:
        raise _FieldCheck("sliding_window.pattern", m.sliding_window.pattern, f"at most n_layers={m.n_layers} "
                          "letters (it repeats over the blocks)")
    if m.swiglu_limit is not None and not m.glu:
        raise _FieldCheck("swiglu_limit", m.swiglu_limit, "unset unless glu is true")


class SearchBlock(BaseModel):
    model_config = _Strict
    num_devices: int | None = Field(default=None, gt=0, le=MAX_DEGREE)


class PerformanceBlock(BaseModel):
    model_config = _Strict
    activation_checkpointing_type: CkptMode = "full"


class OptimizerBlock(BaseModel):
    model_config = _Strict
    optimizer_type: Optimizer = "adamw"


class DataBlock(BaseModel):
    model_config = _Strict
    gbs: int = Field(default=1024, gt=0, le=MAX_GBS)
    seqlen: int = Field(default=2048, gt=0, le=MAX_SEQLEN)
    microbatch_sz: int = Field(default=1, gt=0, le=MAX_MBS)


class HardwareBlock(BaseModel):
    model_config = _Strict
    node_type: str = "p6-b200.48xlarge"


class Degrees(BaseModel):
    """The parallel degrees of a layout (eq:mesh-moe), defined once for :class:`Layout` and the spec's
    ``parallelism`` block: TP, CP, PP, DP, EP, ETP (expert tensor parallelism), VPP (virtual stages), and
    how the layers split over the pipeline stages.

    ``dp`` may be left ``None`` and is then derived as N_dev / (tp*cp*pp) by the estimator. The expert mesh
    folds over each stage's ranks as Megatron-Core builds it: EP x ETP x EDP = TP x CP x DP, so EP x ETP
    must divide TP x CP x DP (not DP alone). ``decoder_first_pipeline_num_layers`` /
    ``decoder_last_pipeline_num_layers``: the transformer layers of the first / last pipeline stage, as
    Megatron-LM's arguments of those names state them (None: the stages split the layers evenly, or, where
    they cannot, scaleplan picks the counts and says so); the middle stages share the rest evenly.
    """

    model_config = _Strict
    tp: int = Field(default=1, gt=0, le=MAX_DEGREE)
    cp: int = Field(default=1, gt=0, le=MAX_DEGREE)
    pp: int = Field(default=1, gt=0, le=MAX_DEGREE)
    dp: int | None = Field(default=None, gt=0, le=MAX_DEGREE)
    ep: int = Field(default=1, gt=0, le=MAX_DEGREE)
    etp: int = Field(default=1, gt=0, le=MAX_DEGREE)
    vpp: int = Field(default=1, gt=0, le=MAX_VPP)
    decoder_first_pipeline_num_layers: int | None = Field(default=None, gt=0, le=MAX_LAYERS)
    decoder_last_pipeline_num_layers: int | None = Field(default=None, gt=0, le=MAX_LAYERS)


class Layout(Degrees):
    """An execution plan P_l = (TP, CP, PP, DP, EP, ETP, VPP, B_micro, A_ckpt): the degrees plus the
    micro-batch size ``mbs`` (sequences) and the activation checkpointing mode."""

    mbs: int = Field(default=1, gt=0, le=MAX_MBS)
    ckpt: CkptMode = "full"


class ParallelismBlock(Degrees):
    """``parallelism``: the layout a spec names. An ``etp`` it leaves out is the model's
    ``model.moe.expert_tp_degree`` (:class:`Spec` fills it in before validation)."""

    # dmlc/ScalePlan's own fields, read so its configs load unchanged; Spec.ignored() says why each is not used
    sp: bool = True
    zero_level: int | None = Field(default=None, ge=0, le=3)
    n_param_buckets: int | None = Field(default=None, gt=0, le=MAX_LAYERS)


# why each reference-tool field is read but not used (Spec.ignored)
_IGNORED = {
    "zero_level": "the optimizer's sharding follows optimizer.optimizer_type as Megatron-LM runs it (Adam: the "
                  "distributed optimizer, ZeRO-1 over DP; Muon/Scion: layer-wise distributed; SGD: none)",
    "n_param_buckets": "DP gradient buckets are Megatron-LM's default size, max(40M, 1M x DP) parameters each",
    "sp": "sequence parallelism runs whenever tp > 1 (Megatron-LM needs it with MoE and TP; the model assumes it)",
}


def stack_features(m: ModelBlock) -> dict[str, bool]:
    """The model features the stack's rules read (scaleplan.stack.check_for_model): MLA, a shared expert, a dense
    (non-MoE) block."""
    moe = m.moe
    dense = moe is None or moe.first_dense_layers > 0 or moe.moe_frequency > 1
    return {"mla": m.mla is not None, "shared_expert": bool(moe and moe.shared_expert_inter_sz), "dense_block": dense}


class Spec(BaseModel):
    """A whole model spec (paper lst:perf-model-input plus an optional ``parallelism`` block)."""

    model_config = _Strict
    model: ModelBlock
    search: SearchBlock = SearchBlock()
    performance: PerformanceBlock = PerformanceBlock()
    optimizer: OptimizerBlock = OptimizerBlock()
    data: DataBlock = DataBlock()
    hardware: HardwareBlock = HardwareBlock()
    parallelism: ParallelismBlock | None = None
    stack: Stack = Stack()  # the training stack (scaleplan/stack.py); default: the paper's

    @model_validator(mode="before")
    @classmethod
    def _etp_from_the_model(cls, data):
        """A parallelism block without ``etp`` (or with ``etp: null``, as older stored specs have it) takes
        the model's ``moe.expert_tp_degree``: the spec names expert TP once, in the paper's field."""
        if not isinstance(data, dict) or not isinstance(par := data.get("parallelism"), dict):
            return data
        moe = data.get("model", {}).get("moe") if isinstance(data.get("model"), dict) else None
        etp = moe.get("expert_tp_degree", 1) if isinstance(moe, dict) else 1
        if par.get("etp") is None and isinstance(etp, int) and not isinstance(etp, bool):
            return {**data, "parallelism": {**par, "etp": etp}}
        return data

    @model_validator(mode="after")
    def _stack_fits_the_model(self) -> Spec:
        moe = self.model.moe
        try:
            check_for_model(self.stack, self.model.precision, moe.capacity_factor if moe else None,
                            **stack_features(self.model))
        except SpecError as e:
            raise _FieldCheck(e.field, e.value, str(e.allowed)) from None
        return self

    @model_validator(mode="after")
    def _known_node(self) -> Spec:
        from scaleplan.profiles import profile_names

        names = profile_names()
        if self.hardware.node_type not in names:
            raise _FieldCheck("hardware.node_type", self.hardware.node_type, f"one of {', '.join(names)}")
        return self

    def device_count(self) -> int | None:
        """N_dev the spec names: search.num_devices, else tp*cp*pp*dp of its parallelism block when dp is given
        (dmlc/ScalePlan's configs give the layout, not the count); None when it names neither."""
        if self.search.num_devices:
            return self.search.num_devices
        p = self.parallelism
        return p.tp * p.cp * p.pp * p.dp if p is not None and p.dp is not None else None

    def ignored(self) -> list[str]:
        """One line per field that is read but not used, with the reason (the reference tool's parallelism.sp,
        zero_level, n_param_buckets)."""
        p, out = self.parallelism, []
        if p is None:
            return out
        out += [f"parallelism.{k}={getattr(p, k)} ignored: {_IGNORED[k]}" for k in ("zero_level", "n_param_buckets")
                if getattr(p, k) is not None]
        if not p.sp and p.tp > 1:
            out.append(f"parallelism.sp=false ignored: {_IGNORED['sp']}")
        return out

    def default_layout(self) -> Layout:
        """The layout the spec itself names (parallelism block, data.microbatch_sz, ckpt mode)."""
        p = self.parallelism or ParallelismBlock(etp=self.model.moe.expert_tp_degree if self.model.moe else 1)
        return Layout(**{k: getattr(p, k) for k in Degrees.model_fields}, mbs=self.data.microbatch_sz,
                      ckpt=self.performance.activation_checkpointing_type)


def _field_path(loc: tuple[Any, ...]) -> str:
    return ".".join(str(x) for x in loc) or "<spec>"


def _is_union_tag(x: Any) -> bool:
    """pydantic's name of a union member in an error's location (``bool``, ``literal['element']``), not a field."""
    return isinstance(x, str) and (x in ("bool", "int", "float", "str") or x.startswith("literal["))


def _block_model(loc: tuple) -> type[BaseModel] | None:
    """The schema class of the block that holds the key at ``loc`` (a pydantic error location), walking the
    fields' annotations from :class:`Spec` (Optional and unions unwrapped); None where it is not a model."""
    import typing

    cls: Any = Spec
    for part in loc[:-1]:
        field = getattr(cls, "model_fields", {}).get(part) if isinstance(part, str) else None
        if field is None:
            return None
        kinds = [field.annotation, *typing.get_args(field.annotation)]
        cls = next((k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)), None)
        if cls is None:
            return None
    return cls


def _unknown_field(loc: tuple) -> str:
    """What is allowed instead of an unknown key: the closest field of its block ('did you mean'), else them all."""
    import difflib

    cls = _block_model(loc)
    known = sorted(cls.model_fields) if cls is not None else []
    key = str(loc[-1]) if loc else ""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if close:
        return f"unknown field; did you mean '{close[0]}'?"
    if known:
        return f"unknown field; the fields here are {', '.join(known)}"
    return "unknown field (check the spelling against the paper's listing)"


def _first_error(err: ValidationError, data: Any) -> SpecError:
    errs = err.errors()
    # an unknown key first: a misspelt key (n_expert) also leaves the real one (n_experts) missing, and the
    # misspelling is what the user has to fix
    e = next((x for x in errs if x["type"] == "extra_forbidden"), errs[0])
    loc = tuple(x for x in e["loc"] if x not in ("function-after",))
    if loc and _is_union_tag(loc[-1]):  # a value no member of a union (bool | "projection") takes: one line of all
        alts = [x for x in errs if x["loc"][:-1] == e["loc"][:-1] and _is_union_tag(x["loc"][-1])]
        allowed = ", or ".join("true or false" if x["type"] == "bool_parsing" else x["msg"].removeprefix(
            "Input should be ") for x in alts)
        return SpecError(_field_path(loc[:-1]), e.get("input"), allowed)
    value: Any = e.get("input")
    msg = e["msg"].removeprefix("Value error, ")
    check = (e.get("ctx") or {}).get("error")
    if isinstance(check, _FieldCheck):  # a cross-field check names the field it blames
        return SpecError(_field_path((*loc, *check.field.split("."))), check.value, msg)
    if e["type"] == "missing":
        return SpecError(_field_path(loc), None, "this field is required")
    if e["type"] == "extra_forbidden":
        return SpecError(_field_path(loc), value, _unknown_field(loc))
    if isinstance(value, dict):  # a model-level check: the message carries the values
        return SpecError(_field_path(loc) or "<spec>", "...", msg)
    return SpecError(_field_path(loc), value, msg)


def parse_spec(data: Any, source: str = "<spec>") -> Spec:
    """Validate a spec given as a mapping. Raises SpecError (one line) on any bad field."""
    if not isinstance(data, dict):
        raise SpecError(source, type(data).__name__, "a spec must be a YAML mapping with a 'model' block")
    try:
        return Spec.model_validate(data)
    except ValidationError as err:
        raise _first_error(err, data) from None


def load_spec(path: str | Path) -> Spec:
    """Load and validate a model spec YAML file, or, when no file of that name exists, the catalogue's spec of a
    model name (``deepseek-v3``, scaleplan.catalogue) or a published run's (its id, scaleplan.published).

    Raises:
        SpecError: unreadable file, bad YAML, or an invalid field (message names the field path).
    """
    p = Path(path)
    if not p.exists():
        from scaleplan import catalogue, published

        data = catalogue.spec_data(str(path))
        if data is None:
            data = published.spec_data(str(path))
        if data is not None:
            return parse_spec(data, source=str(path))
    try:
        text = p.read_text()
    except OSError as e:
        raise SpecError("spec", str(path), f"a readable YAML file, a catalogue model name (scaleplan spec list) or a "
                        f"published run (scaleplan spec published) "
                        f"({e.strerror})") from None
    except UnicodeDecodeError:
        raise SpecError("spec", str(path), "a UTF-8 text YAML file") from None
    try:
        data = load_yaml(text)
    except (yaml.YAMLError, RecursionError) as e:  # RecursionError: absurdly deep nesting
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise SpecError("spec", str(path), f"valid YAML (parse error{where})") from None
    return parse_spec(data, source=str(path))


# a layout's fields are the schema's (their order and the array form: estimator.layout.ParallelLayout)
_LAYOUT_KEYS = set(Layout.model_fields)


def parse_layout(text: str, base: Layout | None = None) -> Layout:
    """Parse ``tp=1,cp=1,pp=2,ep=8,mbs=1,ckpt=full,vpp=1`` into a :class:`Layout`.

    Keys not given keep the values of ``base`` (default: all ones, ckpt=full).
    Raises SpecError naming the bad key or value.
    """
    values: dict[str, Any] = dict(base.model_dump()) if base else {}
    for part in filter(None, (s.strip() for s in text.split(","))):
        key, sep, val = part.partition("=")
        key = key.strip()
        if not sep or key not in _LAYOUT_KEYS:
            raise SpecError("--layout", part, f"key=value with key in {sorted(_LAYOUT_KEYS)}")
        if key == "ckpt":
            if val not in CKPT_MODES:
                raise SpecError(f"--layout {key}", val, f"one of {', '.join(CKPT_MODES)}")
            values[key] = val
        else:
            try:
                n = int(val)
            except ValueError:
                raise SpecError(f"--layout {key}", val, "a positive integer") from None
            if n <= 0:
                raise SpecError(f"--layout {key}", val, "a positive integer")
            values[key] = n
    try:
        return Layout(**values)
    except ValidationError as err:  # a bound (e.g. tp <= MAX_DEGREE): one line naming the key
        e = err.errors()[0]
        key = ".".join(str(x) for x in e["loc"])
        raise SpecError(f"--layout {key}", e.get("input"), e["msg"]) from None


def parse_ckpt_modes(text: str, field: str = "--ckpt") -> tuple[str, ...]:
    """Parse a comma-separated list of checkpointing modes (``none,full``). Raises SpecError
    naming the first unknown mode, or the whole value when it names none."""
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    for m in modes:
        if m not in CKPT_MODES:
            raise SpecError(field, m, f"one of {', '.join(CKPT_MODES)}")
    if not modes:
        raise SpecError(field, text, f"a comma-separated subset of {', '.join(CKPT_MODES)}")
    return modes
