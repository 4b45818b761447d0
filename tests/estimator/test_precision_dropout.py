"""Spec fields model.sdpa_precision and model.dropout reach the estimator.

Expectations are computed here from the rule's physics (lane peaks of the profile, bytes through
HBM), not read off the model: fp32 attention at a third of the TF32 lane, a 1-byte dropout mask per
residual add, 2 masks of T x d bytes saved per block."""
import dataclasses

import numpy as np
import pytest
from scaleplan.estimator import analytic as an
from scaleplan.estimator import memory as mm
from scaleplan.estimator.ckpt import CkptMode
from scaleplan.estimator.compute import elementwise_times, sdpa_times
from scaleplan.estimator.layout import ParallelLayout
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.table_build import build_tables
from scaleplan.estimator.tables import Tables

from scaleplan.db.measurements import load_frames
from scaleplan.profiles import load_profile
from scaleplan.specs import parse_spec

MODEL = {"n_layers": 4, "hidden_sz": 2048, "inter_sz": 5120, "n_q_heads": 16, "n_kv_heads": 8, "head_dim": 128,
         "vocab_sz": 32000, "moe": {"n_experts": 64, "experts_per_token": 2, "expert_inter_sz": 1024}}
from .conftest import context

PROFILE = "p6-b200.48xlarge"


def _ctx(tb, prof, g, seqlen, n=1, **shapes):
    """The evaluation context of ``n`` plans at TP 1, micro-batch 1 (shape fields ``shapes`` replaced)."""
    return context(None, g, ParallelLayout.of(tp=np.ones(n, int)), seqlen, tables=tb, profile=prof, **shapes)


def _geom(**over):
    return geometry(parse_spec({"model": {**MODEL, **over}, "hardware": {"node_type": PROFILE}}).model)


@pytest.fixture(scope="module")
def recorded_tables(recorded_db):
    prof = load_profile(PROFILE)
    return build_tables(PROFILE, load_frames(recorded_db, PROFILE), prof.peak("bf16"))


def test_unset_sdpa_precision_is_the_model_precision():
    assert _geom().sdpa_precision == "bf16"
    assert _geom(precision="fp32").sdpa_precision == "fp32"
    assert _geom(precision="fp32", sdpa_precision="bf16").sdpa_precision == "bf16"


def test_fp32_attention_costs_a_third_of_the_tf32_lane(recorded_tables):
    prof = load_profile(PROFILE)
    ratio = prof.peak("bf16") / (prof.peak_flops["tf32"] / 3)   # 3xTF32: three MMAs per product
    assert ratio > 5  # B200: 2.25e15 / (1.1e15 / 3)
    tb = recorded_tables
    for seq in (4096, 8192):  # one micro-batch of one sequence on 16 query heads
        c16, c32 = (_ctx(tb, prof, _geom(**over), seq) for over in ({}, {"sdpa_precision": "fp32"}))
        f16, b16 = sdpa_times(c16)
        f32, b32 = sdpa_times(c32)
        np.testing.assert_allclose(f32, ratio * f16, rtol=1e-12)
        np.testing.assert_allclose(b32, ratio * b16, rtol=1e-12)
        assert any("sdpa in fp32" in n for n in c32.rec.notes) and not c16.rec.notes
        # fp16 runs on the bf16 lane; fp8 keeps the bf16 time (no measured fp8 attention: an upper bound)
        for prec in ("fp16", "fp8"):
            f, _ = sdpa_times(_ctx(tb, prof, _geom(sdpa_precision=prec), seq))
            np.testing.assert_allclose(f, f16, rtol=1e-12)


def test_measured_rows_of_the_sdpa_dtype_are_used_as_measured(recorded_tables):
    """A table of the requested dtype wins over scaling (here: the bf16 grids filed as fp32 rows)."""
    tb = dataclasses.replace(recorded_tables, sdpa_by_dtype={**recorded_tables.sdpa_by_dtype,
                                                             "fp32": recorded_tables.sdpa_by_dtype["bf16"]})
    prof = load_profile(PROFILE)
    c32 = _ctx(tb, prof, _geom(sdpa_precision="fp32"), 8192)
    f32, _ = sdpa_times(c32)
    f16, _ = sdpa_times(_ctx(tb, prof, _geom(), 8192))
    assert f32 == pytest.approx(f16) and not c32.rec.notes


def test_dropout_adds_the_mask_bytes_to_each_residual_add():
    prof = load_profile(PROFILE)
    tb = Tables(profile=PROFILE)  # no element-wise table: bytes through HBM
    T = np.array([8192.0, 32768.0])
    hbm = prof.hbm_bandwidth
    g0, g1 = _geom(), _geom(dropout=True)
    # T tokens of which every one is on this rank (T = T_sp), RoPE on 16 heads of 128 (no KV heads), bf16
    f0, b0 = elementwise_times(_ctx(tb, prof, g0, 8192, n=2, T=T, Tsp=T, q_loc=16, kv_loc=0))
    f1, b1 = elementwise_times(_ctx(tb, prof, g1, 8192, n=2, T=T, Tsp=T, q_loc=16, kv_loc=0))
    d = g0.d
    np.testing.assert_allclose(f1 - f0, 2 * np.maximum(T * d / hbm, an.KERNEL_FLOOR_S), rtol=1e-12)
    np.testing.assert_allclose(b1 - b0, 2 * np.maximum(5 * T * d / hbm, an.KERNEL_FLOOR_S), rtol=1e-12)


@pytest.mark.parametrize("mode", [CkptMode.NONE, CkptMode.SELECTIVE, CkptMode.SUPER_SELECTIVE, CkptMode.FULL])
def test_dropout_keeps_two_one_byte_masks_per_block(mode):
    s, b, tp = 4096, 2, 2
    g0, g1 = _geom(), _geom(dropout=True)
    for is_moe in (False, True):
        a0 = mm.block_activation_bytes(s, b, g0, tp, 1, is_moe, np.array(mode), 2.0)
        a1 = mm.block_activation_bytes(s, b, g1, tp, 1, is_moe, np.array(mode), 2.0)
        want = 0.0 if mode == CkptMode.FULL else 2 * s * b * g0.d / tp  # full keeps the block input only
        assert float(a1 - a0) == pytest.approx(want)


def test_the_three_tf32_rule_needs_tf32_tensor_cores():
    """On a CPU profile (TF32 lane no faster than fp32) fp32 attention runs at the fp32 lane."""
    cpu = load_profile("cpu-local")
    assert an.sdpa_peak(cpu, "fp32") == cpu.peak("fp32")
    b200 = load_profile(PROFILE)
    assert an.sdpa_peak(b200, "fp32") == pytest.approx(b200.peak_flops["tf32"] / 3)
