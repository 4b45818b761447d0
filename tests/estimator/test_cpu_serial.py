"""cpu-local physics: serial dispatch, per-dtype tables, SDPA backend order, memory reserve, chi_sys c_ovl."""
from __future__ import annotations

import numpy as np
import pytest
from scaleplan.estimator import Estimator
from scaleplan.estimator.model import ChiCoefficients
from scaleplan.estimator.table_build import build_tables

from scaleplan.profiles import load_profile
from scaleplan.specs import Layout, parse_spec
from tests.estimator.conftest import frame

GPU = load_profile("h200-single")
SERIAL = GPU.model_copy(update={"serial_dispatch": True, "name": "serial-test"})
L, N_MB = 3, 4  # 1 dense + 2 MoE layers; gbs 4, mbs 1


def _spec(precision="bf16", ckpt="none"):
    return parse_spec({"model": {"n_layers": L, "hidden_sz": 128, "inter_sz": 320, "n_q_heads": 4,
                                 "n_kv_heads": 2, "head_dim": 32, "vocab_sz": 2048, "precision": precision,
                                 "moe": {"n_experts": 8, "experts_per_token": 2, "expert_inter_sz": 160,
                                         "shared_expert_inter_sz": 160}},
                       "performance": {"activation_checkpointing_type": ckpt},
                       "data": {"gbs": N_MB, "seqlen": 128, "microbatch_sz": 1},
                       "hardware": {"node_type": "cpu-local"}})


HOST = {"moe": 1e-3, "dense": 5e-4, "microbatch": 2e-4, "step_moe": 3e-5, "step_dense": 2e-5, "step": 1e-5}


def _ops_frame(dtype="bf16", ckpt="none"):
    rows = []
    for part, t in HOST.items():
        mode = f"ops:{part}" if part.startswith("step") else f"ops:{part}:{ckpt}"
        rows.append(dict(mode=mode, m=64, n=64, k=4, dtype=dtype, chain_len=1, wall_per_kernel_s=t,
                         active_per_kernel_s=None))
    return frame(rows)


def _est(profile, frames):
    return Estimator.from_frames(profile, frames, extrapolate="clamp")


def test_serial_dispatch_adds_host_time_to_compute():
    spec = _spec()
    lay = [Layout(mbs=1, ckpt="none", dp=1)]
    ser = _est(SERIAL, {"dispatch": _ops_frame()}).estimate(spec, 1, lay)[0]
    # the GPU path with a negligible launch gap: its compute is not hidden behind dispatch
    from scaleplan.profiles import DispatchDefaults

    fast = GPU.model_copy(update={"dispatch": DispatchDefaults(t_gap_s=1e-15, kappa0=1, kappa1=0, source="test")})
    gpu = _est(fast, {"dispatch": _ops_frame()}).estimate(spec, 1, lay)[0]
    # per micro-batch: 1 dense layer + 2 MoE layers + the rest; per step: the optimizer's ops
    host_mb = HOST["dense"] + 2 * HOST["moe"] + HOST["microbatch"]
    step = HOST["step_dense"] + 2 * HOST["step_moe"] + HOST["step"]
    assert ser.breakdown_s["dispatch_floor"] == pytest.approx(N_MB * host_mb, rel=1e-9)
    assert ser.breakdown_s["framework_kernels"] == 0.0  # host work on a CPU: inside dispatch
    assert ser.sources["dispatch_floor"] == "measured"
    # the same compute as the GPU path, then the host time added, not max'ed
    comp = [k for k in ser.breakdown_s if k not in ("dispatch_floor", "framework_kernels", "optimizer")]
    for k in comp:
        assert ser.breakdown_s[k] == pytest.approx(gpu.breakdown_s[k], rel=1e-9), k
    assert ser.breakdown_s["optimizer"] == pytest.approx(gpu.breakdown_s["optimizer"] + step, rel=1e-9)
    assert ser.t_analytic_s == pytest.approx(sum(ser.breakdown_s.values()), rel=1e-12)


def test_serial_dispatch_without_rows_for_the_ckpt_mode_falls_back_to_the_law():
    ser = _est(SERIAL, {"dispatch": _ops_frame(ckpt="full")})
    r = ser.estimate(_spec(ckpt="none"), 1, [Layout(mbs=1, ckpt="none", dp=1)])[0]
    assert r.sources["dispatch_floor"] == "analytic"
    assert r.breakdown_s["dispatch_floor"] > 0


def test_active_time_above_wall_is_never_used():
    # an older CPU definition stored active (6 ms) > wall (0.5 ms) per kernel
    df = frame([dict(mode="gemm", m=8, n=2048, k=2048, dtype="bf16", chain_len=512, wall_per_kernel_s=5e-4,
                     active_per_kernel_s=6e-3)])
    tb = build_tables("x", {"dispatch": df}, 1e12)
    assert tb.t_kernel_min_s == pytest.approx(5e-4)


def _gemm_frame(dtype, scale):
    rows = [dict(m=m, n=n, k=k, dtype=dtype, t_s=scale * 2.0 * m * n * k / 1e12)
            for m in (64, 128, 256, 512) for n in (16, 64, 128, 256, 512, 1024, 2048) for k in (16, 64, 128, 256, 512)]
    return frame(rows)


def test_fp32_spec_uses_fp32_gemm_rows():
    import pandas as pd

    frames = {"gemm": pd.concat([_gemm_frame("bf16", 1.0), _gemm_frame("fp32", 4.0)], ignore_index=True)}
    est = _est(GPU, frames)
    lay = [Layout(mbs=1, ckpt="none", dp=1)]
    b = est.estimate(_spec("bf16"), 1, lay)[0]
    f = est.estimate(_spec("fp32"), 1, lay)[0]
    assert b.sources["attn_proj"] != "analytic" and f.sources["attn_proj"] != "analytic"
    assert f.breakdown_s["attn_proj"] == pytest.approx(4.0 * b.breakdown_s["attn_proj"], rel=1e-6)
    # lm_head lookups ask for the spec's precision
    assert {r["dtype"] for r in est.lookups(_spec("fp32"), 1, lay)["vocab"] if r["op"] == "lm_head_gemm"} == {"fp32"}


def _sdpa_rows(backend, scale, seqs=(64, 128)):
    return [dict(backend=backend, seq_len=s, micro_bs=1, n_q_heads=4, n_kv_heads=2, head_dim=32, causal=True,
                 dtype="bf16", fwd_s=scale * s * 1e-6, bwd_s=2 * scale * s * 1e-6) for s in seqs]


def test_sdpa_uses_cpu_backends_in_order_and_small_grids():
    # two measured points (a CPU table: flash and math, no "te"): interpolated between, flash preferred
    tb = build_tables("x", {"sdpa": frame(_sdpa_rows("math", 3.0) + _sdpa_rows("flash", 1.0))}, 1e12)
    assert tb.sdpa_backend == "flash"
    t = tb.sdpa["fwd"].lookup(96, 1, 4, 32)
    assert float(t.t) == pytest.approx(96e-6, rel=1e-6)
    assert int(t.oor_axis) == -1
    assert int(tb.sdpa["fwd"].lookup(256, 1, 4, 32).oor_axis) == 0  # out of range is still reported
    tb2 = build_tables("x", {"sdpa": frame(_sdpa_rows("math", 3.0) + _sdpa_rows("te", 0.5))}, 1e12)
    assert tb2.sdpa_backend == "te"


def test_a_cpu_profile_has_no_allocator_or_context_memory():
    # no CUDA caching allocator, no CUDA context (the validate runner reports RSS growth over the idle
    # process): allocated = reserved = device total; a GPU profile adds overhead (estimator/api.py _memory)
    cpu = load_profile("cpu-local")
    lay = [Layout(mbs=1, ckpt="none", dp=1)]
    c = _est(cpu, {}).estimate(_spec(), 1, lay)[0]
    assert c.mem_allocated_gb == pytest.approx(c.mem_reserved_gb) == pytest.approx(c.mem_per_device_gb)
    g = _est(GPU, {}).estimate(_spec(), 1, lay)[0]
    assert g.mem_allocated_gb == pytest.approx(c.mem_allocated_gb)  # same model state and activations
    assert g.mem_reserved_gb > g.mem_allocated_gb  # the fixed reserve until the allocator suite measures it


@pytest.mark.parametrize("gpn,pp,deep", [(1, 1, False), (3, 1, False), (3, 3, True)])
def test_overlap_credit_needs_a_pipeline(gpn, pp, deep):
    # cpu-local has one "GPU" per node: pp = 1 >= gpus_per_node used to switch the credit on
    est = _est(GPU.model_copy(update={"gpus_per_node": gpn}), {})
    est.model.chi_c = ChiCoefficients(c_ovl=-0.5)
    r = est.estimate(_spec(), pp, [Layout(pp=pp, mbs=1, ckpt="none", dp=1)])[0]
    assert r.chi_inputs["deep_pp_in_node"] is deep
    assert r.chi_sys == pytest.approx(0.5 if deep else 1.0)
    assert np.isfinite(r.t_iter_s)


def test_fp8_without_fp8_rows_runs_at_the_fp8_lane():
    """An FP8 spec on a profile whose GEMM rows are bf16 only: each GEMM is the bf16 row scaled by the bf16 / FP8
    peak of the profile's lanes (H200: 0.989 / 1.979 PFLOP/s), labelled analytic with a note; with FP8 rows of
    its own the FP8 rows. Rows that time the GEMM alone (torch._scaled_mm's, and the scaled bf16 table) get the
    same casts added (compute.fp8_cast_times); Transformer Engine's rows hold them, and get none."""
    import pandas as pd

    lay = [Layout(mbs=1, ckpt="none", dp=1)]
    only16 = _est(GPU, {"gemm": _gemm_frame("bf16", 1.0)})
    b, f = (only16.estimate(_spec(p), 1, lay)[0] for p in ("bf16", "fp8"))
    ratio = GPU.peak_flops["bf16"] / GPU.peak_flops["fp8"]
    assert 0.4 < ratio < 0.6
    assert f.sources["attn_proj"] == "analytic" and b.sources["attn_proj"] != "analytic"
    assert any(w.startswith("gemm in fp8: the bf16 GEMM table x 0.5") for w in f.warnings)
    assert any(w.startswith("attn_proj in fp8: its inputs' tensorwise casts") for w in f.warnings)
    frames = {"gemm": pd.concat([_gemm_frame("bf16", 1.0), _gemm_frame("fp8", 0.7)], ignore_index=True)}
    f8 = _est(GPU, frames).estimate(_spec("fp8"), 1, lay)[0]
    casts = f.breakdown_s["attn_proj"] - ratio * b.breakdown_s["attn_proj"]
    assert casts > 0 and f8.breakdown_s["attn_proj"] == pytest.approx(0.7 * b.breakdown_s["attn_proj"] + casts,
                                                                       rel=1e-6)
    assert not any(w.startswith("gemm in fp8") for w in f8.warnings)
    te = {"gemm": pd.concat([_gemm_frame("bf16", 1.0), _gemm_frame("fp8", 0.7).assign(backend="te_mxfp8")],
                            ignore_index=True)}
    f8te = _est(GPU, te).estimate(_spec("fp8"), 1, lay)[0]
    assert f8te.breakdown_s["attn_proj"] == pytest.approx(0.7 * b.breakdown_s["attn_proj"], rel=1e-6)
    assert not any("casts" in w for w in f8te.warnings)


@pytest.mark.parametrize("profile, ratio", [
    ("p5.48xlarge", 0.5),       # H100 (sm 9.0): TE prefers its fused cuDNN attention
    ("p6-b200.48xlarge", 0.5),  # B200 (sm 10.0): the same rule, "Hopper+"
    ("p4d.24xlarge", 1.0),      # A100 (sm 8.0): FlashAttention first
])
def test_the_time_model_costs_the_attention_backend_its_stack_runs(profile, ratio):
    """Transformer Engine 2.14.1's get_attention_backend disables FlashAttention where cuDNN's fused attention is
    also available on compute capability 9.0 and up; scaleplan's reference model runs PyTorch's own SDPA, flash
    first (the tables' default). cuDNN measured at half flash's time everywhere: Megatron-Core's SDPA over the
    reference model's is 0.5 on Hopper and Blackwell, 1 on an A100."""
    from scaleplan.estimator.compute import sdpa_times
    from scaleplan.estimator.layout import ParallelLayout
    from scaleplan.estimator.model_dims import geometry

    frames = {"sdpa": frame(_sdpa_rows("flash", 1.0) + _sdpa_rows("cudnn", 0.5))}
    g, lay = geometry(_spec().model), ParallelLayout.from_specs([Layout(mbs=1, ckpt="none", dp=1)], 1)
    fwd = {stack: sdpa_times(Estimator.from_frames(profile, frames, stack=stack).model.context(g, lay, 96))[0]
           for stack in ("megatron", "reference")}
    assert float(fwd["megatron"][0] / fwd["reference"][0]) == pytest.approx(ratio, rel=1e-9)
