"""Building the measured tables (paper sec:microbenchmarks): database rows to the interpolators of
:mod:`scaleplan.estimator.tables`, and the on-disk cache of built tables keyed by the database state
and this code, so a planner command does not re-read and re-fit what the previous one built.
"""
from __future__ import annotations

import functools
from collections.abc import Collection

import numpy as np
from scaleplan.estimator import compose, floors
from scaleplan.estimator.tables import COMPOSED, CollectiveTable, GridTable, Tables, fill_grid

from scaleplan.db.measurements import (
    BORROWED_ROWS,
    FROM_PROFILE,
    SAME_DIE_GEMM,
    SCALED,
    is_scaled,
    load_frames,
    named_profiles,
    part_scales,
)
from scaleplan.lazy import lazy_module
from scaleplan.units import BYTES_PER_ELEMENT

pd = lazy_module("pandas")


# ---------------------------------------------------------------------------------------------- loading
# the rows come from scaleplan/db/measurements.py (load_frames, SQL); this module builds the tables


def _newest(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Keep, per key, the rows of the newest run only (dedupe points measured more than once)."""
    if df.empty:
        return df
    df = df.sort_values(["run_started", "run_order"])
    newest = df.groupby(keys, dropna=False)["run_order"].transform("last")
    return df[df["run_order"] == newest]


def build_tables(profile: str, frames: dict[str, pd.DataFrame], peak_flops: float) -> Tables:
    """Build interpolators from loaded frames (see module docstring for the treatment)."""
    tb = Tables(profile=profile, n_points={k: len(v) for k, v in frames.items() if k != SAME_DIE_GEMM})
    _build_gemm(tb, frames.get("gemm", pd.DataFrame()), peak_flops, frames.get(SAME_DIE_GEMM))
    _build_grouped(tb, frames.get("grouped_gemm", pd.DataFrame()))
    _build_sdpa(tb, frames.get("sdpa", pd.DataFrame()))
    _build_topk(tb, frames.get("router", pd.DataFrame()))
    _build_permute(tb, frames.get("router", pd.DataFrame()))
    _build_vocab(tb, frames.get("vocab", pd.DataFrame()))
    _build_collectives(tb, frames.get("collectives", pd.DataFrame()))
    _build_elementwise(tb, frames.get("elementwise", pd.DataFrame()))
    _build_dispatch(tb, frames.get("dispatch", pd.DataFrame()))
    _build_allocator(tb, frames.get("allocator", pd.DataFrame()))
    _label_scaled(tb, frames)
    return tb


# where each device suite's grids sit in Tables: attributes, and keys of each dtype's view in ``by_dtype``
_SUITE_GRIDS = {"gemm": ((), ("gemm",)), "grouped_gemm": ((), ("grouped",)), "sdpa": (("sdpa_backends",), ()),
                "router": (("topk", "permute"), ()), "vocab": ((), ("vocab",)), "elementwise": (("elementwise",), ())}


def _grids(obj):
    """Every GridTable in ``obj`` (a GridTable or nested dicts of them)."""
    if isinstance(obj, GridTable):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _grids(v)


def _label_scaled(tb: Tables, frames: dict[str, pd.DataFrame]) -> None:
    """Label composed every lookup of a suite that holds rows of another part scaled to this one (``SCALED``:
    measurements.scale_to_part): its times are a rule's, not this part's measurements. A suite that also holds
    rows of its own is labelled composed whole (the grids do not keep whose rows they interpolate)."""
    for suite, (attrs, views) in _SUITE_GRIDS.items():
        df = frames.get(suite, pd.DataFrame())
        if not is_scaled(df):
            continue
        tb.scaled_from[suite] = ", ".join(sorted(df.loc[df[SCALED].notna(), FROM_PROFILE].astype(str).unique()))
        found = [getattr(tb, a) for a in attrs] + [v.get(k) for v in tb.by_dtype.values() for k in views]
        for g in (g for x in found for g in _grids(x)):
            g.label = COMPOSED


def _build_gemm(tb: Tables, df: pd.DataFrame, peak: float, same_die: pd.DataFrame | None = None) -> None:
    """Dense GEMM grid over (m, n, k), one per dtype (bf16 in ``tb.gemm``, every dtype in by_dtype); without
    FP8 rows of its own, the FP8 table composed from ``same_die``'s rows (:func:`_fp8_from_same_die`)."""
    if df.empty:
        return
    grids, hosts = _gemm_grids(df, peak)
    tb.gemm_host_floor_s = hosts
    for dt, (*_, tab) in grids.items():
        tb.by_dtype.setdefault(dt, {})["gemm"] = tab
    tb.gemm = tb.by_dtype.get("bf16", {}).get("gemm")
    if "bf16" in grids and "fp8" not in grids and same_die is not None and not same_die.empty:
        who = ", ".join(sorted(same_die[FROM_PROFILE].astype(str).unique())) if FROM_PROFILE in same_die else "?"
        _fp8_from_same_die(tb, *grids["bf16"][:3], _gemm_grids(same_die, peak)[0], who)


def _gemm_grids(df: pd.DataFrame, peak: float) -> tuple[dict[str, tuple], dict[str, float]]:
    """Per dtype of ``df``'s GEMM rows (grid axes, values in grid order, the points m, n, k, t_s, its
    GridTable), and per dtype the host floor taken off its rows (seconds)."""
    # the per-call host floor of a dtype's rows above bf16's (the recorded B200 FP8 rows: 0.146 ms of TE's
    # per-call host work) is host time, not the GEMM's: taken off every row (estimator/floors.py)
    df = pd.concat([_newest(d, ["m", "n", "k"]) for _, d in df.groupby("dtype")], ignore_index=True)
    hosts = floors.gemm_host_floors(df)
    df = floors.without_host_floor(df, hosts)
    out = {}
    for dt, d in df.groupby("dtype"):
        grid, vals = fill_grid(d, ["m", "n", "k"], "t_s", work=lambda p: 2.0 * p[:, 0] * p[:, 1] * p[:, 2] / peak)
        pts = [d[a].to_numpy(float) for a in ("m", "n", "k", "t_s")]
        floor = compose.gemm_floor(*pts, elem_bytes=float(BYTES_PER_ELEMENT.get(str(dt), 2)))
        tab = GridTable("gemm", ("m", "n", "k"), grid, vals, floor=floor)
        # Transformer Engine's FP8 rows time the Linear (its inputs' quantize included); torch._scaled_mm's
        # rows time the GEMM of operands already in E4M3 (compute.fp8_cast_times adds their casts)
        tab.holds_casts = "backend" in d and bool(d["backend"].astype(str).str.startswith("te").all())
        out[str(dt)] = (grid, vals, pts, tab)
    return out, {dt: h for dt, (h, _) in hosts.items()}


def _fp8_from_same_die(tb: Tables, grid: list, vals: np.ndarray, pts: list, theirs: dict[str, tuple],
                       who: str) -> None:
    """This profile's FP8 GEMM table where it has no FP8 rows: its bf16 table (``grid``, ``vals``, the
    points ``pts``) times the FP8 / bf16 device-time ratio that a GPU of the same die measured (``theirs``:
    :func:`_gemm_grids` of the rows of ``who``, the profile's ``fp8_ratio_tables``) at each grid point, the
    shape clamped into their measured range (the ratio at their nearest shape). Same die, same SMs, clocks
    and tensor-core lanes: the ratio of the two lanes' device times carries over, which the flat lane rule
    (bf16 / FP8 peak, Tables.view) does not give (the H200 measured 0.58 at large shapes, 0.78 at m 256).
    Every lookup is labelled composed."""
    if "bf16" not in theirs or "fp8" not in theirs:
        return
    b16, f8 = theirs["bf16"][3], theirs["fp8"][3]
    lo, hi = np.maximum(b16.lo, f8.lo), np.minimum(b16.hi, f8.hi)

    def ratio(*mnk):
        at = [np.clip(np.asarray(x, dtype=float), a, b) for x, a, b in zip(mnk, lo, hi)]
        return f8.lookup(*at).t / b16.lookup(*at).t

    mesh = np.meshgrid(*grid, indexing="ij")
    vals8 = np.asarray(vals, dtype=float).reshape(mesh[0].shape) * ratio(*mesh)
    m, n, k, t = pts
    floor = compose.gemm_floor(m, n, k, t * ratio(m, n, k), elem_bytes=float(BYTES_PER_ELEMENT["fp8"]))
    tab = GridTable(f"gemm[fp8 = bf16 x the FP8/bf16 ratio of {who}]", ("m", "n", "k"), grid, vals8.reshape(-1),
                    floor=floor)
    tab.label, tab.holds_casts = COMPOSED, f8.holds_casts
    tb.by_dtype.setdefault("fp8", {})["gemm"] = tab


def _build_grouped(tb: Tables, df: pd.DataFrame) -> None:
    """Grouped expert GEMM: one grid per (direction, hidden, ffn) over (num_gemms, tokens_per_expert).

    fc1 and fc2 of one expert MLP are summed per grid point (the estimator always runs both).
    Only balanced routing rows are used (the model assumes balanced routing).
    """
    if df.empty:
        return
    df = df[df["distribution"] == "balanced"]
    for dt, d in df.groupby("dtype"):
        out: dict = {}
        dense = tb.by_dtype.get(str(dt), {}).get("gemm")  # this dtype's dense GEMM (_build_gemm ran first)
        keys = ["proj", "num_gemms", "tokens_per_expert", "hidden", "ffn"]
        _build_grouped_dtype(out, _newest(d, keys), dense)
        tb.by_dtype.setdefault(str(dt), {})["grouped"] = out
        if dt == "bf16":
            tb.grouped = out


def _build_grouped_dtype(out: dict, df: pd.DataFrame, dense=None) -> None:
    """One dtype's grouped grids (every measured point is used, however few: a lookup between them
    is interpolated, outside them out of range); ``dense``: that dtype's dense GEMM table or None
    (compose.grouped_rules)."""
    built = {}
    for (h, f), g in df.groupby(["hidden", "ffn"]):
        for dirn, col in (("fwd", "fwd_s"), ("bwd", "bwd_s")):
            gg = g.dropna(subset=[col])
            piv = gg.groupby(["num_gemms", "tokens_per_expert", "proj"])[col].median().unstack("proj")
            if not {"fc1", "fc2"} <= set(piv.columns):
                continue
            tot = (piv["fc1"] + piv["fc2"]).dropna().rename("t").reset_index()
            if len(tot) >= 1:
                built[(dirn, int(h), int(f))] = tot
    cols = ("num_gemms", "tokens_per_expert", "t")
    points = {k: tuple(v[c].to_numpy(float) for c in cols) for k, v in built.items()}
    rules = compose.grouped_rules(points, dense)
    for key, tot in built.items():
        grid, vals = fill_grid(tot, ["num_gemms", "tokens_per_expert"], "t")
        vals = compose.undominated_grid(vals.reshape(len(grid[0]), len(grid[1]))).reshape(-1)
        out[key] = GridTable(f"grouped_gemm[{key[1]}x{key[2]}]", ("num_gemms", "tokens_per_expert"), grid, vals,
                             ceiling=rules[key][0], floor=rules[key][1])


# SDPA rows by backend, the first of this order present read by default: Transformer Engine's own ("te") where
# measured, else PyTorch's SDPA kernels in the order its dispatcher tries them (scaleplan's reference model), down
# to the eager math path a CPU measures; Megatron-Core's attention picks with :func:`te_attention_backend`
SDPA_BACKENDS = ("te", "flash", "cudnn", "efficient", "math", "pt")


def te_attention_backend(have: Collection[str], compute_capability: float | None) -> str | None:
    """The measured SDPA backend Megatron-Core's Transformer Engine attention runs, of the backends ``have``: its
    own rows ("te") where measured; else on Hopper and newer (compute capability 9.0 and up) cuDNN's fused
    attention, which TE prefers there to FlashAttention "for performance reasons" (TE 2.14.1
    attention/dot_product_attention/utils.py, get_attention_backend); else the default order (FlashAttention
    before cuDNN, as PyTorch's own SDPA and TE on older GPUs choose). None when nothing is measured."""
    order = SDPA_BACKENDS
    if compute_capability is not None and compute_capability >= 9.0:
        order = ("te", "cudnn", *(b for b in SDPA_BACKENDS if b not in ("te", "cudnn")))
    return next((b for b in order if b in have), None)


def _build_sdpa(tb: Tables, df: pd.DataFrame) -> None:
    """SDPA grids over (seq_len, micro_bs, n_q_heads, head_dim), causal, one per dtype and measured backend
    (``tb.sdpa_backends``); any number of points (between them interpolated). ``tb.sdpa_by_dtype`` holds the
    first backend of ``SDPA_BACKENDS`` the profile measured, bf16 first (``tb.sdpa``); the time model may pick
    another (:func:`te_attention_backend`); the spec's sdpa_precision picks the dtype (compute.py).

    n_kv_heads is not an independent axis of the recorded data (it co-varies with n_q_heads:
    kv=1 only at q=8), and the causal flash kernel's work is set by the query heads (K/V reads are
    a lower-order term), so kv is not interpolated; the lookup dict still records it. Rows without
    a backward time (the older forward-only sweep) are not used.
    """
    if df.empty:
        return
    df = df[df["bwd_s"].notna() & (df["causal"].astype(bool))]
    have = set(df["backend"].astype(str))
    backend = next((b for b in SDPA_BACKENDS if b in have), None)
    if backend is None:
        return
    axes = ["seq_len", "micro_bs", "n_q_heads", "head_dim"]
    for b in sorted(have & set(SDPA_BACKENDS), key=SDPA_BACKENDS.index):
        rows = df[df["backend"] == b]
        dtypes = rows["dtype"].astype(str) if "dtype" in rows else pd.Series("bf16", index=rows.index)
        by_dtype = tb.sdpa_backends.setdefault(b, {})
        for dt in sorted(set(dtypes), key=lambda d: (d != "bf16", d)):
            d = _newest(rows[dtypes == dt], ["seq_len", "micro_bs", "n_q_heads", "n_kv_heads", "head_dim"])
            tabs = {}
            for dirn, col in (("fwd", "fwd_s"), ("bwd", "bwd_s")):
                grid, vals = fill_grid(d, axes, col)
                floor = compose.sdpa_floor(*(d[a].to_numpy(float) for a in axes), d[col].to_numpy(float))
                tabs[dirn] = GridTable("sdpa", tuple(axes), grid, vals, floor=floor)
            by_dtype[dt] = tabs
    tb.sdpa_backend, tb.sdpa_by_dtype = backend, tb.sdpa_backends[backend]


def _build_topk(tb: Tables, df: pd.DataFrame) -> None:
    """Router top-k over (num_tokens, num_experts, k); fp32 rows (the router is an fp32 island)."""
    if df.empty:
        return
    df = df[df["variant"] == "topk"]
    if (df["dtype"] == "fp32").any():
        df = df[df["dtype"] == "fp32"]
    df = _newest(df, ["num_tokens", "num_experts", "k", "dtype"])
    tb.topk.update(_direction_grids(df, ("num_tokens", "num_experts", "k"), "router"))


PERMUTE_AXES = ("num_tokens", "num_experts", "k", "hidden")


def _build_permute(tb: Tables, df: pd.DataFrame) -> None:
    """Token permute and unpermute (router suite variants ``permute``, ``unpermute``; bench/suites/router.py)
    over (num_tokens, num_experts, k, hidden), per dtype of the activations they move."""
    if df.empty:
        return
    df = df[df["variant"].isin(("permute", "unpermute"))]
    for (variant, dt), d in df.groupby(["variant", "dtype"]):
        # a hole inherits its neighbour's time per routed row and hidden unit (bytes moved)
        grids = _direction_grids(_newest(d, [*PERMUTE_AXES, "dtype"]), PERMUTE_AXES, "router",
                                 work=lambda p: p[:, 0] * p[:, 2] * p[:, 3])
        tb.permute.update({(str(variant), dirn, str(dt)): tab for dirn, tab in grids.items()})


def _build_vocab(tb: Tables, df: pd.DataFrame) -> None:
    """LM-head GEMM and cross-entropy over (tokens, hidden) at the table's single vocab size.

    Both kernels do work proportional to the logit count tokens x vocab, so a request at another
    (padded, TP-sharded) vocab V is looked up at the logit-equivalent token count
    tokens * V / V_table (see model.vocab_times); the single-valued vocab axis is recorded in
    ``vocab_size``.
    """
    if df.empty:
        return
    # the LM-head GEMM runs in the model precision: one vocab dict per dtype of its rows (the fp32
    # cross-entropy rows go with every dtype); bf16 (or the only dtype) is the default view
    head = df[df["op"] == "lm_head_gemm"]
    dts = sorted(set(head["dtype"].astype(str))) or ["bf16"]
    for dt in dts:
        sub = Tables(tb.profile)
        _build_vocab_dtype(sub, df[(df["op"] != "lm_head_gemm") | (df["dtype"] == dt)])
        tb.by_dtype.setdefault(dt, {})["vocab"] = sub.vocab
        tb.by_dtype[dt]["vocab_size"] = sub.vocab_size
        if dt == "bf16" or len(dts) == 1:
            tb.vocab, tb.vocab_size = sub.vocab, sub.vocab_size


def _build_vocab_dtype(tb: Tables, df: pd.DataFrame) -> None:
    df = _newest(df, ["op", "tokens", "hidden", "vocab", "dtype"])
    vs = df["vocab"].mode()
    if vs.empty:
        return
    tb.vocab_size = int(vs.iloc[0])
    df = df[df["vocab"] == tb.vocab_size]
    tb.vocab.update(_per_op_grids(df, "vocab"))


def _build_collectives(tb: Tables, df: pd.DataFrame) -> None:
    if df.empty:
        return
    df = _newest(df, ["collective", "group_size", "layout", "inter_node", "size_bytes", "dtype"])
    for (coll, layout, inter), g in df.groupby(["collective", "layout", "inter_node"]):
        groups, sizes, lts = [], [], []
        for n, gg in g.groupby("group_size"):
            s = gg.groupby("size_bytes")["t_s"].median()
            if s.empty:
                continue
            sz, t = _undominated(s.index.to_numpy(dtype=float), s.to_numpy(dtype=float))
            groups.append(int(n))
            sizes.append(sz)
            lts.append(np.log(t))
        if groups:
            tb.collectives[(str(coll), str(layout), bool(inter))] = CollectiveTable(
                f"collectives.{coll}", np.array(groups, dtype=float), sizes, lts)
    for (coll, layout, inter), ar in tb.collectives.items():
        rs, ag = (tb.collectives.get((c, layout, inter)) for c in ("reduce_scatter", "all_gather"))
        if coll == "all_reduce" and rs is not None and ag is not None:
            ar.tail = compose.ring_all_reduce_bound(ar.tail, ar.groups, rs.tail, rs.groups, ag.tail, ag.groups)


def _undominated(sizes: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One collective curve (sizes ascending, bytes; seconds) without the points slower than a larger
    message of the same curve, which the curve then interpolates across. Timing noise only adds (a run
    is never faster than the links allow), and the larger message shows the links move more bytes in
    less time, so the slower, smaller point is the artefact (an algorithm or protocol switch at that
    exact size, or a disturbed run). The recorded B200 inter-node all-to-all of 16 ranks at 302 MB takes
    7.46 ms where 512 MB takes 5.68 ms; raising the larger points to it (a running maximum) charged every
    2-node all-to-all from 302 to 604 MB 7.46 ms."""
    keep = t <= np.minimum.accumulate(t[::-1])[::-1]
    return sizes[keep], t[keep]


def _build_elementwise(tb: Tables, df: pd.DataFrame) -> None:
    if df.empty:
        return
    df = _newest(df, ["op", "tokens", "hidden", "dtype"])
    tb.elementwise.update(_per_op_grids(df, "elementwise"))


def _per_op_grids(df: pd.DataFrame, suite: str) -> dict[tuple[str, str], GridTable]:
    """(op, fwd|bwd) -> GridTable over (tokens, hidden) of the rows that have that direction's time
    (one row is enough: a single-point table answers that point and reports the rest out of range)."""
    return {(str(op), dirn): tab for op, g in df.groupby("op")
            for dirn, tab in _direction_grids(g, ("tokens", "hidden"), f"{suite}.{op}").items()}


def _direction_grids(df: pd.DataFrame, axes: tuple[str, ...], name: str, work=None) -> dict[str, GridTable]:
    """fwd|bwd -> GridTable ``name`` over ``axes`` of the rows of ``df`` that have that direction's time
    (``fwd_s``, ``bwd_s``; a direction no row has is left out); ``work``: fill_grid's hole filling."""
    out = {}
    for dirn, col in (("fwd", "fwd_s"), ("bwd", "bwd_s")):
        gg = df.dropna(subset=[col])
        if not gg.empty:
            grid, vals = fill_grid(gg, list(axes), col, work=work)
            out[dirn] = GridTable(name, tuple(axes), grid, vals)
    return out


def _build_dispatch(tb: Tables, df: pd.DataFrame) -> None:
    """Per-kernel dispatch gap t_gap: median wall time per kernel of the launch-bound chain points.

    A chain point is launch-bound when the GPU is busy less than half the wall time per kernel;
    there the wall time per kernel is the CPU enqueue gap. ``host_overhead`` rows give t_host.
    """
    if df.empty:
        return
    host = df[df["mode"] == "host_overhead"]
    if not host.empty:
        tb.t_host_s = float(_newest(host, ["mode"])["wall_per_kernel_s"].median())
    g = df[(df["mode"] == "gemm") & df["active_per_kernel_s"].notna()]
    g = _newest(g, ["mode", "m", "n", "k", "dtype", "chain_len"])
    bound = g[g["active_per_kernel_s"] < 0.5 * g["wall_per_kernel_s"]]
    if not bound.empty:
        tb.t_gap_s = float(bound["wall_per_kernel_s"].median())
    if not g.empty:
        # a kernel cannot keep the device busy longer than the wall time it takes (rows measured by
        # an older CPU definition of "active" could say so): never use more than the wall
        tb.t_kernel_min_s = float(np.minimum(g["active_per_kernel_s"], g["wall_per_kernel_s"]).min())
    ops = df[df["mode"].astype(str).str.startswith("ops:")]
    ops = _newest(ops, ["mode", "m", "n", "k", "dtype", "chain_len"])
    for (mode, dt), r in ops.groupby(["mode", "dtype"]):
        _, part, *ck = str(mode).split(":")
        r = r.groupby(["m", "n", "k"])["wall_per_kernel_s"].median().reset_index()
        tb.host_ops[(part, ck[0] if ck else "", str(dt))] = r[["m", "n", "k", "wall_per_kernel_s"]].to_numpy(float)


def _build_allocator(tb: Tables, df: pd.DataFrame) -> None:
    """Allocator overhead (bench/suites/allocator.py): medians of reserved/allocated - 1 and of the
    bytes outside the allocator over the OK rows."""
    if df.empty or "allocator_fraction" not in df:
        return
    ok = df[df["allocator_fraction"].notna()]
    if not ok.empty:
        tb.allocator = (float(ok["allocator_fraction"].median()), float(ok["context_bytes"].fillna(0).median()))
        tb.n_points["allocator"] = len(ok)


# the modules whose code shapes the compiled tables: a change to any of them rebuilds cached entries
TABLE_MODULES = (__name__, "scaleplan.estimator.tables", "scaleplan.estimator.compose", "scaleplan.estimator.floors",
                 "scaleplan.db.measurements",
                 "scaleplan.db.identity")


@functools.lru_cache(maxsize=32)
def cached_tables(url: str, profile: str, peak_flops: float) -> Tables:
    """Tables of (resolved url, profile): once per process, and for an SQLite database also on disk
    per database state (:func:`scaleplan.db.state_cache.cached_read`), so a planner command does not
    re-read and re-fit the tables the previous one built (~0.6 s of an 18B ``layouts``)."""
    from scaleplan.db.state_cache import cached_read

    # the profiles it borrows rows from are part of the key: an edited profile YAML rebuilds its tables
    named = tuple(named_profiles(profile, f) for f in (*BORROWED_ROWS, "device_tables_first"))
    # an edited datasheet rescales: the factors are part of the key
    scales = (part_scales(profile, p) for p in named_profiles(profile, "scaled_device_tables"))
    named += tuple((tuple(sorted(peak.items())), hbm) for peak, hbm in scales)
    tb = cached_read("tables", url, (profile, peak_flops, named), TABLE_MODULES,
                     lambda: build_tables(profile, load_frames(url, profile), peak_flops),
                     valid=lambda v: isinstance(v, Tables))
    tb.source = (url, profile, peak_flops)  # what the tables were read from (mosaic.evidence measures it again)
    return tb
