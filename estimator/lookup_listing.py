"""The table points an evaluation looks up, recorded while the time model runs (what ``bench plan``
measures and ``bench plan --search`` lists), keyed by measurement-table column names.

:class:`RecordingTables` stands in for the tables of one geometry: every table the model asks for is
present, so the model takes its table path for every component (a profile without a GEMM table
still lists the GEMMs it would read), and every lookup adds its key to :attr:`RecordingTables.points`.
The times it answers are placeholders (1 us, labelled measured): the evaluation run on it is for its
keys only. Because the keys come from the model's own lookups, the list cannot drift from them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike
from scaleplan.estimator.model_dims import Geometry
from scaleplan.estimator.tables import MEASURED, LookupResult, Tables

if TYPE_CHECKING:
    from scaleplan.estimator.layout import ParallelLayout
    from scaleplan.estimator.model import TimeModel
    from scaleplan.stack import Stack

_T = 1e-6  # the placeholder time of every recorded lookup (seconds)


def _ints(*cols) -> list[tuple]:
    """The distinct rows of equal-length columns, rounded to integers (measurement keys)."""
    arr = np.broadcast_arrays(*(np.atleast_1d(np.asarray(c, dtype=float)) for c in cols))
    rows = np.rint(np.stack([a.ravel() for a in arr], axis=1)).astype(np.int64)
    return [tuple(int(x) for x in r) for r in np.unique(rows, axis=0)]


def _result(name: str, axes: tuple, n: tuple) -> LookupResult:
    """A placeholder lookup of shape ``n``: 1 us, measured, in range."""
    return LookupResult(name, axes, np.full(n, _T), np.full(n, MEASURED, dtype=np.int8), np.full(n, -1, np.int16),
                        np.zeros(n), np.zeros(n), np.full(n, np.inf), None)


class _Grid:
    """A recording grid table: ``lookup(*axes)`` adds the key rows ``rows(*ints)`` to ``suite``."""

    holds_casts = False  # as GridTable's; FP8 casts look nothing up

    def __init__(self, owner: RecordingTables, suite: str, rows):
        self.owner, self.suite, self.rows = owner, suite, rows

    def lookup(self, *args) -> LookupResult:
        for key in _ints(*args):
            for row in self.rows(*key):
                self.owner.add(self.suite, row)
        return _result(self.suite, tuple(f"a{i}" for i in range(len(args))), np.broadcast(*args).shape)


class _Collective:
    """A recording collective table: the request was recorded by :meth:`RecordingTables.collective`;
    the group axis spans every size, so no invariance maps the group."""

    name = "collectives"
    groups = np.array([1.0, 2.0 ** 40])

    def time(self, group, size):
        n = np.broadcast(group, size).shape
        return np.full(n, _T), np.zeros(n), np.full(n, np.inf), np.ones(n, dtype=bool)

    def composed(self, group, size):
        return np.full(np.broadcast(group, size).shape, _T)


class _Keyed(dict):
    """A dict of recording tables made on first access (every key is present)."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def get(self, key, default=None):
        return self[key]

    def __missing__(self, key):
        self[key] = self.make(key)
        return self[key]

    def __contains__(self, key) -> bool:
        return True

    def __bool__(self) -> bool:
        return True


class RecordingTables:
    """The tables of one geometry ``g`` as the time model reads them (:meth:`Tables.view` of its
    precision), recording every key looked up in :attr:`points` (suite -> list of key dicts, each
    once, in the order first looked up). Attributes the model reads but does not look up (the
    dispatch table's t_kernel_min_s, ...) are the wrapped tables'."""

    def __init__(self, tables: Tables, g: Geometry):
        self._tb, self._g = tables.view(g.precision), g
        self.points: dict[str, list[dict]] = {}
        self._seen: set = set()
        dt = g.precision
        self.gemm = _Grid(self, "gemm", lambda m, n, k: [{"m": m, "n": n, "k": k, "dtype": dt}])
        self.grouped = _Keyed(self._grouped)
        self.sdpa_by_dtype = _Keyed(lambda d: {"fwd": self._sdpa(d), "bwd": self._sdpa(d)})
        topk = _Grid(self, "router", lambda t, e, k: [{"variant": "topk", "num_tokens": t, "num_experts": e, "k": k,
                                                      "hidden": 0, "dtype": "fp32"}])
        self.topk = {"fwd": topk, "bwd": topk}
        self.permute = _Keyed(lambda key: _Grid(self, "router", lambda t, e, k, h: [
            {"variant": key[0], "num_tokens": t, "num_experts": e, "k": k, "hidden": h, "dtype": key[2]}]))
        self.vocab, self.vocab_size = _Keyed(lambda key: None), 1
        self.elementwise = _Keyed(lambda key: _Grid(self, "elementwise", lambda t, h: [
            {"op": key[0], "tokens": t, "hidden": h, "dtype": dt}]))
        self.collectives = _Keyed(lambda key: _Collective())

    def __getattr__(self, name):
        return getattr(self._tb, name)

    def view(self, precision: str, lane_ratio: float = 1.0) -> RecordingTables:
        return self

    def with_sdpa_backend(self, backend: str | None) -> RecordingTables:
        return self  # the keys looked up are the same whichever backend's rows answer them

    def add(self, suite: str, row: dict) -> None:
        """Record one key of ``suite`` (once)."""
        key = (suite, tuple(row.items()))
        if key not in self._seen:
            self._seen.add(key)
            self.points.setdefault(suite, []).append(row)

    def _grouped(self, key) -> _Grid:
        _, hidden, ffn = key
        return _Grid(self, "grouped_gemm", lambda e, t: [
            {"proj": proj, "distribution": "balanced", "num_gemms": e, "tokens_per_expert": max(t, 1),
             "hidden": int(hidden), "ffn": int(ffn), "dtype": self._g.precision} for proj in ("fc1", "fc2")])

    def _sdpa(self, dtype: str) -> _Grid:
        g = self._g
        # the table is keyed by query heads; the bench runs the model's KV heads per TP rank with them
        return _Grid(self, "sdpa", lambda s, b, h, d: [
            {"seq_len": s, "micro_bs": b, "n_q_heads": h, "n_kv_heads": max(round(g.nkv * h / g.nq), 1),
             "head_dim": d, "causal": True, "dtype": dtype}])

    def collective(self, coll: str, layout: str, inter: bool, group: ArrayLike,
                   size: ArrayLike) -> _Collective:
        """Record the request (``group`` ranks, ``size`` bytes per rank; arrays over the plans that
        ask) of :meth:`Tables.collective`. Collectives are keyed in bytes; they are measured in the dtype
        on the wire: fp32 for an fp32 model (a CPU model: its bench asks for no bf16 point), else bf16
        (Megatron exchanges bf16 activations and gradients, also for fp8 GEMMs)."""
        wire = "fp32" if self._g.precision == "fp32" else "bf16"
        for n, s in _ints(group, size):
            self.add("collectives", {"collective": coll, "group_size": n, "layout": layout,
                                     "inter_node": bool(inter), "size_bytes": s, "dtype": wire})
        return self.collectives.get((coll, layout, inter))

    def vocab_lookup(self, op: str, dirn: str, tokens: ArrayLike, vocab: ArrayLike,
                     hidden: int) -> LookupResult:
        """Record the LM head / cross-entropy point (:meth:`Tables.vocab_lookup`)."""
        for t, v in _ints(tokens, vocab):
            self.add("vocab", {"op": op, "tokens": t, "hidden": int(hidden), "vocab": v,
                               "dtype": self._g.precision if op == "lm_head_gemm" else "fp32"})
        return _result("vocab", ("tokens", "hidden"), np.broadcast(tokens, vocab).shape)

    def host_time(self, part: str, ckpt: str, dtype: str, tokens: ArrayLike, hidden: int,
                  experts: int) -> np.ndarray:
        """Record the host-dispatch row of a model part (:meth:`Tables.host_time`)."""
        mode = f"ops:{part}:{ckpt}" if ckpt else f"ops:{part}"
        for (m,) in _ints(tokens):
            self.add("dispatch", {"mode": mode, "m": m, "n": int(hidden), "k": int(experts), "dtype": dtype,
                                  "chain_len": 1})
        return np.full(np.shape(tokens), _T)


# the launch-bound GEMM chain of the dispatch gap t_gap (bench/suites/dispatch.py): m = 8 rows through
# n = k = 2048 weights, 512 kernels, as the recorded GPU rows; narrower and in the model's own dtype
# where the model is (a bf16 chain at 2048 on a CPU without bf16 units takes minutes per repetition)
CHAIN_M, CHAIN_MAX_WIDTH, CHAIN_LEN = 8, 2048, 512
CHAIN_DTYPES = ("fp32", "bf16", "fp16")  # dtypes a plain matmul chain runs in (fp8/fp4 need scaled GEMMs)


def chain_point(g: Geometry) -> dict:
    """The dispatch-gap chain point of a model: width min(d, 2048), the model's precision (bf16 where a
    plain matmul cannot run it)."""
    width = int(min(g.d, CHAIN_MAX_WIDTH))
    dtype = g.precision if g.precision in CHAIN_DTYPES else "bf16"
    return {"mode": "gemm", "m": CHAIN_M, "n": width, "k": width, "dtype": dtype, "chain_len": CHAIN_LEN}


def recorded_lookups(model: TimeModel, tables: Tables, g: Geometry, lay: ParallelLayout, gbs: int,
                     seqlen: int, optimizer: str, stack: Stack | None = None) -> dict[str, list[dict]]:
    """The table points (suite -> key dicts, keyed by measurement-table column names) that ``model`` (a
    :class:`~scaleplan.estimator.model.TimeModel`) looks up evaluating the plans ``lay`` of geometry
    ``g`` on ``tables``, and the dispatch chain its law's t_gap is read from (at construction, not per
    plan). The reference model's host rows ``ops:*`` appear wherever the model reads them. ``stack``: the
    training stack the plans run on (default the paper's)."""
    rt = RecordingTables(tables, g)
    model.evaluate(g, lay, gbs, seqlen, optimizer, tables=rt, **({"stack": stack} if stack is not None else {}))
    rt.add("dispatch", chain_point(g))
    return rt.points
