"""`validate --trace` attribution: the rule table on CPU op names and CUDA kernel
names, and a profiled CPU step of a tiny model attributed to every component it runs."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch.profiler import ProfilerActivity, profile

from scaleplan.reference import model as vmodel
from scaleplan.reference.optim import MasterAdamW
from scaleplan.specs import parse_spec
from scaleplan.validate import trace as vtrace

# (name, region) -> component, written from what each op or kernel computes
CASES = [
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention", "attention"),
    ("aten::_scaled_dot_product_flash_attention_backward", None, "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", None, "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", None, "attention"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", None, "attention"),
    ("aten::mm", "attention", "dense GEMMs"),
    ("aten::mm", "shared_expert", "dense GEMMs"),
    ("aten::mm", "head", "LM head + CE"),
    ("aten::mm", "experts", "expert GEMMs"),
    ("aten::_grouped_mm", "experts", "expert GEMMs"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "attention", "dense GEMMs"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "head", "LM head + CE"),
    ("void cutlass::device_kernel<at::cuda::detail::GroupedGemmKernel<...>>", None, "expert GEMMs"),
    ("aten::_log_softmax", "head", "LM head + CE"),
    ("aten::nll_loss_backward", "head", "LM head + CE"),
    ("aten::topk", "router", "router/permute"),
    ("aten::sigmoid", "router", "router/permute"),
    ("aten::index_add", None, "router/permute"),
    ("aten::argsort", None, "router/permute"),
    ("void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long>", None, "router/permute"),
    ("aten::native_layer_norm", None, "element-wise"),
    ("aten::silu_backward", "experts", "element-wise"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", None, "element-wise"),
    ("aten::_fused_adamw_", "optimizer", "optimizer"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", None, "optimizer"),
    ("aten::copy_", "optimizer", "optimizer"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", None, "collectives"),
    ("c10d::allreduce_", None, "collectives"),
    ("gloo:all_reduce", "bias_update", "collectives"),
    ("aten::bincount", "bias_update", "router/permute"),
]


@pytest.mark.parametrize("name,region,component", CASES)
def test_rule_table(name, region, component):
    assert vtrace.classify(name, region) == component


MODEL = {"n_layers": 2, "hidden_sz": 64, "inter_sz": 160, "n_q_heads": 4, "n_kv_heads": 2, "head_dim": 16,
         "vocab_sz": 512, "precision": "fp32",
         "moe": {"n_experts": 8, "experts_per_token": 2, "expert_inter_sz": 40, "shared_expert_inter_sz": 40,
                 "first_dense_layers": 1}}


def _profiled(impl: str | None, ckpt: str = "none"):
    sp = parse_spec({"model": MODEL, "hardware": {"node_type": "cpu-local"}})
    torch.manual_seed(0)
    model = vmodel.build_model(sp.model, ckpt, "cpu", torch.float32)
    for b in model.blocks:
        if b.is_moe:
            b.ffn.impl = impl
    opt = MasterAdamW(model.parameters())
    tok = torch.randint(0, 512, (2, 32))
    vmodel.TRACE_SCOPES["on"] = True
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            import time

            t0 = time.perf_counter()
            opt.zero_grad()
            model(tok, tok).backward()
            with vmodel.scope("optimizer"):
                opt.step()
            wall = time.perf_counter() - t0
    finally:
        vmodel.TRACE_SCOPES["on"] = False
    return prof.events(), wall


@pytest.mark.parametrize("impl,ckpt", [("torch_grouped_mm", "none"), ("loop", "full")])
def test_cpu_step_is_attributed_to_every_component_it_runs(impl, ckpt):
    events, wall = _profiled(impl, ckpt)
    got = vtrace.attribute(events, wall, "cpu")
    comp = got["components_s"]
    assert set(comp) == set(vtrace.COMPONENTS)
    for c in ("attention", "dense GEMMs", "expert GEMMs", "router/permute", "element-wise", "LM head + CE",
              "optimizer"):
        assert comp[c] > 0, c
    assert comp["collectives"] == 0.0  # one process: nothing communicates
    assert sum(comp.values()) == pytest.approx(wall, rel=1e-6)  # host gaps close the step
    assert {"attention", "router", "experts", "dense_ffn", "shared_expert", "head", "optimizer"} <= set(
        got["regions_found"])
    # backward GEMMs inherit their forward op's region through autograd's sequence numbers:
    # the expert GEMMs' names are the grouped kernel or, for the loop, plain mm in the experts region
    names = [n for n, _ in got["top_ops"]["expert GEMMs"]]
    assert ("aten::_grouped_mm" in names) if impl == "torch_grouped_mm" else ("aten::mm" in names)
    # the LM head's forward and backward GEMMs: 2 T d V FLOP forward, twice that backward; they land in
    # LM head + CE, not in dense GEMMs
    assert "aten::mm" in [n for n, _ in got["top_ops"]["LM head + CE"]]
    # every op with its calls: the per-op seconds add up to each component's, and every call is counted
    # (the grouped GEMM or the loop's mm run 3 times per expert GEMM per MoE layer: forward, grad of the
    # input, grad of the weight; the model has MoE layers, so at least 3 expert-GEMM calls per step)
    ops = got["ops"]
    for c in vtrace.COMPONENTS:
        if c != "host gaps/idle":
            assert sum(t for cc, _, t, _ in ops if cc == c) == pytest.approx(comp[c], rel=1e-9, abs=1e-12), c
    assert all(n >= 1 for *_, n in ops)
    assert sum(n for c, _, _, n in ops if c == "expert GEMMs") >= 3


def test_predicted_components_sum_the_estimators_breakdown():
    bd = {"attn_proj": 1.0, "sdpa": 2.0, "experts": 3.0, "router": 0.5, "permute": 0.25, "shared_expert": 0.5,
          "ep_a2a": 0.0, "dense_mlp": 1.5, "elementwise": 0.75, "framework_kernels": 0.25, "dp_comm": 0.4,
          "bias_sync": 0.1, "dispatch_floor": 4.0, "bubble": 0.0, "vocab": 1.25, "optimizer": 0.3}
    p = vtrace.predicted_components(bd)
    assert p == {"attention": 2.0, "dense GEMMs": 3.0, "expert GEMMs": 3.0, "router/permute": 0.75,
                 "element-wise": 1.0, "LM head + CE": 1.25, "collectives": 0.5, "optimizer": 0.3,
                 "host gaps/idle": 4.0}
    assert sum(p.values()) == pytest.approx(sum(bd.values()))
    rows = vtrace.component_table({"attention": 1.0}, p)
    assert rows[0] == {"component": "attention", "measured_s": 1.0, "predicted_s": 2.0, "error": 1.0}


class _Evt:
    """The FunctionEvent fields attribute() reads, for a CUDA trace written by hand; ``kernels`` are the
    (name, microseconds) the profiler attached to a CPU op; no linked_correlation_id (torch 2.11 has none)."""

    def __init__(self, name, device, self_us=0.0, span_us=0.0, annotation=False, parent=None, kernels=()):
        self.name, self.device_type, self.sequence_nr, self.cpu_parent = name, device, -1, parent
        self.self_device_time_total, self.self_cpu_time_total = self_us, self_us
        self.is_user_annotation = annotation
        self.kernels = [type("K", (), {"name": n, "duration": d})() for n, d in kernels]
        self.time_range = type("R", (), {"elapsed_us": staticmethod(lambda: span_us)})()


def test_cuda_device_time_is_counted_once():
    """On CUDA each kernel counts once: through the op that launched it (its self device time), or, when
    no op holds it (NCCL on the communication threads), by its name; the profiler's mirror of every
    record_function scope on the GPU timeline (sp::router, ProfilerStep#n) counts nothing. An H200
    trace (torch 2.11) counted scopes' spans and every kernel a second time: element-wise 0.51 s, the
    grouped GEMM kernel as a dense GEMM beside aten::_grouped_mm, host gaps/idle 0 of a 0.63 s step."""
    scope = _Evt("sp::router", "DeviceType.CPU")
    topk = _Evt("aten::topk", "DeviceType.CPU", self_us=300.0, parent=scope, kernels=[("topk_kernel", 300.0)])
    gmm = _Evt("aten::_grouped_mm", "DeviceType.CPU", self_us=900.0, kernels=[("cutlass_GroupProblemShape", 900.0)])
    device = [_Evt("topk_kernel", "DeviceType.CUDA", span_us=300.0),
              _Evt("cutlass_GroupProblemShape", "DeviceType.CUDA", span_us=900.0),
              _Evt("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "DeviceType.CUDA", span_us=200.0),  # no op holds it
              _Evt("sp::router", "DeviceType.CUDA", span_us=5000.0, annotation=True),
              _Evt("ProfilerStep#3", "DeviceType.CUDA", span_us=9000.0)]  # an older build: no flag, by name
    out = vtrace.attribute([scope, topk, gmm, *device], wall_s=0.01, device="cuda")
    got = out["components_s"]
    # per op: a launched kernel has its op's calls; NCCL work no op launched has none to count
    ops = {n: (t, calls) for _, n, t, calls in out["ops"]}
    assert ops["aten::topk"] == (pytest.approx(300e-6), 1)
    assert ops["ncclDevKernel_AllReduce_Sum_bf16_RING_LL"] == (pytest.approx(200e-6), None)
    assert got["router/permute"] == pytest.approx(300e-6)
    assert got["expert GEMMs"] == pytest.approx(900e-6)
    assert got["dense GEMMs"] == 0.0 and got["element-wise"] == 0.0
    assert got["collectives"] == pytest.approx(200e-6)
    assert got["host gaps/idle"] == pytest.approx(0.01 - 1400e-6)


def test_chrome_totals_read_the_device_work_of_a_saved_trace(tmp_path):
    """The second reading of a CUDA trace: kernels, memcpy and memset count as device time, the GPU mirror
    of a record_function scope and the CPU ops do not; overlapping kernels (two streams) count in full in
    device_s and once in busy_s; launches are the runtime/driver launch calls. Two steps: per-step values."""
    import json

    ev = [
        {"ph": "X", "cat": "kernel", "name": "gemm_a", "ts": 100.0, "dur": 40.0},
        {"ph": "X", "cat": "kernel", "name": "nccl_b", "ts": 120.0, "dur": 40.0},   # overlaps gemm_a by 20 us
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 200.0, "dur": 10.0},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset", "ts": 220.0, "dur": 6.0},
        {"ph": "X", "cat": "kernel", "name": "gemm_a", "ts": 300.0, "dur": 24.0},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "sp::router", "ts": 90.0, "dur": 500.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 80.0, "dur": 30.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 85.0, "dur": 5.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernelExC", "ts": 95.0, "dur": 5.0},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "ts": 98.0, "dur": 5.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 190.0, "dur": 5.0},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "ts": 100.0},
    ]
    path = tmp_path / "rank0.pt.trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    got = vtrace.chrome_totals(path, steps=2)
    assert got["kernels"] == pytest.approx(3 / 2)
    assert got["launches"] == pytest.approx(3 / 2)
    assert got["device_s"] == pytest.approx((40 + 40 + 10 + 6 + 24) * 1e-6 / 2)
    assert got["busy_s"] == pytest.approx((60 + 10 + 6 + 24) * 1e-6 / 2)


def test_a_cpu_trace_holds_no_device_work(tmp_path):
    """validate --trace on a CPU: the saved trace's totals are 0 (the CLI prints no trace check)."""
    import json

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 9}]}))
    assert vtrace.chrome_totals(path, steps=1) == {"kernels": 0.0, "launches": 0.0, "device_s": 0.0, "busy_s": 0.0}
