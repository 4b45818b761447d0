"""The Estimator: MFU(.) and Mem(.) of execution plans (paper sec:performance-model).

The contract is :class:`Estimator`'s docstring (docs/architecture.md: where each piece lives). Tables
are loaded once per (database URL, profile) and cached; every evaluation is vectorised over plans
(``model.TimeModel``).
"""
from __future__ import annotations

import copy
import dataclasses
import math
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike
from scaleplan.estimator.dispatch import (RUNTIME_SCALES, STACKS, UNTRACED_HOST_SHARE, host_untimed, law_in_force,
                                          lent_host_ratio, untraced_host_note)
from scaleplan.estimator.model_dims import Geometry, geometry, structure
from scaleplan.estimator.memory import RESERVE_BYTES, STAGES, StageMemory, allocated_reserved, memory_breakdown, state_bytes
from scaleplan.estimator.layout import DEGREE_FIELDS, LayoutContext, ParallelLayout, stack_rules
from scaleplan.estimator.best_plans import best_of_batch
from scaleplan.estimator.model import ChiCoefficients, DispatchLaw, Evaluation, TimeModel
from scaleplan.estimator.placement import plans_domain
from scaleplan.estimator.plans import PlanConstraints, enumerate_plans
from scaleplan.estimator.results import GB, EstimateResult, LayoutsResult
from scaleplan.estimator.shapes import PlanShapes, plan_shapes, resolve_split
from scaleplan.estimator.stack_memory import non_tn_fp8
from scaleplan.estimator.tables import (
    ANALYTIC,
    EXTRAPOLATE_MODES,
    SOURCE_NAMES,
    Tables,
)
from scaleplan.estimator.table_build import build_tables, cached_tables
from scaleplan.errors import OutOfRangeError, ScaleplanError, SpecError
from scaleplan.profiles import ClusterProfile, load_profile
from scaleplan.specs import OPTIMIZERS, Layout, ModelBlock, Spec
from scaleplan.stack import PAPER_STACK, Stack

if TYPE_CHECKING:
    import pandas as pd


def _check_positive(**kw) -> None:
    for k, v in kw.items():
        try:
            bad = v is None or not math.isfinite(float(v)) or float(v) <= 0 or float(v) != int(v)
        except (TypeError, ValueError):
            bad = True
        if bad:
            raise SpecError(k, v, "a positive integer")


class Estimator:
    """Predict t_iter, MFU, HFU and memory of execution plans on one hardware profile.

    Args:
        profile: profile name or ClusterProfile.
        db_url: calibration database (None: the default); tables cached per (url, profile).
        extrapolate: "compose" (default: out-of-range lookups composed by each table's physical rule,
            tables.COMPOSE_RULES, labelled "composed"), "error" (they raise / mark plans infeasible)
            or "clamp" (the edge value, counted).
        calibration_id: a Calibration row id to use for chi_sys (None: newest per kind).
        use_calibration: False -> chi_sys = 1 and the default dispatch law (t_analytic).
        host_scale: multiply the dispatch law's host terms (t_gap, t_ep_host, t_host; on a
            serial-dispatch profile also the measured per-op host times of the ``ops:*`` rows) by
            this factor; None -> the ``host_scale`` coefficient of the 'dispatch' calibration in
            force (1 without one). Used by ``calibrate fit --kind dispatch --from-runs``.
        kernel_scale: multiply every device-kernel time (see :class:`TimeModel`) by this factor;
            None -> the ``kernel_scale`` coefficient of the 'dispatch' calibration in force (1
            without one). Fitted with host_scale by ``calibrate fit --kind dispatch --from-runs``.
        ep_host_scale: multiply the law's per-MoE-layer EP host term t_ep_host on top of host_scale
            (None -> the 'dispatch' calibration's ``ep_host_scale``, 1 without one): the EP token path
            is the one host cost the kernel count does not see, and its constant is the least certain.
        stack: whose software stack's host dispatch is predicted: "megatron" (default; estimate,
            layouts, search, calibrate: on a GPU profile the kernel-count law of
            :mod:`scaleplan.estimator.dispatch`, ``ops:*`` rows ignored) or "reference" (scaleplan's
            own reference model, what ``scaleplan validate`` trains: the measured host seconds of its
            ops, dispatch rows ``ops:*``, per micro-batch and stage, max'ed with the GPU time on a GPU
            profile, labelled measured; the law, labelled analytic, where the profile has no rows for
            the checkpoint mode; :meth:`lookups` then asks for those rows). Serial-dispatch (CPU)
            profiles use the rows with either stack, as before.
    Raises:
        SpecError: unknown profile, extrapolate mode or stack.
    """

    def __init__(self, profile: str | ClusterProfile = "p6-b200.48xlarge", db_url: str | None = None,
                 extrapolate: str = "compose", calibration_id: int | None = None, use_calibration: bool = True,
                 tables: Tables | None = None, host_scale: float | None = None,
                 kernel_scale: float | None = None, ep_host_scale: float | None = None,
                 stack: str = "megatron"):
        if extrapolate not in EXTRAPOLATE_MODES:
            raise SpecError("extrapolate", extrapolate, " | ".join(EXTRAPOLATE_MODES))
        if stack not in STACKS:
            raise SpecError("stack", stack, " | ".join(STACKS))
        self.stack = stack
        self.profile = profile if isinstance(profile, ClusterProfile) else load_profile(profile)
        self.extrapolate = extrapolate
        self.db_url = db_url
        if tables is None:
            from scaleplan.db.session import resolve_url

            tables = cached_tables(resolve_url(db_url), self.profile.name, self.profile.peak("bf16"))
        self.tables = tables
        # the training stack the model-only paths (best_plans, the search) cost; a spec names its own
        self.training_stack, self.stack_key = PAPER_STACK, PAPER_STACK.key()
        self._given = (calibration_id, use_calibration, host_scale, kernel_scale, ep_host_scale)
        self._by_stack: dict[str, Estimator] = {}
        self._calibrate_and_build()

    def _calibrate_and_build(self) -> None:
        """The law, chi_sys and runtime scales in force for this estimator's training stack (the calibration
        rows of that stack only, then the scales given explicitly), and the time model on them."""
        calibration_id, use_calibration, host_scale, kernel_scale, ep_host_scale = self._given
        self.host_scale = self.kernel_scale = self.ep_host_scale = 1.0
        self.dispatch, self.chi = self._calibration(calibration_id, use_calibration)
        if ep_host_scale is not None:
            self.ep_host_scale = float(ep_host_scale)
        if host_scale is not None:
            self.host_scale = float(host_scale)
        if kernel_scale is not None:
            self.kernel_scale = float(kernel_scale)
        if not (math.isfinite(self.kernel_scale) and self.kernel_scale > 0):
            raise SpecError("kernel_scale", self.kernel_scale, "a positive finite number")
        self._apply_host_scale()
        self.model = TimeModel(self.profile, self.tables, self.extrapolate, self.dispatch, self.chi,
                               self.kernel_scale, self.stack)
        self._host_free: Estimator | None = None  # built on first use by _device_only, for this stack's law

    def for_stack(self, stack: Stack, precision: str) -> Estimator:
        """This estimator for plans on training ``stack`` in ``precision``: the same tables and profile, the
        calibration of that stack (:meth:`Stack.key`; none of another stack's is ever applied). Cached."""
        key = stack.key(precision)
        if key == self.stack_key:
            return self
        other = self._by_stack.get(key)
        if other is None:
            other = copy.copy(self)
            other.training_stack, other.stack_key = stack, key
            other._calibrate_and_build()
            self._by_stack[key] = other
        return other

    def runnable(self, c: PlanConstraints) -> PlanConstraints:
        """``c`` restricted to the plans this estimator's training stack runs (Megatron-Core refuses some layouts
        under --overlap-moe-expert-parallel-comm or per-layer CUDA graphs: estimator/layout.py's stack
        rules)."""
        facts = stack_rules(self.training_stack)
        return c if all(getattr(c, k) == v for k, v in facts.items()) else dataclasses.replace(c, **facts)

    @classmethod
    def from_frames(cls, profile: str | ClusterProfile, frames: dict[str, pd.DataFrame],
                    **kw: Any) -> Estimator:
        prof = profile if isinstance(profile, ClusterProfile) else load_profile(profile)
        return cls(prof, tables=build_tables(prof.name, frames, prof.peak("bf16")), use_calibration=False, **kw)

    # -- calibration ---------------------------------------------------------------------------
    def _calibration(self, cal_id, use) -> tuple[DispatchLaw, ChiCoefficients]:
        """The dispatch law (precedence: :func:`dispatch.law_in_force`) and chi_sys in force; sets the
        runtime scales a 'dispatch' calibration carries."""
        rows = self._calibration_rows(cal_id) if use else {}
        law, scales = law_in_force(self.profile.dispatch, self.tables.t_gap_s, self.tables.t_host_s,
                                   rows.get("dispatch"), self._lent_host_ratio())
        self.host_scale, self.kernel_scale, self.ep_host_scale = (scales[k] for k in RUNTIME_SCALES)
        chi = ChiCoefficients()
        c = rows.get("chi_sys")
        if c is not None:
            co = c.coefficients
            chi = ChiCoefficients(float(co.get("c_a2a", 0.0)), float(co.get("c_pp", 0.0)),
                                  float(co.get("c_ovl", 0.0)), c.id, float(co.get("c_level", 0.0)))
        return law, chi

    def _lent_host_ratio(self) -> float | None:
        """Where the profile uses another's dispatch law (``dispatch_from``) and this host's dispatch rows are
        measured: :func:`~scaleplan.estimator.dispatch.lent_host_ratio` against the lender's rows in the same
        database; else None."""
        lender, src = self.profile.dispatch_from, self.tables.source
        if lender is None or not self.tables.t_gap_s or src is None:
            return None
        theirs = cached_tables(src[0], lender, load_profile(lender).peak("bf16"))
        return lent_host_ratio(self.tables.t_gap_s, theirs.t_gap_s)

    def _apply_host_scale(self) -> None:
        """Scale the host side of dispatch by ``self.host_scale`` (the per-op host cost measured on a
        probe understates a real model's): t_gap, t_ep_host, t_host of the law and the ``ops:*`` host
        seconds (read on serial-dispatch profiles and by the reference stack; a copy of the tables, the
        cached ones stay unscaled)."""
        s, se = self.host_scale, self.ep_host_scale
        for name, v in (("host_scale", s), ("ep_host_scale", se)):
            if not (math.isfinite(v) and v > 0):
                raise SpecError(name, v, "a positive finite number")
        if (s, se) == (1.0, 1.0):
            return
        law = self.dispatch  # replace keeps the stack whose kernels kappa counts: a scale moves host seconds only
        self.dispatch = dataclasses.replace(
            law, t_gap_s=law.t_gap_s * s, t_host_s=law.t_host_s * s, t_ep_host_s=law.t_ep_host_s * s * se,
            source=f"{law.source}, host_scale {s:.4g}" + (f", ep_host_scale {se:.4g}" if se != 1 else ""))
        if s == 1.0:
            return
        if self.tables.host_ops:
            scaled = {}
            for k, rows in self.tables.host_ops.items():
                rows = np.array(rows, dtype=float, copy=True)
                rows[:, 3] *= s  # column 3 = host seconds (m, n, k, wall_per_kernel_s)
                scaled[k] = rows
            self.tables = dataclasses.replace(self.tables, host_ops=scaled)

    def _memory(self, g: Geometry, plans: ParallelLayout, gbs: int, seqlen: int, optimizer: str, rope: bool = True,
                shapes: PlanShapes | None = None) -> StageMemory:
        """Bytes per device by category (estimator/memory.py) of each plan's worst stage. Beyond the allocated bytes: the caching
        allocator's overhead and the memory outside it as the bench suite 'allocator' measured them on
        this profile's GPU; without such rows the fixed 5 GB ``reserve`` the plans were always held to
        (counted as reserved; the suite's measurement replaces it); nothing on a serial-dispatch (CPU)
        profile, which has no device allocator or context."""
        st = {"stack": self.training_stack, "non_tn": non_tn_fp8(self.profile.gpu_name),
              "scaleup_domain": plans_domain(self.profile, plans.n_devices)}
        if self.tables.allocator is not None:
            frac, ctx = self.tables.allocator
        elif self.profile.serial_dispatch:
            frac, ctx = 0.0, 0.0
        else:
            return memory_breakdown(g, plans, gbs, seqlen, optimizer, RESERVE_BYTES, rope=rope, shapes=shapes, **st)
        return memory_breakdown(g, plans, gbs, seqlen, optimizer, allocator_fraction=frac, context_bytes=ctx,
                                rope=rope, shapes=shapes, **st)

    def _state_fits(self, geoms: Geometry, sets: list[ParallelLayout], optimizer: str,
                    limit: float) -> list[np.ndarray]:
        """Per plan set (``sets[j]`` the plans of geometry j of ``geoms``: one Geometry, or a GeometryBatch
        of one plan per geometry), the indices of the plans whose model state alone
        (:func:`memory.state_bytes`) stays within ``limit`` bytes: the total of :meth:`_memory` sums it
        first and adds only non-negative bytes, so the others exceed the limit whatever their activations
        (4 in 5 plans on the paper grid). Evaluated once per distinct geometry and :data:`DEGREE_FIELDS`."""
        frac, ctx = self.tables.allocator if self.tables.allocator is not None else (0.0, 0.0)
        if frac < 0 or ctx < 0:  # a measured allocator term below zero: no bound, every plan goes on
            return [np.arange(len(s)) for s in sets]
        parts = [s.distinct(*DEGREE_FIELDS) for s in sets]  # memoised per plan set
        tuples = ParallelLayout.concat([s.take(f) for s, (f, _) in zip(sets, parts)])
        owner = np.repeat(np.arange(len(sets)), [len(f) for f, _ in parts])
        fits = ~(state_bytes(geoms.take(owner), tuples, optimizer, stack=self.training_stack,
                             non_tn=non_tn_fp8(self.profile.gpu_name)) > limit)
        starts = np.cumsum([0] + [len(f) for f, _ in parts])
        return [np.nonzero(fits[a + inv])[0] for (_, inv), a in zip(parts, starts)]

    def _calibration_rows(self, cal_id) -> dict[str, Any]:
        from scaleplan.db.calibrations import calibrations_in_force

        return calibrations_in_force(self.db_url, self.profile.name, cal_id, self.stack_key)

    # -- public API ----------------------------------------------------------------------------
    def estimate(self, spec: Spec, n_devices: int, layouts: list[Layout] | ParallelLayout | None = None,
                 mem_fraction: float = 1.0) -> list[EstimateResult]:
        """Evaluate explicit layouts (default: the spec's own; the user's :class:`Layout` list, or the plans
        already built from them); a plan needing more than ``mem_fraction`` of HBM is marked infeasible
        (reason "memory"). The spec's training stack is costed, with its own calibration (:meth:`for_stack`).
        Raises OutOfRangeError or SpecError."""
        est = self.for_stack(spec.stack, spec.model.precision)
        ev = est.evaluate(spec, n_devices, layouts)
        g, plans = geometry(spec.model), ev.plans
        mem = est._memory(g, plans, spec.data.gbs, spec.data.seqlen, spec.optimizer.optimizer_type,
                          spec.model.rotary_embeds, ev.shapes)
        cap, alone = self.profile.hbm_bytes, est._device_only(spec, g, ev)
        return [est._result(g, ev, mem, i, spec.data.gbs * spec.data.seqlen, cap, mem_fraction,
                            device_only_s=None if alone is None else float(alone[i])) for i in range(len(plans))]

    # host seconds of the host-free estimator (:meth:`host_free`): a positive scale, as the law requires, whose host
    # terms are below a nanosecond per micro-batch
    HOST_FREE_SCALE = 1e-9

    def host_untimed_bound(self, share: ArrayLike) -> np.ndarray:
        """Whether plans whose dispatch floor is ``share`` of their step (arrays) are host-bound on a stack whose host
        is untimed: the law traced on another stack, no host scale of this one's, and the floor at least
        :data:`~scaleplan.estimator.dispatch.UNTRACED_HOST_SHARE` (the condition of the ``dispatch_floor:`` warning,
        :func:`~scaleplan.estimator.dispatch.untraced_host_note`)."""
        return np.asarray(share) >= UNTRACED_HOST_SHARE if host_untimed(
            self.dispatch, self.stack_key, self.host_scale != 1.0) else np.zeros(np.shape(share), dtype=bool)

    def host_free(self) -> Estimator:
        """This estimator (its stack, tables and calibration) with the law's host seconds taken to nothing
        (x :data:`HOST_FREE_SCALE`): its plans' steps are the GPU's work alone, the end of the range an untimed host
        leaves open that the law's own estimate does not give. Built once per estimator."""
        if self._host_free is None:
            free = copy.copy(self)
            free._by_stack, free._given = {}, self._given[:2] + (self.HOST_FREE_SCALE,) + self._given[3:]
            free._calibrate_and_build()
            self._host_free = free
        return self._host_free

    def _device_only(self, spec: Spec, g: Geometry, ev: Evaluation) -> np.ndarray | None:
        """Seconds per step of the plans of ``ev`` at no host cost (:meth:`host_free`), shape (plans,), which the
        host-bound warning of an untimed stack states. None where no plan carries that warning."""
        if not self.host_untimed_bound(ev.components["dispatch_floor"] / ev.t_iter).any():
            return None
        return self.host_free().model.evaluate(g, ev.plans, spec.data.gbs, spec.data.seqlen,
                                               spec.optimizer.optimizer_type, stack=spec.stack).t_iter

    def evaluate(self, spec: Spec, n_devices: int, layouts: list[Layout] | ParallelLayout | None = None) -> Evaluation:
        """The time model's per-plan arrays for explicit layouts (default: the spec's own), validated by the
        layout's rules as :meth:`estimate` validates them but without the memory model or result rows: what a
        fit of step times reads (:func:`scaleplan.calibrate.joint.estimator_t_pred`). Raises OutOfRangeError
        or SpecError."""
        _check_positive(n_devices=n_devices, gbs=spec.data.gbs, seqlen=spec.data.seqlen)
        est = self.for_stack(spec.stack, spec.model.precision)
        g = geometry(spec.model)
        plans = layouts if isinstance(layouts, ParallelLayout) else \
            ParallelLayout.from_specs(layouts or [spec.default_layout()], n_devices)
        ctx = LayoutContext(g, n_devices, spec.data.gbs, spec.data.seqlen, **stack_rules(spec.stack))
        plans.validate(ctx)
        plans = resolve_split(g, plans)  # the uneven split the results state and the arguments emit
        ev = est.model.evaluate(g, plans, spec.data.gbs, spec.data.seqlen, spec.optimizer.optimizer_type,
                                stack=spec.stack)
        if self.extrapolate == "error":
            bad = np.nonzero(ev.oor.reason != None)[0]
            if len(bad):
                i = bad[0]
                raise OutOfRangeError(str(ev.oor.table[i]), str(ev.oor.axis[i]), float(ev.oor.value[i]),
                                      float(ev.oor.lo[i]), float(ev.oor.hi[i]))
        return ev

    def layouts(self, spec: Spec, n_devices: int, constraints: PlanConstraints = PlanConstraints(),
                top: int | None = 10) -> LayoutsResult:
        """Ranked feasible plans of P_disc(N_dev) with counts of infeasible plans by reason."""
        return self.layouts_parts(spec, n_devices, [constraints], top)[0]

    def layouts_parts(self, spec: Spec, n_devices: int, parts: list[PlanConstraints],
                      top: int | None = 10) -> list[LayoutsResult]:
        """:meth:`layouts` under each of ``parts`` (a list aligned with the results), the plans of every part
        costed in one evaluation. A plan's numbers do not depend on the plans evaluated with it (every
        evaluation is elementwise), so each result is its part's :meth:`layouts`; the evaluation's fixed
        cost (the table lookups, the kernel and stage set-up) is paid once, which is most of a command's
        evaluation time when a part adds one micro-batch size to another."""
        _check_positive(n_devices=n_devices, gbs=spec.data.gbs, seqlen=spec.data.seqlen)
        return self.for_stack(spec.stack, spec.model.precision)._search(
            spec.model, n_devices, spec.data.gbs, spec.data.seqlen, spec.optimizer.optimizer_type, parts, top)

    def best_plan(self, model: ModelBlock, n_devices: int, gbs: int, seqlen: int, optimizer: str = "adamw",
                  constraints: PlanConstraints = PlanConstraints()) -> EstimateResult | None:
        """The inner max of eq:c-flops: the best feasible plan (None when none is feasible); one geometry
        of :meth:`best_plans`."""
        return self.best_plans([model], n_devices, gbs, seqlen, optimizer, constraints)[0]

    def best_plans(self, models: list[ModelBlock], n_devices: int, gbs: int, seqlen: int, optimizer: str = "adamw",
                   constraints: PlanConstraints = PlanConstraints(), chunk: int = 256) -> list[EstimateResult | None]:
        """:meth:`best_plan` of each of ``models`` (a list aligned with them), evaluated in batches: the plans
        of up to ``chunk`` geometries of one structure (:func:`~scaleplan.estimator.model_dims.structure`) form one
        plan set, each plan carrying its geometry's fields (:class:`~scaleplan.estimator.model_dims.GeometryBatch`),
        so the memory and time models run once per batch instead of once per geometry (the per-call numpy
        overhead of small arrays dominated a search). Every evaluation is elementwise over plans, so each
        plan's numbers are best_plan's; a result's warnings are those its own geometry's plans raised.
        ``chunk`` bounds the memory (a few hundred geometries' plans at once). Raises as best_plan."""
        _check_positive(n_devices=n_devices, gbs=gbs, seqlen=seqlen)
        if optimizer not in OPTIMIZERS:
            raise SpecError("optimizer", optimizer, f"one of {', '.join(OPTIMIZERS)}")
        geoms = [geometry(m) for m in models]
        if self.model.measured_host:  # measured host rows are keyed by one geometry's (d, E): one per batch
            chunk = 1
        groups: dict[tuple, list[int]] = {}
        for i, (m, g) in enumerate(zip(models, geoms)):
            groups.setdefault(structure(g) + (m.rotary_embeds,), []).append(i)
        out: list[EstimateResult | None] = [None] * len(models)
        for idx in groups.values():
            for lo in range(0, len(idx), max(int(chunk), 1)):
                part = idx[lo:lo + max(int(chunk), 1)]
                best = best_of_batch(self, [geoms[i] for i in part], models[part[0]].rotary_embeds, n_devices, gbs,
                                     seqlen, optimizer, constraints)
                for i, res in zip(part, best):
                    out[i] = res
        return out

    def evaluate_arrays(self, model: ModelBlock, n_devices: int, gbs: int, seqlen: int, optimizer: str,
                        constraints: PlanConstraints = PlanConstraints()) -> tuple:
        """Vectorised core: (plans, evaluation, memory bytes, feasible mask, reasons, counts, n_total)."""
        g, plans, ev, mem, [(_, feasible, reason, counts, total)] = self._evaluate_parts(
            model, n_devices, gbs, seqlen, optimizer, [constraints])
        return g, plans, ev, mem, feasible, reason, counts, total

    def _evaluate_parts(self, model: ModelBlock, n_devices: int, gbs: int, seqlen: int, optimizer: str,
                        parts: list[PlanConstraints]) -> tuple:
        """:meth:`evaluate_arrays` of several constraint sets at once: (geometry, plans, evaluation, memory
        bytes, [one tuple per part: (its slice of the plans, feasible mask, reasons, counts, n_total)]). The
        plans of every part are enumerated on their own and evaluated together (None evaluation and memory
        when no part has a valid plan)."""
        g = geometry(model)
        enum = [enumerate_plans(g, n_devices, gbs, self.runnable(c), seqlen) for c in parts]
        ends = np.cumsum([len(p) for p, _, _ in enum]).tolist()
        cuts = [slice(lo, hi) for lo, hi in zip([0] + ends[:-1], ends)]
        if ends[-1] == 0:
            return g, enum[0][0], None, None, [(s, np.zeros(0, bool), np.zeros(0, object), counts, total)
                                              for s, (_, counts, total) in zip(cuts, enum)]
        plans = enum[0][0] if len(enum) == 1 else ParallelLayout.concat([p for p, _, _ in enum if len(p)])
        sh = plan_shapes(g, plans, seqlen, gbs)
        ev = self.model.evaluate(g, plans, gbs, seqlen, optimizer, shapes=sh, stack=self.training_stack)
        mem = self._memory(g, plans, gbs, seqlen, optimizer, model.rotary_embeds, sh)
        return g, plans, ev, mem, [(s, *self._verdicts(ev, mem, s, c.mem_fraction, counts), total)
                                   for s, c, (_, counts, total) in zip(cuts, parts, enum)]

    def _verdicts(self, ev: Evaluation, mem: StageMemory, part: slice, mem_fraction: float,
                  counts: dict[str, int]) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
        """(feasible mask, reasons, counts) of the plans of ``part``: out of range (the lookup's reason),
        else over ``mem_fraction`` of HBM ("memory"), each counted into ``counts`` after the rules'."""
        tot = sum(v[part] for v in mem.values())
        reason = np.array(ev.oor.reason[part], dtype=object)
        oor = ev.oor.reason[part] != None
        over = (tot > mem_fraction * self.profile.hbm_bytes) & ~oor
        reason[over] = "memory"
        if over.any():
            counts["memory"] = counts.get("memory", 0) + int(over.sum())
        if oor.any():
            for r, n in Counter(reason[oor].tolist()).items():
                counts[str(r)] = counts.get(str(r), 0) + int(n)
        return ~(oor | over), reason, counts

    def _search(self, model, n_devices, gbs, seqlen, optimizer, parts, top) -> list[LayoutsResult]:
        g, _, ev, mem, verdicts = self._evaluate_parts(model, n_devices, gbs, seqlen, optimizer, parts)
        out = []
        for (part, feasible, _, counts, total), c in zip(verdicts, parts):
            if ev is None or part.start == part.stop:
                out.append(LayoutsResult([], counts, total, 0, []))
                continue
            idx = part.start + np.nonzero(feasible)[0]
            order = idx[np.argsort(-ev.mfu[idx], kind="stable")]
            if top is not None:
                order = order[:top]
            ranked = [self._result(g, ev, mem, i, gbs * seqlen, self.profile.hbm_bytes, c.mem_fraction, part)
                      for i in order]
            analytic = sorted(k for k, v in ev.sources.items() if (v[part] == ANALYTIC).any())
            out.append(LayoutsResult(ranked, counts, total, len(idx), analytic))
        return out

    def lookups(self, spec: Spec, n_devices: int, layouts: list[Layout] | None = None) -> dict[str, list[dict]]:
        """The exact table points the evaluation of ``layouts`` (default: the spec's) looks up, recorded
        while it runs (:func:`lookup_listing.recorded_lookups`); the host rows ``ops:*`` of the reference model
        wherever the evaluation reads them (a serial-dispatch profile, or ``stack="reference"``)."""
        from scaleplan.estimator.lookup_listing import recorded_lookups

        layouts = layouts or [spec.default_layout()]
        est = self.for_stack(spec.stack, spec.model.precision)
        return recorded_lookups(est.model, self.tables, geometry(spec.model),
                                ParallelLayout.from_specs(layouts, n_devices), spec.data.gbs, spec.data.seqlen,
                                spec.optimizer.optimizer_type, spec.stack)

    # -- helpers -------------------------------------------------------------------------------
    def _result(self, g: Geometry, ev: Evaluation, mem, i: int, tokens: int, cap: float,
                frac: float, scope=slice(None), device_only_s: float | None = None) -> EstimateResult:
        """Plan ``i`` of ``ev`` as a result; ``scope``: the plans of its geometry (those whose warnings
        count, as when the geometry is evaluated alone); ``device_only_s``: its step at no host cost, which the
        host-bound warning states where given (:meth:`_device_only`)."""
        bd = {k: float(v[i]) for k, v in ev.components.items()}
        src = {k: SOURCE_NAMES[int(ev.sources[k][i]) if k in ev.sources else 0] for k in bd}
        memb = {k: float(v[i]) / GB for k, v in mem.items()}
        tot = sum(memb.values())
        alloc_gb, reserved_gb, _ = (float(x) / GB for x in allocated_reserved({k: v[i] for k, v in mem.items()}))
        reason = ev.oor.reason[i]
        if reason is None and tot * GB > frac * cap:
            reason = "memory"
        warnings = [w for w in ev.warnings if src.get(w.split(":", 1)[0]) == "analytic"
                    and (w not in ev.warned or ev.warned[w][scope].any())]
        warnings += [msg for msg, where in ev.notes.items() if where[i]]
        ana = [k for k, v in src.items() if v == "analytic"]
        if ana:
            warnings.append("analytic (no measured table): " + ", ".join(ana))
        if self.tables.scaled_from:  # another part's rows at this part's datasheet (scaled_device_tables)
            warnings.append("composed from another part's measured rows scaled to this one's datasheet: "
                            + "; ".join(f"{k} ({v})" for k, v in sorted(self.tables.scaled_from.items())))
        host_note = untraced_host_note(self.dispatch, self.stack_key, bd["dispatch_floor"] / float(ev.t_iter[i]),
                                       self.host_scale != 1.0, device_only_s)
        if host_note:
            warnings.append(host_note)
        if (self.host_scale, self.kernel_scale) != (1.0, 1.0):
            warnings.append(f"fitted on observed runs: host time x{self.host_scale:.3g}, "
                            f"kernel time x{self.kernel_scale:.3g}")
        if int(ev.n_clamped[i]):
            warnings.append(f"{int(ev.n_clamped[i])} lookups clamped to the measured range")
        if reason == "memory":
            warnings.append(f"needs {tot:.1f} GB > {frac * cap / GB:.1f} GB per device")
        return EstimateResult(
            layout=ev.plans.row(i), mfu=float(ev.mfu[i]), mfu_validation=float(ev.mfu_validation[i]),
            hfu=float(ev.hfu[i]), t_iter_s=float(ev.t_iter[i]), t_analytic_s=float(ev.t_analytic[i]),
            chi_sys=float(ev.chi[i]),
            chi_inputs={"t_a2a_s": float(ev.t_a2a[i]), "ep_nodes": int(ev.ep_nodes[i]),
                        "pp_nodes": int(ev.pp_nodes[i]), "deep_pp_in_node": bool(ev.deep_pp_in_node[i]),
                        "gpus_per_node": int(self.profile.gpus_per_node)},
            tokens_per_s=float(tokens / ev.t_iter[i]), mem_per_device_gb=tot, mem_breakdown_gb=memb,
            n_act=float(g.n_act), n_tot=float(g.n_tot), breakdown_s=bd, sources=src,
            feasible=reason is None, reason=reason, warnings=warnings, n_clamped=int(ev.n_clamped[i]),
            composed_share=float(ev.composed_share[i]) if ev.composed_share is not None else 0.0,
            mem_allocated_gb=alloc_gb, mem_reserved_gb=reserved_gb, mem_stage=STAGES[int(mem.stage[i])],
            extrapolated_collectives=sorted(k for k, where in ev.extrapolated.items() if where[i]))


__all__ = [
    "EstimateResult",
    "Estimator",
    "LayoutsResult",
    "ParallelLayout",
    "PlanConstraints",
    "ScaleplanError",
]
