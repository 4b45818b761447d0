"""Per-device memory of a plan (vectorised over plans), reported per category for the worst stage.

Model state (Megatron mixed precision with the distributed optimizer): bf16 weights (2 bytes/param),
fp32 main grads (4), and fp32 master weights + optimizer moments sharded over the data-parallel
group (dense params over DP x CP, expert params over EDP) — for Adam 12 bytes/param, so the
unsharded total is Megatron's 18 bytes/param (theoretical_memory_usage: 6 + 12/DP).

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models"), per layer and micro-batch, with TP + sequence parallel dividing everything by TP:
attention 11 s b h + 5 a s^2 b (the score term only without flash attention), MLP 19 s b h for a
4h GeLU MLP, two norms 4 s b h; total s b h (34 + 5 a s / h) for a GPT block with dropout.
Generalised here to GQA (Q, K, V kept separately), SwiGLU, no-dropout and MoE layers: router
logits (fp32), the permuted routed rows (K tokens per token) through fc1 / activation / fc2, and
the unpermute buffer. Checkpoint modes: none (all), selective (no attention-internal tensors),
super-selective (also recompute norms, activations and permutation), full (only the layer input).

1F1B keeps min(PP, n_mb) micro-batches in flight on the first stage (times 1 + (PP-1)/(PP VPP)
with interleaving); the last stage holds one, plus the LM head and its fp32 logits.
"""
from __future__ import annotations

import numpy as np
from scaleplan.estimator.geom import Geometry, padded_vocab

OPT_STATE_BYTES = {"adam": 12.0, "adamw": 12.0, "muon": 8.0, "scion": 8.0, "sgd": 8.0}
WEIGHT_BYTES, GRAD_BYTES = 2.0, 4.0
RESERVE_BYTES = 5e9  # GPU default: CUDA context, NCCL buffers, allocator fragmentation (profile field)


def dense_layer_activation_bytes(s, b, h, a, ffn, *, kv_heads=None, head_dim=None, glu=False,
                                 dropout=True, flash=False, tp=1, gate=False):
    """Korthikanti activation bytes of one dense transformer block (no recomputation), per device.

    With kv_heads = a, ffn = 4h, no GLU, dropout, no flash: s b h (34 + 5 a s / h) / tp.
    """
    kv = a if kv_heads is None else kv_heads
    hd = h / a if head_dim is None else head_dim
    sbh = s * b * h
    attn = 2 * sbh + 2 * s * b * (a + 2 * kv) * hd + 2 * sbh + (sbh if dropout else 0)  # QKV in, Q/K/V, out-proj in, mask
    if not flash:
        attn = attn + 5.0 * a * s * s * b
    if gate:
        attn = attn + 2 * 2 * s * b * a  # gate logits and sigmoid
    mlp = 2 * sbh + 2 * s * b * ffn * (2 if glu else 1) + 2 * s * b * ffn + (sbh if dropout else 0)
    norms = 4 * sbh
    return (attn + mlp + norms) / tp


def moe_layer_activation_bytes(s, b, g: Geometry, tp, etp, mode_code):
    """One MoE block's stored activations per device (flash attention, no dropout)."""
    h = g.d
    sbh = s * b * h
    kv = np.maximum(g.nkv / tp, 1.0) * tp
    attn = (2 * sbh + 2 * s * b * (g.nq + 2 * kv) * g.hd + 2 * sbh + (4 * s * b * g.nq if g.gate else 0)) / tp
    norms = 4 * sbh / tp
    rows = s * b * g.K * etp / tp
    router = 4.0 * s * b * g.E * 2 / tp                      # fp32 logits + probabilities
    w = 2 if g.glu else 1
    experts = 2 * rows * h + 2 * rows * g.dexp / etp * w + 2 * rows * g.dexp / etp + 2 * rows * h
    shared = (2 * sbh + 2 * s * b * g.dsh * (w + 1)) / tp if g.dsh else 0.0
    permute = 2 * rows * h                                     # permutation buffer
    full = attn + norms + router + experts + shared + permute
    act_part = 2 * rows * g.dexp / etp + (2 * s * b * g.dsh / tp if g.dsh else 0.0)
    sel = full  # flash attention: selective recompute frees nothing more
    sup = full - norms - act_part - permute + 2 * sbh / tp
    inp = 2 * sbh / tp
    return np.select([mode_code == 3, mode_code == 2, mode_code == 1], [inp, sup, sel], full)


def dense_block_bytes(s, b, g: Geometry, tp, mode_code):
    full = dense_layer_activation_bytes(s, b, g.d, g.nq, g.dff, kv_heads=np.maximum(g.nkv / tp, 1.0) * tp,
                                        head_dim=g.hd, glu=g.glu, dropout=False, flash=True, tp=tp, gate=g.gate)
    inp = 2 * s * b * g.d / tp
    sup = full - 4 * s * b * g.d / tp - 2 * s * b * g.dff / tp + inp
    return np.select([mode_code == 3, mode_code == 2], [inp, sup], full)


def memory_breakdown(g: Geometry, pl, gbs: int, seqlen: int, optimizer: str,
                     reserve_bytes: float = RESERVE_BYTES) -> dict[str, np.ndarray]:
    """Bytes per device for the worst stage, by category (weights, grads, optimizer, activations,
    logits, reserve), each an array over plans; the worst stage is chosen by total.
    ``reserve_bytes``: framework memory outside the model (the profile's ``memory_reserve_bytes``)."""
    tp, cp, pp, dp, ep, etp, vpp, mbs = (getattr(pl, f).astype(float) for f in
                                         ("tp", "cp", "pp", "dp", "ep", "etp", "vpp", "mbs"))
    ck = pl.ckpt
    n_mb = gbs / (dp * mbs)
    s = seqlen / cp
    L_stage = g.L / pp
    opt_b = OPT_STATE_BYTES.get(optimizer, 12.0)
    V_loc = padded_vocab(g.vocab, tp.astype(np.int64)) / tp
    nd0 = np.minimum(g.n_dense, L_stage)
    n_moe0 = L_stage - nd0
    per_layer_dense = g.attn_params / tp
    dense_first = L_stage * per_layer_dense + nd0 * g.dense_mlp_params / tp + n_moe0 * g.moe_dense_params / tp
    dense_last = L_stage * per_layer_dense + (L_stage if g.is_moe else 0) * g.moe_dense_params / tp \
        + (0 if g.is_moe else L_stage * g.dense_mlp_params / tp)
    exp_first = n_moe0 * g.expert_params / (ep * etp)
    exp_last = (L_stage if g.is_moe else 0) * g.expert_params / (ep * etp)
    emb = V_loc * g.d
    edp = np.maximum(tp * cp * dp / (ep * etp), 1)

    act_moe = moe_layer_activation_bytes(s, mbs, g, tp, etp, ck) if g.is_moe else 0.0
    act_den = dense_block_bytes(s, mbs, g, tp, ck)
    # full recompute still materialises one layer's full activations during its backward
    peak_layer = np.where(ck == 3, np.maximum(moe_layer_activation_bytes(s, mbs, g, tp, etp, np.zeros_like(ck))
                                              if g.is_moe else 0.0,
                                              dense_block_bytes(s, mbs, g, tp, np.zeros_like(ck))), 0.0)
    inflight = np.minimum(pp, n_mb) * np.where(vpp > 1, 1 + (pp - 1) / (pp * vpp), 1.0)
    act_first = inflight * (nd0 * act_den + n_moe0 * act_moe) + peak_layer
    last_layers = (L_stage * act_moe) if g.is_moe else L_stage * act_den
    act_last = np.where(pp > 1, 1.0, inflight) * last_layers + peak_layer

    logits = s * mbs * V_loc * (4.0 + 2.0)  # fp32 upcast + bf16 logits, one micro-batch
    out = {}
    for name, dense, exp, act, has_head, has_emb in (
            ("first", dense_first, exp_first, act_first, pp == 1, True),
            ("last", dense_last, exp_last, act_last, True, pp == 1)):
        emb_p = emb * (np.where(has_emb, 1.0, 0.0) + np.where(has_head & ((not g.tie) | (pp > 1)), 1.0, 0.0))
        dense_all = dense + emb_p
        out[name] = {
            "weights": WEIGHT_BYTES * (dense_all + exp),
            "grads": GRAD_BYTES * (dense_all + exp),
            "optimizer": opt_b * (dense_all / (dp * cp) + exp / edp),
            "activations": act,
            "logits": np.where(has_head, logits, 0.0),
            "reserve": np.full_like(tp, float(reserve_bytes)),
        }
    tot_f = sum(out["first"].values())
    tot_l = sum(out["last"].values())
    worst_first = tot_f >= tot_l
    return {k: np.where(worst_first, out["first"][k], out["last"][k]) for k in out["first"]}
