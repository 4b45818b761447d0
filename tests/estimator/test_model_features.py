"""The time and memory of today's model features: multi-latent attention's GEMMs, SDPA and saved tensors, the
sliding window's SDPA composed from the causal table by a labelled rule, the MTP layers on the last stage
(time, parameters, activations and logits), q/k norms and bias gradients; each against a count by hand of what
Megatron-Core runs and saves."""
from __future__ import annotations

import numpy as np
import pytest

from scaleplan import catalogue
from scaleplan.estimator import analytic as an
from scaleplan.estimator.compute import SDPA_TILE, sdpa_times, window_fraction
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.memory import block_activation_terms, memory_breakdown, outside_blocks_saved_bytes
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.params import stage_params
from scaleplan.estimator.shapes import plan_shapes
from scaleplan.estimator.tables import COMPOSED
from scaleplan.geometry import spec_param_counts
from scaleplan.specs import Layout, parse_spec

MLA = {"n_layers": 4, "hidden_sz": 256, "inter_sz": 512, "n_q_heads": 8, "n_kv_heads": 8, "head_dim": 48,
       "vocab_sz": 1024, "attn_gate": False, "qk_norm": True,
       "mla": {"q_lora_rank": 64, "kv_lora_rank": 32, "qk_rope_head_dim": 16, "v_head_dim": 32},
       "moe": {"n_experts": 8, "experts_per_token": 2, "expert_inter_sz": 64, "shared_expert_inter_sz": 64,
               "first_dense_layers": 1, "router_score": "sigmoid", "expert_bias": True}}


def _model(**over):
    return parse_spec({"model": {**MLA, **over}}).model


def _ctx(model, layout: Layout, n: int, db: str, seqlen=1024, gbs=64, stack=None):
    """An evaluation context on the B200 profile from ``db``'s tables, without calibration (an empty database:
    analytic everywhere), on ``stack`` (default: the paper's). Never the default database: what the user or
    another run left there would change it."""
    from scaleplan.estimator.api import Estimator
    from scaleplan.stack import PAPER_STACK

    est = Estimator("p6-b200.48xlarge", db_url=db, use_calibration=False)
    lay = ParallelLayout.from_specs([layout], n)
    g = geometry(model)
    return est.model.context(g, lay, seqlen, gbs, stack=stack or PAPER_STACK), g, lay


def test_window_fraction_counts_the_tiles_a_window_touches():
    # 4096 tokens = 32 tiles of 128: causal 32 x 33 / 2 = 528 tiles; a 128-token window touches 2 key tiles per
    # query tile (its own and the one before), 1 for the first: 1 + 31 x 2 = 63
    assert window_fraction(4096, 128) == pytest.approx(63 / 528)
    # a 1000-token window: 8 key tiles + the diagonal = 9; the first 9 query tiles ramp (45), 23 more x 9
    assert window_fraction(4096, 1000) == pytest.approx((45 + 23 * 9) / 528)
    assert window_fraction(4096, 4096) == 1.0 and window_fraction(4096, 0) == 1.0 and SDPA_TILE == 128


def test_sdpa_of_mla_heads_and_of_a_window_is_composed_and_labelled(recorded_db):
    """With the recorded B200 SDPA table: MLA's 48-wide q/k heads with 32-wide values cost the 32-wide table times
    (48 + 32) / 64; a 128-token window on half the blocks of GPT-OSS costs the causal table times
    1/2 + 1/2 x window_fraction. Both lookups are marked composed and carry a note."""
    import copy

    lo = Layout(tp=1, ep=8)
    mla, g, _ = _ctx(_model(), lo, 8, recorded_db, seqlen=4096)
    flat = copy.deepcopy(MLA)
    flat.update(head_dim=32, qk_norm=False, mla={**MLA["mla"], "qk_rope_head_dim": 16})
    ref, _, _ = _ctx(_model(head_dim=32, mla={**MLA["mla"], "qk_rope_head_dim": 16, "v_head_dim": 32}), lo, 8,
                     recorded_db, seqlen=4096)
    (f, b), (f0, b0) = sdpa_times(mla), sdpa_times(ref)
    assert f == pytest.approx(f0 * (48 + 32) / 64) and b == pytest.approx(b0 * (48 + 32) / 64)
    assert mla.rec.src["sdpa"][0] >= COMPOSED and any("q/k heads 48 wide" in n for n in mla.rec.notes)

    oss = parse_spec(catalogue.spec_data("gpt-oss-20b")).model
    full = oss.model_copy(update={"sliding_window": None})
    w, _, _ = _ctx(oss, Layout(tp=1, ep=8), 8, recorded_db, seqlen=4096)
    c, _, _ = _ctx(full, Layout(tp=1, ep=8), 8, recorded_db, seqlen=4096)
    (fw, _), (fc, _) = sdpa_times(w), sdpa_times(c)
    assert fw == pytest.approx(fc * (0.5 + 0.5 * 63 / 528))
    assert w.rec.src["sdpa"][0] >= COMPOSED and any("sliding window of 128" in n for n in w.rec.notes)


def test_mla_projections_are_megatron_cores_gemms(sqlite_url):
    """MLA at TP 2, sequence parallel, no tables (the roofline per GEMM): the duplicated down-projections on the
    rank's T/2 tokens, the column-parallel up-projections on all T tokens over 4 of the 8 heads, the output
    projection over the 4 heads' 32-wide values; forward and dgrad + wgrad backward."""
    from scaleplan.estimator.kernels import layer_kernels

    ctx, g, lay = _ctx(_model(), Layout(tp=2, ep=4), 8, sqlite_url, seqlen=1024)
    k = layer_kernels(ctx)
    T, Tsp, peak, hbm = 1024.0, 512.0, ctx.peak, ctx.hbm
    gemms = [(Tsp, 64, 256), (T, 4 * 48, 64), (Tsp, 32 + 16, 256), (T, 4 * (48 - 16 + 32), 32), (T, 256, 4 * 32)]
    fwd = sum(an.gemm_time(m, n, kk, peak, hbm) for m, n, kk in gemms)
    bwd = sum(an.gemm_time(m, kk, n, peak, hbm) + an.gemm_time(kk, n, m, peak, hbm) for m, n, kk in gemms)
    assert k.attn_f[0] == pytest.approx(fwd) and k.attn_b[0] == pytest.approx(bwd)


def test_mla_block_saves_what_megatron_core_saves():
    """Bytes one MLA block saves (bf16, no recompute, TP 1), tensor by tensor from MLASelfAttention's forward
    with the fused MLA RoPE: the first norm's input (T x 256) and output (the down-projections' input, T x 256),
    the q latent before and after its norm (2 x T x 64), the kv latent likewise (2 x T x 32), the contiguous
    query and key (2 x T x 8 x 48) and value (T x 8 x 32), the attention output (T x 8 x 32; the output
    projection's input is a view) and its fp32 statistics (T x 8 x 4 B); 8 B per token and norm for the
    statistics of the block's two norms and the two latent norms."""
    m = _model()
    g = geometry(m)
    T = 1024
    t = block_activation_terms(T, 1, g, 1, 1, False, 2.0)
    attn = (2 * T * 256 + 2 * T * 256 + 2 * 2 * T * 64 + 2 * 2 * T * 32 + 2 * (2 * T * 8 * 48 + T * 8 * 32)
            + 2 * T * 8 * 32 + 4 * T * 8 + 8 * T * 2 + 8 * T * 2)
    names = ("norm1_in", "qkv_in", "mla_latents", "mla_qkv", "sdpa_out", "sdpa_lse", "norm_stats",
             "mla_latent_norm_stats", "qkv_out", "qk_rope", "sdpa_in", "out_proj_in", "gate_sigmoid", "sdpa_out_cast")
    assert sum(t[n][0] for n in names) == pytest.approx(attn)


def test_mtp_layers_sit_on_the_last_stage():
    """DeepSeek-V3's one MTP layer at PP 2: the last stage holds its MoE block (counted with the stage's blocks),
    its two norms, 2d x d projection and norm, and a copy of the input embedding; its memory saves the MTP
    layer's head inputs and one more set of fp32 logits; the time of the last stage's LM head doubles plus the
    projection. The first stage is unchanged."""
    m = parse_spec(catalogue.spec_data("deepseek-v3")).model.model_copy(update={"n_layers": 8})
    no = m.model_copy(update={"mtp_layers": 0})
    lo = Layout(tp=1, pp=2, ep=8)
    lay = ParallelLayout.from_specs([lo], 16)
    g, g0 = geometry(m), geometry(no)
    sh, sh0 = plan_shapes(g, lay, 4096, 64), plan_shapes(g0, lay, 4096, 64)
    assert sh.last.n_layers[0] == sh0.last.n_layers[0] + 1 and sh.last.n_moe[0] == sh0.last.n_moe[0] + 1
    assert sh.first.n_layers[0] == sh0.first.n_layers[0]
    p, p0 = stage_params(g, lay, sh.last), stage_params(g0, lay, sh0.last)
    b = spec_param_counts(m)
    d, V = 7168, 129280
    expert_share = 256 * 3 * d * 2048 / 8  # the MTP block's routed experts over EP 8
    assert p.experts[0] - p0.experts[0] == pytest.approx(expert_share)
    # the rest of the MTP layer (attention, shared expert, router, norms, projection) and the embedding copy
    assert p.dense[0] - p0.dense[0] == pytest.approx(b.mtp - 256 * 3 * d * 2048 + V * d)
    T = 4096.0
    head = 2 * T * d * 2 + 8 * T + 4 * T * V + 8 * T
    extra = outside_blocks_saved_bytes(T, 1, g, 1, 2.0, False, True) - \
        outside_blocks_saved_bytes(T, 1, g0, 1, 2.0, False, True)
    assert extra == pytest.approx(head + 2 * T * 4 * d + 2 * 8 * T)
    mem = memory_breakdown(g, lay, 64, 4096, "adam", shapes=sh)
    mem0 = memory_breakdown(g0, lay, 64, 4096, "adam", shapes=sh0)
    assert mem["logits"][0] == pytest.approx(2 * mem0["logits"][0])


def test_a_sliding_window_saves_what_full_attention_saves():
    """Flash attention with a window saves the same tensors (q, k, v, output, statistics): memory unchanged."""
    oss = parse_spec(catalogue.spec_data("gpt-oss-20b")).model
    full = oss.model_copy(update={"sliding_window": None})
    lay = ParallelLayout.from_specs([Layout(tp=1, ep=8)], 8)
    a = memory_breakdown(geometry(oss), lay, 64, 4096, "adam")
    b = memory_breakdown(geometry(full), lay, 64, 4096, "adam")
    assert a["activations"][0] == b["activations"][0]


def test_small_kernels_of_qk_norms_and_bias_gradients(sqlite_url):
    """Qwen3's per-head q/k norms over a rank's heads, and GPT-OSS's bias gradients, as bytes through HBM: the
    element-wise time grows by exactly their bytes (read + write forward, twice backward; one read of each biased
    output's gradient)."""
    from scaleplan.estimator.kernels import layer_kernels

    q3 = parse_spec(catalogue.spec_data("qwen3-30b-a3b")).model
    lo = Layout(tp=2, ep=8)
    c1, g1, _ = _ctx(q3, lo, 16, sqlite_url, seqlen=2048)
    c0, _, _ = _ctx(q3.model_copy(update={"qk_norm": False}), lo, 16, sqlite_url, seqlen=2048)
    k1, k0 = layer_kernels(c1), layer_kernels(c0)
    T = 2048.0
    norm = an.memory_time(2 * 2.0 * T * (32 + 4) * 128 / 2, c1.hbm)
    assert k1.ew_f[0] - k0.ew_f[0] == pytest.approx(norm) and k1.ew_b[0] - k0.ew_b[0] == pytest.approx(2 * norm)

    oss = parse_spec(catalogue.spec_data("gpt-oss-20b")).model
    c1, g, _ = _ctx(oss, Layout(tp=2, ep=4), 8, sqlite_url, seqlen=2048)
    c0, _, _ = _ctx(oss.model_copy(update={"linear_bias": "none"}), Layout(tp=2, ep=4), 8, sqlite_url, seqlen=2048)
    k1, k0 = layer_kernels(c1), layer_kernels(c0)
    cols = (64 * 64 + 2 * 8 * 64) / 2 + 2880 + 2 * 2880 / 2 + 2880  # QKV per rank; O; the dense MLP fc1, fc2
    assert k1.ew_b[0] - k0.ew_b[0] == pytest.approx(an.memory_time(2.0 * T * cols, c1.hbm))
    assert k1.ew_f[0] == k0.ew_f[0]


def test_gpt_oss_clamped_glu_costs_its_unfused_pass_and_keeps_its_clamped_copy(sqlite_url):
    """GPT-OSS's clamped GLU in Megatron-Core (weighted_bias_quick_geglu_impl): the two clamps and the cat before
    the fused kernel move 2 + 2 + 4 bytes of bf16 per element of one half of the routed rows' fc1 output forward;
    backward the gate half's compare and where (2 + 1 + 1 + 2 + 2 bytes), the linear half's two compares, and and
    where (3 + 3 + 3 + 5), the gradients' cat (8): 30 bytes, by hand from PyTorch's clamp_backward. moe_act's
    recompute re-runs the forward part. Memory: the clamped copy [R, 2f] is kept beside fc1's output (the clamps'
    saved inputs) unless the activation is recomputed."""
    from scaleplan.estimator.kernels import layer_kernels

    oss = parse_spec(catalogue.spec_data("gpt-oss-20b")).model
    plain = oss.model_copy(update={"swiglu_limit": None})
    lo = Layout(tp=1, ep=4, mbs=1)
    c1, g1, _ = _ctx(oss, lo, 8, sqlite_url, seqlen=2048)
    c0, _, _ = _ctx(plain, lo, 8, sqlite_url, seqlen=2048)
    k1, k0 = layer_kernels(c1), layer_kernels(c0)
    R = 2048.0 * 4  # routed rows per rank: tokens x top-4 (balanced: a rank receives what it sends)
    half = R * 2880  # elements of one half of the fc1 output on this rank
    assert float(c1.shapes.R[0]) == R and g1.glu_clamp
    assert k1.ex_f[0] - k0.ex_f[0] == pytest.approx(an.memory_time(16.0 * half, c1.hbm))
    assert k1.ex_b[0] - k0.ex_b[0] == pytest.approx(an.memory_time(30.0 * half, c1.hbm))
    assert k1.act_f[0] - k0.act_f[0] == pytest.approx(an.memory_time(16.0 * half, c1.hbm))
    # PP 1, one micro-batch in flight: every MoE block keeps one clamped copy, 2 bytes x 2 halves
    for ckpt, kept in (("none", True), ("selective", True), ("super-selective", False)):
        one = ParallelLayout.from_specs([lo.model_copy(update={"ckpt": ckpt})], 8)
        b = memory_breakdown(geometry(oss), one, 64, 2048, "adam")["activations"][0]
        c = memory_breakdown(geometry(plain), one, 64, 2048, "adam")["activations"][0]
        assert b - c == pytest.approx(g1.n_moe * 2.0 * 2 * half if kept else 0.0), ckpt
    # the stack's --recompute-modules moe_act (selective with those modules) rebuilds it too
    from scaleplan.stack import Stack

    act = Stack(recompute_modules=("moe_act",))
    sel = ParallelLayout.from_specs([lo.model_copy(update={"ckpt": "selective"})], 8)
    b, c = (memory_breakdown(geometry(m), sel, 64, 2048, "adam", stack=act)["activations"][0] for m in (oss, plain))
    assert b == pytest.approx(c)


def test_layouts_rank_todays_models(sqlite_url):
    """`layouts` ranks every catalogue model of today's families on 64 B200 (no tables: analytic) without error,
    and keeps GPT-OSS at ETP 1 (its biased experts)."""
    from scaleplan.estimator import PlanConstraints
    from scaleplan.estimator.api import Estimator

    est = Estimator("p6-b200.48xlarge", db_url=sqlite_url, use_calibration=False)
    for name in ("gpt-oss-120b", "qwen3-30b-a3b", "mixtral-8x7b"):
        spec = parse_spec(catalogue.spec_data(name))
        res = est.layouts(spec, 64, PlanConstraints(mbs=(1,), ckpt=("full",)), top=5)
        assert res.ranked, name
        if name.startswith("gpt-oss"):
            assert all(r.layout["etp"] == 1 for r in res.ranked)
    assert np.isfinite([r.mfu for r in res.ranked]).all()


@pytest.mark.parametrize("router_dtype, fwd, bwd, host", [
    ("model", 12.0, 16.0, 10 * 8 + 4),
    ("fp32", 28.0, 40.0, 10 * 8 + 4 + 2 + 2 * 8 + 1),
])
def test_gpt_oss_expert_bias_costs_its_unfused_pass(sqlite_url, router_dtype, fwd, bwd, host):
    """GPT-OSS's fc2 bias times the routing probability, added per expert outside the GEMM (Megatron-Core's
    TEGroupedMLP._apply_bias), by hand per element of the routed rows' [R, d] bf16 output. Probabilities in bf16
    (--moe-router-dtype unset): forward the product written (2 bytes), the sum reading two and writing one (6), the
    cat (4); backward the split's gradient cat (4), the bias and probability gradients, each a product read and
    written then reduced (6 + 6). In fp32 the product is fp32: forward 4 + (2 + 8) + 8 and the cast back (4 + 2);
    backward the cast's gradient (2 + 4), the sum's gradient to t cast back (4 + 2), the cat (4), 12 + 12. Host
    launches (estimator/kernel_counts.py, full-recompute units): 10 E_loc + 4, and in fp32 the casts, 2 forward
    and 2 E_loc + 1 backward, on 8 local experts."""
    from scaleplan.estimator.api import Estimator
    from scaleplan.estimator.dispatch import full_recompute_units
    from scaleplan.estimator.kernels import layer_kernels
    from scaleplan.estimator.stages import stage_dispatch
    from scaleplan.stack import Stack

    oss = parse_spec(catalogue.spec_data("gpt-oss-20b")).model
    lo, st = Layout(tp=1, ep=4, mbs=1), Stack(router_dtype=router_dtype)
    c1, _, _ = _ctx(oss, lo, 8, sqlite_url, seqlen=2048, stack=st)
    c0, _, _ = _ctx(oss.model_copy(update={"linear_bias": "qkv"}), lo, 8, sqlite_url, seqlen=2048, stack=st)
    k1, k0 = layer_kernels(c1), layer_kernels(c0)
    el = 2048.0 * 4 * 2880  # routed rows per rank (tokens x top-4) x d
    assert k1.ex_f[0] - k0.ex_f[0] == pytest.approx(an.memory_time(fwd * el, c1.hbm))
    assert k1.ex_b[0] - k0.ex_b[0] == pytest.approx(an.memory_time(bwd * el, c1.hbm))
    law = Estimator("p6-b200.48xlarge", db_url=sqlite_url, use_calibration=False).dispatch
    d1, d0 = (float(stage_dispatch(c, law, c.shapes.first)[0]) for c in (c1, c0))
    units = float(full_recompute_units(c1.lay.ckpt)[0])
    assert float(c1.shapes.E_loc[0]) == 8.0  # 32 experts over EP 4
    assert d1 - d0 == pytest.approx(oss.n_layers * host * units * law.t_gap_s)
