"""eq:desync: chi_sys = 1 + c_level + c_a2a (t_A2A / t) [EP spans nodes] + c_pp (inter-node PP hops)
+ c_ovl [deep pipeline in one node], with the placement features of Megatron-Core's rank order."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scaleplan.estimator.layout import ParallelLayout


@dataclass
class ChiCoefficients:
    """eq:desync coefficients plus a level term: chi = 1 + c_level + c_a2a (t_A2A / t) [EP spans nodes]
    + c_pp (inter-node PP hops) + c_ovl [deep pipeline in one node] (see :func:`desync_features`).
    c_level is what every run of the stack pays beyond the microbenchmarks (allocator, GC, launch
    jitter, input pipeline: paper app:training-stack); fitted only where observed runs identify it."""

    c_a2a: float = 0.0
    c_pp: float = 0.0
    c_ovl: float = 0.0
    calibration_id: int | None = None
    c_level: float = 0.0


def desync_features(lay: ParallelLayout, gpn: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """eq:desync's placement features from Megatron-Core's default rank order
    (:class:`~scaleplan.estimator.layout.ParallelLayout`), arrays over plans:

    * ep_nodes: nodes one EP group spans (its ranks are ETP apart);
    * pp_hops: inter-node hops along the pipeline. Consecutive stages are TP CP DP ranks apart, so
      once TP CP DP fills a node every stage boundary leaves the node (PP - 1 hops); otherwise the
      pipeline covers ceil(PP TP CP DP / gpn) nodes. (eq:desync's N_node^PP - 1 = ceil(PP/gpn) - 1
      assumes stages are adjacent ranks, which Megatron's order never makes them unless TP CP DP = 1.)
    * deep: a pipeline of >= gpn stages inside one node (only when TP CP DP = 1).
    """
    pp = lay.pp
    ep_nodes = lay.nodes("ep", gpn)
    pp_nodes = lay.nodes("pp", gpn)
    pp_hops = np.where(pp > 1, pp_nodes - 1, 0.0)
    deep = (pp >= gpn) & (pp_nodes == 1) & (pp > 1)
    return ep_nodes, pp_hops, deep


def chi_sys(c: ChiCoefficients, t_a2a: ArrayLike, t_an: ArrayLike, ep_nodes: ArrayLike, pp_hops: ArrayLike,
            deep: ArrayLike) -> np.ndarray:
    """eq:desync's multiplier per plan (arrays): t_a2a the all-to-all wire time of the step, t_an the
    analytic step time (seconds), the placement features of :func:`desync_features`."""
    return 1.0 + c.c_level + c.c_a2a * (t_a2a / t_an) * (ep_nodes > 1) + c.c_pp * pp_hops + c.c_ovl * deep
