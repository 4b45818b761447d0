"""What one evaluation reads, passed as one argument: the tables, the profile and the lookup record
(:class:`Lookups`, all a table lookup needs), and the model, the plans and their shapes
(:class:`EvalContext`).

Every kernel, collective and stage cost of the time model takes an :class:`EvalContext` instead of a
mixin's attributes or a long positional list. Costs that depend on fewer fields than the whole plan
(the kernels on (TP, CP, EP, ETP, B_micro), the DP traffic on the degrees) evaluate each distinct tuple
once on :meth:`EvalContext.take` of those plans, then hand the times back with :meth:`Recorder.fold`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import ArrayLike
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.model_dims import Geometry
from scaleplan.estimator.placement import plans_domain
from scaleplan.estimator.shapes import PlanShapes
from scaleplan.estimator.sources import Recorder
from scaleplan.estimator.tables import Tables

from scaleplan.profiles import ClusterProfile
from scaleplan.stack import PAPER_STACK, Stack


@dataclass(frozen=True)
class Lookups:
    """What a table lookup reads: the tables (the spec precision's :meth:`Tables.view`, or a recording
    view, :class:`~scaleplan.estimator.lookup_listing.RecordingTables`), the node type (peaks in FLOP/s,
    HBM bandwidth in B/s, links, GPUs per node) and where each lookup's source, clamps and out-of-range
    reasons go (``rec``, one element per plan)."""

    tables: Tables
    profile: ClusterProfile
    rec: Recorder

    @property
    def P(self) -> int:
        """The number of plans (elements of every array)."""
        return self.rec.P

    @property
    def hbm(self) -> float:
        """HBM bandwidth, B/s."""
        return self.profile.hbm_bandwidth

    @property
    def serial(self) -> bool:
        """The host dispatches on the cores that compute (a CPU profile): nothing overlaps."""
        return bool(getattr(self.profile, "serial_dispatch", False))

    def with_rec(self, rec: Recorder) -> Lookups:
        """The same tables and profile recording into ``rec`` (other elements: the caller folds it back)."""
        return Lookups(self.tables, self.profile, rec)


@dataclass(frozen=True)
class EvalContext(Lookups):
    """One evaluation's inputs over P plans: the :class:`Lookups` and
    g: the model (one :class:`Geometry`, or a GeometryBatch with one geometry per plan);
    lay: the plans; shapes: their per-rank shapes (:func:`~scaleplan.estimator.shapes.plan_shapes`);
    seqlen: tokens per sequence; kernel_scale: multiplies every device-kernel time (1 unless fitted);
    stack: the training stack the plans run on (scaleplan/stack.py; default the paper's).
    """

    g: Geometry
    lay: ParallelLayout
    shapes: PlanShapes
    seqlen: int
    kernel_scale: float = 1.0
    stack: Stack = PAPER_STACK

    @cached_property
    def gpn(self) -> int:
        """GPUs of one scale-up (NVLink) domain as the plans' job holds it, where a parallel group is placed (the
        node, unless the profile's domain is larger: :meth:`ClusterProfile.job_domain` of the plans' world size,
        one for all plans of an evaluation)."""
        return plans_domain(self.profile, self.lay.n_devices)

    @property
    def recipe(self) -> str | None:
        """The FP8 recipe the plans' GEMMs run (None: not FP8)."""
        return self.stack.recipe(self.g.precision)

    @property
    def peak(self) -> float:
        """Dense tensor-core peak of the model precision, FLOP/s."""
        return self.profile.peak(self.g.precision)

    def take(self, idx: ArrayLike, rec: Recorder | None = None, stages: bool = True) -> EvalContext:
        """The plans at ``idx`` with their own record (a new one unless ``rec``): the caller folds it
        back (:meth:`Recorder.fold`); their shapes without the pipeline stages where ``stages`` is False
        (:meth:`PlanShapes.take`: what the per-layer kernels evaluate on)."""
        idx = np.asarray(idx)
        n = int(idx.sum()) if idx.dtype == bool else len(idx)
        return EvalContext(self.tables, self.profile, rec if rec is not None else Recorder(n, self.rec.mode),
                           self.g.take(idx), self.lay.take(idx), self.shapes.take(idx, stages), self.seqlen,
                           self.kernel_scale, self.stack)
