"""Which points a table lookup interpolates and how (:class:`Multilinear`), and which lookups are kept
(:mod:`tables`).

A batched plan search asks each table for tens of thousands of points at once, most of them repeats
(every plan of one shape asks for the same one): a request of :data:`DISTINCT_MIN` points or more is
interpolated once per distinct point (:func:`distinct_points`; every lookup is elementwise, so the numbers
are the same). Such a request is one batch's and is not asked again but at once, so only smaller ones
are memoised (:func:`memoised`): one geometry's evaluations repeat those (the attention GEMMs of one seed
q recur for every (E, K, G)). Keeping the large ones held ~550 MB of result arrays by the end of a
paper-grid search.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

import numpy as np

from scaleplan.lazy import lazy_module

pd = lazy_module("pandas")  # pandas.factorize: a hash per point, no sort

T = TypeVar("T")
#: from a few thousand points hashing them costs less than interpolating them all (a 2-worker batch of
#: the paper grid: ~40K distinct kernel tuples)
DISTINCT_MIN = 2_000
#: memoised lookups per table (cleared when full; an entry is a few small arrays)
CACHE_MAX = 20000
_LAST = object()  # the cache key of the last large request


def distinct_points(cs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
    """(a flat index per distinct tuple, each element's tuple) of the broadcast coordinates ``cs`` (equal
    shapes), tuples numbered in the order first seen; None when under half the points repeat. Each axis is
    hashed once (NaN is one value) and their codes combine into one integer, hashed again before a product
    of their counts would reach 2^62."""
    code, n = 0, 1
    for c in cs:
        ci, u = pd.factorize(c.reshape(-1), use_na_sentinel=False)
        if n * len(u) >= 1 << 62:
            code, n = pd.factorize(code)[0], int(code.max()) + 1
        code, n = code * len(u) + ci, n * len(u)
    code = pd.factorize(code)[0]
    rep = np.empty(int(code.max()) + 1, dtype=np.int64)
    rep[code] = np.arange(len(code))
    return (rep, code) if 2 * len(rep) <= len(code) else None


def memoised(cache: dict, n_points: int, key: Callable[[], Hashable], compute: Callable[[], T]) -> T:
    """``compute()``, kept in ``cache`` under ``key()`` for a request of fewer than :data:`DISTINCT_MIN`
    points; of larger ones (a batch's) only the last is kept, which a caller may ask for again at once
    (:func:`~scaleplan.estimator.comm.collective_time` reads the composed time of what it just looked up).
    ``cache`` is cleared when it holds :data:`CACHE_MAX` entries."""
    k = key()
    if n_points >= DISTINCT_MIN:
        last = cache.get(_LAST)
        if last is None or last[0] != k:
            last = cache[_LAST] = (k, compute())
        return last[1]
    hit = cache.get(k)
    if hit is None:
        if len(cache) >= CACHE_MAX:
            cache.clear()
        hit = cache[k] = compute()
    return hit


def on_grid(x: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Whether each value of ``x`` is one of ``points`` (a table's measured values along an axis): np.isin's
    answer (bool, the shape of ``x``; NaN is on no grid) by a binary search. Not np.isin, whose np.unique
    imports numpy.ma (numpy 2), about 8 ms of every planner command."""
    p = np.sort(np.asarray(points, dtype=float).reshape(-1))
    x = np.asarray(x, dtype=float)
    if not p.size:
        return np.zeros(x.shape, dtype=bool)
    return p[np.minimum(np.searchsorted(p, x), p.size - 1)] == x


class Multilinear:
    """Multilinear interpolation on a rectilinear grid (what scipy's RegularGridInterpolator does with
    method="linear"; tests/estimator/test_tables.py checks the two agree). Own code because the
    lookups run in every planner command and importing scipy.interpolate costs ~0.4 s of a 0.8 s
    start-up budget. ``grid``: one increasing array per axis; ``values``: shape of the grid.
    Points are (n, ndim); outside the grid the edge cells extend linearly (callers clamp first)."""

    def __init__(self, grid: list[np.ndarray], values: np.ndarray):
        self.grid = [np.asarray(g, dtype=float) for g in grid]
        self.values = np.asarray(values, dtype=float)

    def __call__(self, pts) -> np.ndarray:
        pts = np.atleast_2d(np.asarray(pts, dtype=float))
        idx, frac = [], []
        for d, g in enumerate(self.grid):
            i = np.clip(np.searchsorted(g, pts[:, d], side="right") - 1, 0, len(g) - 2)
            idx.append(i)
            frac.append((pts[:, d] - g[i]) / (g[i + 1] - g[i]))
        out = np.zeros(len(pts))
        for corner in range(1 << len(self.grid)):  # 2^ndim cell corners, weight = product of 1-f or f
            w = np.ones(len(pts))
            at = []
            for d in range(len(self.grid)):
                up = (corner >> d) & 1
                w = w * (frac[d] if up else 1.0 - frac[d])
                at.append(idx[d] + up)
            out += w * self.values[tuple(at)]
        return out
