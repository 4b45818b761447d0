"""The optimizer, described once: the state it keeps, the bytes and FLOPs of its step, its DP
collectives and whether Megatron-Core shards it over data parallelism. Read by the time model (the
step, :func:`step_time`; the DP traffic, :mod:`comm`), the memory model and bench plan. Bytes, seconds.

* adam / adamw: Megatron-Core's distributed optimizer (ZeRO-1): fp32 master weights and two moments
  (12 bytes/param) sharded over DP x CP (dense) and EDP (experts); fp32 gradients reduce-scattered
  (NeMo's bf16-mixed plugin, the paper's stack, sets grad_reduce_in_fp32), bf16 parameters
  all-gathered; the step reads master, m, v and the grad and writes master, m, v and the bf16 param
  (30 bytes/param).
* muon / scion: Megatron-Core's layer-wise distributed optimizer (``LayerWiseDistributedOptimizer``):
  each DP rank owns whole weight matrices, orthogonalises only those (5 Newton-Schulz iterations,
  ~5 (4 m^2 n + 2 m^3) FLOPs for an m x n matrix, m <= n, at half the GEMM peak) and the owners
  broadcast their parameters, one call per tensor (estimator/layerwise.py); DDP all-reduces the gradients. Momentum: 8 bytes/param of state with the
  master, 18 bytes/param moved by the step. Why sharded and not plain ``--optimizer muon``, which
  replicates the state and the step on every DP rank (and which the paper's estimator charges, 0.18-0.72
  s on the 5.4B sweep): its measured pp=1 ep=8 layout would then need ~19e9 local parameters x 14 bytes,
  beyond a B200 (tests/estimator/test_muon_sharding.py).
* sgd (momentum): Megatron-Core's distributed optimizer takes the Adam family only
  (megatron/core/optimizer/distrib_optimizer.py, NVIDIA/Megatron-LM#1287): plain DDP, every DP rank
  keeps and steps the whole state; the gradients are all-reduced, nothing is gathered.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scaleplan.estimator import analytic as an
from scaleplan.estimator.model_dims import Geometry
from scaleplan.estimator.layout import ParallelLayout, degree_groups
from scaleplan.estimator.params import StageParams, dp_stages, stage_params
from scaleplan.estimator.shapes import local_experts

from scaleplan.errors import SpecError

GRAD_BYTES_COMM, PARAM_BYTES_COMM = 4, 2  # fp32 gradients reduced, bf16 parameters gathered
MASTER_BYTES = 4.0                        # the fp32 master copy inside the state


@dataclass(frozen=True)
class Optimizer:
    """One optimizer as Megatron-Core runs it (module docstring)."""

    name: str
    state_bytes: float   # fp32 master + moments per parameter, before sharding
    step_bytes: float    # HBM bytes the step reads and writes per parameter
    orthogonalises: bool  # Newton-Schulz per weight matrix (muon, scion)
    sharded: bool        # state and step sharded over DP (distributed optimizer), else replicated

    @property
    def moment_bytes(self) -> float:
        """The state without the fp32 master copy (bytes per parameter)."""
        return self.state_bytes - MASTER_BYTES

    @property
    def dp_collectives(self) -> tuple[tuple[str, int], ...]:
        """The DP collectives of one step as (collective, bytes per parameter), gradient side first."""
        if not self.sharded:
            return (("all_reduce", GRAD_BYTES_COMM),)
        red = "all_reduce" if self.orthogonalises else "reduce_scatter"
        return ((red, GRAD_BYTES_COMM), ("all_gather", PARAM_BYTES_COMM))


OPTIMIZERS = {o.name: o for o in (
    Optimizer("adam", 12.0, 30.0, False, True), Optimizer("adamw", 12.0, 30.0, False, True),
    Optimizer("muon", 8.0, 18.0, True, True), Optimizer("scion", 8.0, 18.0, True, True),
    Optimizer("sgd", 8.0, 18.0, False, False))}


def optimizer(name: str) -> Optimizer:
    """The description of optimizer ``name``. Raises SpecError for one the estimator does not know."""
    try:
        return OPTIMIZERS[name]
    except KeyError:
        raise SpecError("optimizer", name, f"one of {', '.join(OPTIMIZERS)}") from None


def dp_collectives(name: str) -> tuple[tuple[str, int], ...]:
    """:attr:`Optimizer.dp_collectives` of optimizer ``name``."""
    return optimizer(name).dp_collectives


def _newton_schulz_flops(m: int, n: int) -> float:
    m, n = np.minimum(m, n), np.maximum(m, n)  # arrays for a GeometryBatch
    return 5.0 * (4.0 * m * m * n + 2.0 * m ** 3)


def step_time(opt: Optimizer, g: Geometry, lay: ParallelLayout, p: StageParams, peak: float,
              hbm: float) -> np.ndarray:
    """One rank's optimizer step on its stage's parameters ``p`` (seconds, arrays over plans): the
    bytes of its shard through HBM, plus the Newton-Schulz FLOPs of the matrices it owns."""
    dense_rep = lay.dp * lay.cp if opt.sharded else np.ones_like(lay.dp)  # ranks sharing one shard's step
    exp_rep = lay.edp if opt.sharded else np.ones_like(lay.dp)
    t = an.memory_time(opt.step_bytes * (p.dense / dense_rep + p.experts / exp_rep), hbm)
    if opt.orthogonalises:
        attn = _newton_schulz_flops(g.d, g.nq * g.hd) * 2 + _newton_schulz_flops(g.d, g.nkv * g.hd) * 2
        exp_m = _newton_schulz_flops(g.d, g.dexp) * 3
        fl_dense = p.n_layers * attn / (lay.tp * dense_rep)  # the DP rank's share of the matrices
        # each local expert's matrices, 1/ETP of them on this rank, shared out over the expert-DP ranks
        fl_exp = p.n_moe * local_experts(g, lay) * exp_m / (lay.etp * exp_rep)
        t = t + (fl_dense + fl_exp) / (0.5 * peak)
    return t


def slowest_step(opt: Optimizer, g: Geometry, lay: ParallelLayout, peak: float, hbm: float,
                 degrees: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """The optimizer step of the stage whose own parameters take longest (seconds, arrays over plans):
    every stage steps its own shard once its gradients are reduced, and the step ends with the last.
    The stages considered are :func:`params.dp_stages`' (first, first middle, last). Evaluated once per
    distinct :func:`~scaleplan.estimator.layout.degree_groups` tuple, all it depends on (plans differing in
    B_micro or checkpointing share it); ``degrees``: that grouping when the caller has it."""
    first, inv = degrees if degrees is not None else degree_groups(g, lay)
    g, lay = g.take(first), lay.take(first)
    t = np.zeros(len(lay))
    for present, stage in dp_stages(g, lay):
        t = np.maximum(t, np.where(present, step_time(opt, g, lay, stage_params(g, lay, stage), peak, hbm), 0.0))
    return t[inv]
