"""The FP8 grouped GEMM point of the grouped_gemm suite: one projection of the expert MLP over
``num_gemms`` local experts in a recipe (the row's dtype: "fp8" per-tensor current scaling, "mxfp8"), forward
and backward, each expert's rows padded to the recipe's alignment (bench/fp8.py).

Implementations (:func:`pick_impl`): Transformer Engine's GroupedLinear; ``torch._scaled_grouped_mm`` (one
grouped FP8 kernel per GEMM, row-wise scales, casts over the whole token tensor: a fixed number of cast
kernels whatever the number of experts, as TE's multi-tensor casts); one ``torch._scaled_mm`` per expert with
per-expert casts (the loop a stack without fused casts runs: its time grows with the experts' kernel count);
emulated. The GEMM work of row-wise and per-tensor scaling is the same (the scales apply in the epilogue).

What is stored is device time: on CUDA the median of a CUDA-graph replay of the call where it can be
captured (no host launch cost in it), else of CUDA events around it (then the note says "events", which
count host gaps longer than the queue); the eager wall per call (calls issued back to back, host included)
goes into the note, so a table's host floor (estimator/floors.py) is measured, not inferred.
"""
from __future__ import annotations

import torch
from scaleplan.bench import fp8
from scaleplan.bench import harness as h


# compute capabilities torch's grouped FP8 kernel (_scaled_grouped_mm, row-wise scales) runs on
SCALED_GROUPED_CC = ((9, 0), (10, 0))


def pick_impl(ctx: h.Context, recipe: str) -> str:
    """te_grouped_linear (CUDA with Transformer Engine); for tensorwise on CUDA without it,
    torch_scaled_grouped_mm (one grouped FP8 kernel per GEMM; Hopper, Blackwell) unless the suite's impl is
    "loop", else torch_scaled_mm (one FP8 GEMM per expert, compute capability >= 8.9); else emulated."""
    if ctx.is_cuda:
        try:
            import transformer_engine.pytorch  # noqa: F401
            return "te_grouped_linear"
        except Exception:
            pass
        cc = torch.cuda.get_device_capability(ctx.device)
        grouped = hasattr(torch, "_scaled_grouped_mm") and cc in SCALED_GROUPED_CC
        if recipe == "tensorwise" and grouped and ctx.extra.get("grouped_impl") != "loop":
            return "torch_scaled_grouped_mm"
        if recipe == "tensorwise" and cc >= (8, 9):
            return "torch_scaled_mm"
    return "emulated"


def _emulated(x, w, dy, rows, recipe):
    """(forward, backward) closures of the emulated path: fp32 GEMMs of quantized-dequantized operands."""
    def fwd():
        return fp8.grouped_forward(x, w, rows, recipe)

    def bwd():
        xs, ds = torch.split(x, rows), torch.split(dy, rows)
        dx = [fp8.emulated_gemm(d, w[g].t(), recipe) for g, d in enumerate(ds)]
        dw = [fp8.emulated_gemm(xg.t(), d, recipe) for xg, d in zip(xs, ds)]
        return torch.cat(dx), torch.stack(dw)

    return fwd, bwd


def _scaled_mm(a_q, sa, bt_q, sb):
    """a [m, k] (E4M3, row-major) @ b [k, n] given as b^T [n, k] row-major (so column-major b, as cuBLASLt's
    FP8 GEMM needs), per-tensor scales; bf16 out."""
    return torch._scaled_mm(a_q, bt_q.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)


def _torch_scaled(x, w, dy, rows, precast: bool = False):
    """(forward, backward) closures with one torch._scaled_mm per expert (tensorwise): activations and output
    gradients quantized per call, weights once (TE caches them from the first micro-batch). ``precast``: the
    activations are quantized once, outside the closures, which then run the GEMMs alone (cuBLAS per expert,
    the GEMMs Transformer Engine's grouped linear issues on Hopper)."""
    wt = [fp8.quantize_tensorwise(w[g].t().contiguous()) for g in range(w.shape[0])]   # w^T [n, k] for forward
    wq = [fp8.quantize_tensorwise(w[g].contiguous()) for g in range(w.shape[0])]       # w [k, n] for dgrad

    def casts(xg, d):  # x_g, dy_g, x_g^T [k, m], dy_g^T [n, m]
        return [fp8.quantize_tensorwise(t) for t in (xg, d, xg.t().contiguous(), d.t().contiguous())]

    groups = list(zip(torch.split(x, rows), torch.split(dy, rows)))
    pre = [casts(xg, d) for xg, d in groups] if precast else None

    def fwd():
        return torch.cat([_scaled_mm(*(pre[g][0] if precast else fp8.quantize_tensorwise(xg)), *wt[g])
                          for g, (xg, _) in enumerate(groups)])

    def bwd():
        dx, dw = [], []
        for g, (xg, d) in enumerate(groups):
            _, qd, qxt, qdt = pre[g] if precast else casts(xg, d)
            dx.append(_scaled_mm(*qd, *wq[g]))        # dy [m, n] @ w^T [n, k]
            dw.append(_scaled_mm(*qxt, *qdt))         # x^T [k, m] @ dy [m, n]
        return dx, dw

    return fwd, bwd


def _col_major_rowwise(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [E, a, b] quantized along a (each of its E x b columns scaled apart): (E4M3 [E, a, b] column-major,
    float32 scales [E, b]), the right operand layout of torch._scaled_grouped_mm."""
    e, a, b = w.shape
    q, s = fp8.quantize_rowwise(w.transpose(1, 2).reshape(e * b, a))
    return q.view(e, b, a).transpose(1, 2), s.view(e, b)


def _scaled_grouped(x, w, dy, rows, precast: bool = False):
    """(forward, backward) closures with one torch._scaled_grouped_mm per GEMM (row-wise scales): activations
    and output gradients quantized per call over the whole [tokens, features] tensor, a fixed number of cast
    kernels whatever the number of experts (as Transformer Engine's multi-tensor casts); weights once.
    Forward x [M, k] @ w_e; dgrad dy [M, n] @ w_e^T; wgrad x_e^T @ dy_e, the 2-D x 2-D form whose offsets split
    the reduction (the token) axis, each operand's scales taken over all tokens and shared by the groups.
    ``precast``: the activations are quantized once, outside the closures, which then run the GEMMs alone."""
    n_groups = w.shape[0]
    offs = torch.tensor(rows, device=x.device).cumsum(0).to(torch.int32)
    w_fwd = _col_major_rowwise(w)                             # [E, k, n], scales [E, n]
    w_dgrad = _col_major_rowwise(w.transpose(1, 2))           # [E, n, k], scales [E, k]

    def casts():
        return (fp8.quantize_rowwise(x), fp8.quantize_rowwise(dy), fp8.quantize_rowwise(x.t().contiguous()),
                fp8.quantize_rowwise(dy.t().contiguous()))      # x^T [k, M] row-major; dy^T [n, M]

    pre = casts() if precast else None

    def fwd():
        qx, sx = pre[0] if precast else fp8.quantize_rowwise(x)
        return torch._scaled_grouped_mm(qx, w_fwd[0], sx, w_fwd[1], offs=offs, out_dtype=torch.bfloat16)

    def bwd():
        (qd, sd), (qxt, sxt), (qdt, sdt) = pre[1:] if precast else casts()[1:]
        dx = torch._scaled_grouped_mm(qd, w_dgrad[0], sd, w_dgrad[1], offs=offs, out_dtype=torch.bfloat16)
        dw = torch._scaled_grouped_mm(qxt, qdt.t(), sxt.repeat(n_groups), sdt.repeat(n_groups), offs=offs,
                                      out_dtype=torch.bfloat16)
        return dx, dw

    return fwd, bwd


def _te(x, w, dy, rows, recipe, ctx):
    """(forward, backward) closures of TE's GroupedLinear under fp8_autocast with the recipe."""
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe as te_recipe

    rec = te_recipe.Float8CurrentScaling() if recipe == "tensorwise" else te_recipe.MXFP8BlockScaling()
    layer = te.GroupedLinear(w.shape[0], w.shape[1], w.shape[2], bias=False, params_dtype=x.dtype, device=ctx.device)
    xg = x.detach().requires_grad_(True)

    def fwd():
        with te.fp8_autocast(enabled=True, fp8_recipe=rec):
            return layer(xg, rows)

    def bwd():
        xg.grad = None
        fwd().backward(dy)

    return fwd, bwd


def _device_s(fn, ctx: h.Context) -> tuple[float, str]:
    """Median device seconds of fn(): a CUDA-graph replay where the call can be captured, else CUDA events
    (CPU: wall). Returns (seconds, how)."""
    if ctx.is_cuda:
        try:
            s = torch.cuda.Stream(ctx.device)
            s.wait_stream(torch.cuda.current_stream(ctx.device))
            with torch.cuda.stream(s):
                fn()
            torch.cuda.current_stream(ctx.device).wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            # replayed after the L2 flush, as the bf16 rows are timed
            return h.time_fn(lambda _: graph.replay(), ctx).median, "graph"
        except Exception:
            pass
    return h.time_fn(lambda _: fn(), ctx).median, "events" if ctx.is_cuda else "wall"


def measure_fp8(p: dict, ctx: h.Context, fin: int, fout: int, rows: list[int]) -> dict:
    """A grouped_gemm row of dtype "fp8" or "mxfp8" (module docstring). Raises harness.SkipAlign for an
    MXFP8 shape whose dimensions are not multiples of 32."""
    recipe = fp8.RECIPE_OF_DTYPE[p["dtype"]]
    if recipe == "mxfp8":
        try:
            fp8.check_mx_shape(fin, fout)
        except ValueError as e:
            raise h.SkipAlign(str(e)) from None
    xp, padded = fp8.pad_groups(h.randn((sum(rows), fin), torch.bfloat16, ctx.device), rows, fp8.ALIGN[recipe])
    h.check_memory(ctx, 2 * 4 * (sum(padded) * (fin + fout) + len(rows) * fin * fout))
    w = h.randn((len(rows), fin, fout), torch.bfloat16, ctx.device, scale=fin**-0.5)
    dy = h.randn((sum(padded), fout), torch.bfloat16, ctx.device)
    impl = pick_impl(ctx, recipe)
    if impl == "te_grouped_linear":
        fwd, bwd = _te(xp, w, dy, padded, recipe, ctx)
    elif impl == "torch_scaled_grouped_mm":
        fwd, bwd = _scaled_grouped(xp, w, dy, padded)
    elif impl == "torch_scaled_mm":
        fwd, bwd = _torch_scaled(xp, w, dy, padded)
    else:
        fwd, bwd = _emulated(xp.float(), w.float(), dy.float(), padded, recipe)
    f, how = _device_s(fwd, ctx)
    b, _ = _device_s(bwd, ctx)
    wall = h.wall_per_call_s(fwd, ctx)
    extra = "; scales=rowwise" if impl == "torch_scaled_grouped_mm" else ""
    alone = {"torch_scaled_grouped_mm": _scaled_grouped, "torch_scaled_mm": _torch_scaled}.get(impl)
    if alone is not None:  # the GEMMs alone, beside the casts-included times stored
        g_f, g_b = (_device_s(c, ctx)[0] for c in alone(xp, w, dy, padded, precast=True))
        extra += f"; gemm_fwd_s={g_f:.3e}; gemm_bwd_s={g_b:.3e}"
    note = (f"recipe={recipe}; padded_rows={sum(padded)} of {sum(rows)}; device={how}; "
            f"wall_fwd_per_call_s={wall:.3e}{extra}")
    return dict(fwd_s=f, bwd_s=b, impl=impl, in_features=fin, out_features=fout, note=note)
