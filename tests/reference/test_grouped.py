"""Grouped GEMM padding: CUDA's grouped_mm needs every group offset to be a multiple of
16 bytes; the padded path must give the per-expert loop's values and gradients for any routing."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from scaleplan.reference import grouped
from scaleplan.reference.grouped import grouped_linear, pad_plan, row_alignment, select_impl

pytestmark = pytest.mark.skipif(select_impl("cpu", torch.float32) != "torch_grouped_mm",
                                reason="torch.nn.functional.grouped_mm not usable on this CPU build")


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 20), min_size=1, max_size=7), align=st.sampled_from([2, 4, 8]))
def test_pad_plan_puts_every_group_on_an_aligned_offset_in_order(counts, align):
    c = torch.tensor(counts)
    n = sum(counts)
    plan = pad_plan(c, align, n)
    ends = plan.offs.tolist()
    starts = [0] + ends[:-1]
    assert all(e % align == 0 for e in ends) and plan.rows % align == 0 and ends[-1] <= plan.rows
    dest = plan.dest.tolist()
    assert len(set(dest)) == n  # no two rows collide
    row = 0
    for g, k in enumerate(counts):
        assert ends[g] - starts[g] >= max(k, 1)  # room for the group; an empty one still gets a block
        assert dest[row:row + k] == list(range(starts[g], starts[g] + k))  # real rows first, in order
        row += k


def _strict_grouped_mm(align_bytes: int, calls: list | None = None):
    """CPU stand-in for CUDA's offset check: every offset along the jagged dimension a multiple of 16 bytes."""
    real = F.grouped_mm

    def gmm(a, b, *, offs=None, **kw):
        if calls is not None:
            calls.append((a.dim(), b.dim()))
        step = align_bytes // a.element_size()
        bad = [o for o in offs.tolist() if o % step]
        if bad:
            raise RuntimeError(f"offsets {bad} are not multiples of {step} rows")
        return real(a, b, offs=offs, **kw)

    return gmm


def _reference(x, w, counts, dy):
    """Independent per-row einsum with each row's expert weights (no grouping at all)."""
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    rows = torch.repeat_interleave(torch.arange(w.shape[0]), counts)
    y = torch.einsum("nd,nde->ne", x2, w2[rows])
    y.backward(dy)
    return y.detach(), x2.grad, w2.grad


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("counts", [[3, 0, 10, 2], [0, 0, 5, 0], [1, 7, 9, 13], [8, 16, 0, 8]])
def test_padded_path_matches_reference_under_cuda_alignment_rule(monkeypatch, counts, dtype, tol):
    calls: list = []
    monkeypatch.setattr(grouped.F, "grouped_mm", _strict_grouped_mm(16, calls))
    g = torch.Generator().manual_seed(sum(counts))
    c = torch.tensor(counts)
    n, d_in, d_out = sum(counts), 16, 24
    x = torch.randn(n, d_in, generator=g).to(dtype).requires_grad_()
    w = torch.randn(len(counts), d_in, d_out, generator=g).to(dtype).requires_grad_()
    dy = torch.randn(n, d_out, generator=g).to(dtype)
    y = grouped_linear(x, w, c, "torch_grouped_mm", align=row_alignment(dtype))
    y.backward(dy)
    assert calls == [(2, 3), (2, 3), (2, 2)]  # forward, input gradient, weight gradient all grouped
    ref_y, ref_dx, ref_dw = _reference(x.float(), w.float(), c, dy.float())
    torch.testing.assert_close(y.float(), ref_y, rtol=tol, atol=tol * 4)
    torch.testing.assert_close(x.grad.float(), ref_dx, rtol=tol, atol=tol * 4)
    torch.testing.assert_close(w.grad.float(), ref_dw, rtol=tol, atol=tol * 4)
    for e in (i for i, k in enumerate(counts) if k == 0):
        assert torch.all(w.grad[e] == 0)  # an empty expert's zero block contributes nothing


def test_unpadded_path_trips_the_cuda_alignment_rule(monkeypatch):
    # the failure on CUDA: arbitrary router counts give unaligned offsets
    monkeypatch.setattr(grouped.F, "grouped_mm", _strict_grouped_mm(16))
    x = torch.randn(16, 16, dtype=torch.bfloat16)
    w = torch.randn(3, 16, 16, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="not multiples of 8 rows"):
        grouped_linear(x, w, torch.tensor([3, 5, 8]), "torch_grouped_mm", align=1)


def test_default_alignment_pads_only_on_cuda():
    assert grouped.default_align("cpu", torch.bfloat16) == 1
    assert grouped.default_align("cuda", torch.bfloat16) == 8  # 16 bytes / 2
    assert grouped.default_align("cuda", torch.float32) == 4


def test_bad_align_is_refused():
    with pytest.raises(ValueError, match="align 0"):
        grouped_linear(torch.ones(2, 8), torch.ones(1, 8, 8), torch.tensor([2]), "loop", align=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_padded_path_on_cuda_matches_reference():
    c = torch.tensor([3, 0, 10, 2, 1], device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(16, 64, device="cuda", generator=g).bfloat16().requires_grad_()
    w = torch.randn(5, 64, 32, device="cuda", generator=g).bfloat16().requires_grad_()
    dy = torch.randn(16, 32, device="cuda", generator=g).bfloat16()
    y = grouped_linear(x, w, c)
    y.backward(dy)
    ref_y, ref_dx, ref_dw = _reference(x.float().cpu(), w.float().cpu(), c.cpu(), dy.float().cpu())
    torch.testing.assert_close(y.float().cpu(), ref_y, rtol=3e-2, atol=0.3)
    torch.testing.assert_close(x.grad.float().cpu(), ref_dx, rtol=3e-2, atol=0.3)
    torch.testing.assert_close(w.grad.float().cpu(), ref_dw, rtol=3e-2, atol=0.3)
