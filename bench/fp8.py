"""FP8 pieces the bench times: the padding of expert groups to the recipe's row alignment, the
quantize kernels of each recipe, and an FP8 grouped GEMM built from them.

Recipes (Transformer Engine's names, Megatron-LM's --fp8-recipe): ``tensorwise`` (per-tensor current
scaling: an amax over the tensor, a scale 448 / amax, a saturating cast to E4M3; Float8CurrentScalingQuantizer)
and ``mxfp8`` (MX: one power-of-two E8M0 scale per 32 consecutive elements of a row, E4M3 elements;
MXFP8Quantizer): Transformer Engine rounds amax / 448 up to the next power of two (float_to_e8m0, cvt.rp), so no
element saturates, where the OCP MX rule 2^(floor(log2 amax) - 8) clamps a block's largest ones. Rows of every GEMM operand are padded per expert to 16 (tensorwise)
or 32 (mxfp8), Megatron-Core's get_fp8_align_size and TE's Fp8Padding.

The grouped GEMM runs in bench/fp8_grouped.py (its docstring lists the implementations); ``emulated`` here:
quantize, dequantize and an fp32 GEMM per expert, the numerics of the FP8 GEMM without its kernel (what a CPU
runs, and the reference the tests hold the other paths to). ``quantize_rowwise`` gives the row-wise scales
torch's grouped FP8 kernel takes.
"""
from __future__ import annotations

import torch

E4M3_MAX = 448.0          # largest finite float8_e4m3fn
MX_BLOCK = 32             # elements sharing one E8M0 scale (OCP MX)
RECIPES = ("tensorwise", "mxfp8")
ALIGN = {"tensorwise": 16, "mxfp8": 32}
# a grouped_gemm row's dtype names its recipe ("fp8": per-tensor current scaling, Megatron's emitted default)
RECIPE_OF_DTYPE = {"fp8": "tensorwise", "mxfp8": "mxfp8"}


def padded_splits(rows: list[int], align: int) -> list[int]:
    """Each group's rows rounded up to a multiple of ``align`` (a group of 0 rows stays 0)."""
    return [-(-r // align) * align for r in rows]


def pad_groups(x: torch.Tensor, rows: list[int], align: int) -> tuple[torch.Tensor, list[int]]:
    """``x`` [sum(rows), k] with each group's rows followed by zero rows up to ``align``; (padded x, padded rows)."""
    out_rows = padded_splits(rows, align)
    parts = []
    for part, r, p in zip(torch.split(x, rows), rows, out_rows):
        parts.append(part if p == r else torch.cat([part, part.new_zeros(p - r, x.shape[1])]))
    return (torch.cat(parts) if parts else x), out_rows


def unpad_groups(y: torch.Tensor, rows: list[int], padded: list[int]) -> torch.Tensor:
    """The first ``rows[g]`` rows of each group of ``y`` laid out in ``padded`` rows per group."""
    return torch.cat([part[:r] for part, r in zip(torch.split(y, padded), rows)])


def quantize_tensorwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 tensor, dequantization scale amax / 448) of ``x`` under per-tensor current scaling; an all-zero
    tensor gets scale 1."""
    amax = x.detach().abs().amax().float() if x.numel() else torch.zeros((), device=x.device)
    scale = torch.where(amax > 0, E4M3_MAX / amax, torch.ones_like(amax))
    q = (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, 1.0 / scale


def quantize_rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 tensor, float32 dequantization scales amax_row / 448, one per row) of a 2-D ``x``: the row-wise
    scaling ``torch._scaled_grouped_mm`` takes (an all-zero row gets scale 1)."""
    amax = x.detach().abs().amax(dim=1).float()
    scale = torch.where(amax > 0, E4M3_MAX / amax, torch.ones_like(amax))
    q = (x.float() * scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, 1.0 / scale


def quantize_mxfp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 tensor, one power-of-two scale per 32 elements of each row, 2^ceil(log2(amax / 448)), as float32
    [rows, cols / 32]) of a 2-D ``x`` whose columns are a multiple of 32. An all-zero block gets scale 1."""
    rows, cols = x.shape
    if cols % MX_BLOCK:
        raise ValueError(f"mxfp8: columns {cols} are not a multiple of {MX_BLOCK}")
    blocks = x.float().reshape(rows, cols // MX_BLOCK, MX_BLOCK)
    amax = blocks.abs().amax(dim=-1)
    exp = torch.ceil(torch.log2(torch.where(amax > 0, amax / E4M3_MAX, 1.0)))
    scale = torch.exp2(exp)
    q = (blocks / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.reshape(rows, cols), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 values of a quantized tensor: a per-tensor scale (0-d) or per-block row scales [rows, cols/32]."""
    v = q.float()
    if scale.dim() == 0:
        return v * scale
    rows, cols = v.shape
    return (v.reshape(rows, cols // MX_BLOCK, MX_BLOCK) * scale[..., None]).reshape(rows, cols)


def quantize(x: torch.Tensor, recipe: str) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_tensorwise` or :func:`quantize_mxfp8` by ``recipe``. Raises ValueError otherwise."""
    if recipe == "tensorwise":
        return quantize_tensorwise(x)
    if recipe == "mxfp8":
        return quantize_mxfp8(x)
    raise ValueError(f"recipe {recipe!r} is not one of {', '.join(RECIPES)}")


def emulated_gemm(a: torch.Tensor, b: torch.Tensor, recipe: str) -> torch.Tensor:
    """a [m, k] @ b [k, n] with both operands quantized along k (the reduction dimension, as the FP8 kernels
    scale them): float32 result of the dequantized operands."""
    qa, sa = quantize(a, recipe)
    qb, sb = quantize(b.t().contiguous(), recipe)  # b's blocks run along k: its columns, rows of b^T
    return dequantize(qa, sa) @ dequantize(qb, sb).t()


def grouped_forward(x: torch.Tensor, w: torch.Tensor, rows: list[int], recipe: str) -> torch.Tensor:
    """Emulated FP8 grouped projection: x [sum(rows), k], w [groups, k, n]; each group padded to the
    recipe's alignment, quantized, multiplied, unpadded. float32 [sum(rows), n]."""
    xp, padded = pad_groups(x, rows, ALIGN[recipe])
    outs = [emulated_gemm(xg, w[g], recipe) for g, xg in enumerate(torch.split(xp, padded))]
    return unpad_groups(torch.cat(outs), rows, padded)


def grouped_flops(rows: list[int], k: int, n: int) -> float:
    """FLOPs of one grouped projection (its unpadded rows)."""
    return 2.0 * sum(rows) * k * n


def cast_bytes(rows: int, cols: int, recipe: str) -> float:
    """Bytes a quantize of a bf16 [rows, cols] tensor moves: reads it (twice for tensorwise: amax, then cast),
    writes the rowwise and the columnwise (transposed / column-block) E4M3 copies and their scales."""
    n = float(rows) * cols
    if recipe == "tensorwise":
        return 2 * 2 * n + 2 * n
    return 2 * n + 2 * n + 2 * 4 * n / MX_BLOCK


def check_mx_shape(k: int, n: int) -> None:
    """Raise ValueError when a grouped projection's k or n is not a multiple of the MX block (32)."""
    bad = [d for d in (k, n) if d % MX_BLOCK]
    if bad:
        raise ValueError(f"mxfp8 needs dimensions that are multiples of {MX_BLOCK}: got {bad}")
