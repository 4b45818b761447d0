"""The bench's FP8 pieces on a CPU (bench/fp8.py, bench/fp8_grouped.py): group padding to the recipe's
alignment, the two recipes' quantize against reference implementations written here from their definitions
(per-tensor current scaling; OCP MX blocks), the emulated FP8 grouped GEMM against fp32, and the grouped_gemm /
elementwise suites' FP8 rows run end to end (the CUDA paths, TE and torch._scaled_mm, need a GPU)."""
from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch
from scaleplan.bench import fp8
from scaleplan.bench.suites import get_suite

from .conftest import tiny_preset


@pytest.mark.parametrize("align", [16, 32])
def test_groups_are_padded_to_the_alignment_and_unpadded_back(align):
    rows = [0, 1, 15, 16, 17, 33, 64]
    want = [int(math.ceil(r / align) * align) for r in rows]
    assert fp8.padded_splits(rows, align) == want
    x = torch.arange(sum(rows) * 3, dtype=torch.float32).reshape(sum(rows), 3) + 1.0  # no zero rows of its own
    xp, padded = fp8.pad_groups(x, rows, align)
    assert padded == want and xp.shape == (sum(want), 3)
    start = 0
    for r, p, part in zip(rows, want, torch.split(xp, want)):
        assert torch.equal(part[:r], x[start:start + r]) and not part[r:].any()  # data, then zero rows
        start += r
    assert torch.equal(fp8.unpad_groups(xp, rows, padded), x)


def _e4m3_step(v: np.ndarray) -> np.ndarray:
    """Spacing of E4M3 values at |v| (3 mantissa bits; subnormals below 2^-6 spaced 2^-9)."""
    e = np.floor(np.log2(np.maximum(np.abs(v), 2.0 ** -6)))
    return 2.0 ** (e - 3)


def test_tensorwise_scales_the_amax_to_448_and_rounds_to_e4m3():
    x = (torch.randn(64, 96, dtype=torch.float64) * 3.0).clamp(-10.0, 10.0)
    x[5, 7] = -11.0  # the amax
    q, s = fp8.quantize_tensorwise(x)
    ref_scale = 11.0 / 448.0
    assert q.dtype == torch.float8_e4m3fn and float(s) == pytest.approx(ref_scale, rel=1e-6)
    assert float(q.float()[5, 7]) == -448.0
    scaled = x.numpy() / ref_scale  # the reference: every element on the E4M3 grid of x / scale, rounded
    err = np.abs(q.float().numpy() - scaled)
    assert np.all(err <= _e4m3_step(scaled) / 2 + 1e-12)
    assert fp8.quantize_tensorwise(torch.zeros(4, 4))[1] == 1.0


def test_mxfp8_gives_each_32_block_the_power_of_two_scale_transformer_engine_computes():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 128)) * np.exp(rng.uniform(-6, 6, (8, 128)))
    x[3, 32:64] = 0.0  # an all-zero block
    q, s = fp8.quantize_mxfp8(torch.from_numpy(x))
    for r in range(8):
        for b in range(4):
            blk = x[r, 32 * b:32 * (b + 1)]
            amax = np.abs(blk).max()
            # TE's float_to_e8m0(amax / 448): the power of two at or above it (PTX cvt.rp: round up)
            want = 2.0 ** math.ceil(math.log2(amax / 448.0)) if amax > 0 else 1.0
            assert float(s[r, b]) == want
            got = q.float().numpy()[r, 32 * b:32 * (b + 1)]
            assert np.abs(blk / want).max() <= 448.0  # rounded up: nothing saturates
            assert np.all(np.abs(got - blk / want) <= _e4m3_step(blk / want) / 2 + 1e-12)
    with pytest.raises(ValueError, match="multiple of 32"):
        fp8.quantize_mxfp8(torch.ones(4, 48))


@pytest.mark.parametrize("recipe", fp8.RECIPES)
def test_emulated_grouped_gemm_is_the_fp32_product_within_e4m3_precision(recipe):
    torch.manual_seed(1)
    rows, k, n = [5, 40, 0, 33], 64, 96
    x, w = torch.randn(sum(rows), k), torch.randn(len(rows), k, n) / 8
    got = fp8.grouped_forward(x, w, rows, recipe)
    ref = torch.cat([xg @ w[g] for g, xg in enumerate(torch.split(x, rows))])
    assert got.shape == ref.shape
    # two operands each within 2^-4 relative: the product's error is a few percent of its norm, never 10%
    rel = float((got - ref).norm() / ref.norm())
    assert 0.0 < rel < 0.1
    # the padding rows never reach another group: each group equals its own unpadded product
    for g, (xg, out) in enumerate(zip(torch.split(x, rows), torch.split(got, rows))):
        if rows[g]:
            solo = fp8.emulated_gemm(xg, w[g], recipe)
            assert torch.allclose(out, solo, rtol=0, atol=1e-5 * float(solo.abs().max()))


def test_cast_bytes_follow_the_recipe():
    assert fp8.cast_bytes(4096, 2048, "tensorwise") == 4096 * 2048 * 6  # two bf16 reads, two E4M3 writes
    assert fp8.cast_bytes(4096, 2048, "mxfp8") == 4096 * 2048 * (4 + 8 / 32)


def _run(suite: str, cfg: dict, sqlite_url: str):
    from scaleplan.bench import runner
    from scaleplan.bench.config import parse_preset
    from sqlalchemy import select

    from scaleplan.db.session import session_scope

    res = runner.run_preset(parse_preset(tiny_preset({suite: cfg})), sqlite_url, device="cpu")
    table = get_suite(suite).TABLE
    with session_scope(sqlite_url) as s:
        return [{c.key: getattr(r, c.key) for c in table.__table__.columns}
                for r in s.scalars(select(table).where(table.run_id == res[0].run_id))]


def test_grouped_gemm_suite_measures_fp8_rows_on_a_cpu(sqlite_url):
    rows = _run("grouped_gemm", {"dtypes": ["fp8", "mxfp8"], "proj": ["fc1", "fc2"], "distribution": ["skewed"],
                                 "num_gemms": [4], "tokens_per_expert": [24], "hidden": [64], "ffn": [48]},
                sqlite_url)
    by = {(r["dtype"], r["proj"]): r for r in rows}
    assert len(by) == 4
    from scaleplan.bench.suites.grouped_gemm import splits

    for dt, align in (("fp8", 16), ("mxfp8", 32)):
        r = by[(dt, "fc2")]  # in_features = ffn 48: not a multiple of 32
        if dt == "mxfp8":
            assert r["status"] == "SKIP_ALIGN" and r["fwd_s"] is None
            continue
        assert r["status"] == "OK" and r["impl"] == "emulated" and r["fwd_s"] > 0 and r["bwd_s"] > 0
        padded = sum(fp8.padded_splits(splits(4, 24, "skewed"), align))
        assert f"padded_rows={padded} of 96" in r["note"] and "wall_fwd_per_call_s=" in r["note"]
    assert by[("mxfp8", "fc1")]["status"] == "OK"  # 64 -> 96: both multiples of 32


def test_elementwise_suite_times_the_cast_kernels(sqlite_url):
    rows = _run("elementwise", {"ops": ["quantize_tensorwise", "quantize_mxfp8"], "tokens": [64, 48],
                                "hidden": [128]}, sqlite_url)
    by = {(r["op"], r["tokens"]): r for r in rows}
    assert all(r["status"] == "OK" and r["fwd_s"] > 0 and r["bwd_s"] is None and r["note"].endswith("cast=eager")
               for k, r in by.items() if k != ("quantize_mxfp8", 48))
    assert by[("quantize_mxfp8", 48)]["status"] == "SKIP_ALIGN"


def _operands(seed: int, rows: list[int], k: int, n: int):
    """bf16 (x [sum(rows), k], w [groups, k, n] at 1 / sqrt(k), dy [sum(rows), n]) of one seed."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(rows), k, generator=g).bfloat16()
    w = (torch.randn(len(rows), k, n, generator=g) * k**-0.5).bfloat16()
    return x, w, torch.randn(sum(rows), n, generator=g).bfloat16()


def test_the_scaled_mm_path_computes_what_the_emulated_reference_computes():
    """bench/fp8_grouped._torch_scaled (one torch._scaled_mm per expert: what a Hopper GPU without Transformer
    Engine runs) against the emulated FP8 numerics, forward and both gradients, each expert's operands in
    their own layout (row-major A, column-major B). torch's CPU _scaled_mm runs the same operand checks."""
    from scaleplan.bench import fp8_grouped

    if not hasattr(torch, "_scaled_mm"):
        pytest.skip("this torch has no _scaled_mm")
    rows, k, n = [32, 16, 48], 64, 80
    x, w, dy = _operands(3, rows, k, n)
    fwd, bwd = fp8_grouped._torch_scaled(x, w, dy, rows)
    ref = fp8.grouped_forward(x.float(), w.float(), rows, "tensorwise")
    torch.testing.assert_close(fwd().float(), ref, rtol=1e-2, atol=1e-2)  # bf16 output rounding
    dx, dw = bwd()
    pre_f, pre_b = fp8_grouped._torch_scaled(x, w, dy, rows, precast=True)  # the GEMMs alone: the same results
    assert torch.equal(pre_f(), fwd()) and all(torch.equal(a, b) for a, b in zip(pre_b()[0] + pre_b()[1], dx + dw))
    xs, ds = torch.split(x.float(), rows), torch.split(dy.float(), rows)
    for e in range(3):
        torch.testing.assert_close(dx[e].float(), fp8.emulated_gemm(ds[e], w[e].float().t(), "tensorwise"),
                                   rtol=1e-2, atol=2e-2)
        torch.testing.assert_close(dw[e].float(), fp8.emulated_gemm(xs[e].t(), ds[e], "tensorwise"),
                                   rtol=1e-2, atol=2e-2)


def test_an_fp8_gemm_row_notes_its_eager_wall_per_call(sqlite_url):
    if not hasattr(torch, "_scaled_mm"):
        pytest.skip("this torch has no _scaled_mm")
    rows = _run("gemm", {"dtypes": ["fp8", "bf16"], "m": [64], "n": [32], "k": [48]}, sqlite_url)
    by = {r["dtype"]: r for r in rows}
    assert by["fp8"]["status"] == "OK" and by["fp8"]["backend"] == "torch_scaled_mm"
    wall = float(by["fp8"]["note"].split("wall_per_call_s=")[1])
    assert 0 < wall < 1.0
    assert by["bf16"]["note"] is None


def _emulated_scaled_grouped_mm(a, b, scale_a, scale_b, offs=None, out_dtype=None, **_):
    """torch._scaled_grouped_mm on a CPU: torch's own operand checks (its meta kernel: E4M3 operands, row-major
    a, column-major b, 16-byte strides, scale shapes, int32 offsets), then the product of the dequantized
    operands: 2-D x 3-D splits a's rows by ``offs``; 2-D x 2-D splits the reduction axis, scales [G x rows],
    [G x cols], output [G, rows, cols]."""
    def meta(t):
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")

    torch.ops.aten._scaled_grouped_mm(meta(a), meta(b), meta(scale_a), meta(scale_b), offs=meta(offs),
                                      out_dtype=out_dtype)
    ends = offs.tolist()
    spans = list(zip([0, *ends[:-1]], ends))
    af, bf = a.float(), b.float()
    if b.dim() == 3:
        out = torch.cat([(af[s:e] * scale_a[s:e, None]) @ (bf[g] * scale_b[g][None, :])
                         for g, (s, e) in enumerate(spans)])
    else:
        r, c = a.shape[0], b.shape[1]
        out = torch.stack([(af[:, s:e] * scale_a[g * r:(g + 1) * r, None]) @ (bf[s:e] * scale_b[g * c:(g + 1) * c])
                           for g, (s, e) in enumerate(spans)])
    return out.to(out_dtype)


def _rel_err(got, want):
    return float((got.float() - want).norm() / want.norm())


def test_the_grouped_fp8_kernel_path_lays_out_its_operands_as_torch_checks_and_computes_the_product(monkeypatch):
    """bench/fp8_grouped._scaled_grouped (torch._scaled_grouped_mm, what an H100 / H200 / B200 without
    Transformer Engine runs): forward, dgrad and wgrad within FP8 rounding of the fp32 products, each call
    passing torch's own layout checks. A transposed or row-major weight fails the checks; swapped groups or
    scales give errors near 1, not the few percent of E4M3 rounding."""
    from scaleplan.bench import fp8_grouped

    if not hasattr(torch, "_scaled_grouped_mm"):
        pytest.skip("this torch has no _scaled_grouped_mm")
    monkeypatch.setattr(torch, "_scaled_grouped_mm", _emulated_scaled_grouped_mm, raising=True)
    rows, k, n = [32, 16, 48], 64, 96
    x, w, dy = _operands(5, rows, k, n)
    fwd, bwd = fp8_grouped._scaled_grouped(x, w, dy, rows)
    xs, ds = torch.split(x.float(), rows), torch.split(dy.float(), rows)
    y = fwd()
    assert y.shape == (sum(rows), n) and y.dtype == torch.bfloat16
    assert _rel_err(y, torch.cat([xe @ w[e].float() for e, xe in enumerate(xs)])) < 0.05
    dx, dw = bwd()
    assert _rel_err(dx, torch.cat([de @ w[e].float().t() for e, de in enumerate(ds)])) < 0.05
    assert dw.shape == (3, k, n)
    assert _rel_err(dw, torch.stack([xe.t() @ de for xe, de in zip(xs, ds)])) < 0.05
    pre_f, pre_b = fp8_grouped._scaled_grouped(x, w, dy, rows, precast=True)  # the GEMMs alone: the same results
    assert torch.equal(pre_f(), y) and all(torch.equal(a, b) for a, b in zip(pre_b(), (dx, dw)))


def test_rowwise_quantize_scales_each_rows_amax_to_448():
    x = torch.randn(8, 40, dtype=torch.float64)
    x[3] = 0.0
    q, s = fp8.quantize_rowwise(x)
    amax = x.abs().amax(dim=1)
    assert torch.equal(q.float().abs().amax(dim=1)[amax > 0], torch.full((7,), 448.0))
    assert torch.allclose(s.double()[amax > 0], amax[amax > 0] / 448.0) and s[3] == 1.0
    back = q.float().double() * s.double()[:, None]
    assert torch.all((back - x).abs() <= torch.from_numpy(_e4m3_step(x.numpy() / s.double()[:, None].numpy()))
                     * s.double()[:, None] / 2 + 1e-12)


@pytest.mark.parametrize("suite_impl, want", [("auto", "torch_scaled_grouped_mm"), ("loop", "torch_scaled_mm")])
def test_a_grouped_kernel_or_loop_row_notes_its_gemms_alone(monkeypatch, suite_impl, want):
    """measure_fp8 as on a Hopper GPU (pick_impl told it runs on CUDA at compute capability 9.0, without
    Transformer Engine; the grouped kernel emulated): the grouped FP8 kernel, or with the suite's impl "loop"
    one FP8 GEMM per expert; the row's times include the casts, and its note gives the GEMMs alone."""
    from types import SimpleNamespace

    from scaleplan.bench import fp8_grouped
    from scaleplan.bench import harness as h

    if not hasattr(torch, "_scaled_grouped_mm"):
        pytest.skip("this torch has no _scaled_grouped_mm")
    monkeypatch.setattr(torch, "_scaled_grouped_mm", _emulated_scaled_grouped_mm)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setitem(sys.modules, "transformer_engine", None)  # not installed there
    real = fp8_grouped.pick_impl
    monkeypatch.setattr(fp8_grouped, "pick_impl", lambda ctx, recipe: real(
        SimpleNamespace(is_cuda=True, device=ctx.device, extra=ctx.extra), recipe))
    ctx = h.Context(device=torch.device("cpu"), timing=h.Timing(warmup=1, reps=3, min_reps=3))
    ctx.extra["grouped_impl"] = suite_impl
    r = fp8_grouped.measure_fp8({"dtype": "fp8"}, ctx, 64, 96, [20, 30])
    assert r["impl"] == want and r["fwd_s"] > 0 and r["bwd_s"] > 0
    note = dict(kv.split("=") for kv in r["note"].split("; "))
    assert note["padded_rows"] == "64 of 50" and (note.get("scales") == "rowwise") == (suite_impl == "auto")
    assert float(note["gemm_fwd_s"]) > 0 and float(note["gemm_bwd_s"]) > 0
