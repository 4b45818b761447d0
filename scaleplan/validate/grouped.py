"""Grouped GEMM for the routed experts: the same implementation choice the bench's grouped_gemm
suite records in ``GroupedGemmPoint.impl``.

``torch_grouped_mm``: ``torch.nn.functional.grouped_mm`` (one call for all local experts) where the
build supports it on the device and dtype; ``loop``: one matmul per expert otherwise. Both run
through :class:`GroupedLinearFn`, whose backward issues the data-gradient as a grouped GEMM with the
transposed weights and the weight-gradient as a 2-D x 2-D grouped GEMM over the same offsets, so
forward and backward cost what the bench measures (fc1/fc2, fwd_s/bwd_s).

Shapes: x [N, d_in] rows sorted by expert; w [G, d_in, d_out]; counts [G] rows per expert
(int64, sums to N); returns [N, d_out].
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

IMPLS = ("torch_grouped_mm", "loop")


@functools.cache
def _grouped_mm_works(device_type: str, dtype: torch.dtype) -> bool:
    if not hasattr(F, "grouped_mm"):
        return False
    try:
        x = torch.ones(4, 8, device=device_type, dtype=dtype)
        w = torch.ones(2, 8, 8, device=device_type, dtype=dtype)
        offs = torch.tensor([2, 4], device=device_type, dtype=torch.int32)
        y = F.grouped_mm(x, w, offs=offs)
        return bool(torch.allclose(y.float(), torch.full((4, 8), 8.0, device=device_type)))
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def select_impl(device: torch.device | str, dtype: torch.dtype) -> str:
    """'torch_grouped_mm' when the build runs it on this device/dtype, else 'loop' (the bench's rule)."""
    dev = torch.device(device).type
    return "torch_grouped_mm" if _grouped_mm_works(dev, dtype) else "loop"


def _aligned(*ts: torch.Tensor) -> bool:
    """grouped_mm needs every non-unit stride of its (contiguous) operands to be a multiple of 16 bytes."""
    return all((t.shape[-1] * t.element_size()) % 16 == 0 for t in ts)


def _gmm(a: torch.Tensor, b: torch.Tensor, counts: torch.Tensor, impl: str) -> torch.Tensor:
    """a [N, k] (rows grouped) x b [G, k, n] -> [N, n]. A misaligned shape runs the loop."""
    if impl == "torch_grouped_mm" and _aligned(a, b):
        offs = torch.cumsum(counts, 0).to(torch.int32)
        return F.grouped_mm(a.contiguous(), b.contiguous(), offs=offs)
    outs = [a_i @ b[i] for i, a_i in enumerate(torch.split(a, counts.tolist()))]
    return torch.cat(outs) if outs else a.new_zeros(0, b.shape[-1])


def _gmm_weight_grad(x: torch.Tensor, dy: torch.Tensor, counts: torch.Tensor, impl: str) -> torch.Tensor:
    """sum over each group's rows of x_g^T dy_g -> [G, d_in, d_out]. A misaligned shape runs the loop."""
    if impl == "torch_grouped_mm" and _aligned(x.t(), dy):
        offs = torch.cumsum(counts, 0).to(torch.int32)
        return F.grouped_mm(x.t().contiguous(), dy.contiguous(), offs=offs)
    xs, ds = torch.split(x, counts.tolist()), torch.split(dy, counts.tolist())
    return torch.stack([a.t() @ b for a, b in zip(xs, ds)])


class GroupedLinearFn(torch.autograd.Function):
    """y_g = x_g @ w_g for every expert g, with a grouped backward (see module docstring)."""

    @staticmethod
    def forward(ctx, x, w, counts, impl):
        ctx.save_for_backward(x, w, counts)
        ctx.impl = impl
        return _gmm(x, w, counts, impl)

    @staticmethod
    def backward(ctx, dy):
        x, w, counts = ctx.saved_tensors
        dy = dy.contiguous()
        dx = _gmm(dy, w.transpose(1, 2), counts, ctx.impl) if ctx.needs_input_grad[0] else None
        dw = _gmm_weight_grad(x, dy, counts, ctx.impl) if ctx.needs_input_grad[1] else None
        return dx, dw, None, None


def grouped_linear(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor, impl: str | None = None) -> torch.Tensor:
    """Grouped GEMM with autograd; ``impl`` None picks :func:`select_impl` for x's device/dtype."""
    impl = impl or select_impl(x.device, x.dtype)
    if impl not in IMPLS:
        raise ValueError(f"grouped GEMM impl {impl!r}; one of {IMPLS}")
    return GroupedLinearFn.apply(x, w, counts, impl)
