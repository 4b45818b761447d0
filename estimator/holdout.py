"""How good is composition beyond the measured range? Hide the top of a recorded table, compose, compare.

For each table kind the points above a cut on one axis are removed, the table is rebuilt from the
rest, and the removed points are looked up through the composition rule (tables.COMPOSE_RULES);
the error is against their measured times. This is the honest test of ``--extrapolate compose``:
the composed values are checked against measurements the rule never saw
(tests/estimator/test_compose.py, benchmarks/compose_accuracy.py).
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scaleplan.estimator.table_build import TABLE_MODULES, build_tables


@dataclass
class Holdout:
    """One hold-out: ``table`` hidden above ``cut`` on ``axis``; errors of the composed times."""

    table: str
    axis: str
    cut: float
    n: int
    mape: float       # mean |composed / measured - 1|
    median_ratio: float  # median composed / measured (< 1: composition is optimistic)
    max_err: float
    below: bool = False  # the points under ``cut`` were hidden (composition down from the smallest)


def _summary(table, axis, cut, pred, meas, below=False) -> Holdout:
    r = np.asarray(pred, dtype=float) / np.asarray(meas, dtype=float)
    if not r.size:  # nothing measured beyond the cut (a smaller table, e.g. one GPU's): n = 0, errors NaN
        return Holdout(table, axis, float(cut), 0, float("nan"), float("nan"), float("nan"), below)
    return Holdout(table, axis, float(cut), int(r.size), float(np.mean(np.abs(r - 1))), float(np.median(r)),
                   float(np.max(np.abs(r - 1))), below)


def _split(df: pd.DataFrame, axis: str, cut: float, below: bool):
    """(kept, hidden) rows: the hidden ones above ``cut`` on ``axis``, or under it when ``below``."""
    hide = df[axis] < cut if below else df[axis] > cut
    return df[~hide], df[hide]


def _rebuilt(frames: dict[str, pd.DataFrame], suite: str, keep: pd.DataFrame, peak: float, also: tuple = ()):
    """Tables of ``keep`` for ``suite`` and the full rows of the suites ``also`` (a rule that reads them)."""
    full = {k: frames[k] for k in also if k in frames}
    return build_tables("holdout", {**{k: pd.DataFrame() for k in frames}, **full, suite: keep}, peak)


def grouped(frames: dict[str, pd.DataFrame], peak: float, cut: float = 2048, axis: str = 'tokens_per_expert',
            below: bool = False) -> Holdout:
    """Grouped GEMM, ``axis`` (tokens_per_expert or num_gemms) above ``cut`` hidden, or under it with
    ``below`` (fc1 + fc2, fwd + bwd, balanced bf16)."""
    df = frames["grouped_gemm"]
    df = df[(df["distribution"] == "balanced") & (df["dtype"] == "bf16")]
    keep, hid = _split(df, axis, cut, below)
    tb = _rebuilt(frames, "grouped_gemm", keep, peak, also=("gemm",))  # compose.concatenated_time's bound
    pred, meas = [], []
    for (h, f, ng, tpe), g in hid.groupby(["hidden", "ffn", "num_gemms", "tokens_per_expert"]):
        per = g.groupby("proj")[["fwd_s", "bwd_s"]].median()
        if not {"fc1", "fc2"} <= set(per.index):
            continue
        for dirn in ("fwd", "bwd"):
            tab = tb.grouped.get((dirn, int(h), int(f)))
            if tab is not None:
                pred.append(float(tab.lookup(ng, tpe).t_composed))
                meas.append(float(per.loc[["fc1", "fc2"], f"{dirn}_s"].sum()))
    return _summary("grouped_gemm", axis, cut, pred, meas, below)


def gemm(frames: dict[str, pd.DataFrame], peak: float, cut: float = 32768, min_nk: float = 1024,
         below: bool = False) -> Holdout:
    """Dense GEMM, m above ``cut`` hidden (under it with ``below``); checked where n, k >= ``min_nk``
    (the model's shapes)."""
    df = frames["gemm"]
    df = df[df["dtype"] == "bf16"]
    keep, hid = _split(df, "m", cut, below)
    tb = _rebuilt(frames, "gemm", keep, peak)
    hid = hid[(hid["n"] >= min_nk) & (hid["k"] >= min_nk)]
    hid = hid.groupby(["m", "n", "k"])["t_s"].median().reset_index()
    pred = tb.gemm.lookup(hid["m"].to_numpy(float), hid["n"].to_numpy(float), hid["k"].to_numpy(float)).t_composed
    return _summary("gemm", "m", cut, pred, hid["t_s"], below)


def sdpa(frames: dict[str, pd.DataFrame], peak: float, cut: float = 8192, below: bool = False) -> Holdout:
    """Causal SDPA (the backend the tables pick), seq_len above ``cut`` hidden, or under it with
    ``below`` (fwd + bwd)."""
    df = frames["sdpa"]
    full = build_tables("holdout", {"sdpa": df}, peak)
    df = df[(df["backend"] == full.sdpa_backend) & df["bwd_s"].notna() & df["causal"].astype(bool)]
    keep, hid = _split(df, "seq_len", cut, below)
    tb = _rebuilt(frames, "sdpa", keep, peak)
    hid = hid.groupby(["seq_len", "micro_bs", "n_q_heads", "head_dim"])[
        ["fwd_s", "bwd_s"]].median().reset_index()
    c = [hid[a].to_numpy(float) for a in ("seq_len", "micro_bs", "n_q_heads", "head_dim")]
    pred = tb.sdpa["fwd"].lookup(*c).t_composed + tb.sdpa["bwd"].lookup(*c).t_composed
    return _summary("sdpa", "seq_len", cut, pred, hid["fwd_s"] + hid["bwd_s"], below)


def collectives(frames: dict[str, pd.DataFrame], peak: float, frac: float = 0.25) -> Holdout:
    """Every collective curve with its sizes above ``frac`` x its largest size hidden; the table is rebuilt
    from what is left of every curve (a regime's rule reads its other group sizes: compose.collective_tail)."""
    df = frames["collectives"]
    keys = ["collective", "layout", "inter_node", "group_size"]
    cut = frac * df.groupby(keys)["size_bytes"].transform("max")
    tb = _rebuilt(frames, "collectives", df[df["size_bytes"] <= cut], peak)
    pred, meas = [], []
    for (coll, lay, inter, n), g in df[df["size_bytes"] > cut].groupby(keys):
        tab = tb.collectives.get((str(coll), str(lay), bool(inter)))
        hid = g.groupby("size_bytes")["t_s"].median()
        if tab is None or hid.empty:
            continue
        pred.extend(tab.composed(np.full(len(hid), float(n)), hid.index.to_numpy(float)).tolist())
        meas.extend(hid.to_numpy(float).tolist())
    return _summary("collectives", "size_bytes", frac, pred, meas)


def all_holdouts(frames: dict[str, pd.DataFrame], peak: float) -> list[Holdout]:
    """The hold-outs of every table kind the recorded B200 data can test."""
    return [grouped(frames, peak), grouped(frames, peak, 64, "num_gemms"), gemm(frames, peak), sdpa(frames, peak),
            collectives(frames, peak)]


def group_sizes(frames: dict[str, pd.DataFrame], peak: float, gpus_per_node: int = 8) -> Holdout:
    """Collectives at the largest measured group size hidden and predicted from the smaller ones the way the
    estimator extrapolates to more ranks than measured (comm.collective_time): busbw invariance (the
    per-link bytes S factor(n) kept), an inter-node all-to-all by its inter-node bytes per rank
    S (n - m) / n (m = ``gpus_per_node``). One doubling of the group on the recorded tables (16 -> 32 inter-node);
    a search extrapolating further compounds it. ``cut`` is the hidden group size's ratio to the largest kept."""
    from scaleplan.estimator.analytic import bus_factor

    df = frames["collectives"]
    pred, meas, ratio = [], [], []
    for (coll, lay, inter), fam in df.groupby(["collective", "layout", "inter_node"]):
        sizes = sorted(fam["group_size"].unique())
        if len(sizes) < 2:
            continue
        n, n_ref = float(sizes[-1]), float(sizes[-2])
        tab = _rebuilt(frames, "collectives", fam[fam["group_size"] < n], peak).collectives.get(
            (str(coll), str(lay), bool(inter)))
        hid = fam[fam["group_size"] == n].groupby("size_bytes")["t_s"].median()
        if tab is None or hid.empty:
            continue
        s = hid.index.to_numpy(float)
        if inter and coll == "all_to_all":
            m = min(float(gpus_per_node), n_ref)
            s_ref = s * ((n - min(gpus_per_node, n)) / n) / ((n_ref - m) / n_ref)
        else:
            s_ref = s * bus_factor(str(coll), n) / bus_factor(str(coll), n_ref)
        pred.extend(tab.composed(np.full(len(s), n_ref), s_ref).tolist())
        meas.extend(hid.to_numpy(float).tolist())
        ratio.append(n / n_ref)
    return _summary("collectives", "group_size", max(ratio, default=float("nan")), pred, meas)


# Each rule at its present cut and one twice as deep: above the range twice the octaves hidden
# (2048 -> 1024 of 4096 tokens per expert, m 32768 -> 4096 of 262144, a quarter -> a sixteenth of the
# largest message), below it twice the cut (one octave more hidden).
DEPTHS = (
    ("grouped", dict(cut=2048), dict(cut=1024)),
    ("grouped", dict(cut=64, axis="num_gemms"), dict(cut=32, axis="num_gemms")),
    ("gemm", dict(cut=32768), dict(cut=4096)),
    ("sdpa", dict(cut=8192), dict(cut=4096)),
    ("collectives", dict(frac=0.25), dict(frac=1 / 16)),
    ("grouped", dict(cut=8, axis="num_gemms", below=True), dict(cut=16, axis="num_gemms", below=True)),
    ("grouped", dict(cut=512, below=True), dict(cut=1024, below=True)),
    ("gemm", dict(cut=1024, below=True), dict(cut=2048, below=True)),
    ("sdpa", dict(cut=4096, below=True), dict(cut=8192, below=True)),
)


def depth_holdouts(frames: dict[str, pd.DataFrame], peak: float) -> list[tuple[Holdout, Holdout]]:
    """(present cut, twice as deep) hold-out of every rule in DEPTHS."""
    fn = {"grouped": grouped, "gemm": gemm, "sdpa": sdpa, "collectives": collectives}
    return [(fn[k](frames, peak, **a), fn[k](frames, peak, **b)) for k, a, b in DEPTHS]


def rule_errors(frames: dict[str, pd.DataFrame], peak: float) -> dict[str, float]:
    """Each table kind's composition error as measured on hidden points: the largest MAPE (a fraction
    of the time) over its rules' hold-outs at both depths, table kind -> error (grouped_gemm, gemm,
    sdpa, collectives). What a composed lookup of that kind is uncertain by, e.g. for ``search
    --samples`` (a log-normal sigma of about this size on the composed share of a plan's time). A kind
    without rows, or without points beyond its cuts, is absent."""
    out: dict[str, float] = {}
    for pair in depth_holdouts_present(frames, peak):
        for h in pair:
            if h.n:
                out[h.table] = max(out.get(h.table, 0.0), h.mape)
    return out


def measured_errors(frames: dict[str, pd.DataFrame], peak: float) -> dict:
    """What the rules' hold-outs measure on ``frames``: ``{"composed": {table kind: MAPE}, "group_extrapolation":
    MAPE or None}`` (fractions; :func:`rule_errors`, :func:`group_sizes`). A kind without a hold-out (no rows,
    or none beyond a cut) is absent and no group extrapolation measured is None: the caller's fallback decides."""
    g = group_sizes(frames, peak) if _has_rows(frames, "collectives") else None
    return {"composed": rule_errors(frames, peak), "group_extrapolation": g.mape if g is not None and g.n else None}


def _has_rows(frames, suite: str) -> bool:
    df = frames.get(suite)
    return df is not None and not df.empty


_SUITE = {"grouped": "grouped_gemm", "gemm": "gemm", "sdpa": "sdpa", "collectives": "collectives"}


def depth_holdouts_present(frames: dict[str, pd.DataFrame], peak: float) -> list[tuple[Holdout, Holdout]]:
    """:func:`depth_holdouts` of the rules whose table has rows in ``frames`` (an empty suite has no columns
    to cut)."""
    fn = {"grouped": grouped, "gemm": gemm, "sdpa": sdpa, "collectives": collectives}
    return [(fn[k](frames, peak, **a), fn[k](frames, peak, **b)) for k, a, b in DEPTHS if _has_rows(frames, _SUITE[k])]


@functools.lru_cache(maxsize=8)
def cached_errors(url: str, profile: str, peak: float) -> dict:
    """:func:`measured_errors` of the tables of (resolved url, profile), about 15 s to measure: once per
    content of the measurement rows (a copy of a database, or one whose other tables changed, reuses it),
    stored beside the compiled tables ($SCALEPLAN_CACHE, :func:`scaleplan.db.state_cache.stored`), and once
    per process. An SQLite database's state (:func:`scaleplan.db.state_cache.cached_read`) keys a second
    copy, read first: a planner command on an unchanged database neither reads the rows nor hashes them
    (~0.35 s before its plan search)."""
    from scaleplan.db.measurements import load_frames
    from scaleplan.db.state_cache import cached_read

    return cached_read("errors-by-state", url, (profile, peak), (*TABLE_MODULES, __name__),
                       lambda: _errors_by_content(load_frames(url, profile), profile, peak),
                       valid=lambda v: isinstance(v, dict))


def _errors_by_content(frames, profile: str, peak: float) -> dict:
    """:func:`measured_errors` of ``frames``, cached per content of the rows (:func:`cached_errors`)."""
    from scaleplan.db.state_cache import cache_file, stored

    digest = hashlib.sha256(repr((profile, peak)).encode())
    for name in sorted(frames):
        digest.update(name.encode() + pd.util.hash_pandas_object(frames[name], index=False).to_numpy().tobytes())
    path = cache_file("rule-errors", "pkl", digest.digest(), (*TABLE_MODULES, __name__))
    return stored(path, lambda: measured_errors(frames, peak), valid=lambda v: isinstance(v, dict))
