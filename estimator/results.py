"""What the Estimator returns: one plan's prediction (:class:`EstimateResult`, JSON keys per the API contract)
and a ranked search (:class:`LayoutsResult`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

GB = 1e9


@dataclass
class EstimateResult:
    """One plan's prediction (JSON keys per the API contract)."""

    layout: dict[str, Any]
    mfu: float
    mfu_validation: float
    hfu: float
    t_iter_s: float
    t_analytic_s: float
    chi_sys: float
    chi_inputs: dict[str, Any]
    tokens_per_s: float
    mem_per_device_gb: float
    mem_breakdown_gb: dict[str, float]
    n_act: float
    n_tot: float
    breakdown_s: dict[str, float]
    sources: dict[str, str]
    feasible: bool
    reason: str | None
    warnings: list[str] = field(default_factory=list)
    n_clamped: int = 0
    composed_share: float = 0.0  # fraction of t_analytic_s read from composed (out-of-range) lookups
    # components whose collectives this plan read at group sizes the tables did not measure (invariance)
    extrapolated_collectives: list[str] = field(default_factory=list)
    # GB per device: what torch.cuda.max_memory_allocated sees, and torch.cuda.memory_reserved (plus the
    # allocator's overhead); mem_per_device_gb adds the memory outside the allocator (CUDA context)
    mem_allocated_gb: float = 0.0
    mem_reserved_gb: float = 0.0
    mem_stage: str = "first"  # the pipeline stage whose memory mem_per_device_gb is (memory.STAGES)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LayoutsResult:
    ranked: list[EstimateResult]
    infeasible_counts: dict[str, int]
    n_plans: int
    n_feasible: int = 0
    analytic_components: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"ranked": [r.to_dict() for r in self.ranked], "infeasible_counts": self.infeasible_counts,
                "n_plans": self.n_plans, "n_feasible": self.n_feasible,
                "analytic_components": self.analytic_components}
