"""A stack's --recompute-modules (estimator/recompute.py): what each module frees, against a hand count of the
tensors Megatron-Core keeps, what it re-runs in the time model, its kernel units, and Megatron-Core's rules."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scaleplan.estimator.ckpt import CkptMode, recompute
from scaleplan.estimator.kernels import LayerKernels
from scaleplan.estimator.memory import block_activation_bytes
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.recompute import Selective
from scaleplan.estimator.stages import layer_totals

from scaleplan.errors import SpecError
from scaleplan.specs import parse_spec
from scaleplan.stack import Stack

S, B, A = 4096, 4, 2.0
T = S * B
H, F, K, E = 2880, 2880, 4, 128
R = T * K  # routed rows


def _model(**over):
    m = {"n_layers": 36, "hidden_sz": H, "inter_sz": F, "n_q_heads": 64, "n_kv_heads": 8, "head_dim": 64,
         "vocab_sz": 201088, "attn_gate": False,
         "moe": {"n_experts": E, "experts_per_token": K, "expert_inter_sz": F, "first_dense_layers": 0}}
    m.update(over)
    return m


def _freed(modules, is_moe=True, sel=None, **over):
    """Bytes selective with ``modules`` frees against no recompute, one block of one micro-batch, bf16."""
    g = geometry(parse_spec({"model": _model(**over)}).model)
    sel = sel or Selective(tuple(modules))
    kw = dict(a=A, mcore=True, recipe=None)
    none = block_activation_bytes(S, B, g, 1.0, 1.0, is_moe, np.array([CkptMode.NONE]), **kw)
    got = block_activation_bytes(S, B, g, 1.0, 1.0, is_moe, np.array([CkptMode.SELECTIVE]), sel=sel, **kw)
    return float(none[0] - got[0])


def test_layernorm_and_moe_act_free_the_norm_output_its_statistics_and_fc2s_input():
    # the pre-MLP norm's output (T x h, bf16) and its fp32 statistics (the model's 8 bytes per token per norm),
    # the experts' activation output (R x f, fc2's bf16 input); core attention is not recomputed: its
    # log-sum-exp (fp32, one per query head and token) stays
    assert _freed(("layernorm", "moe_act")) == pytest.approx(A * T * H + 8.0 * T + A * R * F)
    assert _freed(("core_attn",)) == pytest.approx(4.0 * T * 64)


def test_the_moe_module_frees_the_whole_moe_block_but_its_input():
    # router: fp32 logits and scores (T x E each), top-k int64 indices and fp32 weights, three fp32 per-token
    # tensors and the fp32 per-expert counts; the routed rows: fc1's input (R x h), its output (R x 2f, the
    # fused SwiGLU's input), fc2's input (R x f), row indices (2 int64 per row), a bf16 gate per row and the
    # per-expert counts; the router weight copy (fp32 E x (h + 2)). The pre-MLP norm's output stays: it is the
    # checkpoint's input.
    router = 2 * 4.0 * T * E + 8.0 * T * K + 4.0 * T * K + 3 * 4.0 * T + 4.0 * B * E + 4.0 * E * (H + 2)
    rows = A * R * H + A * R * 2 * F + A * R * F + 2 * 8.0 * R + A * R + 8.0 * E
    assert _freed(("moe",)) == pytest.approx(router + rows)


def test_the_mlp_module_frees_a_dense_mlp_from_its_norm_on():
    # fc1's input (TE's fused norm output, T x h), fc1's output (T x 2 d_ff), fc2's input (T x d_ff) and the
    # fused norm's statistics; the fused SwiGLU keeps no output of its own
    assert _freed(("mlp",), is_moe=False) == pytest.approx(A * T * H + A * T * 2 * F + A * T * F + 8.0 * T)


def test_captured_router_graphs_keep_the_pre_mlp_norm_unless_the_all_to_all_preprocess_is_captured():
    keep = Selective.of(Stack(dispatcher="hybridep", cuda_graphs=("attn", "moe_router", "moe_preprocess"),
                              recompute_modules=("layernorm",)))
    free = Selective.of(Stack(cuda_graphs=("attn", "moe_router", "moe_preprocess"), recompute_modules=("layernorm",)))
    assert keep.graphs_keep_norm and not free.graphs_keep_norm
    assert _freed(("layernorm",), sel=keep) == 0.0
    assert _freed(("layernorm",), sel=free) == pytest.approx(A * T * H + 8.0 * T)


def _kernels(n: int = 1) -> LayerKernels:
    """Distinct powers of two per part, so that any sum of parts is exact and tells which parts it holds."""
    names = [f.name for f in dataclasses.fields(LayerKernels)]
    return LayerKernels(**{name: np.full(n, 2.0 ** -(i + 1)) for i, name in enumerate(names)})


@pytest.mark.parametrize("modules, moe_rc, dense_rc", [
    (("layernorm", "moe_act"), lambda k: k.norm_f + k.act_f, lambda k: 0.0),
    (("core_attn", "moe_act"), lambda k: k.sd_f + k.act_f, lambda k: k.sd_f),
    (("moe",), lambda k: k.moe_f + np.maximum(k.sh_f, k.a2a_f), lambda k: 0.0),
    (("mlp",), lambda k: 0.0, lambda k: k.dense_f),
    (("shared_experts",), lambda k: k.sh_f, lambda k: 0.0),
])
def test_selective_modules_re_run_their_parts_forward(modules, moe_rc, dense_rc):
    k, fw = _kernels(), np.zeros(1)
    sel, none = np.array([CkptMode.SELECTIVE]), np.array([CkptMode.NONE])
    with_m, without = (layer_totals(k, c, fw, True, True, modules) for c in (sel, none))
    np.testing.assert_allclose(with_m.moe - without.moe, moe_rc(k))
    np.testing.assert_allclose(with_m.dense - without.dense, dense_rc(k))
    # the MoE module runs the dispatch again: its exposed part is exposed twice
    a2a_x = np.maximum(k.sh_f, k.a2a_f) - k.sh_f
    np.testing.assert_allclose(with_m.a2a_x - without.a2a_x, a2a_x * ("moe" in modules))


def test_the_four_modes_are_what_they_were_without_modules():
    k, fw = _kernels(4), np.zeros(4)
    codes = np.array([0, 1, 2, 3])
    lt = layer_totals(k, codes, fw, True)
    common = k.attn_f + k.sd_f + k.ew_f + k.tp_f + k.cp_f
    moe_lf = common + k.moe_f + np.maximum(k.sh_f, k.a2a_f)
    moe_lb = k.attn_b + k.sd_b + k.ew_b + k.tp_b + k.cp_b + k.moe_b + np.maximum(k.sh_b, k.a2a_b)
    rc = [0.0, k.sd_f[1], k.sd_f[2] + k.ew_f[2] + k.perm[2], moe_lf[3]]
    np.testing.assert_allclose(lt.moe, moe_lf + moe_lb + np.array(rc))


def test_kernel_units_of_modules():
    # core_attn, layernorm and moe_act 0.1 each (selective 3.1, super-selective 3.3 as the law counts them); a
    # MoE block by its named forward launches at the law's traced point (EP 8, 16 local experts): gating 3,
    # token counts 7, top-k and scores 11, permute 9, all-to-alls 3 + chunk sorts 3, unpermute 2, 2 x 16 GEMMs,
    # SwiGLU 1 = 71, of 71 + the attention's 8
    codes = np.array([CkptMode.SELECTIVE])
    assert recompute(codes, ("layernorm", "moe_act")).units[0] == pytest.approx(3.2)
    assert recompute(codes, ("moe",)).units[0] == pytest.approx(3.0 + 71 / 79)
    assert recompute(codes, ("mlp",)).units[0] == pytest.approx(3.0 + 4 / 12)
    assert recompute(codes).units[0] == pytest.approx(3.1)


@pytest.mark.parametrize("stack, model, value", [
    ({"experts": "sequential", "recompute_modules": ["moe_act"]}, {}, "moe_act"),
    ({"recompute_modules": ["mla_up_proj"]}, {}, "mla_up_proj"),
    ({"recompute_modules": ["shared_experts"]}, {}, "shared_experts"),
    ({"recompute_modules": ["layernorm", "layernorm"]}, {}, ["layernorm", "layernorm"]),
    ({"recompute_modules": ["attention"]}, {}, "attention"),
])
def test_megatron_cores_recompute_rules_are_one_line_errors(stack, model, value):
    with pytest.raises(SpecError) as e:
        parse_spec({"model": _model(**model), "stack": stack})
    assert "recompute_modules" in e.value.field and "\n" not in str(e.value)
    assert e.value.value == value or value in str(e.value.value)


def test_shared_expert_recompute_needs_the_shared_expert_not_overlapped():
    moe = {**_model()["moe"], "shared_expert_inter_sz": 1024}
    with pytest.raises(SpecError):
        parse_spec({"model": _model(moe=moe), "stack": {"recompute_modules": ["shared_experts"]}})
    s = parse_spec({"model": _model(moe=moe),
                    "stack": {"recompute_modules": ["shared_experts"], "shared_expert_overlap": False}})
    assert s.stack.recompute_modules == ("shared_experts",) and not s.stack.overlaps_shared_expert()
