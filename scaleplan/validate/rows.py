"""What `scaleplan validate` adds to each comparison row beyond the keys every comparison has:
the reference runner's predicted memory (allocated, reserved, categories), the measured reserved
peak, the machine-load report and its warning, and (with --trace) measured vs predicted time per
component."""
from __future__ import annotations

from typing import Any

GB = 1e9


def extend_row(row: dict[str, Any], result, mem_pred: dict | None, components: dict | None = None) -> dict:
    """``row`` (compare.comparison_row) with the extra keys. ``predicted_mem_gb`` becomes the
    reference runner's peak allocated, the quantity ``measured_peak_mem_gb`` measures on a GPU; the
    estimator's own figure (its Megatron stack) stays as ``estimator_mem_gb``."""
    load = result.extra.get("load")
    reserved = result.extra.get("peak_reserved_bytes")
    out = {**row, "estimator_mem_gb": row.get("predicted_mem_gb")}
    if mem_pred is not None:
        out.update(predicted_mem_gb=mem_pred["allocated_gb"], predicted_mem_allocated_gb=mem_pred["allocated_gb"],
                   predicted_mem_reserved_gb=mem_pred["reserved_gb"], predicted_mem_device_gb=mem_pred["device_gb"],
                   predicted_mem_breakdown_gb=mem_pred["breakdown_gb"],
                   allocator_overhead={"fraction": mem_pred["allocator_fraction"],
                                       "source": mem_pred["overhead_source"]})
    out["measured_mem_reserved_gb"] = None if reserved is None else reserved / GB
    out["load"] = load
    out["warnings"] = [load["warning"]] if load and load.get("warning") else []
    if components is not None:
        out["components"] = components
    return out
