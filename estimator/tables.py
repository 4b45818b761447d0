"""Measured microbenchmark tables as vectorised interpolators (paper sec:microbenchmarks).

One :class:`Tables` holds every measured table of one hardware profile, loaded once from the
calibration database (rows of ``BenchRun.profile == profile`` with status OK, from runs of that
profile's hardware: scaleplan.db.identity.same_hardware). A point measured
more than once keeps the value of the newest run (``BenchRun.started_at``, then id); duplicates
inside that run are reduced by the median.

Interpolation is multilinear on log axes of log time, so inside the measured range a lookup is
a power-law blend of its neighbours (for GEMMs this equals interpolating log utilisation, because
log FLOPs is linear in the log axes). Regular grids use :class:`Multilinear` (scipy's linear
RegularGridInterpolator without its import cost);
holes in a grid (SKIP_MEM / ERROR points) are filled from the nearest measured point in log
utilisation before the grid is built. Outside the measured range a lookup is never extrapolated
silently: each lookup reports per element whether it was exact ("measured"), interpolated,
clamped, or out of range, and names the axis (see :class:`LookupResult`); the caller decides to
raise :class:`~scaleplan.errors.OutOfRangeError`, to mark a plan infeasible, or (``extrapolate=
"clamp"``) to clamp and count.

All lookups take and return numpy arrays (broadcasting), for the plan search over thousands of
plans at once. Times are seconds.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from scaleplan.estimator.compose import Ceiling, LaunchFloor, MemoryFloor, SdpaFloor, collective_tail
from scaleplan.estimator.lookup_points import DISTINCT_MIN, Multilinear, distinct_points, memoised, on_grid
from scaleplan.lazy import lazy_module

pd = lazy_module("pandas")  # only building tables needs it: cached tables are read without pandas

# source codes per looked-up element (higher = weaker provenance)
MEASURED, INTERPOLATED, CLAMPED, COMPOSED, ANALYTIC = 0, 1, 2, 3, 4
SOURCE_NAMES = {MEASURED: "measured", INTERPOLATED: "interpolated", CLAMPED: "clamped", COMPOSED: "composed",
                ANALYTIC: "analytic"}
EXTRAPOLATE_MODES = ("compose", "error", "clamp")

# Composition beyond the measured range (``--extrapolate compose``, the default). A kernel's time is a
# fixed part (launch, set-up, latency) plus a part that grows with its work, so above the largest
# measured value of an axis the time is affine in the work, continued from the last measured interval:
# t(x) = t(edge) (1 + s ((x / edge)^e - 1)), e the power with which the work grows along the axis and s
# the edge's marginal share, (1 - t(prev) / t(edge)) / (1 - (prev / edge)^e), bounded to [0, 1]: never
# shrinking, never growing faster than the work (s = 1 is constant throughput, the rule of an axis
# measured at one point). Where the edge is still amortising its fixed part (small grouped GEMMs, SDPA
# below 16k, sub-MB collectives) constant throughput over-charges; on the recorded B200 tables the
# affine rule beats it on every hold-out but the shallowest GEMM cut (estimator/holdout.py,
# benchmarks/compose_accuracy.py). Collectives apply the same rule to message bytes (alpha-beta).
# Below the smallest measured value (GEMM and SDPA have rules of their own: COMPOSE_RULES' texts, compose.py)
# the same affine rule runs down from the first measured interval,
# never under its fixed part: an edge that already sits on its launch floor (flat first interval) keeps
# it, one whose time still follows its work (e.g. 4 grouped GEMMs of 12k tokens: 1 GEMM is a quarter of
# the work; an LM head of 2k tokens is half of 4k) scales down. (A floor at the table's fastest point
# was tried: it charged 1 GEMM at least 4 GEMMs' launches; its hold-out error: docs/accuracy.md.)
# Collectives keep their smallest message's latency-bound time.
# (table name prefix) -> (work exponent per axis, rule text)
COMPOSE_RULES: dict[str, tuple[tuple[float, ...], str]] = {
    "gemm": ((1.0, 1.0, 1.0), "GEMM: affine in FLOPs (m n k) at the last measured interval's marginal "
                              "throughput; below the measured m, the transposed problem (n, m', k) at the fastest "
                              "measured m' >= m where n is measured (compose.transposed_time), else a roofline"),
    "grouped_gemm": ((1.0, 1.0), "grouped GEMM: affine in FLOPs (num_gemms x tokens_per_expert), a fixed "
                                 "per-call part plus the last measured interval's marginal cost, on the "
                                 "undominated grid (compose.undominated_grid); above the measured tokens no faster "
                                 "than the dense GEMMs of the concatenated tokens (compose.concatenated_time)"),
    "sdpa": ((2.0, 1.0, 1.0, 1.0), "causal SDPA: affine in FLOPs (quadratic in seq_len, linear in micro-batch, "
                                   "heads, head_dim) at the last measured interval's marginal throughput; "
                                   "below the measured seq_len compose.SdpaFloor"),
    "router": ((1.0, 1.0, 0.0), "router top-k: affine in the score count (tokens x experts), memory-bound"),
    "vocab": ((1.0, 1.0), "LM head / cross-entropy: affine in tokens x hidden at the last measured interval's "
                          "marginal throughput"),
    "elementwise": ((1.0, 1.0), "element-wise: affine in bytes (tokens x hidden) at the last measured "
                                "interval's marginal bandwidth"),
    "collectives": ((1.0,), "collective: beyond the largest measured message alpha-beta, the time per byte of "
                            "the last three messages (at most the regime's saturated bus bandwidth; all-to-all: "
                            "its own group size's) added to the edge time (compose.collective_tail), an all-reduce "
                            "at most a reduce-scatter plus an all-gather; below the smallest, its latency-bound "
                            "time"),
}


def affine_growth(t_edge: ArrayLike, t_nb: ArrayLike, edge: ArrayLike, nb: ArrayLike, x: ArrayLike,
                  e: float = 1.0) -> np.ndarray:
    """t(x) / t(edge) of a kernel whose time is a fixed part plus a part proportional to its work (work
    ~ size^e), continued from the measured interval (nb, edge) to ``x`` outside it (COMPOSE_RULES):
    1 + s ((x / edge)^e - 1), s = (1 - t_nb / t_edge) / (1 - (nb / edge)^e) the edge's marginal share,
    bounded to [0, 1] (s = 0: all fixed, e.g. launch-bound; s = 1: constant throughput). Arrays
    broadcast; dimensionless."""
    s = np.clip((1.0 - t_nb / t_edge) / (1.0 - (nb / edge) ** e), 0.0, 1.0)
    return 1.0 + s * ((x / edge) ** e - 1.0)


def compose_rule(table: str) -> tuple[tuple[float, ...], str]:
    """The composition rule of a table (by its name's prefix: ``grouped_gemm[4096x1024]`` ->
    ``grouped_gemm``); an unknown table scales linearly in every axis."""
    key = table.split("[")[0].split(".")[0]
    return COMPOSE_RULES.get(key, ((1.0,) * 8, "linear in every axis beyond the edge"))

@dataclass
class LookupResult:
    """Per-element result of a table lookup.

    t: seconds; code: source per element (MEASURED..CLAMPED); oor_axis: the index into ``axes`` of the
    first out-of-range axis per element (-1: in range); oor_value / lo / hi: its value asked and range.
    """

    table: str
    axes: tuple[str, ...]
    t: np.ndarray
    code: np.ndarray
    oor_axis: np.ndarray
    oor_value: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    t_composed: np.ndarray | None = None


_RESULT_ARRAYS = ("t", "code", "oor_axis", "oor_value", "lo", "hi", "t_composed")


def _readonly(a) -> np.ndarray:
    a = np.array(a)  # an owned copy
    a.flags.writeable = False
    return a


def _frozen(res: LookupResult) -> LookupResult:
    if res.t_composed is None:
        res.t_composed = res.t
    for f in ("t", "code", "oor_axis", "oor_value", "lo", "hi", "t_composed"):
        setattr(res, f, _readonly(getattr(res, f)))
    return res


class GridTable:
    """log-time on a regular grid of log axes; lookups report range status per axis."""

    def __init__(self, name: str, axes: tuple[str, ...], grid: list[np.ndarray], values: np.ndarray,
                 ceiling: Ceiling | None = None, floor: LaunchFloor | MemoryFloor | SdpaFloor | None = None):
        self.name, self.axes = name, axes
        # roofline composition (estimator/compose.py): above ``ceiling.axis``, below ``floor.axis``
        self.ceiling, self.floor = ceiling, floor
        self.grid = [np.asarray(g, dtype=float) for g in grid]
        self.lo = np.array([g.min() for g in self.grid])
        self.hi = np.array([g.max() for g in self.grid])
        logv = np.log(values)
        logg = [np.log(g) for g in self.grid]
        # single-valued axes cannot be interpolated: keep them for range checks only
        self._keep = [i for i, g in enumerate(self.grid) if len(g) > 1]
        sq = logv.reshape([len(g) for g in self.grid])
        sq = sq.reshape([len(self.grid[i]) for i in self._keep]) if self._keep else sq.reshape(1)
        if self._keep:
            self._interp = Multilinear([logg[i] for i in self._keep], sq)
        else:
            self._const = float(sq.reshape(-1)[0])
        self._points = [set(g.tolist()) for g in self.grid]
        self._cache: dict = {}
        self.label: int | None = None  # every lookup's source code, where the times are not this grid's own
        self.holds_casts = False  # an FP8 GEMM table whose times include its inputs' quantize (TE's rows)

    def scaled(self, factor: float, label: int) -> GridTable:
        """A copy whose times are ``factor`` x this table's at every point (its interpolation shifted in log
        time) and whose every lookup is labelled ``label`` (a source code: the times are not measured)."""
        out = copy.copy(self)
        shift = float(np.log(factor))
        if self._keep:
            out._interp = Multilinear(self._interp.grid, self._interp.values + shift)
        else:
            out._const = self._const + shift
        out._cache, out.label = {}, label
        return out

    def lookup(self, *coords: ArrayLike) -> LookupResult:
        """Interpolated times at ``coords`` (one array per axis, broadcast together).

        Results of a request of fewer than DISTINCT_MIN points are memoised (:mod:`lookup_points`); the
        returned arrays are read-only, so a caller cannot alter a later lookup's answer.
        """
        arrs = [np.asarray(c, dtype=float) for c in coords]
        key = lambda: tuple((a.shape, a.tobytes()) for a in arrs)  # noqa: E731
        return memoised(self._cache, max(a.size for a in arrs), key, lambda: self._lookup_distinct(arrs))

    def _lookup_distinct(self, arrs) -> LookupResult:
        """:meth:`_lookup` of each distinct point of a large request once (:func:`distinct_points`)."""
        cs = np.broadcast_arrays(*arrs)
        d = distinct_points(cs) if cs[0].size >= DISTINCT_MIN else None
        if d is None:
            return self._lookup(arrs)
        rep, inv = d
        res = self._lookup([c.reshape(-1)[rep] for c in cs])
        back = [getattr(res, f)[inv].reshape(cs[0].shape) for f in _RESULT_ARRAYS]
        return _frozen(LookupResult(res.table, res.axes, *back))

    def _lookup(self, arrs) -> LookupResult:
        cs = np.broadcast_arrays(*arrs)
        shape = cs[0].shape
        oor_axis = np.full(shape, -1, dtype=np.int16)
        oor_val = np.zeros(shape)
        exact = np.ones(shape, dtype=bool)
        clamped, outside = [], []  # outside: (axis, upper, mask) of every axis a request leaves
        for i, c in enumerate(cs):
            # NaN compares false both ways: flag it out of range explicitly rather than return NaN
            bad = ((c < self.lo[i] * (1 - 1e-9)) | (c > self.hi[i] * (1 + 1e-9)) | np.isnan(c)) & (oor_axis < 0)
            oor_axis[bad] = i
            oor_val[bad] = c[bad]
            cc = np.clip(c, self.lo[i], self.hi[i])
            clamped.append(cc)
            for upper, mask in ((True, c > self.hi[i] * (1 + 1e-9)), (False, c < self.lo[i] * (1 - 1e-9))):
                if mask.any():
                    outside.append((i, upper, mask))
            exact &= on_grid(cc, self.grid[i])
        t, grow = self._times(cs, clamped, outside)
        code = np.where(exact, MEASURED, INTERPOLATED).astype(np.int8)
        if self.label is not None:
            code = np.full(shape, self.label, dtype=np.int8)
        lo = np.where(oor_axis >= 0, self.lo[np.maximum(oor_axis, 0)], np.nan)
        hi = np.where(oor_axis >= 0, self.hi[np.maximum(oor_axis, 0)], np.nan)
        t_comp = self._roofline(cs, t * grow, outside)
        return _frozen(LookupResult(self.name, self.axes, t, code, oor_axis, oor_val, lo, hi, t_comp))

    def _roofline(self, cs, t_comp, outside):
        """The roofline rules of estimator/compose.py on the axes they own (``_times`` left those alone)."""
        for i, upper, mask in outside:
            if upper and self.ceiling is not None and i == self.ceiling.axis:
                t_comp = self.ceiling.above(cs, t_comp, mask)
            elif not upper and self.floor is not None and i == self.floor.axis:
                at_edge = list(cs)
                at_edge[i] = np.full(np.shape(cs[i]), self.lo[i])
                t_comp = self.floor.below(cs, at_edge, t_comp, t_comp, mask, self)
        return t_comp

    def _owned(self, i: int, upper: bool) -> bool:
        rule = self.ceiling if upper else self.floor
        return rule is not None and rule.axis == i

    def _times(self, cs, clamped, outside):
        """(t at the clamped coordinates, composed / clamped time ratio): the interpolations of the clamped
        points and of both ends of each edge interval a request leaves by (the measured interval next to
        that edge, at the other clamped coordinates) in one pass. Outside the range along axis i the
        ratio is :func:`affine_growth` over that interval; an axis measured at one point (or with no
        work exponent) keeps constant throughput above and its time below (COMPOSE_RULES)."""
        shape = np.shape(cs[0])
        grow = np.ones(shape)
        exps = compose_rule(self.name)[0]
        if not self._keep:
            for i, upper, mask in outside:
                if not self._owned(i, upper):
                    grow = np.where(mask & upper, grow * (cs[i] / self.hi[i]) ** exps[i], grow)
            return np.full(shape, np.exp(self._const)), grow
        base = np.stack([np.log(clamped[i]).ravel() for i in self._keep], axis=-1)
        blocks, jobs = [base], []
        for i, upper, mask in outside:
            g, e = self.grid[i], exps[i]
            if self._owned(i, upper):
                continue
            if len(g) < 2 or i not in self._keep or e == 0:
                if upper:
                    grow = np.where(mask, grow * (cs[i] / g[-1]) ** e, grow)
                continue
            edge, nb = (g[-1], g[-2]) if upper else (g[0], g[1])
            col = self._keep.index(i)
            for v in (nb, edge):
                pts = base.copy()
                pts[:, col] = np.log(v)
                blocks.append(pts)
            jobs.append((i, mask, edge, nb, e))
        t_all = np.exp(self._interp(np.concatenate(blocks))).reshape(len(blocks), *shape)
        with np.errstate(invalid="ignore", divide="ignore"):
            for n, (i, mask, edge, nb, e) in enumerate(jobs):
                t_nb, t_edge = t_all[1 + 2 * n], t_all[2 + 2 * n]
                grow = np.where(mask, grow * affine_growth(t_edge, t_nb, edge, nb, cs[i], e), grow)
        return t_all[0], grow


def fill_grid(df: pd.DataFrame, axes: list[str], value: str,
              work: np.ndarray | None = None) -> tuple[list[np.ndarray], np.ndarray]:
    """Pivot ``df`` onto the full product grid of its axes; fill holes by nearest neighbour.

    Holes are filled in log(value / work) (log inverse-throughput when ``work`` is the FLOP count
    per row), in log-axis space, so a missing big GEMM inherits its neighbour's utilisation rather
    than its time. Returns (grid axes, values array in grid order).
    """
    grid = [np.sort(df[a].unique()).astype(float) for a in axes]
    idx = pd.MultiIndex.from_product(grid, names=axes)
    s = df.set_index(axes)[value].groupby(level=list(range(len(axes)))).median()
    s.index = s.index.set_levels([lv.astype(float) for lv in s.index.levels])
    full = s.reindex(idx)
    vals = full.to_numpy(dtype=float).copy()
    if np.isnan(vals).any():
        coords = np.log(np.array(list(idx), dtype=float))
        w = np.ones(len(vals)) if work is None else work(np.array(list(idx), dtype=float))
        ok = ~np.isnan(vals)
        from scipy.interpolate import NearestNDInterpolator  # building only: kept off the planner's start-up

        nn = NearestNDInterpolator(coords[ok], np.log(vals[ok] / w[ok]))
        vals[~ok] = np.exp(nn(coords[~ok])) * w[~ok]
    return grid, vals


@dataclass
class CollectiveTable:
    """Measured collective times for one (collective, layout, inter_node) regime.

    Per measured group size a 1-D log-log curve over message size; between measured group sizes
    the time is interpolated linearly in log(group). Group sizes outside the measured set are
    handled by busbw invariance (see :meth:`Tables.collective`), the size axis is range-checked.
    """

    name: str
    groups: np.ndarray
    sizes: list[np.ndarray]
    log_t: list[np.ndarray]
    tail: object = None  # compose.CollectiveTail beyond each curve's largest message (built from the curves)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        if self.tail is None:
            self.tail = collective_tail(self.name.split(".")[-1], self.groups, self.sizes,
                                        [np.exp(x) for x in self.log_t])

    def time(self, group: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
             np.ndarray]:
        """(seconds, size lo, size hi, exact) per element; memoised like :meth:`GridTable.lookup`."""
        g, s = np.asarray(group, dtype=float), np.asarray(size, dtype=float)
        key = lambda: (g.shape, g.tobytes(), s.shape, s.tobytes())  # noqa: E731
        return memoised(self._cache, max(g.size, s.size), key,
                        lambda: tuple(_readonly(x) for x in self._time_distinct(g, s)))

    def _time_distinct(self, group: np.ndarray, size: np.ndarray):
        """:meth:`_time` of each distinct (group, size) of a large request once (:func:`distinct_points`)."""
        g, s = np.broadcast_arrays(group, size)
        d = distinct_points([g, s]) if g.size >= DISTINCT_MIN else None
        if d is None:
            return self._time(group, size)
        rep, inv = d
        return tuple(x[inv].reshape(g.shape) for x in self._time(g.reshape(-1)[rep], s.reshape(-1)[rep]))

    def composed(self, group: np.ndarray, size: np.ndarray) -> np.ndarray:
        """Seconds with the COMPOSE_RULES["collectives"] rule outside the measured sizes: beyond a curve's
        largest message its ``tail`` (alpha-beta, compose.collective_tail), the curves blended in log group
        as :meth:`time` does; below the smallest, its (latency-bound) time."""
        size = np.asarray(size, dtype=float)
        t, _, hi, _ = self.time(group, size)
        above = size > hi * (1 + 1e-9)
        if not above.any():
            return t
        g = np.broadcast_to(np.asarray(group, dtype=float), above.shape)
        out = np.array(t, dtype=float)
        out[above] = self._time(g[above], size[above], tail=True)[0]
        return out

    def _curve(self, gi: int, ls: np.ndarray, tail: bool) -> np.ndarray:
        """log seconds on curve ``gi`` at log sizes ``ls``: interpolated, clamped at its ends, or (``tail``)
        beyond its largest message its tail."""
        xs = np.log(self.sizes[gi])
        lt = np.interp(ls, xs, self.log_t[gi])
        if tail:
            lt = np.where(ls > xs[-1], np.log(self.tail.time(gi, np.exp(ls))), lt)
        return lt

    def _time(self, group: np.ndarray, size: np.ndarray, tail: bool = False):
        g = np.clip(group, self.groups[0], self.groups[-1])
        lg = np.log(g)
        lgr = np.log(self.groups)
        j = np.clip(np.searchsorted(lgr, lg, side="right") - 1, 0, len(self.groups) - 1)
        j2 = np.minimum(j + 1, len(self.groups) - 1)
        w = np.where(j2 > j, (lg - lgr[j]) / np.where(j2 > j, lgr[j2] - lgr[j], 1.0), 0.0)
        ls = np.log(np.maximum(size, 1.0))
        gb, lsb, jb, j2b, wb = np.broadcast_arrays(g, ls, j, j2, w)
        t1 = np.empty(gb.shape)
        t2 = np.empty(gb.shape)
        for gi in sorted(set(jb.ravel().tolist()) | set(j2b.ravel().tolist())):  # not np.unique: see on_grid
            m1, m2 = jb == gi, j2b == gi
            t1[m1], t2[m2] = self._curve(gi, lsb[m1], tail), self._curve(gi, lsb[m2], tail)
        out = np.exp((1 - wb) * t1 + wb * t2)
        mins = np.array([s.min() for s in self.sizes])
        maxs = np.array([s.max() for s in self.sizes])
        lo, hi = np.maximum(mins[jb], mins[j2b]), np.minimum(maxs[jb], maxs[j2b])
        exact = on_grid(gb, self.groups) & on_grid(np.exp(lsb).round(), np.concatenate(self.sizes))
        return out, lo, hi, exact


@dataclass
class Tables:
    """All measured tables of one profile (any may be None: that component is analytic)."""

    profile: str
    gemm: GridTable | None = None
    grouped: dict[tuple[str, int, int], GridTable] = field(default_factory=dict)  # (fwd|bwd, hidden, ffn)
    sdpa_by_dtype: dict[str, dict[str, GridTable]] = field(default_factory=dict)  # dtype -> fwd|bwd (bf16 first)
    topk: dict[str, GridTable] = field(default_factory=dict)  # fwd|bwd
    # token permute / unpermute (router suite variants): (permute|unpermute, fwd|bwd, dtype) -> grid over
    # (num_tokens, num_experts, k, hidden); see compute.permute_times
    permute: dict[tuple[str, str, str], GridTable] = field(default_factory=dict)
    vocab: dict[tuple[str, str], GridTable] = field(default_factory=dict)  # (op, fwd|bwd)
    vocab_size: int | None = None
    collectives: dict[tuple[str, str, bool], CollectiveTable] = field(default_factory=dict)
    elementwise: dict[tuple[str, str], GridTable] = field(default_factory=dict)
    t_gap_s: float | None = None  # per-kernel CPU dispatch gap (dispatch table)
    t_host_s: float | None = None  # fixed per-microbatch host time (dispatch table, mode host_overhead)
    t_kernel_min_s: float | None = None  # GPU-active time of the smallest measured kernel (dispatch table)
    # per dtype: the per-call host floor taken off its dense-GEMM rows (estimator/floors.py), seconds
    gemm_host_floor_s: dict[str, float] = field(default_factory=dict)
    n_points: dict[str, int] = field(default_factory=dict)
    # per precision ("bf16", "fp32", ...): the GEMM / grouped / vocab tables of that dtype's rows;
    # ``gemm``, ``grouped``, ``vocab`` hold bf16 (the default view); see :meth:`view`
    by_dtype: dict[str, dict] = field(default_factory=dict)
    # the bf16 GEMM table scaled to a faster lane without rows of its own (:meth:`view`): (precision, ratio) -> table
    lane_gemm: dict[tuple[str, float], GridTable] = field(default_factory=dict, repr=False, compare=False)
    # serial-dispatch host seconds (dispatch rows ``ops:<part>[:<ckpt>]``): (part, ckpt, dtype) ->
    # array of rows (tokens m, hidden n, experts k, seconds); see :meth:`host_time`
    host_ops: dict[tuple[str, str, str], np.ndarray] = field(default_factory=dict)
    sdpa_backend: str | None = None  # of ``sdpa_by_dtype``; every measured one's: backend -> dtype -> fwd|bwd
    sdpa_backends: dict[str, dict[str, dict[str, GridTable]]] = field(default_factory=dict)
    # caching-allocator overhead measured by the bench suite 'allocator': (fraction of allocated,
    # bytes outside the allocator), medians over OK rows; None -> estimator.memory's defaults
    allocator: tuple[float, float] | None = None
    scaled_from: dict[str, str] = field(default_factory=dict)  # suite -> the part whose rows, scaled, built it
    # (resolved url, profile, peak FLOP/s) the tables were read from (table_build.cached_tables); None
    # for tables built from frames in hand
    source: tuple | None = None

    def host_time(self, part: str, ckpt: str, dtype: str, tokens: ArrayLike, hidden: int,
                  experts: int) -> np.ndarray | None:
        """Host seconds of a model part at ``tokens`` per micro-batch (array), or None without rows.

        Rows of the exact (hidden, experts) are used where present (else all rows); between measured
        token counts log-log interpolation, outside them the nearest (the dispatch share does not
        depend on the widths; the uncosted compute is a small share)."""
        rows = self.host_ops.get((part, ckpt, dtype))
        if rows is None:
            return None
        same = rows[(rows[:, 1] == hidden) & (rows[:, 2] == experts)]
        rows = same if len(same) else rows
        rows = rows[np.argsort(rows[:, 0])]
        m, t = np.log(rows[:, 0]), np.log(rows[:, 3])
        return np.exp(np.interp(np.log(np.asarray(tokens, dtype=float)), m, t))

    def collective(self, coll: str, layout: str, inter: bool, group: ArrayLike | None = None,
                   size: ArrayLike | None = None) -> CollectiveTable | None:
        """The collective table of a regime (None: unmeasured). ``group`` / ``size`` (ranks, bytes per
        rank; arrays over the plans that ask) are the request, which these tables do not need and a
        recording view (:class:`~scaleplan.estimator.lookup_listing.RecordingTables`) lists."""
        return self.collectives.get((coll, layout, bool(inter)))

    def vocab_lookup(self, op: str, dirn: str, tokens: ArrayLike, vocab: ArrayLike,
                     hidden: int) -> LookupResult | None:
        """LM head / cross-entropy (``op``, ``dirn``) at ``tokens`` and a (padded, TP-sharded) ``vocab``:
        the table of the one vocab size it measures, at the logit-equivalent token count
        tokens x vocab / vocab_size (both kernels' work is proportional to the logit count). None where
        the op is not measured."""
        tab = self.vocab.get((op, dirn))
        return None if tab is None else tab.lookup(tokens * vocab / self.vocab_size, hidden)

    def view(self, precision: str, lane_ratio: float = 1.0) -> Tables:
        """These tables with gemm / grouped / vocab taken from ``precision``'s rows (a spec in fp32 looks up
        fp32 GEMMs). A precision without GEMM rows whose tensor-core lane is faster than bf16's
        (``lane_ratio``: the bf16 peak over its peak, below 1 for FP8 and FP4; analytic.gemm_lane_ratio) gets
        the bf16 GEMM table scaled by that ratio, each lookup labelled analytic, as attention in another
        precision is (compute.sdpa_times); FP8 grouped GEMMs are then composed from it
        (compute.expert_times). Any other precision without rows keeps the bf16 tables. The scaled table is
        made once per (precision, ratio)."""
        d = self.by_dtype.get(precision) or {}
        if precision == "bf16":
            return self
        if self.lane_scaled(precision, lane_ratio):
            key = (precision, float(lane_ratio))
            if key not in self.lane_gemm:
                self.lane_gemm[key] = self.gemm.scaled(lane_ratio, ANALYTIC)
            d = {**d, "gemm": self.lane_gemm[key]}
            return dataclasses.replace(self, by_dtype={**self.by_dtype, precision: d},
                                       **{k: v for k, v in d.items() if v})
        if not d:
            return self
        return dataclasses.replace(self, **{k: v for k, v in d.items() if v})

    def lane_scaled(self, precision: str, lane_ratio: float) -> bool:
        """Whether :meth:`view` gives ``precision`` the bf16 GEMM table scaled by ``lane_ratio`` (no GEMM rows of
        its own, a faster lane)."""
        return (precision != "bf16" and lane_ratio < 1.0 and self.gemm is not None
                and not (self.by_dtype.get(precision) or {}).get("gemm"))

    def with_sdpa_backend(self, backend: str | None) -> Tables:
        """These tables with the SDPA grids of ``backend`` (one of :attr:`sdpa_backends`; themselves otherwise)."""
        if backend is None or backend == self.sdpa_backend or backend not in self.sdpa_backends:
            return self
        return dataclasses.replace(self, sdpa_by_dtype=self.sdpa_backends[backend], sdpa_backend=backend)

    @property
    def sdpa(self) -> dict[str, GridTable]:
        """The bf16 SDPA grids (fwd|bwd), else those of the first dtype measured; {} without any."""
        return next(iter(self.sdpa_by_dtype.values()), {})

    @property
    def empty(self) -> bool:
        return not any(self.n_points.values())
