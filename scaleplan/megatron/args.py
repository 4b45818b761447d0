"""Megatron-LM ``pretrain_gpt.py`` arguments of a spec under a layout (docs/megatron.md is the whole mapping).

:func:`megatron_args` gives the flags, :func:`megatron_notes` the comment lines that say what the flags cannot
(runtime packages, the nearest optimizer, vocabulary padding), :class:`Budget` the token budget and the
learning-rate schedule lengths that follow from it, :func:`render_megatron` the shell text. The arguments target
Megatron-LM :data:`scaleplan.megatron.MEGATRON_LM_VERSION`; tests/cli/test_megatron_accepts.py checks every flag
and choice against that version's flag table and builds megatron-core's TransformerConfig from them.

Never imports torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from scaleplan.errors import SpecError
from scaleplan.estimator.layout import FIELDS as LAYOUT_FIELDS
from scaleplan.estimator.layout import SPLIT_FIELDS
from scaleplan.estimator.model_dims import VOCAB_DIVISOR, padded_vocab
from scaleplan.megatron.features import attention_args, feature_notes, mlp_args, mtp_args, router_args
from scaleplan.megatron.pipeline_split import layout_string
from scaleplan.megatron.stack_args import stack_args, stack_notes
from scaleplan.estimator.shapes import accounted_ends, layout_shapes, split_of, stage_split
from scaleplan.specs import Layout, ModelBlock, Spec
from scaleplan.stack import Stack

# fp8: the recipe is the stack's (--fp8-recipe, scaleplan/megatron/stack_args.py; default the current-scaling
# "tensorwise": Megatron-LM's default, delayed scaling, refuses the moe_act and layernorm recompute that
# super-selective checkpointing asks for (TransformerConfig.__post_init__); tensorwise runs on Hopper and
# Blackwell alike and allows it).
_PRECISION = {"bf16": ["--bf16"], "fp16": ["--fp16"],
              "fp8": ["--bf16", "--fp8-format", "hybrid"],
              "fp4": ["--bf16", "--fp4-format", "e2m1"], "tf32": [], "fp32": []}
_RECOMPUTE = {
    "none": [],
    "selective": ["--recompute-granularity", "selective", "--recompute-modules", "core_attn"],
    "super-selective": ["--recompute-granularity", "selective", "--recompute-modules", "core_attn", "layernorm",
                        "moe_act"],
    "full": ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"],
}
# optimizer -> (Megatron-LM --optimizer, with --use-distributed-optimizer). muon with the distributed optimizer is
# Megatron-LM's layer-wise distributed optimizer (each DP rank owns whole weight matrices, runs their Newton-Schulz
# step, all-gathers the updated parameters): the optimizer the estimator models (estimator.compute). Since
# core_v0.18 that is spelled `--optimizer muon --use-distributed-optimizer`; `dist_muon` is deprecated.
_OPTIMIZER = {"adam": ("adam", True), "adamw": ("adam", True), "sgd": ("sgd", False), "muon": ("muon", True),
              "scion": ("muon", True)}
SCION_NOTE = ("optimizer scion: Megatron-LM has no Scion; emitted its nearest, muon (the same Newton-Schulz "
              "orthogonalised momentum step on the hidden weight matrices). What differs: Megatron-LM's muon updates "
              "embeddings, LM head and norms with Adam (--muon-scalar-optimizer), where Scion uses its own norm "
              "constraints (sign / column-norm steps) and no second moment; the learning-rate scales differ")
MUON_NOTE = ("optimizer muon needs the emerging-optimizers package at run time (pip install emerging-optimizers); "
             "Megatron-LM imports its Newton-Schulz step from there")
GATE_NOTE = ("model.attn_gate: the paper's head-wise gate ({head:,} parameters per block) has no Megatron-LM "
             "equivalent, so no gate is emitted: the nearest model to what was costed (the gate is ~0.1% of its "
             "FLOPs). Megatron-LM's --attention-output-gate is element-wise ({element:,} per block): set "
             "model.attn_gate: element to cost and emit it")
# the paper's schedule (app:lr_hpo): warm-up-stable-decay, ~100M tokens of warm-up, linear decay to 0 over the last
# 20% of the steps
WARMUP_TOKENS = 100e6
DECAY_FRACTION = 0.2


@dataclass(frozen=True)
class Budget:
    """A token budget D (tokens) trained at ``gbs`` sequences of ``seqlen`` tokens per step.

    ``train_samples`` is D / seqlen rounded up to whole steps (a multiple of gbs); the schedule is the paper's
    WSD (app:lr_hpo): ``warmup_samples`` ~ 100M tokens (at most the whole run), ``decay_samples`` the last 20%.
    """

    tokens: float
    seqlen: int
    gbs: int

    @property
    def train_iters(self) -> int:
        return max(1, math.ceil(self.tokens / (self.seqlen * self.gbs)))

    @property
    def train_samples(self) -> int:
        return self.train_iters * self.gbs

    @property
    def warmup_samples(self) -> int:
        return min(self.train_samples, math.ceil(WARMUP_TOKENS / self.seqlen))

    @property
    def decay_samples(self) -> int:
        return max(1, round(DECAY_FRACTION * self.train_samples))


def layout_dict(layout: dict[str, Any] | Layout) -> dict[str, Any]:
    """A layout (spec block or dict; etp and vpp default to 1) as a dict of every layout field, ckpt a
    name and the degrees ints. Raises SpecError naming the missing fields."""
    d = layout.model_dump() if isinstance(layout, Layout) else dict(layout)
    d.setdefault("etp", 1)
    d.setdefault("vpp", 1)
    missing = [k for k in LAYOUT_FIELDS if d.get(k) is None]
    if missing:
        raise SpecError("layout", d, f"all of {', '.join(LAYOUT_FIELDS)} (missing {', '.join(missing)})")
    out = {k: (str(d[k]) if k == "ckpt" else int(d[k])) for k in LAYOUT_FIELDS}
    return out | {k: int(d[k]) for k in SPLIT_FIELDS if d.get(k)}  # a stated stage split


def megatron_optimizer(name: str, field: str = "optimizer.optimizer_type") -> str:
    """Megatron-LM's --optimizer for ``name`` (scion: its nearest, muon; see :data:`SCION_NOTE`). Raises
    SpecError naming ``field`` for a name scaleplan does not know."""
    if name not in _OPTIMIZER:
        raise SpecError(field, name, f"one of {', '.join(_OPTIMIZER)}")
    return _OPTIMIZER[name][0]


def moe_layer_pattern(n_layers: int, first_dense: int, frequency: int) -> list[int]:
    """Megatron-LM's --moe-layer-freq list: 1 for an MoE block, 0 for a dense one. The first ``first_dense``
    blocks are dense, then every ``frequency``-th block is MoE (the count scaleplan.geometry uses)."""
    return [0 if i < first_dense else int((i - first_dense + 1) % frequency == 0) for i in range(n_layers)]


def megatron_args(spec: Spec, layout: dict[str, Any] | Layout, budget: Budget | None = None,
                  hybrid: bool = False) -> list[list[str]]:
    """Megatron-LM ``pretrain_gpt.py`` arguments for ``spec`` under ``layout`` (and, given, the token budget and
    its schedule), one flag with its values per item; ``hybrid``: ``pretrain_hybrid.py``'s, the layer order and
    pipeline segments in --hybrid-layer-pattern (:func:`to_hybrid`). The mapping is docs/megatron.md's table."""
    m, lo = spec.model, layout_dict(layout)
    out = _model_args(m, spec.data.seqlen)
    if m.moe is not None:
        out += _moe_args(m, overlap=spec.stack.overlaps_shared_expert())
    out += stack_args(spec.stack, m.precision, m.moe is not None)
    out += [["--tensor-model-parallel-size", str(lo["tp"])], ["--pipeline-model-parallel-size", str(lo["pp"])],
            ["--context-parallel-size", str(lo["cp"])], ["--expert-model-parallel-size", str(lo["ep"])],
            ["--expert-tensor-parallel-size", str(lo["etp"])]]
    if lo["tp"] > 1:
        out.append(["--sequence-parallel"])
    out += _stage_args(m, lo, spec.data.seqlen)
    out += [["--micro-batch-size", str(lo["mbs"])], ["--global-batch-size", str(spec.data.gbs)]]
    if recompute_args(lo["ckpt"], spec.stack):
        out.append(recompute_args(lo["ckpt"], spec.stack))
    opt, distributed = _OPTIMIZER[spec.optimizer.optimizer_type]
    out.append(["--optimizer", opt])
    if distributed:
        out.append(["--use-distributed-optimizer"])
    if budget is not None:
        out += [["--train-samples", str(budget.train_samples)], ["--lr-decay-style", "WSD"],
                ["--lr-warmup-samples", str(budget.warmup_samples)],
                ["--lr-decay-samples", str(budget.train_samples)], ["--lr-wsd-decay-style", "linear"],
                ["--lr-wsd-decay-samples", str(budget.decay_samples)], ["--min-lr", "0.0"]]
    if spec.stack.cross_entropy != "unfused":
        out.append(["--cross-entropy-loss-fusion"])
    return to_hybrid(m, lo, out) if hybrid else out


def recompute_args(ckpt: str, stack: Stack) -> list[str]:
    """The recompute flags of a checkpointing mode: ``selective`` recomputes the stack's --recompute-modules
    (core_attn unless the stack names others; none named: no recompute flag at all)."""
    if ckpt == "selective" and stack.recompute_modules is not None:
        mods = list(stack.recompute_modules)
        return ["--recompute-granularity", "selective", "--recompute-modules", *mods] if mods else []
    return _RECOMPUTE[ckpt]


# flags the hybrid pattern replaces: the layer count, the MoE layers, the virtual stages, the MTP depth and the
# per-layer window list (over GPT blocks there, over hybrid layers in the pattern's run)
_HYBRID_REPLACES = {"--num-layers", "--moe-layer-freq", "--num-layers-per-virtual-pipeline-stage",
                    "--mtp-num-layers", "--window-attn-skip-freq", "--decoder-first-pipeline-num-layers",
                    "--decoder-last-pipeline-num-layers", "--num-virtual-stages-per-pipeline-rank",
                    "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"}


def to_hybrid(m: ModelBlock, lo: dict[str, Any], args: list[list[str]]) -> list[list[str]]:
    """GPT arguments rewritten for HybridModel: --hybrid-layer-pattern with one ``|`` segment per pipeline stage
    and virtual stage (Megatron-LM derives VPP from the segment count), the window list over hybrid layers."""
    from scaleplan.megatron.hybrid import hybrid_pattern, hybrid_window_list, stage_segments

    first, last = split_of(m, Layout(**lo))  # the split the plan states or was costed with (0: even)
    segments = stage_segments(m.n_layers, lo["pp"], lo["vpp"], first or None, last or None) if lo["pp"] > 1 \
        else [m.n_layers]
    out = [["--hybrid-layer-pattern", hybrid_pattern(m, segments)]]
    out += [a for a in args if a[0] not in _HYBRID_REPLACES]
    window = hybrid_window_list(m)
    if window is not None:
        out.append(["--window-attn-skip-freq", window])
    return out


def _stage_args(m: ModelBlock, lo: dict[str, Any], seqlen: int) -> list[list[str]]:
    """The pipeline's stage split: an uneven one as Megatron-LM states it (--decoder-first/last-pipeline-num-
    layers, which refuse --num-layers-per-virtual-pipeline-stage: the VPP chunks then by
    --num-virtual-stages-per-pipeline-rank), or where its end stages hold one layer fewer than the middle ones
    and are no multiples of VPP, by --account-for-embedding/loss-in-pipeline-split (shapes.accounted_ends), or where
    neither states it (a stage's layers no multiple of VPP), by --pipeline-model-parallel-layout; an even
    one with VPP by its layers per virtual stage. A split the plan leaves unstated where the even one does not
    exist is the one scaleplan costed it with."""
    first, last = split_of(m, Layout(**lo))
    emb, loss = (bool(x) for x in accounted_ends(m.n_layers, lo["pp"], lo["vpp"], first, last))
    if emb or loss:  # a split only Megatron-LM's accounting flags state (stage layers not multiples of VPP)
        out = [[flag] for flag, on in (("--account-for-embedding-in-pipeline-split", emb),
                                       ("--account-for-loss-in-pipeline-split", loss)) if on]
        return out + [["--num-virtual-stages-per-pipeline-rank", str(lo["vpp"])]]
    if first or last:
        pp, vpp = lo["pp"], lo["vpp"]
        F, M, Ls = (int(x) for x in stage_split(m.n_layers, pp, first, last))
        if any(n % vpp for n in (F, Ls) + ((M,) if pp > 2 else ())):  # no counts Megatron-LM takes at this VPP
            stages = [F] + [M] * (pp - 2) + [Ls]
            return [["--pipeline-model-parallel-layout", layout_string(pp, vpp, stages, m.mtp_layers)]]
        out = [[flag, str(n)] for flag, n in (("--decoder-first-pipeline-num-layers", first),
                                              ("--decoder-last-pipeline-num-layers", last)) if n]
        return out + ([["--num-virtual-stages-per-pipeline-rank", str(vpp)]] if vpp > 1 else [])
    if lo["vpp"] > 1:
        return [["--num-layers-per-virtual-pipeline-stage", str(int(layout_shapes(m, Layout(**lo), seqlen).first.chunk_layers))]]
    return []


def _model_args(m: ModelBlock, seqlen: int) -> list[list[str]]:
    out = [["--num-layers", str(m.n_layers)], ["--hidden-size", str(m.hidden_sz)],
           ["--ffn-hidden-size", str(m.inter_sz)], *attention_args(m)]
    out += [["--vocab-size", str(m.vocab_sz)], ["--make-vocab-size-divisible-by", str(VOCAB_DIVISOR)],
            ["--seq-length", str(seqlen)], ["--max-position-embeddings", str(seqlen)],
            ["--normalization", "RMSNorm"], *mlp_args(m)]
    out.append(["--position-embedding-type", "rope" if m.rotary_embeds else "learned_absolute"])
    out += mtp_args(m)
    if not m.tie_embeddings:
        out.append(["--untie-embeddings-and-output-weights"])
    if not m.dropout:
        out += [["--attention-dropout", "0.0"], ["--hidden-dropout", "0.0"]]
    if m.attn_gate == "element":  # Megatron-LM's only gate; the paper's head-wise gate has none (megatron_notes)
        out.append(["--attention-output-gate"])
    if _PRECISION[m.precision]:
        out.append(_PRECISION[m.precision])
    return out


def _moe_args(m: ModelBlock, overlap: bool = True) -> list[list[str]]:
    """The MoE block's flags; ``overlap``: the shared expert overlaps the dispatcher's communication
    (core_v0.19.0 allows it with the alltoall and flex dispatchers, TransformerConfig.__post_init__)."""
    moe = m.moe
    pattern = moe_layer_pattern(m.n_layers, moe.first_dense_layers, moe.moe_frequency)
    out = [["--num-experts", str(moe.n_experts)], ["--moe-router-topk", str(moe.experts_per_token)],
           ["--moe-ffn-hidden-size", str(moe.expert_inter_sz)],
           ["--moe-layer-freq", "[" + ",".join(map(str, pattern)) + "]"]]  # --moe-router-dtype: stack_args
    out += router_args(moe)
    if moe.experts_per_token == 1 and moe.router_score == "softmax":
        # top-1 softmax routing: a softmax over the one selected logit is 1 with zero gradient, so Megatron-LM
        # refuses K=1 unless the softmax runs over all experts before the top-K (TransformerConfig check)
        out.append(["--moe-router-pre-softmax"])
    if moe.shared_expert_inter_sz:
        out.append(["--moe-shared-expert-intermediate-size", str(moe.shared_expert_inter_sz)])
        if overlap:
            out.append(["--moe-shared-expert-overlap"])
    if moe.capacity_factor != 1.0:  # 1.0: balanced routing, Megatron's dropless default
        out += [["--moe-expert-capacity-factor", f"{moe.capacity_factor:g}"], ["--moe-pad-expert-input-to-capacity"]]
    return out


def megatron_notes(spec: Spec, layout: dict[str, Any] | Layout) -> list[str]:
    """What the arguments cannot say, one line each: runtime packages, the optimizer stand-in, vocab padding."""
    lo = layout_dict(layout)
    notes = stack_notes(spec.stack, lo["ckpt"], spec.model.precision)
    opt = spec.optimizer.optimizer_type
    if opt == "scion":
        notes.append(SCION_NOTE)
    if opt in ("muon", "scion"):
        notes.append(MUON_NOTE)
    m = spec.model
    if m.attn_gate is True:
        notes.append(GATE_NOTE.format(head=m.hidden_sz * m.n_q_heads, element=m.hidden_sz * m.n_q_heads * m.head_dim))
    notes += feature_notes(m)
    v = spec.model.vocab_sz
    padded = int(padded_vocab(v, lo["tp"]))
    if padded != v:  # the LM head's time and logits are costed on the padded vocabulary (estimator.model_dims)
        notes.append(f"Megatron-LM pads the vocabulary {v} to {padded} (a multiple of {VOCAB_DIVISOR} x TP "
                     f"{lo['tp']}), the size the plan's LM head is costed at; your tokenizer keeps {v} ids")
    return notes


def megatron_text(spec: Spec, layout: dict[str, Any] | Layout, n_devices: int, gpus_per_node: int,
                  candidate: str = "", tokens: float | None = None, hybrid: bool = False) -> str:
    """``--emit megatron``'s text: a comment naming ``candidate``, the token budget, the notes the flags cannot
    carry, then the arguments (with --train-samples and the schedule when ``tokens``, the budget D, is known)."""
    budget = Budget(tokens, spec.data.seqlen, spec.data.gbs) if tokens else None
    comments = [f"candidate: {candidate}"] if candidate else []
    if budget is None:
        comments.append("token budget: not given (estimate --tokens D, or the search's own --emit megatron); add "
                        + "--train-samples and the learning-rate schedule")
    else:
        comments.append(f"token budget: D = {tokens:.4g} tokens = {budget.train_iters} steps of {spec.data.gbs} "
                        f"x {spec.data.seqlen} tokens; WSD schedule (app:lr_hpo)")
    comments += megatron_notes(spec, layout)
    if hybrid:
        comments.append("HybridModel (Megatron-LM main after core_v0.19.0, pretrain_hybrid.py): the layer order and "
                        "pipeline segments are --hybrid-layer-pattern's")
    return render_megatron(megatron_args(spec, layout, budget, hybrid), n_devices, gpus_per_node, comments,
                           "pretrain_hybrid.py" if hybrid else "pretrain_gpt.py")


def render_megatron(args: list[list[str]], n_devices: int, gpus_per_node: int,
                    comments: list[str] | tuple[str, ...] = (), script: str = "pretrain_gpt.py") -> str:
    """Shell text: ``comments`` as # lines, a torchrun comment line, then one flag per line joined with
    backslashes."""
    import shlex

    nodes = max(1, n_devices // max(1, gpus_per_node))
    lines = [f"# {c}" for c in comments]
    lines.append(f"# {n_devices} GPUs = {nodes} nodes x {gpus_per_node}: torchrun --nnodes {nodes} "
                 f"--nproc-per-node {gpus_per_node} {script} \\")
    lines += ["  " + " ".join(shlex.quote(a) for a in flag) + " \\" for flag in args]
    lines[-1] = lines[-1].removesuffix(" \\")
    return "\n".join(lines)
