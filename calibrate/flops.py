"""FLOP counts a measured MFU can be expressed in, and the step time they imply.

A measured MFU is only a step time in disguise: MFU = F_step / (t_step N_dev F_peak) with F_step the
FLOPs per optimizer step *as the run counted them*. Three counts are in use for the same run and
they differ by up to a third, so an MFU is meaningless without its count. The counts
(``COUNTS``), all in FLOPs per optimizer step of ``gbs`` sequences of ``seqlen`` tokens:

``6n``
    6 N tokens with N every active parameter that multiplies a token (shared/validation/README.md's
    reading of the MFU the training stack logged): input embedding and LM head (twice when untied),
    attention Q K V O, the dense blocks' MLP, the K routed experts and the shared expert of each
    MoE block. Router and the head-wise output gate are left out: with them out this count gives
    the README's N (1.8269e9, 6.4239e9, 20.983e9) to 0.02%; with them in it is 0.2-0.3% higher.
``eq-mfu``
    6 N_act tokens, N_act the non-embedding active parameters (paper eq:mfu); what ``scaleplan``
    reports as ``mfu``.
``megatron``
    Megatron-LM's ``num_floating_point_operations`` (megatron/training/training.py), the count behind
    the TFLOP/s/GPU its log prints: 3 (fwd + two bwd GEMMs) x 2 (FMA) x per token [h (f d_ff n_dense
    + f d_exp K n_moe + f d_sh n_moe) + L (h (q + 2 kv) + q s + q h) + h V_pad], f = 3 with SwiGLU
    else 2, q = heads x head_dim, kv = kv heads x head_dim, the causal score term q s (QK^T and AV,
    halved by the mask), the LM head on the vocabulary padded to a multiple of 128 TP, no input
    embedding and no router. No head-wise gate (Megatron's ``attention_output_gate`` is
    element-wise; a spec's head-wise gate is < 0.3% of the count and left out).
"""
from __future__ import annotations

from scaleplan.errors import SpecError

COUNTS = ("6n", "eq-mfu", "megatron")


def logged_params(g) -> float:
    """N of the ``6n`` count (parameters per token): Geometry ``g``'s active parameters that multiply
    a token, router and head-wise output gate excluded (module docstring; the estimator's
    ``mfu_validation`` uses the same N, ``Geometry.n_mfu_validation``)."""
    return g.n_mfu_validation


def megatron_flops_per_token(g, seqlen: int, tp: int = 1) -> float:
    """FLOPs per token of one training step (fwd + bwd) in Megatron-LM's count (module docstring)."""
    from scaleplan.estimator.model_dims import padded_vocab

    f = 3 if g.glu else 2
    q, kv = g.nq * g.hd, g.nkv * g.hd
    mlp = f * g.dff * g.n_dense + (f * g.dexp * g.K + f * g.dsh) * g.n_moe if g.is_moe else f * g.dff * g.L
    attn = g.L * (g.d * (q + 2 * kv) + q * seqlen + q * g.d)
    return 6.0 * (g.d * mlp + attn + g.d * float(padded_vocab(g.vocab, tp)))


def flops_per_step(model, gbs: int, seqlen: int, count: str, tp: int = 1) -> float:
    """FLOPs of one optimizer step (``gbs`` sequences of ``seqlen`` tokens) in ``count``.

    Args:
        model: a spec's model block (``Spec.model``).
        count: one of ``COUNTS``.
        tp: tensor-parallel degree (only Megatron's padded vocabulary depends on it).

    Raises:
        SpecError: an unknown count.
    """
    from scaleplan.estimator.model_dims import geometry

    if count not in COUNTS:
        raise SpecError("--mfu-flops", count, f"one of {', '.join(COUNTS)}")
    g = geometry(model)
    tokens = float(gbs) * seqlen
    if count == "megatron":
        return megatron_flops_per_token(g, seqlen, tp) * tokens
    return 6.0 * (logged_params(g) if count == "6n" else g.n_act) * tokens


def step_time_from_mfu(mfu: float, flops_step: float, n_devices: int, peak_flops: float) -> float:
    """Seconds per step of a run whose MFU (a fraction) was logged in a count of ``flops_step`` FLOPs
    per step, on ``n_devices`` devices of ``peak_flops`` FLOP/s each (eq:mfu solved for t_iter)."""
    return flops_step / (mfu * n_devices * peak_flops)


def step_time_from_tflops(tflops_per_gpu: float, flops_step: float, n_devices: int) -> float:
    """Seconds per step from the TFLOP/s per GPU a Megatron-LM log prints (its count: ``flops_step``
    from :func:`flops_per_step` with count 'megatron')."""
    return flops_step / (tflops_per_gpu * 1e12 * n_devices)
