"""Activation checkpointing modes (paper A_ckpt) and what each recomputes.

One place answers "what does this mode re-run in the backward" for the time model, the memory model
and the dispatch law; arrays of modes are int codes (the enum's values), one per plan.

* none: nothing is recomputed; every activation is kept.
* selective (Megatron-Core ``--recompute-granularity selective``, core attention): the SDPA forward
  is re-run; its output and log-sum-exp are not kept.
* super-selective: also the element-wise work (norms, SwiGLU activation, and under MoE the
  permutation) is re-run; their outputs are not kept.
* full (``--recompute-granularity full --recompute-method uniform``): the whole block forward is re-run
  from the block input, the only activation kept.

A stack that names its own ``--recompute-modules`` (scaleplan/stack.py recompute_modules) changes what
``selective`` means: those modules (estimator/recompute.py). :func:`recompute` gives every plan's factors.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from functools import lru_cache
from enum import IntEnum

import numpy as np
from numpy.typing import ArrayLike

from scaleplan.errors import SpecError
from scaleplan.specs import CKPT_MODES


class CkptMode(IntEnum):
    """A checkpointing mode; its value is the code stored in plan arrays (:class:`ParallelLayout`)."""

    NONE = 0
    SELECTIVE = 1
    SUPER_SELECTIVE = 2
    FULL = 3

    @property
    def spec_name(self) -> str:
        """The spelling of specs and the CLI ("none", "selective", "super-selective", "full")."""
        return CKPT_MODES[self.value]

    @classmethod
    def parse(cls, name: str) -> CkptMode:
        """The mode a spec spells ``name``. Raises SpecError for an unknown name."""
        if name not in CKPT_MODES:
            raise SpecError("ckpt", name, f"one of {', '.join(CKPT_MODES)}")
        return cls(CKPT_MODES.index(name))


# Share of a layer's kernels issued per mode, in forward-pass units: forward 1, backward 2, full
# recompute +1 forward; selective re-runs attention only, super-selective also norms/activations
# (the dispatch law's and the framework kernels' unit, :mod:`scaleplan.estimator.dispatch`).
_KERNEL_UNITS = np.array([3.0, 3.1, 3.3, 4.0])
assert len(_KERNEL_UNITS) == len(CkptMode) == len(CKPT_MODES)
FULL_UNITS = float(_KERNEL_UNITS[CkptMode.FULL])  # the dispatch law's unit (kappa counted under full recompute)


def kernel_units(codes: ArrayLike) -> np.ndarray:
    """Kernels issued per layer and micro-batch in forward-pass units (arrays of mode codes)."""
    return _KERNEL_UNITS[np.asarray(codes, dtype=np.int64)]


def full_recompute_units(codes: ArrayLike) -> np.ndarray:
    """:func:`kernel_units` as a share of full recompute's (the unit the dispatch law's kappa is counted in)."""
    return kernel_units(codes) / _KERNEL_UNITS[CkptMode.FULL]


def recomputes_block(codes: ArrayLike) -> np.ndarray:
    """1.0 where the whole block forward is re-run (full), else 0.0 (float arrays, a multiplier)."""
    return np.where(np.asarray(codes) == CkptMode.FULL, 1.0, 0.0)


def recomputes_sdpa(codes: ArrayLike) -> np.ndarray:
    """1.0 where the SDPA forward is re-run (every mode but none), else 0.0."""
    return np.where(np.asarray(codes) >= CkptMode.SELECTIVE, 1.0, 0.0)


def recomputes_pointwise(codes: ArrayLike) -> np.ndarray:
    """1.0 where the element-wise work (norms, activations, MoE permutation) is re-run
    (super-selective and full), else 0.0."""
    return np.where(np.asarray(codes) >= CkptMode.SUPER_SELECTIVE, 1.0, 0.0)


def codes(names: Iterable[str]) -> np.ndarray:
    """Mode codes (int64 array) of spec spellings."""
    return np.array([CkptMode.parse(n).value for n in names], dtype=np.int64)


@dataclass(frozen=True)
class Recompute:
    """What each plan re-runs in its backward (float arrays over plans, 0 or 1, multipliers of a part's
    forward time): the whole block (full), the SDPA, the element-wise work and permutation (super-selective,
    full), and what a stack's selective modules add (estimator/recompute.py): one separate norm, the routed
    activation, the whole MoE block, a dense MLP, the shared expert, MLA's up-projections. ``units``: kernels per
    layer and micro-batch in forward-pass units (:func:`kernel_units` where the stack names no modules)."""

    block: np.ndarray
    sdpa: np.ndarray
    pointwise: np.ndarray
    norm: np.ndarray
    act: np.ndarray
    moe: np.ndarray
    mlp: np.ndarray
    shared: np.ndarray
    mla_up: np.ndarray
    units: np.ndarray


_RECOMPUTE_MEMO: dict = {}  # recompute's: one evaluation asks it per stage and per term of the same plans


def recompute(codes: ArrayLike, modules: Iterable[str] | None = None) -> Recompute:
    """:class:`Recompute` of the plans' mode codes; ``modules``: the stack's recompute_modules (None: selective
    is core_attn, as without a stack). Every field is a function of the code alone: each mode's row is worked
    out once per ``modules`` and handed to the plans by their codes; the answer for one codes array is kept
    while that array lives (read-only arrays)."""
    mods = None if modules is None else tuple(modules)
    key = (id(codes), mods)
    hit = _RECOMPUTE_MEMO.get(key)
    if hit is not None and hit[0] is codes:
        return hit[1]
    table = _recompute_table(mods)
    c = np.asarray(codes, dtype=np.int64)
    out = Recompute(*(_readonly(np.asarray(getattr(table, f.name)[c])) for f in fields(Recompute)))
    if isinstance(codes, np.ndarray):
        if len(_RECOMPUTE_MEMO) >= 64:
            _RECOMPUTE_MEMO.clear()
        _RECOMPUTE_MEMO[key] = (codes, out)  # the array kept alive, so that its id is not reused meanwhile
    return out


def _readonly(x: np.ndarray) -> np.ndarray:
    x.flags.writeable = False
    return x


@lru_cache(maxsize=32)
def _recompute_table(modules: tuple[str, ...] | None) -> Recompute:
    """:func:`_recompute` of every mode code, in code order."""
    return _recompute(np.arange(len(CkptMode), dtype=np.int64), modules)


def _recompute(c: np.ndarray, modules: Iterable[str] | None) -> Recompute:
    """:func:`recompute` without the memo (``c``: int64 codes)."""
    from scaleplan.estimator import recompute as rm
    from scaleplan.estimator.kernel_counts import dense_mlp_forward_share, moe_forward_share

    sel = (c == CkptMode.SELECTIVE).astype(float)
    units = kernel_units(c)
    mods = set(modules) if modules is not None else {"core_attn"}
    if modules is not None:
        extra = rm.kernel_units(mods, moe_forward_share(), dense_mlp_forward_share())
        units = np.where(c == CkptMode.SELECTIVE, _KERNEL_UNITS[CkptMode.NONE] + extra, units)
    has = {m: sel * float(m in mods) for m in ("layernorm", "moe_act", "moe", "mlp", "shared_experts", "mla_up_proj")}
    sdpa = np.where(c == CkptMode.SELECTIVE, float("core_attn" in mods), recomputes_sdpa(c))
    parts = [np.broadcast_to(x, c.shape).copy() for x in (recomputes_block(c), sdpa, recomputes_pointwise(c),
             has["layernorm"], has["moe_act"], has["moe"], has["mlp"], has["shared_experts"], has["mla_up_proj"], units)]
    for x in parts:
        x.flags.writeable = False
    return Recompute(*parts)
