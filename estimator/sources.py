"""Bookkeeping while the model reads tables: source codes per component, out-of-range lookups
(error mode), composition notes (compose mode) and clamp counts (clamp mode)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scaleplan.estimator.tables import CLAMPED, COMPOSED, LookupResult, compose_rule


@dataclass
class OOR:
    """First out-of-range lookup per plan (reason string and the numbers for the error message)."""

    reason: np.ndarray  # object: None or "out_of_range:<table>.<axis>"
    table: np.ndarray
    axis: np.ndarray
    value: np.ndarray
    lo: np.ndarray
    hi: np.ndarray



class Recorder:
    """Collects source codes, clamp counts and out-of-range reasons while the model looks up tables.

    ``mode`` (the estimator's ``extrapolate``): "compose" replaces an out-of-range lookup by its
    table's composition rule (tables.COMPOSE_RULES, labelled "composed", the rule in the warnings);
    "clamp" by the edge value (labelled "clamped", counted); "error" records the first
    out-of-range lookup per plan, which makes the plan infeasible.
    """

    def __init__(self, P: int, mode: str):
        self.P, self.mode = P, mode
        self.src: dict[str, np.ndarray] = {}
        self.n_clamped = np.zeros(P, dtype=np.int64)
        self.has_oor = np.zeros(P, dtype=bool)
        self.oor = OOR(*(np.full(P, None, dtype=object) for _ in range(3)), np.zeros(P), np.zeros(P), np.zeros(P))
        self.warnings: list[str] = []  # component-scoped messages, in the order first said
        self.warned: dict[str, np.ndarray] = {}  # each warning -> the plans (bool (P,)) that raised it
        self.notes: dict[str, np.ndarray] = {}  # message -> plans it applies to
        # component -> the plans (bool (P,)) whose collective of it was read at a group size outside the
        # measured ones (busbw / NIC-bytes invariance): per plan, whatever else is evaluated with it
        self.extrapolated: dict[str, np.ndarray] = {}

    def take(self, idx: np.ndarray) -> Recorder:
        """The record of the plans at ``idx`` (int indices) alone: every message kept in its order, each
        with the selected plans' masks."""
        out = Recorder(len(idx), self.mode)
        out.src = {c: v[idx] for c, v in self.src.items()}
        out.n_clamped, out.has_oor = self.n_clamped[idx], self.has_oor[idx]
        out.oor = OOR(*(getattr(self.oor, f)[idx] for f in ("reason", "table", "axis", "value", "lo", "hi")))
        out.warnings = list(self.warnings)
        out.warned, out.notes, out.extrapolated = ({m: w[idx] for m, w in d.items()}
                                                   for d in (self.warned, self.notes, self.extrapolated))
        return out

    def warn(self, msg: str, where: ArrayLike = True) -> None:
        """A warning about component ``msg.split(":")[0]`` raised by the plans in ``where``: shown with a
        plan whose component is analytic (``Estimator`` results); ``warned`` keeps which plans raised it."""
        where = np.broadcast_to(np.asarray(where, dtype=bool), (self.P,))
        cur = self.warned.get(msg)
        self.warned[msg] = where.copy() if cur is None else (cur | where)
        if msg not in self.warnings:
            self.warnings.append(msg)

    def mark_extrapolated(self, comp: str, where: ArrayLike) -> None:
        """Mark the plans in ``where`` as having read a collective of ``comp`` at a group size the table
        did not measure (mosaic/evidence.py weighs that part with the group-size extrapolation error)."""
        where = np.broadcast_to(np.asarray(where, dtype=bool), (self.P,))
        cur = self.extrapolated.get(comp)
        self.extrapolated[comp] = where.copy() if cur is None else (cur | where)

    def note(self, msg: str, where: ArrayLike = True) -> None:
        """A per-plan note (shown in the warnings of the plans in ``where``)."""
        where = np.broadcast_to(np.asarray(where, dtype=bool), (self.P,))
        cur = self.notes.get(msg)
        self.notes[msg] = where.copy() if cur is None else (cur | where)

    def mark(self, comp: str, code: ArrayLike) -> None:
        code = np.asarray(code, dtype=np.int8)
        cur = self.src.get(comp)
        self.src[comp] = np.broadcast_to(code, (self.P,)).copy() if cur is None else np.maximum(cur, code)

    def fold(self, other: Recorder, idx: ArrayLike) -> None:
        """Take over the records of a recorder over other elements (distinct tuples, stacked pipeline
        stages) where element ``idx[j, p]`` is plan p's j-th lookup (int array (k, P), or (P,) for one):
        per plan the weakest source, the clamps summed, the first out-of-range lookup, the notes of any."""
        idx = np.atleast_2d(idx)
        for comp, v in other.src.items():
            self.mark(comp, v[idx].max(axis=0))
        self.n_clamped += other.n_clamped[idx].sum(axis=0)
        for row in idx:
            new = other.has_oor[row] & ~self.has_oor
            if new.any():
                for f in ("reason", "table", "axis", "value", "lo", "hi"):
                    getattr(self.oor, f)[new] = getattr(other.oor, f)[row][new]
                self.has_oor |= new
        for msg, where in other.notes.items():
            self.note(msg, where[idx].any(axis=0))
        for msg, where in other.warned.items():
            self.warn(msg, where[idx].any(axis=0))
        for comp, where in other.extrapolated.items():
            self.mark_extrapolated(comp, where[idx].any(axis=0))
        self.warnings.extend(w for w in other.warnings if w not in self.warnings)

    def use(self, comp: str, res: LookupResult, active: ArrayLike = True) -> np.ndarray:
        """Record one lookup for component ``comp`` (``active``: plans where it really happens)."""
        P = self.P
        all_active = active is True
        active = _vec(np.asarray(active, dtype=bool), P)
        t, ax, code = _vec(res.t, P), _vec(res.oor_axis, P), _vec(res.code, P)
        bad = ax >= 0
        if not all_active:
            bad &= active
        if bad.any():
            if self.mode == "compose":
                code = np.where(bad, COMPOSED, code)
                t = np.where(bad, _vec(res.t if res.t_composed is None else res.t_composed, P), t)
                lo, hi = _vec(res.lo, P), _vec(res.hi, P)
                # the axis left and the measured edge it is composed from (a set: lookup_points.on_grid says why)
                for a in sorted(set(ax[bad].tolist())):
                    sel = bad & (ax == a)
                    i = int(np.argmax(sel))
                    self.note(f"{comp} composed outside the measured {res.table} range ({res.axes[a]} measured "
                              f"{lo[i]:g}..{hi[i]:g}): {compose_rule(res.table)[1]}", sel)
            elif self.mode == "clamp":
                code = np.where(bad, CLAMPED, code)
                self.n_clamped += bad
            else:
                new = bad & ~self.has_oor
                if new.any():
                    self.has_oor |= new
                    for a in sorted(set(ax[new].tolist())):
                        sel = new & (ax == a)
                        self.oor.reason[sel] = f"out_of_range:{res.table.split('[')[0]}.{res.axes[a]}"
                        self.oor.table[sel] = res.table
                        self.oor.axis[sel] = res.axes[a]
                    self.oor.value[new] = _vec(res.oor_value, P)[new]
                    self.oor.lo[new] = _vec(res.lo, P)[new]
                    self.oor.hi[new] = _vec(res.hi, P)[new]
        if all_active:
            self.mark(comp, code)
            return t
        self.mark(comp, np.where(active, code, 0))
        return np.where(active, t, 0.0)


#: a column of non-negative integers below this is coded by a table of its values, not by sorting
_DENSE_CODES = 1 << 16
#: combined codes below this are made distinct by a table of them, not by sorting
_DENSE_TUPLES = 1 << 24


def distinct(*cols: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """The distinct tuples of equal-length columns (arrays over plans), for lookups made once per tuple
    and handed back with :meth:`Recorder.fold`: (first, inv), ``first`` the index of each tuple's first
    plan (the tuples in sorted order), ``inv`` (shape (P,)) the tuple of each plan. Each column is coded by its own distinct values and the codes
    combine exactly (no overflow, unlike packing the raw values into one integer). Small non-negative
    integer columns and code ranges (a plan set's degrees, geometry indices) go through lookup tables in
    O(P) instead of sorts: a batched search calls this on millions of plans."""
    if not cols or np.size(cols[0]) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(np.size(cols[0]) if cols else 0, dtype=np.int64)
    codes, dims = [], []
    for c in cols:
        ci, n = _codes(np.asarray(c).reshape(-1))
        if n > 1:  # a column of one value tells no tuples apart (a plan set's unstated splits, say)
            codes.append(ci)
            dims.append(n)
    if not codes:
        return np.zeros(1, dtype=np.int64), np.zeros(np.size(cols[0]), dtype=np.int64)
    key = np.ravel_multi_index(codes, dims)
    size = int(np.prod(dims, dtype=float)) if dims else 0
    if 0 < size <= min(_DENSE_TUPLES, 4 * len(key) + _DENSE_CODES) and len(key) > 0:
        inv, n = _codes(key, size)
        first = np.full(n, len(key), dtype=np.int64)
        np.minimum.at(first, inv, np.arange(len(key)))
        return first, inv
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    return first, inv.reshape(-1)


def _codes(c: np.ndarray, bound: int | None = None) -> tuple[np.ndarray, int]:
    """(code of each element by rank among the column's distinct values, how many there are)."""
    if c.dtype.kind in "iu" and len(c):
        hi = int(c.max()) if bound is None else bound - 1
        lo = int(c.min())
        if bound is None and lo == hi:
            return np.zeros(len(c), dtype=np.int64), 1
        if hi < max(_DENSE_CODES, bound or 0) and lo >= 0:
            seen = np.zeros(hi + 1, dtype=bool)
            seen[c] = True
            rank = np.cumsum(seen, dtype=np.int64)
            rank -= 1
            return rank[c], int(rank[-1]) + 1
    u, ci = np.unique(c, return_inverse=True)
    return ci.reshape(-1), len(u)


def _vec(x, P):
    """``x`` as an array of shape (P,) (a view when it already is one; the plan arrays are never written)."""
    if isinstance(x, np.ndarray) and x.shape == (P,):
        return x
    return np.broadcast_to(x, (P,))


def _arr(x, P):
    return np.broadcast_to(np.asarray(x, dtype=float), (P,)).copy()
