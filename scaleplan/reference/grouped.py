"""Grouped GEMM for the routed experts: the same implementation choice the bench's grouped_gemm
suite records in ``GroupedGemmPoint.impl``.

``torch_grouped_mm``: ``torch.nn.functional.grouped_mm`` (one call for all local experts) where the
build supports it on the device and dtype; ``loop``: one matmul per expert otherwise. Both run
through :class:`GroupedLinearFn`, whose backward issues the data-gradient as a grouped GEMM with the
transposed weights and the weight-gradient as a 2-D x 2-D grouped GEMM over the same offsets, so
forward and backward cost what the bench measures (fc1/fc2, fwd_s/bwd_s).

Alignment: on CUDA, grouped_mm requires every group offset along the jagged dimension to
be a multiple of 16 bytes, i.e. of ``16 / element_size`` rows (8 for bf16), in the forward (rows of
x), the input gradient (rows of dy) and the weight gradient (the jagged contraction dimension of
x^T dy). A router's per-expert counts are arbitrary, so :func:`pad_plan` lays every group out in a
zero-filled buffer padded to a multiple of the alignment (an empty expert gets one block of zero
rows, so no kernel ever sees a zero-size group); zero rows add nothing to x^T dy and their outputs
are dropped. The plan is computed on the device without a host sync (the buffer has the static
bound ceil(N/a) a + G a rows; rows past the last offset are ignored by grouped_mm). CPU builds do
not need it, so there padding is off unless asked for (``align``), which is how the tests check the
padded path against the per-expert loop.

Shapes: x [N, d_in] rows sorted by expert; w [G, d_in, d_out]; counts [G] rows per expert
(int64, sums to N); returns [N, d_out].
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F

IMPLS = ("torch_grouped_mm", "loop")
ALIGN_BYTES = 16  # grouped_mm's alignment of strides and (on CUDA) group offsets


@functools.cache
def _grouped_mm_works(device_type: str, dtype: torch.dtype) -> bool:
    """Probe both forms the layer issues (2-D x 3-D forward, 2-D x 2-D weight gradient) on shapes that
    meet every alignment rule, so a probe never fails for a reason the padded path removes."""
    if not hasattr(F, "grouped_mm"):
        return False
    try:
        x = torch.ones(32, 16, device=device_type, dtype=dtype)
        w = torch.ones(2, 16, 16, device=device_type, dtype=dtype)
        offs = torch.tensor([16, 32], device=device_type, dtype=torch.int32)
        y = F.grouped_mm(x, w, offs=offs)
        dw = F.grouped_mm(x.t().contiguous(), y, offs=offs)
        return bool(torch.allclose(y.float(), torch.full((32, 16), 16.0, device=device_type))
                    and torch.allclose(dw.float(), torch.full((2, 16, 16), 256.0, device=device_type)))
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def select_impl(device: torch.device | str, dtype: torch.dtype) -> str:
    """'torch_grouped_mm' when the build runs it on this device/dtype, else 'loop' (the bench's rule)."""
    dev = torch.device(device).type
    return "torch_grouped_mm" if _grouped_mm_works(dev, dtype) else "loop"


def row_alignment(dtype: torch.dtype) -> int:
    """Rows per 16-byte offset step: 8 for bf16/fp16, 4 for fp32."""
    return max(1, ALIGN_BYTES // torch.empty((), dtype=dtype).element_size())


def default_align(device: torch.device | str, dtype: torch.dtype) -> int:
    """Group-offset alignment in rows the device's grouped_mm needs: CUDA's kernels check it, CPU's do not (1)."""
    return row_alignment(dtype) if torch.device(device).type == "cuda" else 1


class PadPlan(NamedTuple):
    """Where each real row sits in the padded buffer: dest [N] int64, offs [G] int32 group ends
    (multiples of the alignment), rows = buffer length (a multiple of the alignment)."""

    dest: torch.Tensor
    offs: torch.Tensor
    rows: int


def pad_plan(counts: torch.Tensor, align: int, n_rows: int) -> PadPlan:
    """Padded layout of groups with ``counts`` [G] rows (sum ``n_rows``): group g gets
    max(ceil(c_g / align), 1) * align rows, its real rows first, in order. No host sync."""
    G = counts.numel()
    dev = counts.device
    padded = torch.clamp((counts + align - 1) // align, min=1) * align
    ends = torch.cumsum(padded, 0)
    start_real = torch.cumsum(counts, 0) - counts
    group = torch.repeat_interleave(torch.arange(G, device=dev), counts, output_size=n_rows)
    dest = (ends - padded)[group] + torch.arange(n_rows, device=dev) - start_real[group]
    rows = -(-n_rows // align) * align + G * align  # >= sum(padded): sum(c + a - 1) over full groups, a per empty one
    return PadPlan(dest, ends.to(torch.int32), rows)


def pad_rows(x: torch.Tensor, plan: PadPlan) -> torch.Tensor:
    """[N, k] -> [plan.rows, k], zero rows between the groups."""
    return x.new_zeros(plan.rows, x.shape[1]).index_copy_(0, plan.dest, x)


def _aligned(*ts: torch.Tensor) -> bool:
    """grouped_mm needs every non-unit stride of its (contiguous) operands to be a multiple of 16 bytes."""
    return all((t.shape[-1] * t.element_size()) % ALIGN_BYTES == 0 for t in ts)


def _loop_mm(a: torch.Tensor, b: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    outs = [a_i @ b[i] for i, a_i in enumerate(torch.split(a, counts.tolist()))]
    return torch.cat(outs) if outs else a.new_zeros(0, b.shape[-1])


def _gmm(a: torch.Tensor, b: torch.Tensor, counts: torch.Tensor, impl: str, plan: PadPlan | None) -> torch.Tensor:
    """a [N, k] (rows grouped) x b [G, k, n] -> [N, n]. A misaligned feature width runs the loop."""
    if impl != "torch_grouped_mm" or not _aligned(a, b):
        return _loop_mm(a, b, counts)
    if plan is None:
        offs = torch.cumsum(counts, 0).to(torch.int32)
        return F.grouped_mm(a.contiguous(), b.contiguous(), offs=offs)
    y = F.grouped_mm(pad_rows(a, plan), b.contiguous(), offs=plan.offs)
    return y.index_select(0, plan.dest)  # drop the padding rows


def _gmm_weight_grad(x: torch.Tensor, dy: torch.Tensor, counts: torch.Tensor, impl: str,
                     plan: PadPlan | None) -> torch.Tensor:
    """sum over each group's rows of x_g^T dy_g -> [G, d_in, d_out]. A misaligned shape runs the loop."""
    if impl == "torch_grouped_mm" and plan is not None and _aligned(dy):
        # padded rows are zero in both operands, so they add nothing to any group's sum
        return F.grouped_mm(pad_rows(x, plan).t().contiguous(), pad_rows(dy, plan), offs=plan.offs)
    if impl == "torch_grouped_mm" and plan is None and _aligned(x.t(), dy):
        offs = torch.cumsum(counts, 0).to(torch.int32)
        return F.grouped_mm(x.t().contiguous(), dy.contiguous(), offs=offs)
    xs, ds = torch.split(x, counts.tolist()), torch.split(dy, counts.tolist())
    return torch.stack([a.t() @ b for a, b in zip(xs, ds)])


class GroupedLinearFn(torch.autograd.Function):
    """y_g = x_g @ w_g for every expert g, with a grouped backward (see module docstring).
    Saves x, w and counts only; the pad plan is rebuilt in the backward (a few small kernels)
    so the padding costs no saved activation memory."""

    @staticmethod
    def forward(ctx, x, w, counts, impl, align):
        ctx.save_for_backward(x, w, counts)
        ctx.impl, ctx.align = impl, align
        return _gmm(x, w, counts, impl, _plan(counts, impl, align, x.shape[0]))

    @staticmethod
    def backward(ctx, dy):
        x, w, counts = ctx.saved_tensors
        dy = dy.contiguous()
        plan = _plan(counts, ctx.impl, ctx.align, x.shape[0])
        dx = _gmm(dy, w.transpose(1, 2), counts, ctx.impl, plan) if ctx.needs_input_grad[0] else None
        dw = _gmm_weight_grad(x, dy, counts, ctx.impl, plan) if ctx.needs_input_grad[1] else None
        return dx, dw, None, None, None


def _plan(counts: torch.Tensor, impl: str, align: int, n_rows: int) -> PadPlan | None:
    return pad_plan(counts, align, n_rows) if impl == "torch_grouped_mm" and align > 1 else None


def grouped_linear(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor, impl: str | None = None,
                   align: int | None = None) -> torch.Tensor:
    """Grouped GEMM with autograd; ``impl`` None picks :func:`select_impl` for x's device/dtype;
    ``align`` (rows) pads every group offset to a multiple of it, None: :func:`default_align`.
    Raises ValueError for an unknown impl or align < 1."""
    impl = impl or select_impl(x.device, x.dtype)
    if impl not in IMPLS:
        raise ValueError(f"grouped GEMM impl {impl!r}; one of {IMPLS}")
    align = default_align(x.device, x.dtype) if align is None else align
    if align < 1:
        raise ValueError(f"grouped GEMM align {align}; a positive number of rows")
    return GroupedLinearFn.apply(x, w, counts, impl, align)
