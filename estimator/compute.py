"""Kernel times of one layer and micro-batch from the measured tables (GEMM, grouped GEMM, SDPA,
router, element-wise, vocabulary) and the reference model's measured host time; seconds. Each function
takes the evaluation's :class:`~scaleplan.estimator.context.EvalContext` (the tables it reads, the
profile, the record its lookups go to, the plans' shapes); arrays over its plans."""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from scaleplan.estimator import analytic as an
from scaleplan.estimator import fp8_costs as fp8c
from scaleplan.estimator.ckpt import CkptMode
from scaleplan.estimator.context import EvalContext
from scaleplan.estimator.shapes import StageCounts
from scaleplan.estimator.tables import ANALYTIC, COMPOSED, INTERPOLATED, MEASURED, LookupResult


def gemm_times(ctx: EvalContext, comp: str, m: ArrayLike, n: ArrayLike, k: ArrayLike,
               active: ArrayLike = True) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of the GEMM [m, k] x [k, n] for component ``comp`` (arrays over plans),
    backward = dgrad (m,k,n) + wgrad (k,n,m); 0 where not ``active``. The GEMM table, else the roofline."""
    tb, rec, peak, hbm = ctx.tables, ctx.rec, ctx.peak, ctx.hbm
    if tb.gemm is None:
        rec.mark(comp, ANALYTIC)
        cast_f, cast_b = fp8_cast_times(ctx, comp, m, n, k, active)
        f = an.gemm_time(m, n, k, peak, hbm)
        b = an.gemm_time(m, k, n, peak, hbm) + an.gemm_time(k, n, m, peak, hbm)
        return np.where(active, f, 0.0) + cast_f, np.where(active, b, 0.0) + cast_b
    if not np.any(active):  # nothing runs (no dense block): no lookup, as a lookup masked everywhere
        rec.mark(comp, 0)
        return np.zeros(rec.P), np.zeros(rec.P)
    cast_f, cast_b = fp8_cast_times(ctx, comp, m, n, k, active)
    f = rec.use(comp, tb.gemm.lookup(m, n, k), active)
    b = rec.use(comp, tb.gemm.lookup(m, k, n), active) + rec.use(comp, tb.gemm.lookup(k, n, m), active)
    return f + cast_f, b + cast_b


# the GEMMs whose inputs Transformer Engine casts to FP8 in an FP8 model: every TE Linear / GroupedLinear of the
# blocks (the router's gating GEMM runs in fp32, the output layer and MTP's projection in bf16)
FP8_CAST_COMPONENTS = ("attn_proj", "dense_mlp", "shared_expert", "experts")


def fp8_cast_times(ctx: EvalContext, comp: str, m: ArrayLike, n: ArrayLike, k: ArrayLike,
                   active: ArrayLike = True) -> tuple[np.ndarray | float, np.ndarray | float]:
    """(forward, backward) device seconds of the quantize kernels of the FP8 GEMM [m, k] x [k, n] of ``comp``
    where the GEMM table's times hold none (``GridTable.holds_casts``: the own H100 / H200 rows, the lane-scaled
    bf16 table, the roofline): forward the input [m, k], backward the output gradient [m, n], each cast writing
    the row- and the column-wise copy the other GEMMs read (fp8_costs.cast_time: bytes at HBM bandwidth, at
    least its kernels' shortest time). Weights are cast once per step (TE caches them) and left out. (0, 0) for
    a model not in FP8, a GEMM TE does not cast, or a table that holds its casts."""
    recipe, tab = ctx.recipe, ctx.tables.gemm
    if recipe is None or comp not in FP8_CAST_COMPONENTS or (tab is not None and tab.holds_casts):
        return 0.0, 0.0
    t_min = ctx.tables.t_kernel_min_s or an.KERNEL_FLOOR_S
    ctx.rec.note(f"{comp} in fp8: its inputs' {recipe} casts at HBM bandwidth (not in the GEMM rows)", active)
    f = fp8c.cast_time(m, k, recipe, ctx.hbm, t_min)
    b = fp8c.cast_time(m, n, recipe, ctx.hbm, t_min)
    return np.where(active, f, 0.0), np.where(active, b, 0.0)


def expert_times(ctx: EvalContext) -> tuple[np.ndarray, np.ndarray]:
    """Routed-expert GEMMs (fc1 + fc2) of one MoE layer per micro-batch: (fwd, bwd) seconds, keyed by the
    shapes' local experts ``E_loc`` and rows per expert ``tile``.

    Per expert shape (d, d_expert / ETP), in order of preference:

    1. the grouped-GEMM table of that exact shape, keyed (num_gemms = E_loc, tokens_per_expert = tile);
    2. the shape is not in the grouped table but the profile has a dense GEMM table: the expert MLP
       as a loop over the E_loc local experts of measured dense GEMMs, fc1 [tile, d] x [d, w1 f]
       and fc2 [tile, f] x [f, d] (w1 = 2 with GLU), backward = dgrad + wgrad of each (as
       :func:`gemm_times`). This is one of the implementations the grouped bench measures ("loop"; the
       recorded B200 rows are TE GroupedLinear, itself a sequence of cuBLAS GEMMs), so it is
       physically grounded at every shape the dense grid covers; lookups are range-checked like
       any GEMM (``out_of_range:gemm.<axis>``) and, where the profile has a grouped table at all,
       against the grouped kernel's measured (num_gemms, tokens_per_expert) envelope
       (``out_of_range:grouped_gemm.<axis>``): the loop stands in for the grouped kernel, whose
       behaviour outside that envelope (per-group host cost, stream overlap) the profile has no
       evidence of, and an unmeasured shape must not get a wider envelope than a measured one
       (else measuring a shape would remove plans). Labelled "interpolated" with a note.
       Not chosen: interpolating between measured grouped shapes in log (hidden, ffn). The recorded
       shapes are 7 scattered points, not a grid, and most ladder shapes (d = 512 q > 6144 for
       q >= 14, d_expert > 3840 for G <= 2) lie outside their hull, so it would cover few shapes
       and blend kernels tuned for other shapes; the dense grid holds the exact shape. At the
       measured shapes the loop agrees with the grouped rows within ~1.5x in the compute-bound
       regime (tests/estimator/test_compute.py);
    3. neither table: the analytic roofline (labelled "analytic").
    """
    tb, rec, g, P = ctx.tables, ctx.rec, ctx.g, ctx.P
    E_loc, tile = ctx.shapes.E_loc, ctx.shapes.tile
    ex_f, ex_b = np.zeros(P), np.zeros(P)
    # one grouped table per expert shape (d, d_expert / ETP); d and d_expert are per plan in a GeometryBatch
    shape_d = np.broadcast_to(np.asarray(g.d, dtype=np.int64), (P,))
    shape_f = np.broadcast_to(np.rint(np.asarray(ctx.shapes.ffn_loc, dtype=float)).astype(np.int64), (P,))
    other = np.ones(P, dtype=bool)  # plans whose shape has no grouped table
    for d, f_loc in sorted(set(zip(shape_d.tolist(), shape_f.tolist()))):
        tabf, tabb = tb.grouped.get(("fwd", d, f_loc)), tb.grouped.get(("bwd", d, f_loc))
        if tabf is not None and tabb is not None:
            sel = (shape_d == d) & (shape_f == f_loc)
            # the other shapes' plans ask this table nothing: their keys are one of this shape's
            e_s, t_s = (_only(x, sel, P) for x in (E_loc, tile))
            f, b = rec.use("experts", tabf.lookup(e_s, t_s), sel), rec.use("experts", tabb.lookup(e_s, t_s), sel)
            if _fp8_from_bf16_grouped(ctx):
                f, b = _fp8_grouped(ctx, f, b, t_s, d, f_loc, sel)
            ex_f, ex_b = ex_f + f, ex_b + b
            other &= ~sel
    if other.any():
        f, b = _untabled_expert_times(ctx, shape_d, shape_f, other)
        ex_f, ex_b = ex_f + f, ex_b + b
    return ex_f, ex_b


def _fp8_from_bf16_grouped(ctx: EvalContext) -> bool:
    """An FP8 model whose grouped tables are the bf16 ones (no FP8 grouped rows measured) while both dense
    GEMM tables exist: its grouped times are composed (:func:`_fp8_grouped`)."""
    by = ctx.tables.by_dtype
    return (ctx.g.precision == "fp8" and not by.get("fp8", {}).get("grouped")
            and by.get("fp8", {}).get("gemm") is not None and by.get("bf16", {}).get("gemm") is not None)


def _fp8_grouped(ctx: EvalContext, f, b, tile, d: int, f_loc: int, sel: np.ndarray):
    """FP8 grouped expert GEMMs of the plans in ``sel``: the bf16 grouped times ``f``, ``b`` scaled by the
    dense tables' FP8 / bf16 device-time ratio of the same expert GEMMs (host floors off; estimator/fp8_costs.py),
    labelled composed; plus the casts of all local experts' rows at once where the FP8 rows hold none
    (:func:`fp8_cast_times` of fc1 and fc2 on the rank's routed rows R = E_loc tile)."""
    by, rec = ctx.tables.by_dtype, ctx.rec
    fwd, bwd = fp8c.expert_gemm_shapes(tile, float(d), float(f_loc), bool(ctx.g.glu))
    r_f, looked_f = fp8c.device_ratio(by["fp8"]["gemm"], by["bf16"]["gemm"], fwd)
    r_b, looked_b = fp8c.device_ratio(by["fp8"]["gemm"], by["bf16"]["gemm"], bwd)
    for res in looked_f + looked_b:  # their range checks: an FP8 lookup outside the table is out of range too
        rec.use("experts", res, sel)
    rec.mark("experts", np.where(sel, fp8c.SOURCE, 0))
    rec.note("experts in fp8: the bf16 grouped table x the dense FP8 / bf16 device-time ratio (composed)", sel)
    f, b = fp8c.composed_grouped(f, b, np.where(sel, r_f, 1.0), np.where(sel, r_b, 1.0))
    for m, n, k in fp8c.expert_gemm_shapes(ctx.shapes.R, float(d), float(f_loc), bool(ctx.g.glu))[0]:
        cast_f, cast_b = fp8_cast_times(ctx, "experts", m, n, k, sel)
        f, b = f + cast_f, b + cast_b
    return f, b


def _untabled_expert_times(ctx: EvalContext, shape_d: np.ndarray, shape_f: np.ndarray,
                           sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The routed experts of the plans in ``sel``, whose shape (``shape_d`` x ``shape_f``, per plan) the
    grouped table lacks (:func:`expert_times` 2 and 3): the dense-GEMM loop for all of them in one lookup
    per GEMM (the shape is a coordinate of the dense table), else the analytic roofline."""
    tb, rec, g = ctx.tables, ctx.rec, ctx.g
    E_loc, tile = ctx.shapes.E_loc, ctx.shapes.tile
    w1 = 2 if g.glu else 1
    if tb.gemm is not None:
        _grouped_envelope(ctx, sel)
        P = rec.P  # the plans outside ``sel`` ask the dense table nothing: their keys are a selected plan's
        t_s, d_s, f_s = (_only(x, sel, P) for x in (tile, shape_d, shape_f))
        f1, b1 = gemm_times(ctx, "experts", t_s, w1 * f_s, d_s, sel)
        f2, b2 = gemm_times(ctx, "experts", t_s, d_s, f_s, sel)
        rec.mark("experts", np.where(sel, INTERPOLATED, 0))
        for d, f_loc in sorted(set(zip(shape_d[sel].tolist(), shape_f[sel].tolist()))):
            rec.note(f"experts from dense GEMM table (shape {d}x{f_loc} not in grouped table)",
                     sel & (shape_d == d) & (shape_f == f_loc))
        return E_loc * (f1 + f2), E_loc * (b1 + b2)
    rec.mark("experts", np.where(sel, ANALYTIC, 0))
    fa = an.grouped_gemm_time(E_loc, tile, shape_d, shape_f, ctx.peak, ctx.hbm, g.glu)
    return np.where(sel, fa, 0.0), np.where(sel, 2 * fa, 0.0)


def _only(x, sel: np.ndarray, P: int) -> np.ndarray:
    """``x`` (shape (P,)) where ``sel``, elsewhere its first selected value: the keys a lookup for the
    plans in ``sel`` asks (the other plans' results are masked out)."""
    x = np.broadcast_to(np.asarray(x, dtype=float), (P,))
    return np.where(sel, x, x[np.argmax(sel)])


def sdpa_times(ctx: EvalContext) -> tuple[np.ndarray, np.ndarray]:
    """Causal SDPA of one layer and micro-batch on a rank's query heads (``q_loc``, the whole sequence:
    the caller divides by CP): (fwd, bwd) seconds, in the spec's ``sdpa_precision``.

    The SDPA table of that dtype where the profile measured one. Otherwise the table of the
    16-bit rows scaled to the dtype's attention rate (:func:`analytic.sdpa_lane_ratio`): fp32/tf32
    runs ~6x slower on a B200 (the flash and cuDNN kernels take 16-bit inputs only; PyTorch runs
    fp32 in its memory-efficient kernel, 3xTF32 on tensor cores), fp16 at the bf16 rate, fp8/fp4
    keep the bf16 time (an upper bound: no measured low-precision attention). Such a lookup is
    labelled analytic with a note. Without any SDPA table: the roofline at that rate.
    """
    tb, prof, rec, g, hbm = ctx.tables, ctx.profile, ctx.rec, ctx.g, ctx.hbm
    seqlen, mbs, heads = ctx.seqlen, ctx.lay.mbs.astype(float), ctx.shapes.q_loc
    prec = g.sdpa_precision
    tabs, ratio = tb.sdpa_by_dtype.get(prec), 1.0
    if tabs is None:
        base = next((d for d in ("bf16", "fp16") if d in tb.sdpa_by_dtype), None)
        if base is None:
            rec.mark("sdpa", ANALYTIC)
            f = an.sdpa_fwd_time(seqlen, mbs, heads, g.v_dim, an.sdpa_peak(prof, prec), hbm) * _sdpa_variants(ctx)
            return f, an.SDPA_BWD_OVER_FWD * f
        tabs, ratio = tb.sdpa_by_dtype[base], an.sdpa_lane_ratio(prof, prec)
        rec.mark("sdpa", ANALYTIC)
        rec.note(f"sdpa in {prec}: the {base} SDPA table x {ratio:.3g} (no measured {prec} rows)")
    f = rec.use("sdpa", tabs["fwd"].lookup(seqlen, mbs, heads, g.v_dim))
    b = rec.use("sdpa", tabs["bwd"].lookup(seqlen, mbs, heads, g.v_dim))
    return ratio * f * _sdpa_variants(ctx), ratio * b * _sdpa_variants(ctx)


# FlashAttention-2/3 and cuDNN's fused attention work on 128 x 128 tiles of (queries, keys)
SDPA_TILE = 128


def window_fraction(seqlen: ArrayLike, window: ArrayLike, tile: int = SDPA_TILE) -> np.ndarray:
    """The share of causal attention's work a sliding window of ``window`` tokens keeps on a sequence of
    ``seqlen`` tokens, counted in the kernel's tiles: causal attention runs n (n + 1) / 2 of the n x n
    (query, key) tiles (n = seqlen / tile); a query tile whose queries see their own token and the
    ``window`` before it touches at most ceil(window / tile) + 1 key tiles (the diagonal one and those the
    window reaches). Arrays broadcast; 1 where the window covers the sequence."""
    n = np.ceil(np.asarray(seqlen, dtype=float) / tile)
    k = np.ceil(np.asarray(window, dtype=float) / tile) + 1.0  # key tiles one query tile touches
    causal = n * (n + 1.0) / 2.0
    kept = np.where(n <= k, causal, k * (k + 1.0) / 2.0 + (n - k) * k)  # the first k tiles ramp up
    return np.where(np.asarray(window) > 0, kept / causal, 1.0)


def _sdpa_variants(ctx: EvalContext):
    """The SDPA table's causal full attention of head_dim-wide heads, composed for (labelled, noted):

    * heads whose queries/keys and values differ in width (MLA: q/k ``head_dim``, values ``v_dim``):
      the table at the value width times (head_dim + v_dim) / (2 v_dim): QK^T takes head_dim and PV
      v_dim multiply-adds per (query, key) pair, the same FLOPs as symmetric heads of the mean width;
    * sliding-window attention on a share of the blocks: those blocks' time times
      :func:`window_fraction` (the tiles a window touches, out of the causal ones), averaged over blocks.
    """
    g, rec = ctx.g, ctx.rec
    hd, hv = np.asarray(g.hd, dtype=float), np.asarray(g.v_dim, dtype=float)
    scale = (hd + hv) / (2.0 * hv)
    wide = scale != 1.0
    if np.any(wide):
        rec.mark("sdpa", np.where(wide, COMPOSED, 0))
        rec.note(f"sdpa: q/k heads {int(np.max(hd))} wide, values {int(np.max(hv))}: the {int(np.max(hv))}-wide "
                 "SDPA table x (q/k width + v width) / (2 v width), the FLOPs of QK^T and PV", wide)
    share = np.asarray(g.window_share, dtype=float)
    slide = share > 0
    if np.any(slide):
        frac = window_fraction(ctx.seqlen, g.window)
        scale = scale * (1.0 - share + share * frac)
        rec.mark("sdpa", np.where(slide, COMPOSED, 0))
        rec.note(f"sdpa: sliding window of {int(np.max(g.window))} tokens on {100 * float(np.max(share)):.0f}% of "
                 f"the blocks: the causal SDPA table x the {SDPA_TILE} x {SDPA_TILE} tiles the window touches "
                 "out of the causal ones (compute.window_fraction)", slide)
    return scale


def _grouped_envelope(ctx: EvalContext, sel: np.ndarray) -> None:
    """Range-check (num_gemms, tokens_per_expert) of the dense-loop fallback against the envelope
    the grouped tables measure (union over shapes); records out_of_range:grouped_gemm.<axis>."""
    tb, rec, E_loc, tile = ctx.tables, ctx.rec, ctx.shapes.E_loc, ctx.shapes.tile
    if not tb.grouped:
        return
    tabs = list(tb.grouped.values())
    lo = np.min([t.lo for t in tabs], axis=0)
    hi = np.max([t.hi for t in tabs], axis=0)
    P = rec.P
    cs = [np.broadcast_to(np.asarray(E_loc, dtype=float), (P,)), np.broadcast_to(np.asarray(tile, dtype=float), (P,))]
    ax = np.full(P, -1, dtype=np.int16)
    val, l, h = np.zeros(P), np.full(P, np.nan), np.full(P, np.nan)
    for i, c in enumerate(cs):
        bad = ((c < lo[i] * (1 - 1e-9)) | (c > hi[i] * (1 + 1e-9))) & (ax < 0)
        ax[bad], val[bad], l[bad], h[bad] = i, c[bad], lo[i], hi[i]
    res = LookupResult("grouped_gemm", ("num_gemms", "tokens_per_expert"), np.zeros(P),
                       np.full(P, INTERPOLATED, dtype=np.int8), ax, val, l, h)
    rec.use("experts", res, sel)


def permute_times(ctx: EvalContext) -> tuple[np.ndarray, np.ndarray]:
    """Token permute + unpermute of one MoE layer and micro-batch: (forward, backward) seconds, arrays (P,).

    Measured where the tables have them (router suite variants ``permute``: sort of the [T, K] expert ids
    and gather of [T, d] into [T K, d]; ``unpermute``: gate scaling and index-add of [T K, d] back into
    [T, d]; bench/suites/router.py), looked up at (T_sp, E, K, d) in the activations' dtype, on the plans
    where every one of the four lookups is inside the measured range. Elsewhere, and on a serial-dispatch
    profile (whose measured host rows ``ops:*`` already hold these ops' compute), the bytes of T_sp tokens
    and R routed rows read and written at HBM bandwidth ``hbm`` (B/s), the same each way: a lookup outside
    the range falls back to that analytic form, it is not extrapolated (sec:microbenchmarks: the
    permutation kernels are memory-bound, and scattered index kernels run far below bandwidth, e.g. the
    H100's index-add at 11% of HBM in cluster_profiles/observed/h100-single-trace-ops.csv). The rows time
    unfused torch index ops, which is what both stacks run: the reference model, and Megatron-Core with
    its default ``moe_permute_fusion = False`` (TransformerConfig), which scaleplan's emitted arguments
    keep (no ``--moe-permute-fusion``)."""
    tb, rec, g, sh = ctx.tables, ctx.rec, ctx.g, ctx.shapes
    Tsp = sh.Tsp
    t_an = an.memory_time(sh.b_el * (Tsp + sh.R) * g.d * 2 * 2, ctx.hbm)
    keys = [(v, dirn, g.precision) for v in ("permute", "unpermute") for dirn in ("fwd", "bwd")]
    if ctx.serial or not all(k in tb.permute for k in keys):
        rec.mark("permute", ANALYTIC)
        return t_an, t_an
    res = [tb.permute[k].lookup(Tsp, g.E, g.K, g.d) for k in keys]
    ok = np.all([r.oor_axis < 0 for r in res], axis=0)
    rec.mark("permute", np.where(ok, np.max([r.code for r in res], axis=0), ANALYTIC))
    pf, pb, uf, ub = (r.t for r in res)
    return np.where(ok, pf + uf, t_an), np.where(ok, pb + ub, t_an)


def measured_host_times(ctx: EvalContext, stage: StageCounts, t_law: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Measured host seconds of the reference model's ops: (per micro-batch and stage, per step),
    arrays (P,) (sec:iteration-time-model, "Compute versus dispatch", kappa measured).

    Per micro-batch: n_moe_stage t_moe(ckpt) + n_dense_stage t_dense(ckpt) + t_microbatch(ckpt),
    the measured host time of the reference model's ops (dispatch rows ``ops:*``: op count kappa
    x seconds per op, bench/suites/model_ops.py); per step the optimizer's ops (step_moe,
    step_dense, step). A checkpoint mode without rows keeps the kernel-count law ``t_law``
    (labelled analytic), as does every plan when the profile has no such rows. ``stage``: the blocks of
    the stage costed. Used on a serial-dispatch (CPU) profile, where
    the caller adds it to the compute, and for the reference stack on a GPU, where it enters
    the max with the GPU time (:func:`scaleplan.estimator.pipeline.stage_periods`).
    """
    tb, rec, g, P = ctx.tables, ctx.rec, ctx.g, ctx.P
    ckc, T = ctx.lay.ckpt, ctx.shapes.T
    prec = g.precision
    E = int(g.E) if g.is_moe else 1
    n_moe, n_den = stage.n_moe * np.ones(P), stage.n_dense * np.ones(P)
    t_mb = np.array(t_law, dtype=float, copy=True).reshape(-1) * np.ones(P)
    src = np.full(P, ANALYTIC, dtype=np.int8)

    def part(name, ck):
        return tb.host_time(name, ck, prec, T, g.d, E)

    for mode in CkptMode:
        sel, ck = ckc == mode, mode.spec_name
        if not sel.any():
            continue
        den, mb, mo = part("dense", ck), part("microbatch", ck), part("moe", ck) if g.is_moe else 0.0
        if den is None or mb is None or mo is None:
            continue
        t_mb = np.where(sel, n_den * den + mb + n_moe * mo, t_mb)
        src[sel] = MEASURED
    rec.mark("dispatch_floor", src)
    # per step: the optimizer's ops; a part without a row issues none (the bench stores a part
    # that counts 0 ops, e.g. the per-layer master copies of an fp32 model, as UNSUPPORTED)
    st = {k: (v if v is not None else 0.0) for k in ("step_dense", "step") + (("step_moe",) if np.any(g.n_moe) else ())
          for v in [part(k, "")]}
    st.setdefault("step_moe", 0.0)
    step = ((g.L - g.n_moe) * st["step_dense"] + st["step"] + g.n_moe * st["step_moe"]) * stage.n_layers / g.L
    return t_mb, step


# (op, tokens is the sequence-parallel shard?, count per layer and pass, analytic bytes factor)
_EW_OPS = (("rmsnorm", True, 2, 2.0), ("residual_add", True, 2, 3.0), ("rope", False, 1, 2.0))


def elementwise_times(ctx: EvalContext) -> tuple[np.ndarray, np.ndarray]:
    """Per layer and micro-batch (fwd, bwd) seconds of the 2 RMSNorms and 2 residual adds on the
    sequence-parallel shard [T/TP, d] and RoPE on the local q/k heads [T, (n_q/TP + kv_loc) hd]:
    the element-wise table (bench/suites/elementwise.py) where it has the op, else the bytes
    through HBM (read + write; backward twice the forward), labelled analytic. With dropout
    (spec model.dropout) each residual add is Megatron's fused bias-dropout-add: plus the
    1-byte mask written forward and applied backward."""
    g, sh, hbm = ctx.g, ctx.shapes, ctx.hbm
    Tsp, b_el = sh.Tsp, sh.b_el
    f = np.zeros(np.shape(sh.T))
    b = np.zeros(np.shape(sh.T))
    for op, sp, n, passes in _EW_OPS:
        of, ob = _ew_op_times(ctx, op, sp, passes)
        f, b = f + n * of, b + n * ob
    if g.dropout:  # Megatron's bias-dropout-add: each residual add also writes a 1-byte mask, and
        # the backward applies it (read grad and mask, write grad); bytes through HBM
        f = f + 2 * an.memory_time(1.0 * Tsp * g.d, hbm)
        b = b + 2 * an.memory_time((2.0 * b_el + 1.0) * Tsp * g.d, hbm)
        ctx.rec.note("dropout: hidden-dropout masks costed as bytes through HBM; attention dropout's "
                 "in-kernel RNG is not (the SDPA table is measured without dropout)")
    return f, b


def _ew_op_times(ctx: EvalContext, op: str, sp: bool, passes: float) -> tuple[np.ndarray, np.ndarray]:
    """(fwd, bwd) seconds of one element-wise op of :data:`_EW_OPS` per layer and micro-batch: the element-wise
    table where it has the op, else bytes through HBM (labelled analytic)."""
    tb, rec, g, sh = ctx.tables, ctx.rec, ctx.g, ctx.shapes
    # RoPE on q/k; MLA rotates only each query head's rotary part and the one shared rotary key
    rope_width = np.where(np.asarray(g.kv_rank) > 0, (sh.q_loc + 1.0) * g.rope_dim, (sh.q_loc + sh.kv_loc) * g.hd)
    rows, width = (sh.Tsp, g.d) if sp else (sh.T, rope_width)
    tab_f, tab_b = tb.elementwise.get((op, "fwd")), tb.elementwise.get((op, "bwd"))
    if tab_f is not None:
        of = rec.use("elementwise", tab_f.lookup(rows, width))
        ob = rec.use("elementwise", tab_b.lookup(rows, width)) if tab_b is not None else 2 * of
        return of, ob
    rec.mark("elementwise", ANALYTIC)
    of = an.memory_time(sh.b_el * rows * width * passes, ctx.hbm)
    return of, 2 * of


def norm_time(ctx: EvalContext) -> np.ndarray:
    """One RMSNorm's forward over the sequence-parallel shard [T/TP, d] (seconds per layer and micro-batch):
    what recomputing a norm re-runs (estimator/recompute.py)."""
    return _ew_op_times(ctx, "rmsnorm", True, _EW_OPS[0][3])[0]


def vocab_times(ctx: EvalContext) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(t_first, t_last_fwd, t_last_bwd) per micro-batch: embedding gather/scatter; LM head GEMM +
    cross-entropy, forward and backward apart (the forward is exposed, :func:`stage_periods`).

    The vocab table has one vocab size V_t (Megatron-padded). Both kernels do work proportional
    to the logit count, so a TP-sharded padded vocab V_loc = pad(V, TP)/TP is looked up at the
    logit-equivalent token count T V_loc / V_t (in range or reported out of range like any axis).
    """
    tb, rec, g, hbm = ctx.tables, ctx.rec, ctx.g, ctx.hbm
    T, V_loc, b_el = ctx.shapes.T, ctx.shapes.V_loc, ctx.shapes.b_el
    t_first = an.memory_time(b_el * T * g.d * 2 + 4.0 * T * g.d * 2, hbm)  # gather fwd, fp32 scatter-add bwd
    if tb.vocab and tb.vocab_size:
        t_last = {"fwd": np.zeros_like(T), "bwd": np.zeros_like(T)}
        for op in ("lm_head_gemm", "cross_entropy"):
            for dirn in ("fwd", "bwd"):
                res = tb.vocab_lookup(op, dirn, T, V_loc, g.d)
                if res is not None:
                    t_last[dirn] = t_last[dirn] + rec.use("vocab", res)
        return t_first, t_last["fwd"], t_last["bwd"]
    else:
        rec.mark("vocab", ANALYTIC)
        f, b = gemm_times(ctx, "vocab", T, V_loc, g.d)
        ce = an.memory_time(4.0 * T * V_loc * 3, hbm)
        rec.mark("vocab", ANALYTIC)
        return t_first, f + ce, b + ce
