"""Kernels one MoE layer launches per micro-batch (estimator/kernel_counts.py) against a hand count of what
Megatron-Core core_v0.19.0 with Transformer Engine 2.x launches, written out launch by launch in the order
the code issues them, for the issue's fine-grained model: 128 experts, top-8, expert width 768 (SwiGLU),
FP8 with per-tensor current scaling (the emitted recipe), EP 8 so 16 local experts per rank, TP 1."""
from __future__ import annotations

import numpy as np
import pytest
from scaleplan.estimator.kernel_counts import (
    FRAMEWORK_PARTS,
    PAPER_STACK,
    STOCK_TRACE_STACK,
    counted_as_stock,
    framework_scale,
    graph_savings,
    host_framework_scale,
    kappa_delta,
    moe_layer_counts,
    named_framework_kernels,
    stack_extra_kernels,
    stock_framework_scale,
)

from scaleplan.stack import Stack

E_LOC, EP = 16, 8
CURRENT_SCALING = ["amax", "compute_scale", "cast_transpose"]  # Float8CurrentScalingQuantizer::quantize_impl


def _router_and_dispatch_fwd() -> list[str]:
    """TopKRouter.routing (unfused softmax after top-k, aux-loss scores) and the alltoall dispatcher's
    dispatch_preprocess / token_dispatch / dispatch_postprocess, forward (the gating GEMM and the token
    counts are in neither list: no stack option changes them)."""
    scores = ["topk", "softmax", "zeros(probs)", "scatter(probs)", "zeros(map)", "scatter(map)", "bool(map)"]
    aux = ["softmax(aux)", "topk(aux)", "zeros(aux map)", "scatter(aux map)"]
    # a stable argsort of T x E flags: cub's segmented radix sort, 4 passes
    permute = ["T.contiguous(map)", "sort pass 1", "sort pass 2", "sort pass 3", "sort pass 4", "mod(num_tokens)",
               "T.contiguous(probs)", "gather(probs)", "index_select(tokens)"]
    dispatch = ["all_to_all(tokens)", "all_to_all(probs)", "cat(sort chunks: tokens)", "cat(sort chunks: probs)"]
    return scores + aux + permute + dispatch


def _combine_fwd() -> list[str]:
    return ["cat(unsort chunks)", "all_to_all(output)", "zeros(restore)", "scatter_add(restore)"]


def _router_and_dispatch_bwd() -> list[str]:
    scores = ["softmax_backward", "gather(probs grad)", "zeros(topk grad)", "index_put(topk grad)"]
    aux = ["softmax_backward(aux)", "zeros(aux grad)", "index_put(aux grad)"]
    permute = ["zeros(tokens grad)", "index_add(tokens grad)", "zeros(probs grad)", "index_put(probs grad)",
               "T.contiguous(probs grad)"]
    dispatch = ["cat(sort chunks grad: tokens)", "cat(sort chunks grad: probs)", "all_to_all(tokens grad)",
                "all_to_all(probs grad)"]
    combine = ["gather(restore grad)", "all_to_all(output grad)", "cat(unsort chunks grad)"]
    return scores + aux + permute + dispatch + combine


def _grouped_mlp(per_gemm: int) -> tuple[list[str], list[str]]:
    """TEGroupedMLP with FP8: Fp8Padding of tokens and probabilities, fc1 (split_quantize per expert,
    then ``per_gemm``: E_loc cuBLAS GEMMs or one grouped kernel), the weighted SwiGLU, fc2, Fp8Unpadding."""
    quant = CURRENT_SCALING * E_LOC if per_gemm > 1 else CURRENT_SCALING  # per split vs group_quantize
    gemms = [f"gemm[{i}]" for i in range(per_gemm)]
    fwd = ["fused_multi_row_padding(tokens)", "fused_multi_row_padding(probs)",
           *quant, *gemms,                       # fc1
           "weighted_bias_swiglu",
           *quant, *gemms,                       # fc2
           "fused_multi_row_unpadding"]
    bwd = ["unpadding_backward",
           *quant, *[g + ".dgrad" for g in gemms], *[g + ".wgrad" for g in gemms],   # fc2
           "weighted_bias_swiglu_backward",
           *quant, *[g + ".dgrad" for g in gemms], *[g + ".wgrad" for g in gemms],   # fc1
           "padding_backward(tokens)", "padding_backward(probs)"]
    return fwd, bwd


def _sequential_mlp() -> tuple[list[str], list[str]]:
    """SequentialMLP with FP8: per expert, zero-pad tokens and probabilities to the recipe's alignment
    (_pad_tensor_for_quantization), then the expert's MLP: TE Linear fc1 (quantize + GEMM), weighted
    SwiGLU, TE Linear fc2; the outputs concatenated."""
    fwd, bwd = [], []
    for e in range(E_LOC):
        fwd += ["zeros(pad)", "cat(pad tokens)", "zeros(pad probs)", "cat(pad probs)",
                *CURRENT_SCALING, f"fc1[{e}]", "weighted_bias_swiglu", *CURRENT_SCALING, f"fc2[{e}]"]
        bwd += [*CURRENT_SCALING, f"fc2[{e}].dgrad", f"fc2[{e}].wgrad", "weighted_bias_swiglu_backward",
                *CURRENT_SCALING, f"fc1[{e}].dgrad", f"fc1[{e}].wgrad"]
    return fwd + ["cat(outputs)"], bwd + ["cat(split grads)"]


def _attention_quantize() -> list[str]:
    return CURRENT_SCALING * 2  # QKV input, output projection input (forward; their gradients backward)


def _counted(stack: Stack) -> tuple[float, float]:
    c = moe_layer_counts(stack, np.array([float(E_LOC)]), np.array([EP]), "fp8", glu=True)
    f, b = c.total()
    return float(f[0]), float(b[0])


@pytest.mark.parametrize("stack, experts", [
    (Stack(), _grouped_mlp(E_LOC)),                          # the paper's stack: TE GroupedLinear, per-expert GEMMs
    (Stack(grouped_gemm="grouped"), _grouped_mlp(1)),        # TE >= 2.17 grouped-tensor path: one kernel per call
    (Stack(experts="sequential"), _sequential_mlp()),        # SequentialMLP: a TE Linear per expert
])
def test_moe_layer_kernels_match_a_hand_count_of_megatron_core(stack, experts):
    fwd = _router_and_dispatch_fwd() + experts[0] + _combine_fwd() + _attention_quantize()
    bwd = _router_and_dispatch_bwd() + experts[1] + _attention_quantize()
    assert _counted(stack) == (len(fwd), len(bwd))


def test_the_grouped_kernel_launches_the_same_gemms_whatever_the_local_experts():
    """One grouped kernel per projection and pass: the count does not grow with E_loc; per-expert GEMMs
    add 6 per local expert (fc1 and fc2: forward, data and weight gradient) and, with current scaling, 12
    quantize kernels (3 per split, fc1 and fc2, forward and backward)."""
    E = np.array([4.0, 16.0, 64.0])
    grouped = moe_layer_counts(Stack(grouped_gemm="grouped"), E, np.full(3, 8), "fp8")
    loop = moe_layer_counts(Stack(), E, np.full(3, 8), "fp8")
    g, lp = np.add(*grouped.total()), np.add(*loop.total())
    assert np.ptp(g) == 0
    np.testing.assert_array_equal(np.diff(lp) / np.diff(E), [6 + 12, 6 + 12])


KAPPA0 = 642.0  # the law's (estimator/dispatch.py): traced kernels per layer and micro-batch, full recompute


def test_the_laws_kappa0_is_the_named_framework_kernels_times_their_traced_launches():
    # the paper's stack at EP 8, 16 local experts, in full-recompute units (2 forward + backward): attention
    # 2x8+12, gating 2x3+4, token counts 2x7, top-k 2x11+7, permute 2x9+5, all-to-alls and chunk sorts
    # 2x6+6, unpermute 2x2+1, weighted SwiGLU 2x1+1
    named = 28 + 10 + 14 + 29 + 23 + 18 + 5 + 3
    assert named_framework_kernels(Stack(), np.array([16.0]), np.array([8]))[0] == named
    assert framework_scale(KAPPA0) == pytest.approx(KAPPA0 / named)


def test_kappa_delta_is_zero_on_the_laws_own_stack_and_removes_the_per_expert_gemms():
    E, ep = np.array([16.0, 128.0]), np.array([8, 1])
    np.testing.assert_array_equal(kappa_delta(Stack(), E, ep, "bf16", KAPPA0), 0.0)
    # the law's kappa1 counts 7.29 kernels per local expert (traces); the per-expert GEMMs are 8 of them
    # in full-recompute units (fc1, fc2: forward twice, data and weight gradients), single C++ launches:
    # the grouped kernel leaves 8 per layer whatever E_loc
    np.testing.assert_array_equal(kappa_delta(Stack(grouped_gemm="grouped"), E, ep, "bf16", KAPPA0), 8 - 8 * E)
    # fusing the router takes 2x(11-2)+(7-2) = 23 named kernels and what the traces count with each
    fused = kappa_delta(Stack(router_fusion=True), E, ep, "bf16", KAPPA0)
    np.testing.assert_allclose(fused, -23 * framework_scale(KAPPA0))
    assert "expert_gemms" not in FRAMEWORK_PARTS and "fp8_quantize" not in FRAMEWORK_PARTS


def test_stock_launches_per_named_kernel_are_the_published_profiles():
    """Megatron-Bridge's rank-0 Nsight profile of one step of its H100 BF16 V1 Qwen3-30B-A3B workload holds 463,348
    kernels: 48 layers x 64 micro-batches, no recompute. The host issues, per layer and micro-batch, the named
    framework kernels of attention 8 + 12, the fused permutation 4 + 1, HybridEP's dispatch and combine 4 + 4, the
    unpermutation 1 + 1 and the weighted SwiGLU 1 + 1 (the gating GEMM, the token counts and the fused top-k replay
    in the moe_router and moe_preprocess graphs: 2 graphs x 2 passes), and 8 local experts' fc1 and fc2 GEMMs,
    forward 16, data and weight gradients 32."""
    issued, gemms, graphs = 20 + 5 + 8 + 2 + 2, 16 + 32, 4
    assert stock_framework_scale() == pytest.approx((463_348 / (48 * 64) - gemms - graphs) / issued)
    assert 2.0 < stock_framework_scale() < framework_scale(KAPPA0) / 1.5


def test_the_host_counts_the_profiled_stacks_launches_near_the_profile():
    """The law's count on the paper's stack plus what the profiled stack issues beyond it (full-recompute units,
    then no recompute's 3/4 of them: estimator/ckpt.py) lands within 10% of the profile's 151 per layer and
    micro-batch (its forward share and the law's 7.29 launches per local expert against the 8 GEMMs named)."""
    E, ep = np.array([8.0]), np.array([16])
    per_moe, _ = stack_extra_kernels(STOCK_TRACE_STACK, PAPER_STACK, E, ep, "bf16", KAPPA0)
    law = KAPPA0 + 7.29 * 8
    assert 0.75 * (law + per_moe[0]) == pytest.approx(463_348 / (48 * 64), rel=0.10)


def test_a_spec_stack_launches_as_stock_megatron_core_beside_the_papers_law_only():
    fused = Stack(router_fusion=True)
    assert counted_as_stock(fused, PAPER_STACK) and not counted_as_stock(PAPER_STACK, PAPER_STACK)
    assert host_framework_scale(fused, PAPER_STACK, KAPPA0) == stock_framework_scale()
    # a law traced on the user's own stack counts their framework's launches for every stack
    own = Stack(permute_fusion=True)
    assert not counted_as_stock(fused, own) and host_framework_scale(fused, own, KAPPA0) == framework_scale(KAPPA0)
    # the fused router's stack names 130 - 23 framework kernels (full-recompute units, EP 8, 16 local experts): at
    # the stock scale it issues that many at s each, where the law counts the paper's 130 at its own scale
    E, ep, s = np.array([16.0]), np.array([8]), stock_framework_scale()
    np.testing.assert_allclose(kappa_delta(fused, E, ep, "bf16", KAPPA0, scale=s),
                               s * 107 - framework_scale(KAPPA0) * 130)


def test_cuda_graphs_save_the_host_launches_of_what_they_capture():
    c = moe_layer_counts(Stack(), np.array([16.0]), np.array([8]), "bf16")
    s = framework_scale(KAPPA0)
    none = graph_savings(Stack(), c, KAPPA0)
    router = graph_savings(Stack(cuda_graphs=("moe_router",)), c, KAPPA0)
    both = graph_savings(Stack(cuda_graphs=("moe_router", "moe_preprocess")), c, KAPPA0)
    # the router's gating GEMM (3 forward, 4 backward) and score kernels (11, 7): 2 x 14 + 11 named kernels in
    # full-recompute units with their traced launches, less the graph launches (forward twice, backward once)
    assert none == 0 and router == pytest.approx(s * (2 * 14 + 11) - 3)
    assert both == pytest.approx(router + s * 2 * 7 - 3)
    # a dense layer's MLP graph does not apply to an MoE layer, nor the MoE modules to a dense one
    assert graph_savings(Stack(cuda_graphs=("mlp",)), c, KAPPA0) == 0
    assert graph_savings(Stack(cuda_graphs=("moe_router",)), c, KAPPA0, moe_layer=False) == 0
    # FP8's attention quantize kernels leave the host with the attention graph, one launch each
    c8 = moe_layer_counts(Stack(), np.array([16.0]), np.array([8]), "fp8")
    attn8 = graph_savings(Stack(cuda_graphs=("attn",)), c8, KAPPA0)
    attn = graph_savings(Stack(cuda_graphs=("attn",)), c, KAPPA0)
    assert attn8 - attn == pytest.approx(3 * 2 * 3)  # 2 inputs x 3 kernels (current scaling), 2 fwd + 1 bwd


def test_mxfp8_experts_quantize_each_split_and_swizzle_the_weights_scales_once_per_call():
    """MXFP8 on the per-expert path (TE 2.14 to main): split_quantize bulk-allocates the splits, then
    multi_tensor_quantize_impl, whose fused kernel serves delayed scaling only, calls nvte_quantize_v2 once per
    split (row- and column-wise in one kernel); general_grouped_gemm swizzles the cached weights' scales in one
    multi-tensor kernel per call that reads them (forward, data gradient), the activations and gradients being
    quantized in the GEMM's layout (optimize_for_gemm). The attention's QKV and output projection: one quantize
    and one swizzle each way."""
    quant = ["mxfp8_quantize"] * E_LOC
    gemms = [f"gemm[{i}]" for i in range(E_LOC)]
    fwd = ["fused_multi_row_padding(tokens)", "fused_multi_row_padding(probs)",
           *quant, "swizzle(fc1 weights)", *gemms, "weighted_bias_swiglu",
           *quant, "swizzle(fc2 weights)", *gemms, "fused_multi_row_unpadding"]
    bwd = ["unpadding_backward",
           *quant, "swizzle(fc2 weights)", *[g + ".dgrad" for g in gemms], *[g + ".wgrad" for g in gemms],
           "weighted_bias_swiglu_backward",
           *quant, "swizzle(fc1 weights)", *[g + ".dgrad" for g in gemms], *[g + ".wgrad" for g in gemms],
           "padding_backward(tokens)", "padding_backward(probs)"]
    attention = ["quantize(qkv in)", "swizzle(qkv weight)", "quantize(proj in)", "swizzle(proj weight)"]
    want_f = _router_and_dispatch_fwd() + fwd + _combine_fwd() + attention
    want_b = _router_and_dispatch_bwd() + bwd + attention
    assert _counted(Stack(fp8_recipe="mxfp8")) == (len(want_f), len(want_b))


def _aten_kernels(fn) -> int:
    """ATen ops that write a tensor (views left out) dispatched while ``fn`` runs: the kernels a GPU would launch."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += not func.is_view
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


@pytest.mark.parametrize("E_loc", [1, 4, 16])
@pytest.mark.parametrize("probs_dtype", ["bfloat16", "float32"])
def test_expert_bias_kernels_are_what_megatron_cores_apply_bias_dispatches(E_loc, probs_dtype):
    """TEGroupedMLP._apply_bias (core_v0.19.0 experts.py) as Megatron-Core writes it, run on CPU under a dispatch
    counter, forward and backward, with bf16 and with fp32 routing probabilities; the count adds the 2 E_loc main_grad accumulations of fc1's and fc2's biases
    (DistributedDataParallel's backward hook, which this bare run has no buffers for)."""
    from scaleplan.estimator.kernel_counts import expert_bias_kernels

    torch = pytest.importorskip("torch")
    sizes = [3 + i for i in range(E_loc)]
    out = torch.randn(sum(sizes), 8, dtype=torch.bfloat16, requires_grad=True)
    biases = [torch.randn(8, dtype=torch.bfloat16, requires_grad=True) for _ in range(E_loc)]
    probs = torch.rand(sum(sizes), dtype=getattr(torch, probs_dtype), requires_grad=True).unsqueeze(-1)

    def apply_bias():
        shape = out.shape
        return torch.cat([t + b * p for t, b, p in zip(torch.split(out.view(-1, shape[-1]), sizes), biases,
                                                      torch.split(probs, sizes))]).view(shape).to(out.dtype)

    y = []
    fwd = _aten_kernels(lambda: y.append(apply_bias()))
    grad = torch.ones_like(y[0])
    bwd = _aten_kernels(lambda: y[0].backward(grad))
    widened = probs_dtype == "float32"  # fp32 probabilities on a bf16 model (--moe-router-dtype fp32)
    assert float(expert_bias_kernels(E_loc, widened)) == 2 * fwd + bwd + 2 * E_loc
