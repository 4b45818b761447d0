"""The parallel layout of execution plans: one type for one plan or a whole plan set.

:class:`ParallelLayout` holds the degrees of P plans as int64 columns (tp, cp, pp, dp, ep, etp, vpp,
mbs, ckpt; ckpt as :class:`~scaleplan.estimator.ckpt.CkptMode` codes), in the spirit of torchtitan's
``ParallelDims``: built once (from the user's :class:`scaleplan.specs.Layout` or by enumeration),
validated once (:meth:`ParallelLayout.reasons`, the rules of :data:`RULES`), and the one place that
answers derived questions (DP, EDP, n_mb, layers per stage, virtual stages) and placement questions
(which group leaves the node, ranks per node on an axis: the rails a strided group drives).

**Rank order.** Megatron-Core numbers ranks with two generators over the same world
(``parallel_state.RankGenerator``, order "tp-cp-ep-dp-pp", TP fastest). The dense one (EP = 1) makes a
TP group TP contiguous ranks, CP ranks TP apart, the DP x CP gradient group CP DP ranks TP apart and
pipeline neighbours TP CP DP apart. The expert one (Megatron-Core >= 0.10; TP = ETP, CP = 1, DP = EDP:
order etp-ep-edp-pp) makes an ETP group ETP contiguous ranks, EP ranks ETP apart and the expert gradient
group EDP ranks ETP EP apart; its pipeline groups are the dense ones (ETP EP EDP = TP CP DP).
:data:`GROUPS` is the one place this lives.

A group of n ranks s apart spans the domains its ranks fall in (rank r in domain r // gpn, gpn the GPUs of one
scale-up domain): :func:`scaleplan.estimator.placement.span` counts them, the worst group of a kind per plan
(:meth:`ParallelLayout.ranks_per_node`, :meth:`ParallelLayout.nodes`, :meth:`ParallelLayout.spans_nodes`).
"""
from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike
from scaleplan.estimator.ckpt import CkptMode
from scaleplan.estimator.model_dims import Geometry
from scaleplan.estimator.placement import span
from scaleplan.estimator.sources import distinct

from scaleplan.errors import SpecError
from scaleplan.specs import Layout

if TYPE_CHECKING:
    from scaleplan.stack import Stack

# group -> (stride between its ranks, its size) in Megatron-Core's rank order (module docstring)
GROUPS: dict[str, Callable[[ParallelLayout], tuple[np.ndarray, np.ndarray]]] = {
    "tp": lambda lo: (np.ones_like(lo.tp), lo.tp),
    "cp": lambda lo: (lo.tp, lo.cp),
    "dp_cp": lambda lo: (lo.tp, lo.cp * lo.dp),         # the dense gradient group
    "etp": lambda lo: (np.ones_like(lo.etp), lo.etp),
    "ep": lambda lo: (lo.etp, lo.ep),
    "edp": lambda lo: (lo.etp * lo.ep, lo.edp),  # the expert gradient group
    "pp": lambda lo: (lo.tp * lo.cp * lo.dp, lo.pp),
    "tp_cp_dp": lambda lo: (np.ones_like(lo.tp), lo.tp * lo.cp * lo.dp),  # one pipeline stage
}


@dataclass(frozen=True, eq=False)
class ParallelLayout:
    """P execution plans P_l = (TP, CP, PP, DP, EP, ETP, VPP, B_micro, A_ckpt) and their stage split as
    int64 arrays of shape (P,), in the field order of :class:`scaleplan.specs.Layout`; ``ckpt`` holds
    CkptMode codes, the first / last stage's layers 0 where the layout leaves them to the even split.
    Build with :meth:`of`, :meth:`from_specs` or :func:`~scaleplan.estimator.plans.enumerate_grid`; never mutated."""

    tp: np.ndarray
    cp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    vpp: np.ndarray
    decoder_first_pipeline_num_layers: np.ndarray
    decoder_last_pipeline_num_layers: np.ndarray
    mbs: np.ndarray
    ckpt: np.ndarray

    @classmethod
    def of(cls, tp: ArrayLike = 1, cp: ArrayLike = 1, pp: ArrayLike = 1, dp: ArrayLike = 1, ep: ArrayLike = 1,
           etp: ArrayLike = 1, vpp: ArrayLike = 1, mbs: ArrayLike = 1, ckpt: ArrayLike = "full",
           decoder_first_pipeline_num_layers: ArrayLike = 0,
           decoder_last_pipeline_num_layers: ArrayLike = 0) -> ParallelLayout:
        """Plans from scalars or arrays (broadcast together); ``ckpt`` by spec name(s) or code(s); the first /
        last stage's layers 0 for the even split."""
        ck = np.asarray(ckpt)
        if ck.dtype.kind in "US":
            ck = np.vectorize(lambda n: CkptMode.parse(str(n)).value, otypes=[np.int64])(ck)
        cols = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (
            tp, cp, pp, dp, ep, etp, vpp, decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers, mbs, ck)))
        return cls(*(np.array(c, dtype=np.int64).reshape(-1) for c in cols))

    @classmethod
    def from_specs(cls, layouts: Iterable[Layout], n_devices: int) -> ParallelLayout:
        """The user's layouts (specs.Layout); DP derived as N / (TP CP PP) where a layout omits it."""
        rows = [[getattr(lo, f) or 0 for f in COLUMNS[:-1]] + [CkptMode.parse(lo.ckpt).value] for lo in layouts]
        for r, lo in zip(rows, layouts):
            if lo.dp is None:  # dp: N_dev over the model-parallel product (floor; the mesh rule checks it)
                r[3] = n_devices // max(r[0] * r[1] * r[2], 1)
        a = np.array(rows, dtype=np.int64).reshape(-1, len(COLUMNS))
        return cls(*a.T.copy())

    @classmethod
    def concat(cls, sets: Iterable[ParallelLayout]) -> ParallelLayout:
        """The plans of ``sets`` one after the other (in order)."""
        sets = list(sets)
        return cls(*(np.concatenate([getattr(s, f) for s in sets]) for f in COLUMNS))

    def __len__(self) -> int:
        return len(self.tp)

    def take(self, idx: ArrayLike) -> ParallelLayout:
        """The plans at ``idx`` (indices or a mask)."""
        return ParallelLayout(*(getattr(self, f)[idx] for f in COLUMNS))

    def row(self, i: int) -> dict:
        """Plan ``i`` as a Layout's fields, ckpt by name (the JSON form of results); the first / last stage's
        layers only where the plan states them (an uneven split)."""
        out = {f: int(getattr(self, f)[i]) for f in FIELDS}
        out["ckpt"] = CkptMode(out["ckpt"]).spec_name
        out.update({f: int(getattr(self, f)[i]) for f in SPLIT_FIELDS if getattr(self, f)[i]})
        return out

    def spec(self, i: int) -> Layout:
        """Plan ``i`` as the user-input schema."""
        return Layout(**self.row(i))

    def distinct(self, *names: str) -> tuple[np.ndarray, np.ndarray]:
        """(first, inv) of :func:`~scaleplan.estimator.sources.distinct` over the columns ``names``;
        memoised for a read-only plan set (:meth:`readonly`: the enumeration's cached sets, which a search
        asks about once per geometry)."""
        if self.tp.flags.writeable:
            return distinct(*(getattr(self, f) for f in names))
        memo = _DISTINCT.setdefault(self, {})
        if names not in memo:
            memo[names] = distinct(*(getattr(self, f) for f in names))
        return memo[names]

    def readonly(self) -> ParallelLayout:
        """Mark the columns read-only (a cached plan set is shared between callers)."""
        for f in COLUMNS:
            getattr(self, f).flags.writeable = False
        return self

    # -- derived quantities ----------------------------------------------------------------------
    @property
    def n_devices(self) -> np.ndarray:
        """N_dev = TP CP PP DP."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def model_parallel(self) -> np.ndarray:
        """TP CP PP (the axes of :data:`MODEL_PARALLEL`): the ranks of one model replica; N_dev / DP."""
        return self.tp * self.cp * self.pp

    @property
    def edp(self) -> np.ndarray:
        """Expert data parallelism EDP = TP CP DP / (EP ETP) (eq:mesh-moe; integral for a valid plan)."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)

    @property
    def virtual_stages(self) -> np.ndarray:
        """PP VPP: the model chunks of the interleaved schedule."""
        return self.pp * self.vpp

    # -- placement -------------------------------------------------------------------------------
    def group(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(stride between ranks, ranks) of group ``name`` (:data:`GROUPS`), arrays over plans."""
        return GROUPS[name](self)

    def ranks_per_node(self, name: str, gpn: int) -> np.ndarray:
        """Ranks of one ``name`` group in one domain of ``gpn`` GPUs (float arrays): the NIC rails it drives
        once it leaves the domain; the fewest of the worst group where groups straddle domains unevenly."""
        return span(*self.group(name), self.n_devices, gpn)[1]

    def nodes(self, name: str, gpn: int) -> np.ndarray:
        """Domains of ``gpn`` GPUs the worst ``name`` group spans (float arrays)."""
        return span(*self.group(name), self.n_devices, gpn)[0]

    def spans_nodes(self, name: str, gpn: int) -> np.ndarray:
        """Whether a ``name`` group leaves its domain (bool arrays)."""
        return self.nodes(name, gpn) > 1

    # -- validity --------------------------------------------------------------------------------
    def reasons(self, ctx: LayoutContext) -> np.ndarray:
        """The first rule of :data:`RULES` each plan breaks (object array: the rule's name, None
        where the plan is structurally valid)."""
        return np.array([None] + [r.name for r in RULES], dtype=object)[self.rule_codes(ctx)]

    def rule_codes(self, ctx: LayoutContext) -> np.ndarray:
        """:meth:`reasons` as codes (int8 (P,): 0 valid, i + 1 where RULES[i] is the first rule broken)."""
        out = np.zeros(len(self), dtype=np.int8)
        for i, r in enumerate(RULES):
            ok = np.broadcast_to(np.asarray(r.check(self, ctx), dtype=bool), out.shape)
            out[~ok & (out == 0)] = i + 1
        return out

    def first_violation(self, ctx: LayoutContext, prefer: tuple[str, ...] = ()) -> Violation | None:
        """The first rule the first invalid plan breaks (:class:`Violation`: the plan's index, the rule,
        and the parts of its one-line error), or the first of the rules named in ``prefer`` that it breaks
        (a caller whose error for one rule says more); None when every plan is valid."""
        why = self.reasons(ctx)
        bad = np.nonzero(why != None)[0]  # noqa: E711  (object array)
        if not len(bad):
            return None
        i = int(bad[0])
        one = self.take([i])
        r = next((r for name in prefer for r in RULES if r.name == name and not np.all(r.check(one, ctx))),
                 next(r for r in RULES if r.name == why[i]))
        row = self.row(i)
        mesh = "{tp}*{cp}*{pp}*{dp}".format(**row)
        facts = dict(row, first=int(self.decoder_first_pipeline_num_layers[i]),
                     last=int(self.decoder_last_pipeline_num_layers[i]), stage_ranks=row["tp"] * row["cp"] * row["dp"],
                     n_devices=ctx.n_devices, gbs=ctx.gbs, seqlen=ctx.seqlen, n_experts=ctx.g.E, n_layers=ctx.g.L,
                     n_q_heads=ctx.g.nq, n_kv_heads=ctx.g.nkv, expert_inter_sz=ctx.g.dexp)
        return Violation(i, r, r.field, mesh if r.field == "mesh" else row.get(r.field, 0), r.allowed.format(**facts))

    def violation(self, ctx: LayoutContext) -> tuple[str, object, str] | None:
        """:meth:`first_violation` as (field, value, what is allowed) (field "mesh": the product TP CP PP DP);
        None when every plan is valid."""
        v = self.first_violation(ctx)
        return None if v is None else (v.field, v.value, v.allowed)

    def validate(self, ctx: LayoutContext) -> None:
        """Raise SpecError("layout <field>", value, allowed) for :meth:`violation` (a user's layout)."""
        v = self.violation(ctx)
        if v is not None:
            field, value, allowed = v
            raise SpecError("layout" if field == "mesh" else f"layout {field}", value, allowed)


# every column, in specs.Layout's field order; FIELDS: the ones every plan names (outputs list them), the
# stage split only where a plan states it (ParallelLayout.row)
COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(ParallelLayout))
_DISTINCT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # ParallelLayout.distinct's memo
MODEL_PARALLEL: tuple[str, ...] = ("tp", "cp", "pp")  # one model replica; DP is N_dev over their product
# the first and the last pipeline stage's layers (Megatron-LM's --decoder-first/last-pipeline-num-layers)
SPLIT_FIELDS: tuple[str, ...] = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")
FIELDS: tuple[str, ...] = tuple(c for c in COLUMNS if c not in SPLIT_FIELDS)
# what a stage's parameters, its DP groups and its optimizer shard depend on: the degrees and the stage split
DEGREE_FIELDS: tuple[str, ...] = ("tp", "cp", "pp", "dp", "ep", "etp", "vpp", *SPLIT_FIELDS)
assert COLUMNS == tuple(Layout.model_fields), "ParallelLayout's columns are specs.Layout's fields, in order"


def degree_groups(g: Geometry, lay: ParallelLayout) -> tuple[np.ndarray, np.ndarray]:
    """(first, inv) of :func:`~scaleplan.estimator.sources.distinct` over the plans' geometry, degrees
    (:data:`DEGREE_FIELDS`) and stage split: all the DP traffic, the optimizer step and the model state
    depend on. An evaluation groups its plans so once and hands the grouping to each of them."""
    return distinct(*g.batch_keys, *(getattr(lay, f) for f in DEGREE_FIELDS))


def layout_text(row: dict) -> str:
    """One plan's fields (a :meth:`ParallelLayout.row` dict, fields it lacks left out) as one line:
    ``tp=1 cp=1 pp=2 dp=16 ep=8 etp=1 vpp=1 mbs=1 full`` (a stated stage split after them)."""
    return " ".join(f"{k}={row[k]}" for k in (*FIELDS, *SPLIT_FIELDS) if k != "ckpt" and k in row) + \
        f" {row.get('ckpt', '')}"


@dataclass(frozen=True)
class LayoutContext:
    """What the validity rules read beside the layout: the model and the run (seqlen None: no CP rule), and
    how far beyond the paper's P_disc a plan may go: an expert mesh folded over TP and CP (``fold_experts``)
    and an uneven split of the layers over the stages (``uneven_stages``); both valid layouts, which an
    enumeration leaves out unless asked (PlanConstraints)."""

    g: Geometry
    n_devices: int
    gbs: int
    seqlen: int | None = None
    fold_experts: bool = True
    uneven_stages: bool = True
    a2a_overlap: bool = False  # the stack runs --overlap-moe-expert-parallel-comm (Stack.a2a_overlap)
    layer_graphs: bool = False  # the stack captures per-layer CUDA graphs (cuda_graphs but full_iteration)


def stack_rules(stack: Stack) -> dict[str, bool]:
    """The facts of a training stack (a :class:`~scaleplan.stack.Stack`) that Megatron-Core's layout rules
    read, as :class:`LayoutContext` and PlanConstraints name them."""
    layer_graphs = bool(stack.cuda_graphs) and not stack.captures_step()
    return {"a2a_overlap": stack.a2a_overlap, "layer_graphs": layer_graphs}


@dataclass(frozen=True)
class Violation:
    """A plan that breaks a rule: its index in the plan set, the rule, and the parts of the one-line error
    (``field`` as the rule names it, the plan's ``value`` there, what is ``allowed``)."""

    plan: int
    rule: Rule
    field: str
    value: object
    allowed: str


@dataclass(frozen=True)
class Rule:
    """One structural rule: ``name`` counts the plans it refuses, ``field`` and ``allowed`` (a format
    string over the plan's fields and the context's facts) make the one-line error. ``geometric``:
    the check reads the model (``ctx.g``); :func:`~scaleplan.estimator.plans.enumerate_grid` runs the others once
    per grid."""

    name: str
    field: str
    allowed: str
    check: Callable[[ParallelLayout, LayoutContext], np.ndarray]
    geometric: bool = True


RULES: list[Rule] = []  # in the order a plan's first failing rule is reported


#: the columns a geometric rule (one that reads the model) may read: enumeration runs those rules on the
#: distinct combinations of these alone (tests/estimator/test_layout_rules.py checks every rule against the
#: whole grid)
GEOMETRIC_COLUMNS: tuple[str, ...] = ("tp", "pp", "ep", "etp", "vpp", *SPLIT_FIELDS)


def rule(name: str, field: str, allowed: str, geometric: bool = True) -> Callable[[Callable], Callable]:
    """Register a validity rule (a function (layout, context) -> bool array, True where valid):
    adding a rule is one decorated function. ``geometric=False`` only for a check that never reads
    ``ctx.g`` (the model): enumeration then runs it once for every model searched on the grid; a
    geometric rule reads no column outside :data:`GEOMETRIC_COLUMNS`."""
    def deco(check):
        RULES.append(Rule(name, field, allowed, check, geometric))
        return check
    return deco


@rule("mesh_not_dividing_devices", "mesh", "tp*cp*pp*dp must equal --devices {n_devices}", geometric=False)
def _mesh(lo, c):
    return lo.n_devices == c.n_devices


# the paper's P_disc (eq:mesh-moe) where folding is not asked for: the expert mesh within DP
@rule("ep_not_dividing_dp", "ep", "must divide dp={dp} (eq:mesh-moe; a layout given by hand, or --fold-experts, may fold "
      "the expert mesh over TP and CP)", geometric=False)
def _ep_in_dp(lo, c):
    return True if c.fold_experts else lo.dp % lo.ep == 0


# MoE parallel folding (Megatron-Core's expert RankGenerator: tp=ETP, ep=EP, dp=EDP over each stage's ranks):
# the expert mesh EP x ETP x EDP is laid over the stage's TP x CP x DP ranks, EP need not divide DP
@rule("expert_mesh_not_folding", "ep", "ep*etp must divide tp*cp*dp = {stage_ranks}, the ranks of one pipeline "
      "stage the expert mesh EP x ETP x EDP folds over", geometric=False)
def _expert_mesh(lo, c):
    return (lo.tp * lo.cp * lo.dp) % (lo.ep * lo.etp) == 0


@rule("experts_not_divisible_by_ep", "ep", "must divide n_experts={n_experts}")
def _experts(lo, c):
    return (c.g.E % lo.ep == 0) if c.g.is_moe else lo.ep == 1


@rule("gbs_not_divisible", "mbs", "dp*mbs must divide gbs={gbs} (integral n_mb)", geometric=False)
def _gbs(lo, c):
    return c.gbs % (lo.dp * lo.mbs) == 0


# the paper's P_disc where uneven stages are not asked for: an even split
@rule("layers_not_divisible_by_pp_vpp", "pp", "pp*vpp must divide n_layers={n_layers} (a layout given by hand, or "
      "--uneven-stages, may split them unevenly)")
def _even_layers(lo, c):
    if c.uneven_stages:
        return True
    unset = (lo.decoder_first_pipeline_num_layers == 0) & (lo.decoder_last_pipeline_num_layers == 0)
    return ~unset | (c.g.L % lo.virtual_stages == 0)


@rule("stage_layers_need_pp", "pp", "at least 2 pipeline stages where decoder_first_pipeline_num_layers or "
      "decoder_last_pipeline_num_layers is stated", geometric=False)
def _split_needs_pp(lo, c):
    return (lo.pp > 1) | ((lo.decoder_first_pipeline_num_layers == 0) & (lo.decoder_last_pipeline_num_layers == 0))


# Megatron-Core's TransformerConfig: the layers left after the stated first / last stages split evenly over the
# other stages, and there are such layers exactly where there are such stages
@rule("stage_layers_not_adding_up", "decoder_first_pipeline_num_layers",
      "first {first} + last {last} stage layers leaving n_layers={n_layers} - first - last to split evenly over "
      "the pp={pp} stages that do not state theirs")
def _split_adds_up(lo, c):
    first, last = lo.decoder_first_pipeline_num_layers, lo.decoder_last_pipeline_num_layers
    if not (first.any() or last.any()):  # no split stated (every enumerated plan): nothing to add up
        return True
    rest, shared = c.g.L - first - last, lo.pp - (first > 0) - (last > 0)
    ok = (rest >= 0) & ((shared > 0) == (rest > 0)) & (rest % np.maximum(shared, 1) == 0)
    return ok | ((first == 0) & (last == 0)) | (lo.pp == 1)


@rule("layers_not_split_over_stages", "pp", "pp*vpp chunks splitting n_layers={n_layers}: evenly, or with "
      "decoder_first/last_pipeline_num_layers")
def _layers(lo, c):
    """A stated split is one Megatron-LM runs whatever its stages' layers (emitted as the first / last counts, the
    accounting flags or a --pipeline-model-parallel-layout string: scaleplan/megatron/args.py); an unstated one
    needs the even split or one scaleplan states (shapes.auto_split)."""
    from scaleplan.estimator.shapes import auto_split

    first, last = lo.decoder_first_pipeline_num_layers, lo.decoder_last_pipeline_num_layers
    stated = (first > 0) | (last > 0)
    even = np.broadcast_to(c.g.L % lo.virtual_stages == 0, stated.shape)
    if not (c.uneven_stages or stated.any()):  # an enumeration on P_disc: _even_layers refuses the others
        return True
    ok = even | stated
    rest = np.nonzero(~ok)[0]  # no split stated and no even one: the automatic split (few plans)
    if len(rest):
        L = np.broadcast_to(np.asarray(c.g.L), stated.shape)[rest]
        ok = ok.copy()
        ok[rest] = auto_split(L, lo.pp[rest], lo.vpp[rest])[0] > 0
    return ok


@rule("vpp_needs_pp", "vpp", "interleaving needs pp > 1", geometric=False)
def _vpp(lo, c):
    return (lo.vpp == 1) | (lo.pp > 1)


# Megatron-Core's rules for --overlap-moe-expert-parallel-comm (core_v0.19.0 TransformerConfig.__post_init__)
for _name, _field, _allowed, _ok in (
        ("a2a_overlap_needs_ep", "ep", "> 1 under stack.a2a_overlap (Megatron-Core's rule)", lambda lo: lo.ep > 1),
        ("a2a_overlap_needs_vpp", "vpp", "> 1 where pp > 1 under stack.a2a_overlap (Megatron-Core's rule)",
         lambda lo: (lo.vpp > 1) | (lo.pp == 1)),
        ("a2a_overlap_not_full", "ckpt", "not full under stack.a2a_overlap (Megatron-Core's rule)",
         lambda lo: lo.ckpt != CkptMode.FULL.value)):
    rule(_name, _field, _allowed, geometric=False)(lambda lo, c, ok=_ok: ok(lo) | (not c.a2a_overlap))


# core_v0.19.0 TransformerConfig.__post_init__: with CUDA graphs, recompute_granularity full only under
# cuda_graph_impl full_iteration ("full recompute is only supported with full iteration CUDA graph")
@rule("layer_graphs_not_full", "ckpt", "not full under per-layer stack.cuda_graphs (Megatron-Core: full "
      "recompute only with cuda_graphs full_iteration)", geometric=False)
def _layer_graphs(lo, c):
    return (lo.ckpt != CkptMode.FULL.value) | (not c.layer_graphs)


@rule("heads_not_divisible_by_tp", "tp", "must divide n_q_heads={n_q_heads}")
def _heads(lo, c):
    return c.g.nq % lo.tp == 0


# TP | n_kv, or n_kv | TP with the KV heads replicated over TP / n_kv ranks (kv_loc = max(n_kv/TP, 1))
@rule("kv_heads_vs_tp", "tp", "must divide or be a multiple of n_kv_heads={n_kv_heads}")
def _kv_heads(lo, c):
    return (c.g.nkv % lo.tp == 0) | (lo.tp % c.g.nkv == 0)


# the paper's P_disc where folding is not asked for: the expert tensor group within the TP group
@rule("etp_not_dividing_tp", "etp", "must divide tp={tp} (a layout given by hand, or --fold-experts, may fold the "
      "expert mesh over TP, CP and DP)", geometric=False)
def _etp_in_tp(lo, c):
    return True if c.fold_experts else lo.tp % lo.etp == 0


# ETP shards each expert's width (TEGroupedMLP: fc1 / fc2 split over the expert tensor group)
@rule("etp_not_dividing_expert_width", "etp", "must divide expert_inter_sz={expert_inter_sz}")
def _etp(lo, c):
    return c.g.dexp % lo.etp == 0


# Megatron-Core builds an MoE layer with biases only at ETP 1 (TransformerConfig: "Bias in Moe is only supported
# when ETP==1"): GPT-OSS's experts carry biases
@rule("moe_bias_needs_etp_1", "etp", "1 for an MoE model with biases on every linear (model.linear_bias: all)")
def _moe_bias(lo, c):
    return (lo.etp == 1) | (c.g.bias != "all") | (not c.g.is_moe)


# Megatron's load-balanced causal CP cuts the sequence into 2 CP chunks
@rule("cp_not_dividing_seq", "cp", "2*cp must divide seqlen={seqlen}", geometric=False)
def _cp(lo, c):
    return True if c.seqlen is None else (lo.cp == 1) | (c.seqlen % (2 * lo.cp) == 0)
