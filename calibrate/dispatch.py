"""The CPU-dispatch floor (paper sec:iteration-time-model, "Compute versus dispatch"):

    t_mb   = max(t_cmp, t_disp)
    t_disp = L_stage * kappa(E_loc) * t_gap + t_host,    kappa(E_loc) = kappa0 + kappa1 * E_loc

with t_gap the per-kernel CPU enqueue gap (seconds), kappa the kernels launched per layer and
microbatch, and t_host a fixed per-microbatch host time (seconds).

What the dispatch benchmark (DispatchPoint: a chain of small kernels, wall vs GPU-active seconds
per row unit) identifies. Units differ by origin: ``scaleplan bench dispatch`` rows are per kernel
(its chain_len counts every GEMM and ReLU), while the imported dmlc/ScalePlan rows are per chain
step, and a gemm_relu step launches 2 kernels (matmul + relu); :func:`launches_per_unit` says which.

* the chain gap: per unit, wall = max(active + t_lat, n_launch * t_gap_chain): once the kernels
  are small the GPU idles and the wall is the launch cost. Fitted by soft-L1 least squares on log
  wall, with t_lat the small exposed per-kernel latency of the GPU-bound rows. Stored as
  ``t_gap_chain_s``; it is t_gap only where no block-level gap is known. A real block launches
  through autograd and framework code and its per-kernel gap is larger (profiler traces of the
  Megatron-Core stack on B200: ~27 us against ~15 us for the chain), so a block-level t_gap from
  the profile or a previous calibration is kept and the chain gap reported beside it.
* t_host: only from rows of mode 'host_overhead' (the median of their ``wall_per_kernel_s``).
* kappa0, kappa1: NOT identifiable from chained-kernel rows. They are kernel counts per layer of a
  real block, and kappa1 needs runs (or traces) at two or more local expert counts E_loc. Without
  such data they keep the prior (the previous dispatch calibration of the profile, else
  :data:`PRIOR`) and the fit says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scaleplan.estimator.model import KAPPA0_DEFAULT, KAPPA1_DEFAULT, T_HOST_DEFAULT_S
from scipy.optimize import least_squares

from scaleplan.errors import ScaleplanError

CHAIN_MODES = ("gemm", "gemm_relu")


def launches_per_unit(mode: str, source: str) -> int:
    """Kernels launched per stored row unit: 2 for an imported (dmlc/ScalePlan) gemm_relu step, else 1."""
    return 2 if (mode == "gemm_relu" and source == "imported") else 1

# Last-resort priors (no previous calibration, no dispatch block in the profile): the estimator's
# module defaults, kernel counts per layer of a Megatron-Core MoE block counted in profiler traces
# (kappa0, kappa1) and no host time.
PRIOR = {"kappa0": float(KAPPA0_DEFAULT), "kappa1": float(KAPPA1_DEFAULT), "t_host_s": float(T_HOST_DEFAULT_S)}
COEFFS = ("t_gap_s", "kappa0", "kappa1", "t_host_s", "t_gap_chain_s")


@dataclass
class DispatchFit:
    coefficients: dict[str, float]
    identified: list[str]
    unidentified: dict[str, str]
    n_obs: int
    residuals: list[float]
    per_mode_gap_s: dict[str, float]
    t_lat_s: float
    notes: list[str] = field(default_factory=list)


def load_dispatch_rows(sess, profile: str) -> list[dict]:
    """OK DispatchPoint rows of a profile as dicts (mode, m, n, k, chain_len, wall/active seconds)."""
    from sqlalchemy import select

    from scaleplan.db import models as m

    q = (select(m.DispatchPoint, m.BenchRun.source).join(m.BenchRun, m.BenchRun.id == m.DispatchPoint.run_id)
         .where(m.BenchRun.profile == profile, m.DispatchPoint.status == "OK"))
    return [dict(mode=p.mode, m=p.m, n=p.n, k=p.k, chain_len=p.chain_len, wall_s=p.wall_per_kernel_s,
                 active_s=p.active_per_kernel_s, source=src) for p, src in sess.execute(q)]


def _gap_fit(wall: np.ndarray, active: np.ndarray, launches: np.ndarray) -> tuple[float, float, np.ndarray]:
    """Fit (t_gap, t_lat) of wall = max(active + t_lat, launches * t_gap) on log wall (soft-L1)."""
    def fun(x):
        t_gap, t_lat = np.exp(x)
        return np.log(np.maximum(active + t_lat, launches * t_gap)) - np.log(wall)

    x0 = np.log([np.median(wall / launches), 1e-6])
    sol = least_squares(fun, x0, loss="soft_l1", f_scale=0.1)
    t_gap, t_lat = np.exp(sol.x)
    return float(t_gap), float(t_lat), fun(sol.x)


def fit_dispatch(rows: list[dict], prior: dict[str, float] | None = None,
                 prior_source: str = "the estimator's defaults") -> DispatchFit:
    """Fit the dispatch floor from benchmark rows; keep the prior law for what the rows cannot identify.

    Args:
        rows: DispatchPoint rows (see :func:`load_dispatch_rows`).
        prior: the law in force before this fit (a previous 'dispatch' calibration, else the
            profile's trace-derived ``dispatch`` block). A ``t_gap_s`` in it is a per-kernel gap
            inside a real block and is kept: an isolated chain cannot identify it (its gap is a
            lower bound, reported as ``t_gap_chain_s``). Without one, the chain gap is t_gap.
        prior_source: where ``prior`` came from, for the notes.

    Raises:
        ScaleplanError: fewer usable rows (with both wall and active time, a chain mode) than the
            two parameters of the gap model, or no row where dispatch binds (the GPU idles).
    """
    block_gap = (prior or {}).get("t_gap_s")
    prior = {**PRIOR, **(prior or {})}
    chain = [r for r in rows if r["mode"] in CHAIN_MODES and r["wall_s"] and r["active_s"]]
    host = [r["wall_s"] for r in rows if r["mode"] == "host_overhead" and r["wall_s"]]
    if len(chain) < 2:
        raise ScaleplanError(f"dispatch fit refused: {len(chain)} usable dispatch row(s) for 2 parameters "
                             "(t_gap, t_lat); run `scaleplan bench run --suite dispatch` first")
    wall = np.array([r["wall_s"] for r in chain])
    active = np.array([r["active_s"] for r in chain])
    launches = np.array([launches_per_unit(r["mode"], r.get("source", "measured")) for r in chain], dtype=float)
    if not np.any(active < 0.5 * wall):
        raise ScaleplanError("dispatch fit refused: no row is dispatch-bound (GPU active < half the wall); "
                             "t_gap is not identifiable, add smaller kernels to the sweep")
    t_chain, t_lat, res = _gap_fit(wall, active, launches)
    per_mode = {}
    for mode in sorted({r["mode"] for r in chain}):
        sel = np.array([r["mode"] == mode for r in chain]) & (active < 0.5 * wall)
        if sel.any():  # the dispatch-bound plateau of this mode, per launched kernel
            per_mode[mode] = float(np.median(wall[sel] / launches[sel]))
    coeffs = {"t_gap_s": t_chain, "kappa0": prior["kappa0"], "kappa1": prior["kappa1"],
              "t_host_s": prior["t_host_s"], "t_gap_chain_s": t_chain}
    identified = ["t_gap_chain_s"]
    why = {"kappa0": f"not identifiable from chained-kernel rows (needs kernels counted per layer of a real "
                     f"block); kept from {prior_source}",
           "kappa1": f"not identifiable: needs runs or traces at two or more local expert counts E_loc; "
                     f"kept from {prior_source}"}
    if block_gap is not None:
        coeffs["t_gap_s"] = float(block_gap)
        why["t_gap_s"] = (f"the per-kernel gap inside a real block is not identifiable from isolated chained "
                          f"kernels (chain gap {t_chain * 1e6:.1f} us, a lower bound); kept "
                          f"{block_gap * 1e6:.1f} us from {prior_source}")
    else:
        identified.insert(0, "t_gap_s")
    if host:
        coeffs["t_host_s"] = float(np.median(host))
        identified.append("t_host_s")
    else:
        why["t_host_s"] = f"not identifiable: no 'host_overhead' rows; kept from {prior_source}"
    notes = [f"{k} = {coeffs[k]:g}: {v}" for k, v in why.items()]
    notes.append("per-kernel chain gap by mode (dispatch-bound rows): "
                 + ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in per_mode.items()))
    return DispatchFit(coefficients=coeffs, identified=identified, unidentified=why, n_obs=len(chain),
                       residuals=[float(x) for x in res], per_mode_gap_s=per_mode, t_lat_s=t_lat, notes=notes)
