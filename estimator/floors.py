"""A measured table's flat per-call floor, and the host time it holds (sec:microbenchmarks).

A kernel microbenchmark times calls, not kernels: below some size every call takes the same time, the cost
of issuing it (Python, the framework's per-call work, the launch) rather than of the work on the device.
The recorded B200 FP8 dense-GEMM table (Transformer Engine, MXFP8: its failed points name the MXFP8
quantizer) takes 0.152-0.199 ms at 1,294 of its 2,686 points, from 32 x 32 x 128 to 8192 x 2048 x 128
(2048 x 512 x 2048: 0.156 ms, against 0.019 ms in bf16), and above the floor its time is the floor plus
what the work takes (8192 x 8192 x 2048: 0.289 ms, bf16 0.202 ms: 0.137 ms on the device beyond the
floor, 0.68 of bf16, as a 2x FP8 lane less its quantize kernels gives). So the floor is host time that
adds to each call, and a time model that charges it to the device charges a rank with 16 local experts
that floor 16 times per projection.

:func:`detect_floor` finds such a floor in a table's (work, time) points. :func:`host_floor` is the part of
it that is host time: what it exceeds the device's own shortest call by (the same device's reference table,
bf16, whose floor the rest of the model already reads as the time of a small kernel; or the shortest GPU
time a dispatch chain measured). :func:`device_times` takes that host part off every point: the additive
reading above, which at the floor leaves the reference's time.

Times in seconds; work in any unit that grows with the work of a point (FLOPs for a GEMM).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

if TYPE_CHECKING:
    import pandas as pd

# A floor: at least FLOOR_MIN_POINTS points within FLOOR_TOL of the fastest, spanning FLOOR_MIN_DECADES
# decades of work (a kernel whose time follows its work doubles in time over 0.3 decades; the recorded
# FP8 floor spans 5.5 decades, the bf16 one 5.6). The fastest time is the FLOOR_QUANTILE-th quantile, not
# the minimum, so that one lucky point does not set it.
FLOOR_TOL = 0.10
FLOOR_MIN_POINTS = 10
FLOOR_MIN_DECADES = 2.0
FLOOR_QUANTILE = 0.02
# a floor holds host time only where it exceeds the device's shortest call by more than this share of it:
# two tables of one device differ by a few microseconds of timing noise without any host work apart
HOST_MARGIN = 0.5


@dataclass(frozen=True)
class Floor:
    """A table's flat per-call floor: ``t_s`` (seconds, the median of the points at it), the ``n_points`` at
    it and the ``decades`` of work they span, and the largest ``work_max`` among them (above it the work
    shows in the time)."""

    t_s: float
    n_points: int
    decades: float
    work_max: float


def detect_floor(work: ArrayLike, t: ArrayLike, tol: float = FLOOR_TOL, min_points: int = FLOOR_MIN_POINTS,
                 min_decades: float = FLOOR_MIN_DECADES) -> Floor | None:
    """The flat per-call floor of points (``work``, ``t``), arrays of one length, or None: the points within
    ``tol`` of the table's fastest time (its FLOOR_QUANTILE-th quantile), when there are at least
    ``min_points`` of them over at least ``min_decades`` decades of work. Non-positive or non-finite points
    are left out."""
    work, t = np.asarray(work, dtype=float), np.asarray(t, dtype=float)
    ok = np.isfinite(work) & np.isfinite(t) & (work > 0) & (t > 0)
    work, t = work[ok], t[ok]
    if len(t) < min_points:
        return None
    fastest = float(np.quantile(t, FLOOR_QUANTILE))
    at = t <= fastest * (1.0 + tol)
    if at.sum() < min_points:
        return None
    decades = float(np.log10(work[at].max() / work[at].min()))
    if decades < min_decades:
        return None
    return Floor(float(np.median(t[at])), int(at.sum()), decades, float(work[at].max()))


def host_floor(floor: Floor | None, device_min_s: float) -> float:
    """Seconds of host time in each call of a table with ``floor``: what the floor exceeds the device's
    shortest call ``device_min_s`` by, or 0 where it does not exceed it by more than HOST_MARGIN of it (or
    there is no floor)."""
    if floor is None or device_min_s <= 0:
        return 0.0
    excess = floor.t_s - device_min_s
    return excess if excess > HOST_MARGIN * device_min_s else 0.0


def device_times(t: ArrayLike, host_s: float, device_min_s: float) -> np.ndarray:
    """Device seconds of points of measured time ``t`` (array) whose calls each hold ``host_s`` of host time:
    t - host_s, never below ``device_min_s`` (the shortest call of the device; the point at the floor)."""
    t = np.asarray(t, dtype=float)
    return t if host_s <= 0 else np.maximum(t - host_s, min(device_min_s, float(np.min(t))))



# the dtype whose per-call floor the rest of the model reads as the device's shortest call (its tables are
# the ones every validation figure rests on); another dtype's floor above it is host time
REFERENCE_DTYPE = "bf16"


def gemm_host_floors(df: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """Per dtype of dense-GEMM rows (a frame with columns m, n, k, dtype, t_s): (host seconds per call, the
    device's shortest call), the host time being :func:`host_floor` of the dtype's flat floor above the
    reference dtype's (bf16; without bf16 rows, the fastest floor of the others). (0, floor) for the reference
    itself and (0, 0) for a dtype without a flat floor."""
    work = 2.0 * df["m"].astype(float) * df["n"].astype(float) * df["k"].astype(float)
    floors = {str(dt): detect_floor(work[d.index], d["t_s"]) for dt, d in df.groupby("dtype")}
    ref = floors.get(REFERENCE_DTYPE)
    if ref is None:
        found = [f for f in floors.values() if f is not None]
        ref = min(found, key=lambda f: f.t_s) if found else None
    ref_s = ref.t_s if ref is not None else 0.0
    return {dt: (host_floor(f, ref_s), ref_s) for dt, f in floors.items()}


def without_host_floor(df: pd.DataFrame, hosts: dict[str, tuple[float, float]]) -> pd.DataFrame:
    """``df`` (dense-GEMM rows) with each dtype's host floor (:func:`gemm_host_floors`) taken off its times
    (:func:`device_times`), and the seconds taken off each row in a column ``host_floor_s``."""
    df = df.copy()
    df["host_floor_s"] = 0.0
    for dt, (h, device_min) in hosts.items():
        if h <= 0:
            continue
        sel = df["dtype"].astype(str) == dt
        t = df.loc[sel, "t_s"].to_numpy(float)
        dev = device_times(t, h, device_min)
        df.loc[sel, "host_floor_s"] = t - dev
        df.loc[sel, "t_s"] = dev
    return df
