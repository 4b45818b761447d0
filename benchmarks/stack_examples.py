"""Fine-grained FP8 and wide-expert MoE models on today's training stacks (prints figures; asserts nothing):
step time uncalibrated, its breakdown, and memory per GPU at published layouts (Megatron-Bridge performance
recipes, NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs: qwen3 and gpt_oss workload base configs).

1. Qwen3-30B-A3B (128 experts, top-8, expert width 768) on 8 B200, EP 8 (16 local experts per rank), micro-batch
   4, sequence 4096, FP8: the paper's stack with per-tensor current scaling, and the published stack (HybridEP,
   CUDA graphs over attention, router and preprocess, MXFP8).
2. GPT-OSS-120B on 64 B200 at EP 8, micro-batch 4, sequence 4096, global batch 1280: the paper's stack without
   recompute (the issue's example), and the published B200 V2 recipe (PP 1, the all-to-all dispatcher, permute
   and router fusion, gradients reduced in bf16, TE's cross-entropy, --recompute-modules layernorm moe_act) in
   bf16 and MXFP8; on 64 H100 the published H100 V2 recipe (PP 4, EP 8, micro-batch 1, the same stack).
3. Qwen3-235B-A22B on 256 B200 at PP 8 (the embedding and the loss counted in the split: 11 + 6 x 12 + 11 layers),
   EP 8, micro-batch 1, sequence 4096, global batch 8192 (256 micro-batches per pipeline), MXFP8: the published
   B200 V2 workload; and on 256 H100 the H100 V2 workload (TP 2, PP 8 x VP 4, EP 32, FP8 tensorwise, the
   all-to-all overlapped with --overlap-moe-expert-parallel-comm, estimator/ep_overlap.py).
4. DeepSeek-V3 on 256 B200, MXFP8: the published B200 V2 workload (PP 8 x VP 2 with its layout string's 8 + 6 x 8
   + 5 layers and the MTP layer last, EP 32, micro-batch 1, global batch 4096, DeepEP, the all-to-all overlapped,
   CUDA graphs over attention, router and preprocess, --recompute-modules mla_up_proj mlp).

5. The same models at the other layouts Megatron-Bridge published on B200 for earlier containers, each with its
   container's stack (:data:`OTHER_LAYOUTS`): DeepSeek-V3 at PP 16 EP 8, GPT-OSS-120B at EP 64 (eight nodes),
   Qwen3-30B-A3B at micro-batch 1. Their MAPE is printed apart from the seven 26.04.01 rows and with them.
6. The same table's GB200 runs of these models (:data:`GB200_RUNS`), on a profile with no measured table; a job of
   256 GB200 takes 64 GPUs of each rack, as the launcher's --segment places it (ClusterProfile.job_domain); and the
   26.06 container's GB200 runs, the whole step one CUDA graph (:data:`CAPTURED_RUNS`).
7. Qwen3-30B-A3B on 16 H100 in bf16 as Megatron-Bridge's controlled comparisons measured it (:data:`H100_RUNS`):
   HybridEP or the all-to-all dispatcher, the all-to-all overlapped or not, CUDA graphs or eager.
8. The same table's B300 and GB300 runs of the four models and Kimi-K2's GB300 run (:data:`BLACKWELL_ULTRA_RUNS`),
   on profiles with no measured table: their kernels the B200's rows scaled to their datasheets.
9. The 26.06 container's B300 and GB300 rows that run a new stack or layout (:data:`ULTRA_26_06_RUNS`): the step
   captured on GB300 and B300 (as the GB200's 26.06 rows), GPT-OSS-120B in MXFP8 on B300.
10. Rows of the archive's earlier containers that differ from a row above in one stated choice (:data:`ARCHIVE_PAIRS`):
   a dispatcher, a part, or virtual stages.

Then a diagnostic scan, applied to nothing: every published row with the dispatch law's host seconds scaled by
a factor f (:func:`host_scan`), which shows how much of each row's error the host side can account for.

    python benchmarks/stack_examples.py --db URL-with-the-recorded-and-own-tables [--json]

The database needs ../shared/recorded/dmlc-scaleplan (`scaleplan db import-scaleplan`) and scaleplan's own
tables (`scaleplan db import-recorded`) for the H100.
"""
from __future__ import annotations

import argparse
import json

from scaleplan.estimator import Estimator
from scaleplan.estimator.kernel_counts import STOCK_TRACE_STACK

from scaleplan.catalogue import spec_data
from scaleplan.megatron.pipeline_split import LAYOUT_FIELD, stated_split
from scaleplan.specs import Layout, parse_spec


def _with_mbs(over: dict, mbs: int) -> dict:
    """Spec overrides ``over`` with their data block's micro-batch size set to ``mbs`` (the run's layout's)."""
    return {**over, "data": {**over["data"], "microbatch_sz": mbs}}


def _split(model: str, pp: int, layout: str | None = None) -> dict:
    """The first and last pipeline stage's decoder layers of a recipe's run of catalogue ``model`` on ``pp`` stages,
    as Megatron-LM reads them (scaleplan.megatron.pipeline_split.stated_split): from its
    --pipeline-model-parallel-layout string ``layout``, else from the embedding and the loss counted in the split
    (the Qwen3 recipes' account_for_embedding/loss_in_pipeline_split)."""
    m = spec_data(model)["model"]
    args = {"num_layers": m["n_layers"], "mtp_num_layers": m.get("mtp_layers", 0)}
    if layout:
        args[LAYOUT_FIELD] = layout
    else:
        args.update(account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    first, last = stated_split(args, pp, "stack_examples")
    return {"decoder_first_pipeline_num_layers": first, "decoder_last_pipeline_num_layers": last}


# Megatron-Bridge's DeepSeek-V3 layouts (recipes/deepseek/deepseek_v3.py set_deepseek_v3_pipeline_model_parallel_layout:
# 16 chunks for PP x VP 16 x 1, 8 x 2, 4 x 4 and the performance scripts' 2 x 8; the PP 8 x 1 map) and Kimi-K2's (4, 4)
# (recipes/kimi/kimi_k2.py _get_kimi_k2_pipeline_layout), in Megatron-LM's layout syntax
DSV3_LAYOUT, DSV3_PP8_LAYOUT = "Et*4|(t*4|)*14tmL", "Et*8|(t*8|)*6t*5mL"
KIMI_K2_LAYOUT = "Et*4|(t*4|)*14tL"


QWEN_FP8 = {"model": {"precision": "fp8"}, "data": {"gbs": 512, "seqlen": 4096, "microbatch_sz": 4}}
# every published stack: Megatron-Bridge's performance overrides turn the loss's NaN check off
# (utils/overrides.py _set_common_perf_overrides: rerun_state_machine.check_for_nan_in_loss = False); the Qwen3 and
# GPT-OSS bridges leave --moe-router-dtype unset (router_dtype "model"), DeepSeek-V3's sets fp32
# Megatron-Bridge: the qwen3 recipe (moe_permute_fusion), set_qwen3_common_configs (router fusion, grad_reduce_in_fp32
# off, no recompute), the B200 workload (HybridEP, TE CUDA graphs over attn, moe_router, moe_preprocess) and
# bf16_with_mxfp8_mixed (MXFP8 with FP8 primary weights, fp8_param_gather); every performance run gets Transformer
# Engine's cross-entropy (utils/overrides.py: cross_entropy_fusion_impl "te", since 2025-11)
PUBLISHED_QWEN = {"dispatcher": "hybridep", "cuda_graphs": ["attn", "moe_router", "moe_preprocess"],
                  "fp8_recipe": "mxfp8", "fp8_param": True, "permute_fusion": True, "router_fusion": True,
                  "grads_fp32": False, "cross_entropy": "te", "nan_check": False, "router_dtype": "model"}
GPT_OSS = {"data": {"gbs": 1280, "seqlen": 4096, "microbatch_sz": 4}}
# Megatron-Bridge: the gpt_oss recipe (moe_permute_fusion; the all-to-all dispatcher), set_gpt_oss_common_configs
# (router fusion, grad_reduce_in_fp32 off), TE's cross-entropy, and the B200 V2 / H100 V2 workloads
# (recompute_modules layernorm and moe_act: selective with those modules, core attention not recomputed; B200 EP 8
# micro-batch 4, H100 PP 4 micro-batch 1). HybridEP is the B300 V2 workload's, not the B200's.
PUBLISHED_GPT_OSS = {"permute_fusion": True, "router_fusion": True, "grads_fp32": False, "cross_entropy": "te",
                     "recompute_modules": ["layernorm", "moe_act"], "nan_check": False, "router_dtype": "model"}
# its MXFP8 runs: the spec's precision and the stack's recipe (bf16_with_mxfp8_mixed: FP8 primary weights)
GPT_OSS_FP8 = {**GPT_OSS, "model": {"precision": "fp8"}}
MXFP8 = {"fp8_recipe": "mxfp8", "fp8_param": True}

# the H100 FP8 workload (16 GPUs, EP 16, micro-batch 1, global batch 1024, HybridEP, no CUDA graphs) and
# bf16_with_fp8_current_scaling_mixed (tensorwise, FP8 primary weights; first/last layers bf16 off in the perf config)
PUBLISHED_QWEN_H100 = {"dispatcher": "hybridep", "fp8_param": True, "permute_fusion": True, "router_fusion": True,
                       "grads_fp32": False, "cross_entropy": "te", "nan_check": False, "router_dtype": "model"}
# the Qwen3-235B-A22B B200 V2 workload (qwen3_workload_base_configs: PP 8, EP 8, GBS 8192, moe_a2a_overlap off;
# qwen3_235b_a22b_pretrain_config: permute fusion, grouped GEMM, the embedding and loss counted in the pipeline
# split, no recompute, no CUDA graphs; qwen3_llm_pretrain: the all-to-all dispatcher on B200, router fusion,
# gradients reduced in bf16; bf16_with_mxfp8_mixed)
QWEN_235B = {"model": {"precision": "fp8"}, "data": {"gbs": 8192, "seqlen": 4096, "microbatch_sz": 1}}
PUBLISHED_QWEN_235B = {"permute_fusion": True, "router_fusion": True, "grads_fp32": False, "cross_entropy": "te",
                       "fp8_recipe": "mxfp8", "fp8_param": True, "nan_check": False, "router_dtype": "model"}
# the H100 V2 workload (TP 2, PP 8, VP 4, EP 32, moe_a2a_overlap: --overlap-moe-expert-parallel-comm and
# --delay-wgrad-compute, the shared expert's overlap off; the all-to-all dispatcher; bf16_with_fp8_current_scaling_mixed
# with FP8 primary weights)
PUBLISHED_QWEN_235B_H100 = {**PUBLISHED_QWEN_235B, "fp8_recipe": "tensorwise", "a2a_overlap": True,
                            "shared_expert_overlap": False}
# DeepSeek-V3 B200 FP8_MX V2 (deepseek_workload_base_configs: PP 8, VP 2, EP 32, GBS 4096, DeepEP, moe_a2a_overlap,
# CUDA graphs attn / moe_router / moe_preprocess, recompute_modules mla_up_proj mlp, layout "Et*4|(t*4|)*14tmL";
# set_deepseek_v3_common_configs: router fusion, selective recompute, grads in bf16; the deepseek_v3 recipe: permute
# fusion, TE's cross-entropy, one MTP layer; bf16_with_mxfp8_mixed)
DSV3 = {"model": {"precision": "fp8"}, "data": {"gbs": 4096, "seqlen": 4096, "microbatch_sz": 1}}
PUBLISHED_DSV3 = {"permute_fusion": True, "router_fusion": True, "grads_fp32": False, "cross_entropy": "te",
                  "fp8_recipe": "mxfp8", "fp8_param": True, "dispatcher": "deepep", "a2a_overlap": True,
                  "shared_expert_overlap": False, "cuda_graphs": ["attn", "moe_router", "moe_preprocess"],
                  "recompute_modules": ["mla_up_proj", "mlp"], "nan_check": False}
# Published throughput (tokens / s / GPU) of these runs: Megatron-Bridge docs/fern/versions/0.4.2/pages/
# performance-summary.mdx, 26.04.01 NeMo container (DGX-B200, DGX-H100); step = GBS x seqlen / (GPUs x tokens/s/GPU)
PUBLISHED_TOKENS_PER_GPU_S = {"qwen3-30b-a3b fp8, published stack": 27136,
                              "qwen3-30b-a3b fp8 16 H100, published stack": 8960,
                              "gpt-oss-120b bf16 64 B200, published stack": 13568,
                              "gpt-oss-120b bf16 64 H100, published stack, PP 4": 5824,
                              "qwen3-235b-a22b mxfp8 256 B200, published stack, PP 8": 3776,
                              "qwen3-235b-a22b fp8 256 H100, published stack, PP 8 x VP 4": 1712,
                              "deepseek-v3 mxfp8 256 B200, published stack, PP 8 x VP 2": 3328,
                              # the archive's earlier containers (OTHER_LAYOUTS)
                              "deepseek-v3 mxfp8 256 B200, 26.04 stack, PP 16": 2815,
                              "gpt-oss-120b bf16 64 B200, 26.02 stack, EP 64": 8047,
                              "qwen3-30b-a3b mxfp8 8 B200, 26.02 stack, micro-batch 1": 9691,
                              # GB200 (GB200_RUNS), the 26.04.01 container
                              "qwen3-30b-a3b mxfp8 8 GB200": 26112,
                              "gpt-oss-120b bf16 64 GB200, EP 64, a2a overlap": 16640,
                              "qwen3-235b-a22b mxfp8 256 GB200, PP 8 x VP 3, EP 32": 5680,
                              "deepseek-v3 mxfp8 256 GB200, PP 4 x VP 4, EP 64": 4256,
                              # the 26.06 container's GB200 rows (CAPTURED_RUNS; the archive at v0.6.0)
                              "qwen3-30b-a3b mxfp8 8 GB200, 26.06, step captured": 40706,
                              "qwen3-235b-a22b mxfp8 256 GB200, 26.06, step captured": 7376,
                              "deepseek-v3 mxfp8 256 GB200, 26.06, step captured": 4969,
                              "gpt-oss-120b mxfp8 64 GB200, 26.06, step captured": 28947,
                              # B300 and GB300, the 26.04.01 container (BLACKWELL_ULTRA_RUNS)
                              "qwen3-30b-a3b mxfp8 8 B300": 30720,
                              "qwen3-30b-a3b mxfp8 8 GB300": 31744,
                              "gpt-oss-120b bf16 64 B300, EP 8, HybridEP": 15232,
                              "gpt-oss-120b bf16 64 GB300, EP 64": 19200,
                              "qwen3-235b-a22b mxfp8 256 B300, PP 8, micro-batch 2": 5936,
                              "qwen3-235b-a22b mxfp8 256 GB300, PP 4 x VP 12, EP 32": 6944,
                              "deepseek-v3 mxfp8 256 B300, PP 8, EP 8": 3456,
                              "deepseek-v3 mxfp8 256 GB300, PP 2 x VP 8, EP 32": 4992,
                              "kimi-k2 mxfp8 256 GB300, PP 4 x VP 4, EP 64, Muon": 5328,
                              # B300 and GB300, the 26.06 container (ULTRA_26_06_RUNS; the archive at v0.6.0)
                              "qwen3-30b-a3b mxfp8 8 GB300, 26.06, step captured": 45275,
                              "qwen3-30b-a3b mxfp8 8 B300, 26.06, step captured": 40769,
                              "qwen3-235b-a22b mxfp8 256 GB300, 26.06, step captured": 9015,
                              "deepseek-v3 mxfp8 256 GB300, 26.06, step captured": 6338,
                              "deepseek-v3 mxfp8 256 GB300, 26.06, step captured, GBS 15360": 6422,
                              "gpt-oss-120b mxfp8 64 GB300, 26.06, step captured, EP 16": 33166,
                              "gpt-oss-120b mxfp8 64 B300, 26.06, EP 8, HybridEP": 18534,
                              # the archive's earlier containers on B300, GB200 and GB300 (ARCHIVE_PAIRS)
                              "deepseek-v3 mxfp8 256 B300, 26.04 stack, PP 16": 3131,
                              "qwen3-235b-a22b mxfp8 256 B300, 26.04 stack, all-to-all": 4865,
                              "qwen3-235b-a22b mxfp8 256 GB300, 26.02.01 stack, PP 4, no VP": 6583,
                              "qwen3-235b-a22b mxfp8 256 GB200, 26.02.01 stack, PP 8, no VP": 5530}

# (name, catalogue model, spec overrides, stack block, profile, devices, layout)
EXAMPLES = [
    ("qwen3-30b-a3b fp8, paper stack", "qwen3-30b-a3b", QWEN_FP8, {}, "p6-b200.48xlarge", 8,
     Layout(ep=8, mbs=4, ckpt="none")),
    ("qwen3-30b-a3b fp8, published stack", "qwen3-30b-a3b", QWEN_FP8, PUBLISHED_QWEN, "p6-b200.48xlarge", 8,
     Layout(ep=8, mbs=4, ckpt="none")),
    ("qwen3-30b-a3b fp8 16 H100, published stack", "qwen3-30b-a3b",
     {**QWEN_FP8, "data": {"gbs": 1024, "seqlen": 4096, "microbatch_sz": 1}}, PUBLISHED_QWEN_H100, "p5.48xlarge", 16,
     Layout(ep=16, mbs=1, ckpt="none")),
    ("qwen3-30b-a3b bf16, paper stack", "qwen3-30b-a3b", {**QWEN_FP8, "model": {}}, {}, "p6-b200.48xlarge", 8,
     Layout(ep=8, mbs=4, ckpt="none")),
    ("gpt-oss-120b bf16 64 B200, paper stack, no recompute", "gpt-oss-120b", GPT_OSS, {}, "p6-b200.48xlarge", 64,
     Layout(ep=8, mbs=4, ckpt="none")),
    ("gpt-oss-120b bf16 64 B200, published stack", "gpt-oss-120b", GPT_OSS, PUBLISHED_GPT_OSS,
     "p6-b200.48xlarge", 64, Layout(ep=8, mbs=4, ckpt="selective")),
    ("gpt-oss-120b mxfp8 64 B200, published stack", "gpt-oss-120b", GPT_OSS_FP8,
     {**PUBLISHED_GPT_OSS, **MXFP8}, "p6-b200.48xlarge", 64,
     Layout(ep=8, mbs=4, ckpt="selective")),
    ("gpt-oss-120b bf16 64 H100, published stack, PP 4", "gpt-oss-120b",
     _with_mbs(GPT_OSS, 1), PUBLISHED_GPT_OSS, "p5.48xlarge", 64,
     Layout(pp=4, ep=8, mbs=1, ckpt="selective")),
    ("qwen3-235b-a22b mxfp8 256 B200, published stack, PP 8", "qwen3-235b-a22b", QWEN_235B, PUBLISHED_QWEN_235B,
     "p6-b200.48xlarge", 256, Layout(pp=8, ep=8, mbs=1, ckpt="none", **_split("qwen3-235b-a22b", 8))),
    ("qwen3-235b-a22b fp8 256 H100, published stack, PP 8 x VP 4", "qwen3-235b-a22b", QWEN_235B,
     PUBLISHED_QWEN_235B_H100, "p5.48xlarge", 256,
     Layout(tp=2, pp=8, vpp=4, ep=32, mbs=1, ckpt="none", **_split("qwen3-235b-a22b", 8))),
    ("deepseek-v3 mxfp8 256 B200, published stack, PP 8 x VP 2", "deepseek-v3", DSV3, PUBLISHED_DSV3,
     "p6-b200.48xlarge", 256,
     Layout(pp=8, vpp=2, ep=32, mbs=1, ckpt="selective", **_split("deepseek-v3", 8, DSV3_LAYOUT))),
]

# The seven runs above are the 26.04.01 container's. OTHER_LAYOUTS: the same models on the same systems at
# the other layouts Megatron-Bridge published for earlier containers (the performance summary archive in the docs
# of Megatron-Bridge v0.6.0), each with the stack its scripts set at the matching tag; printed apart so the seven
# keep their own MAPE.
# * DeepSeek-V3, 26.04 container (v0.4.1 B200 V2): PP 16, EP 8, HybridEP without the all-to-all overlap or CUDA
#   graphs, --recompute-modules mla_up_proj, the recipe's PP 16 layout (embedding + 4, 14 x 4, 1 + MTP + loss).
# * GPT-OSS-120B, 26.02 container (v0.3.0 B200 V2): EP 64, the B200 stack of the 26.04.01 row otherwise.
# * Qwen3-30B-A3B, 26.02 container (v0.3.0 B200 FP8_MX V1): micro-batch 1, the provider's all-to-all dispatcher,
#   CUDA graphs over moe_router and moe_preprocess only; MXFP8 with FP8 parameter gather as in bf16_with_mxfp8_mixed.
DSV3_2604 = {**{k: v for k, v in PUBLISHED_DSV3.items() if k not in ("a2a_overlap", "cuda_graphs")},
             "dispatcher": "hybridep", "recompute_modules": ["mla_up_proj"]}  # the flex dispatcher: no shared overlap
QWEN_2602 = {**{k: v for k, v in PUBLISHED_QWEN.items() if k != "dispatcher"},
             "cuda_graphs": ["moe_router", "moe_preprocess"]}
OTHER_LAYOUTS = [
    ("deepseek-v3 mxfp8 256 B200, 26.04 stack, PP 16", "deepseek-v3", DSV3, DSV3_2604, "p6-b200.48xlarge", 256,
     Layout(pp=16, ep=8, mbs=1, ckpt="selective", **_split("deepseek-v3", 16, DSV3_LAYOUT))),
    ("gpt-oss-120b bf16 64 B200, 26.02 stack, EP 64", "gpt-oss-120b", GPT_OSS, PUBLISHED_GPT_OSS,
     "p6-b200.48xlarge", 64, Layout(ep=64, mbs=4, ckpt="selective")),
    ("qwen3-30b-a3b mxfp8 8 B200, 26.02 stack, micro-batch 1", "qwen3-30b-a3b",
     _with_mbs(QWEN_FP8, 1), QWEN_2602, "p6-b200.48xlarge", 8,
     Layout(ep=8, mbs=1, ckpt="none")),
]


# GB200_RUNS: the same table's GB200 rows (26.04.01 container), each with its Megatron-Bridge 0.4.2 GB200 workload,
# on a profile with no table of its own: its kernels the B200's rows scaled to its datasheet (scaled_device_tables),
# its fabric analytic. 256 GPUs take 64 of each rack's 72 under the
# launcher's --segment (ClusterProfile.job_domain), so EP 32 and 64 stay on NVLink.
# * Qwen3-30B-A3B GB200 FP8_MX V1: micro-batch 4, HybridEP, CUDA graphs over moe_router and moe_preprocess.
# * GPT-OSS-120B GB200 BF16 V2: EP 64, the all-to-all overlapped (moe_a2a_overlap; no shared expert to overlap).
# * Qwen3-235B-A22B GB200 FP8_MX V2: PP 8 x VP 3 (11 + 6 x 12 + 11 with the embedding and loss in the split), EP 32,
#   HybridEP, CUDA graphs over attn, moe_router and moe_preprocess.
# * DeepSeek-V3 GB200 V2: PP 4 x VP 4 (the recipe's layout: embedding + 4, 14 x 4, 1 + MTP + loss; 16 + 16 + 16 +
#   13 layers per stage), EP 64, HybridEP, --recompute-modules mlp, CUDA graphs over attn, moe_router, preprocess.
GB200 = "p6e-gb200.36xlarge"
GB200_RUNS = [
    ("qwen3-30b-a3b mxfp8 8 GB200", "qwen3-30b-a3b", QWEN_FP8,
     {**PUBLISHED_QWEN, "cuda_graphs": ["moe_router", "moe_preprocess"]}, GB200, 8, Layout(ep=8, mbs=4, ckpt="none")),
    ("gpt-oss-120b bf16 64 GB200, EP 64, a2a overlap", "gpt-oss-120b", GPT_OSS,
     {**PUBLISHED_GPT_OSS, "a2a_overlap": True, "shared_expert_overlap": False}, GB200, 64,
     Layout(ep=64, mbs=4, ckpt="selective")),
    ("qwen3-235b-a22b mxfp8 256 GB200, PP 8 x VP 3, EP 32", "qwen3-235b-a22b", QWEN_235B,
     {**PUBLISHED_QWEN_235B, "dispatcher": "hybridep", "cuda_graphs": ["attn", "moe_router", "moe_preprocess"]},
     GB200, 256, Layout(pp=8, vpp=3, ep=32, mbs=1, ckpt="none", **_split("qwen3-235b-a22b", 8))),
    ("deepseek-v3 mxfp8 256 GB200, PP 4 x VP 4, EP 64", "deepseek-v3", DSV3,
     {**DSV3_2604, "recompute_modules": ["mlp"], "cuda_graphs": PUBLISHED_DSV3["cuda_graphs"]}, GB200, 256,
     Layout(pp=4, vpp=4, ep=64, mbs=1, ckpt="selective", **_split("deepseek-v3", 4, DSV3_LAYOUT))),
]
# CAPTURED_RUNS: the four GB200 jobs above as the 26.06 container runs them (Megatron-Bridge 0.5.0 GB200 FP8_MX
# workloads, the same layouts): the whole step one CUDA graph (cuda_graph_impl full_iteration; for Qwen3
# set_full_iter_cg_configs: expert capacity 1.5 per rank, a paged activation stash), the all-to-all overlapped
# (moe_a2a_overlap), and device changes scaleplan does not cost: the CuTe DSL fused grouped MLP
# (cutedsl_fused_grouped_mlp) and, for Qwen3 and GPT-OSS, FP8 attention (fp8_dot_product_attention). DeepSeek-V3's
# recompute modules are mla_up_proj; GPT-OSS runs MXFP8 (FP8_MX V2) with HybridEP and no recompute. No host launch
# is left: these rows read the device side alone, which the uncosted changes make faster than costed here.
CAPTURED = {"cuda_graphs": ["full_iteration"], "a2a_overlap": True, "shared_expert_overlap": False}
QWEN_CAPTURED = {**PUBLISHED_QWEN, **CAPTURED}
QWEN_235B_CAPTURED = {**PUBLISHED_QWEN_235B, "dispatcher": "hybridep", **CAPTURED}
CAPTURED_RUNS = [
    ("qwen3-30b-a3b mxfp8 8 GB200, 26.06, step captured", "qwen3-30b-a3b", QWEN_FP8, QWEN_CAPTURED,
     GB200, 8, Layout(ep=8, mbs=4, ckpt="none")),
    ("qwen3-235b-a22b mxfp8 256 GB200, 26.06, step captured", "qwen3-235b-a22b", QWEN_235B,
     QWEN_235B_CAPTURED, GB200, 256,
     Layout(pp=8, vpp=3, ep=32, mbs=1, ckpt="none", **_split("qwen3-235b-a22b", 8))),
    ("deepseek-v3 mxfp8 256 GB200, 26.06, step captured", "deepseek-v3", DSV3, {**DSV3_2604, **CAPTURED}, GB200, 256,
     Layout(pp=4, vpp=4, ep=64, mbs=1, ckpt="selective", **_split("deepseek-v3", 4, DSV3_LAYOUT))),
    ("gpt-oss-120b mxfp8 64 GB200, 26.06, step captured", "gpt-oss-120b", GPT_OSS_FP8,
     {**PUBLISHED_GPT_OSS, **MXFP8, "dispatcher": "hybridep", "recompute_modules": None,
      **CAPTURED}, GB200, 64, Layout(ep=64, mbs=4, ckpt="none")),
]
# BLACKWELL_ULTRA_RUNS: the same table's B300 and GB300 rows (26.04.01 container), each with its Megatron-Bridge 0.4.2
# workload, on profiles with no measured table: their kernels the B200's rows scaled to their datasheets (the same
# bf16 and FP8 peaks on a B300: factor 1), their fabric analytic at 800 Gb/s per GPU.
# * Qwen3-30B-A3B B300 / GB300 FP8_MX V1: micro-batch 8, HybridEP, CUDA graphs over moe_router and moe_preprocess.
# * GPT-OSS-120B B300 BF16 V2: EP 8, HybridEP, CUDA graphs over attn, moe_router and moe_preprocess, no recompute;
#   GB300 BF16 V2: EP 64, the all-to-all dispatcher, the same graphs, no recompute.
# * Qwen3-235B-A22B B300 FP8_MX V2: PP 8 (11 + 6 x 12 + 11), EP 8, micro-batch 2, HybridEP, no graphs; GB300 FP8_MX V2:
#   PP 4 x VP 12 (two layers a virtual stage with the embedding and loss counted: 23 + 24 + 24 + 23), EP 32,
#   micro-batch 2, HybridEP, graphs over attn, moe_router and moe_preprocess.
# * DeepSeek-V3 B300 V2: PP 8 (the recipe's (8, 1) layout: embedding + 8, 6 x 8, 5 + MTP + loss), EP 8, micro-batch
#   2, HybridEP, graphs over attn, moe_router and moe_preprocess, --recompute-modules mla_up_proj; GB300 V2: PP 2 x VP
#   8 ("Et*4|(t*4|)*14tmL": 32 + 29 layers), EP 32, micro-batch 2, HybridEP, no graphs, mla_up_proj.
# * Kimi-K2 GB300 (the only system it was published on): PP 4 x VP 4 (the recipe's (4, 4) layout: embedding + 4, 14 x 4,
#   1 + loss: 16 + 16 + 16 + 13 layers), EP 64, micro-batch 2, global batch 4096, HybridEP, no graphs,
#   --recompute-modules mla_up_proj, the distributed Muon optimizer (kimi_k2_pretrain_config's default; with MXFP8 it
#   turns FP8 parameter gather off), gradients reduced in bf16, routing forced to balance.
B300, GB300 = "p6-b300.48xlarge", "p6e-gb300.36xlarge"
KIMI_K2 = {"model": {"precision": "fp8"}, "data": {"gbs": 4096, "seqlen": 4096, "microbatch_sz": 2},
           "optimizer": {"optimizer_type": "muon"}}
PUBLISHED_KIMI_K2 = {**DSV3_2604, "fp8_param": False}
QWEN_MBS8 = _with_mbs(QWEN_FP8, 8)
QWEN_ULTRA = {**PUBLISHED_QWEN, "cuda_graphs": ["moe_router", "moe_preprocess"]}
GPT_OSS_ULTRA = {**{k: v for k, v in PUBLISHED_GPT_OSS.items() if k != "recompute_modules"},
                 "cuda_graphs": ["attn", "moe_router", "moe_preprocess"]}
QWEN_235B_MBS2 = _with_mbs(QWEN_235B, 2)
DSV3_MBS2 = _with_mbs(DSV3, 2)
BLACKWELL_ULTRA_RUNS = [
    ("qwen3-30b-a3b mxfp8 8 B300", "qwen3-30b-a3b", QWEN_MBS8, QWEN_ULTRA, B300, 8, Layout(ep=8, mbs=8, ckpt="none")),
    ("qwen3-30b-a3b mxfp8 8 GB300", "qwen3-30b-a3b", QWEN_MBS8, QWEN_ULTRA, GB300, 8,
     Layout(ep=8, mbs=8, ckpt="none")),
    ("gpt-oss-120b bf16 64 B300, EP 8, HybridEP", "gpt-oss-120b", GPT_OSS, {**GPT_OSS_ULTRA, "dispatcher": "hybridep"},
     B300, 64, Layout(ep=8, mbs=4, ckpt="none")),
    ("gpt-oss-120b bf16 64 GB300, EP 64", "gpt-oss-120b", GPT_OSS, GPT_OSS_ULTRA, GB300, 64,
     Layout(ep=64, mbs=4, ckpt="none")),
    ("qwen3-235b-a22b mxfp8 256 B300, PP 8, micro-batch 2", "qwen3-235b-a22b", QWEN_235B_MBS2,
     {**PUBLISHED_QWEN_235B, "dispatcher": "hybridep"}, B300, 256,
     Layout(pp=8, ep=8, mbs=2, ckpt="none", **_split("qwen3-235b-a22b", 8))),
    ("qwen3-235b-a22b mxfp8 256 GB300, PP 4 x VP 12, EP 32", "qwen3-235b-a22b", QWEN_235B_MBS2,
     {**PUBLISHED_QWEN_235B, "dispatcher": "hybridep", "cuda_graphs": ["attn", "moe_router", "moe_preprocess"]},
     GB300, 256, Layout(pp=4, vpp=12, ep=32, mbs=2, ckpt="none", **_split("qwen3-235b-a22b", 4))),
    ("deepseek-v3 mxfp8 256 B300, PP 8, EP 8", "deepseek-v3", DSV3_MBS2,
     {**DSV3_2604, "cuda_graphs": PUBLISHED_DSV3["cuda_graphs"]}, B300, 256,
     Layout(pp=8, ep=8, mbs=2, ckpt="selective", **_split("deepseek-v3", 8, DSV3_PP8_LAYOUT))),
    ("deepseek-v3 mxfp8 256 GB300, PP 2 x VP 8, EP 32", "deepseek-v3", DSV3_MBS2, DSV3_2604, GB300, 256,
     Layout(pp=2, vpp=8, ep=32, mbs=2, ckpt="selective", **_split("deepseek-v3", 2, DSV3_LAYOUT))),
    ("kimi-k2 mxfp8 256 GB300, PP 4 x VP 4, EP 64, Muon", "kimi-k2", KIMI_K2, PUBLISHED_KIMI_K2, GB300, 256,
     Layout(pp=4, vpp=4, ep=64, mbs=2, ckpt="selective", **_split("kimi-k2", 4, KIMI_K2_LAYOUT))),
]
# ULTRA_26_06_RUNS: the 26.06 container's B300 and GB300 rows whose stack or layout is not already a row above (its
# DeepSeek-V3 B300, Kimi-K2 GB300 and Qwen3-30B-A3B H100 rows repeat a 26.04.01 row's workload), each with its
# Megatron-Bridge 0.5.0 workload; added after the model was built, and nothing was changed for them.
# * Qwen3-30B-A3B GB300 and B300 FP8_MX V1: micro-batch 8, HybridEP, the step captured and the all-to-all overlapped
#   (as CAPTURED_RUNS), the CuTe DSL fused grouped MLP and FP8 attention (not costed).
# * Qwen3-235B-A22B GB300 FP8_MX V2: PP 4 x VP 12, EP 32, micro-batch 2, HybridEP, the step captured.
# * DeepSeek-V3 GB300 FP8_MX V2: PP 2 x VP 8 ("Et*4|(t*4|)*14tmL"), EP 32, micro-batch 1, HybridEP, the step captured,
#   no recompute (recompute_modules []), FP8 attention; at global batch 4096 and 15360 (FP8_MX_GBS15360).
# * GPT-OSS-120B GB300 FP8_MX V2: EP 16, micro-batch 4, HybridEP, the step captured, no recompute; B300 FP8_MX V2 (the
#   B300 BF16 V2 workload in MXFP8): EP 8, HybridEP, graphs over attn, moe_router and moe_preprocess, no recompute.
DSV3_CAPTURED = {**DSV3_2604, **CAPTURED, "recompute_modules": None}
GPT_OSS_HYBRIDEP_MXFP8 = {**GPT_OSS_ULTRA, **MXFP8, "dispatcher": "hybridep"}
ULTRA_26_06_RUNS = [
    ("qwen3-30b-a3b mxfp8 8 GB300, 26.06, step captured", "qwen3-30b-a3b", QWEN_MBS8, QWEN_CAPTURED, GB300, 8,
     Layout(ep=8, mbs=8, ckpt="none")),
    ("qwen3-30b-a3b mxfp8 8 B300, 26.06, step captured", "qwen3-30b-a3b", QWEN_MBS8, QWEN_CAPTURED, B300, 8,
     Layout(ep=8, mbs=8, ckpt="none")),
    ("qwen3-235b-a22b mxfp8 256 GB300, 26.06, step captured", "qwen3-235b-a22b", QWEN_235B_MBS2,
     QWEN_235B_CAPTURED, GB300, 256,
     Layout(pp=4, vpp=12, ep=32, mbs=2, ckpt="none", **_split("qwen3-235b-a22b", 4))),
    ("deepseek-v3 mxfp8 256 GB300, 26.06, step captured", "deepseek-v3", DSV3, DSV3_CAPTURED, GB300, 256,
     Layout(pp=2, vpp=8, ep=32, mbs=1, ckpt="none", **_split("deepseek-v3", 2, DSV3_LAYOUT))),
    ("deepseek-v3 mxfp8 256 GB300, 26.06, step captured, GBS 15360", "deepseek-v3",
     {**DSV3, "data": {**DSV3["data"], "gbs": 15360}}, DSV3_CAPTURED, GB300, 256,
     Layout(pp=2, vpp=8, ep=32, mbs=1, ckpt="none", **_split("deepseek-v3", 2, DSV3_LAYOUT))),
    ("gpt-oss-120b mxfp8 64 GB300, 26.06, step captured, EP 16", "gpt-oss-120b",
     GPT_OSS_FP8, {**GPT_OSS_HYBRIDEP_MXFP8, **CAPTURED}, GB300, 64,
     Layout(ep=16, mbs=4, ckpt="none")),
    ("gpt-oss-120b mxfp8 64 B300, 26.06, EP 8, HybridEP", "gpt-oss-120b", GPT_OSS_FP8,
     GPT_OSS_HYBRIDEP_MXFP8, B300, 64, Layout(ep=8, mbs=4, ckpt="none")),
]
# ARCHIVE_PAIRS: rows of the archive's earlier containers (Megatron-Bridge v0.4.0 for 26.04, v0.3.1 for 26.02.01, as
# its docs/versions1.json pairs them) that differ from a row above in one stated choice; added unchanged, as the 26.06
# rows were. The other rows of those containers repeat a workload above, or state a layout no preset of their tag
# has (Qwen3-30B-A3B H100 PP 2 x VP 12 and Qwen3-235B-A22B B300 PP 8 x VP 4 in 26.02.01: the 26.02 presets' columns)
# and are left out.
# * DeepSeek-V3 B300, 26.04 (B300_FP8_MX_V2): PP 16 (the recipe's layout), EP 8, micro-batch 1, HybridEP, no graphs,
#   --recompute-modules mla_up_proj: the B200 PP 16 row's stack (DSV3_2604) on a B300.
# * Qwen3-235B-A22B B300, 26.04: the 26.04.01 B300 row's layout on the all-to-all dispatcher (HybridEP came to the
#   B300 presets after v0.4.0).
# * Qwen3-235B-A22B GB300 and GB200, 26.02.01 (GB300 / GB200_FP8_MX_V2): PP 4 EP 32 micro-batch 2 and PP 8 EP 32
#   micro-batch 1 without virtual stages, HybridEP, graphs over attn, moe_router and moe_preprocess: the 26.04.01
#   rows' layouts without their VP 12 and VP 3.
QWEN_235B_GRAPHED = {**PUBLISHED_QWEN_235B, "dispatcher": "hybridep",
                     "cuda_graphs": ["attn", "moe_router", "moe_preprocess"]}
ARCHIVE_PAIRS = [
    ("deepseek-v3 mxfp8 256 B300, 26.04 stack, PP 16", "deepseek-v3", DSV3, DSV3_2604, B300, 256,
     Layout(pp=16, ep=8, mbs=1, ckpt="selective", **_split("deepseek-v3", 16, DSV3_LAYOUT))),
    ("qwen3-235b-a22b mxfp8 256 B300, 26.04 stack, all-to-all", "qwen3-235b-a22b", QWEN_235B_MBS2,
     PUBLISHED_QWEN_235B, B300, 256, Layout(pp=8, ep=8, mbs=2, ckpt="none", **_split("qwen3-235b-a22b", 8))),
    ("qwen3-235b-a22b mxfp8 256 GB300, 26.02.01 stack, PP 4, no VP", "qwen3-235b-a22b", QWEN_235B_MBS2,
     QWEN_235B_GRAPHED, GB300, 256, Layout(pp=4, ep=32, mbs=2, ckpt="none", **_split("qwen3-235b-a22b", 4))),
    ("qwen3-235b-a22b mxfp8 256 GB200, 26.02.01 stack, PP 8, no VP", "qwen3-235b-a22b", QWEN_235B,
     QWEN_235B_GRAPHED, GB200, 256, Layout(pp=8, ep=32, mbs=1, ckpt="none", **_split("qwen3-235b-a22b", 8))),
]
# H100_RUNS: Qwen3-30B-A3B on 16 H100 (two nodes: EP 16 spans them), bf16, micro-batch 1, global batch 1024, sequence
# 4096, routing forced to balance, as Megatron-Bridge's own controlled comparisons measured them, each published as
# seconds per step (NVIDIA-NeMo/Megatron-Bridge v0.6.0 skills/nemo-mbridge-perf-moe-comm-overlap and
# -perf-cuda-graphs; its CUDA-graphs training doc, PR #3868):
# * the H100 BF16 V1 workload (HybridEP, TE CUDA graphs over moe_router and moe_preprocess), the all-to-all not
#   overlapped and overlapped (--overlap-moe-expert-parallel-comm, delayed wgrad off; 2026-07-25, iterations 5-20 and
#   41-50); its rank-0 Nsight profile: 463,348 kernels and 22.821 s of GPU-active time in the 24.71 s step;
# * the all-to-all dispatcher, permute fusion off, no CUDA graphs, not overlapped and overlapped (2026-05-18,
#   iterations 3-8); and with TE graphs over attn, moe_router and moe_preprocess (replay iterations 5-8: 42.00 s,
#   against 41.36 s eager in the same comparison).
BF16_H100 = {"model": {"precision": "bf16"}, "data": {"gbs": 1024, "seqlen": 4096, "microbatch_sz": 1}}
# the H100 BF16 V1 workload's stack: the one whose Nsight kernel count gives stock Megatron-Core's launch rate
H100_HYBRIDEP = STOCK_TRACE_STACK.model_dump(mode="json", exclude_defaults=True)
H100_ALLTOALL = {**{k: v for k, v in H100_HYBRIDEP.items() if k not in ("dispatcher", "cuda_graphs")},
                 "permute_fusion": False}
EP_OVERLAP = {"a2a_overlap": True, "shared_expert_overlap": False}
H100_EP16 = ("qwen3-30b-a3b", BF16_H100)
# (name, stack, published seconds per step)
H100_CASES = (
    ("qwen3-30b-a3b bf16 16 H100, HybridEP", H100_HYBRIDEP, 24.7138),
    ("qwen3-30b-a3b bf16 16 H100, HybridEP, a2a overlap", {**H100_HYBRIDEP, **EP_OVERLAP}, 20.992),
    ("qwen3-30b-a3b bf16 16 H100, all-to-all, eager", H100_ALLTOALL, 41.25),
    ("qwen3-30b-a3b bf16 16 H100, all-to-all, eager, a2a overlap", {**H100_ALLTOALL, **EP_OVERLAP}, 31.31),
    ("qwen3-30b-a3b bf16 16 H100, all-to-all, CUDA graphs",
     {**H100_ALLTOALL, "cuda_graphs": ["attn", "moe_router", "moe_preprocess"]}, 42.00))
H100_RUNS = [(name, *H100_EP16, stack, "p5.48xlarge", 16, Layout(ep=16, mbs=1, ckpt="none"))
             for name, stack, _ in H100_CASES]
PUBLISHED_STEP_S = {name: step for name, _, step in H100_CASES}
ALL_RUNS = (EXAMPLES + OTHER_LAYOUTS + GB200_RUNS + CAPTURED_RUNS + H100_RUNS + BLACKWELL_ULTRA_RUNS
            + ULTRA_26_06_RUNS + ARCHIVE_PAIRS)  # print order
# the published rows' groups, in print order: (label, example names)
GROUPS = (("the 26.04.01 container on B200 and H100", [e[0] for e in EXAMPLES]),
          ("the archive's other B200 layouts", [e[0] for e in OTHER_LAYOUTS]),
          ("GB200, kernels from the B200's rows scaled", [e[0] for e in GB200_RUNS]),
          ("GB200 26.06, the step captured (fused grouped MLP, FP8 attention not costed)",
           [e[0] for e in CAPTURED_RUNS]),
          ("H100, Megatron-Bridge's controlled comparisons (seconds per step)", [e[0] for e in H100_RUNS]),
          ("B300 and GB300, kernels from the B200's rows scaled", [e[0] for e in BLACKWELL_ULTRA_RUNS]),
          ("B300 and GB300 26.06 (added unchanged; captured rows: fused grouped MLP, FP8 attention not costed)",
           [e[0] for e in ULTRA_26_06_RUNS]),
          ("the archive's B300, GB200 and GB300 pairs (26.02.01, 26.04; added unchanged)", [e[0] for e in ARCHIVE_PAIRS]))


def _spec(model: str, over: dict, stack: dict, profile: str):
    doc = spec_data(model)
    doc = {**doc, "model": {**doc["model"], **over.get("model", {})}, "data": {**doc["data"], **over["data"]},
           "optimizer": {**doc.get("optimizer", {}), **over.get("optimizer", {})}, "hardware": {"node_type": profile}}
    if stack:
        doc["stack"] = stack
    return parse_spec(doc)


def run(db: str | None, host_scale: float | None = None) -> list[dict]:
    out = []
    for name, model, over, stack, profile, n, layout in ALL_RUNS:
        spec = _spec(model, over, stack, profile)
        est = Estimator(profile, db, use_calibration=False, host_scale=host_scale)
        r = est.estimate(spec, n, [layout])[0]
        top = sorted(r.breakdown_s.items(), key=lambda kv: -kv[1])[:6]
        tok = PUBLISHED_TOKENS_PER_GPU_S.get(name)
        published = spec.data.gbs * spec.data.seqlen / (n * tok) if tok else PUBLISHED_STEP_S.get(name)
        out.append({"example": name, "t_iter_s": r.t_iter_s, "published_t_iter_s": published, "mfu": r.mfu,
                    "feasible": r.feasible,
                    "mem_gb": r.mem_per_device_gb, "mem_breakdown_gb": r.mem_breakdown_gb,
                    "top_components_s": dict(top), "sources": {k: r.sources[k] for k, _ in top}})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = run(a.db)
    if a.json:
        print(json.dumps(rows, indent=1, default=float))
        return
    for r in rows:
        if r["published_t_iter_s"]:
            print(f"{r['example']}: published step {r['published_t_iter_s']:.2f} s, predicted / published "
                  f"{r['t_iter_s'] / r['published_t_iter_s']:.2f}")
        comps = ", ".join(f"{k} {v:.2f}" for k, v in r["top_components_s"].items())
        mem = ", ".join(f"{k} {v:.1f}" for k, v in r["mem_breakdown_gb"].items() if v > 0.05)
        print(f"{r['example']}: step {r['t_iter_s']:.2f} s (MFU {100 * r['mfu']:.1f}%), memory {r['mem_gb']:.1f} GB "
              f"({'fits' if r['feasible'] else 'does not fit'})\n   top terms (s): {comps}\n   memory (GB): {mem}")
    every = []
    for label, rs in _published_sets(rows):
        ratios = [r["t_iter_s"] / r["published_t_iter_s"] for r in rs]
        every += ratios
        print(f"published runs, {label}: {len(ratios)}, predicted / published {min(ratios):.2f}-{max(ratios):.2f}, "
              f"MAPE {100 * _mape(ratios):.1f}%")
    print(f"published runs, all: {len(every)}, MAPE {100 * _mape(every):.1f}%")
    host_scan(a.db)


def _published_sets(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """The rows with a published step time by :data:`GROUPS`: the issue's seven first."""
    pub = {r["example"]: r for r in rows if r["published_t_iter_s"]}
    return [(label, [pub[n] for n in names if n in pub]) for label, names in GROUPS]


def _mape(ratios: list[float]) -> float:
    return sum(abs(x - 1.0) for x in ratios) / len(ratios)


# host-side factors of the scan: the law's t_gap, t_host and t_ep_host all scaled (Estimator(host_scale=...))
HOST_SCAN = (1.0, 0.75, 0.5, 0.35, 0.25)


def host_scan(db: str | None) -> None:
    """What the published rows say about the dispatch law on stock Megatron-Core, printed, not used: every row's
    predicted / published with the law's host seconds scaled by each factor of :data:`HOST_SCAN` (the law was
    traced on the paper's own stack; nothing here is fitted or applied to any prediction)."""
    print("host-side scan (the dispatch law's host seconds x f, every published row by group: "
          + " | ".join(label for label, _ in GROUPS) + "; diagnostic, not applied):")
    for f in HOST_SCAN:
        groups = [[r["t_iter_s"] / r["published_t_iter_s"] for r in rs] for _, rs in _published_sets(run(db, f))]
        every = [x for g in groups for x in g]
        inside = sum(0.75 <= x <= 1.33 for x in every)
        print(f"   f={f:<4g} " + " | ".join(" ".join(f"{x:.2f}" for x in g) for g in groups)
              + f"  MAPE {100 * _mape(groups[0]):.1f}% ({len(groups[0])}), {100 * _mape(every):.1f}% "
              f"({len(every)}); {inside} of {len(every)} within 0.75-1.33")

if __name__ == "__main__":
    main()
