"""Fine-grained FP8 and wide-expert MoE models on today's training stacks (prints figures; asserts nothing):
step time uncalibrated, its breakdown, and memory per GPU at published layouts (Megatron-Bridge performance
recipes, NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs: qwen3 and gpt_oss workload base configs).

1. Qwen3-30B-A3B (128 experts, top-8, expert width 768) on 8 B200, EP 8 (16 local experts per rank), micro-batch
   4, sequence 4096, FP8: the paper's stack with per-tensor current scaling, and the published stack (HybridEP,
   CUDA graphs over attention, router and preprocess, MXFP8).
2. GPT-OSS-120B on 64 B200 at EP 8, micro-batch 4, sequence 4096, global batch 1280: the paper's stack without
   recompute (the issue's example), and the published B200 V2 recipe (PP 1, HybridEP, router fusion, gradients
   reduced in bf16, recompute of layernorm and moe_act: our super-selective) in bf16 and MXFP8; on 64 H100 the
   published H100 recipe (PP 4, EP 8, micro-batch 1, the same recompute, all-to-all).

    python benchmarks/stack_examples.py --db URL-with-the-recorded-and-own-tables [--json]

The database needs ../shared/recorded/dmlc-scaleplan (`scaleplan db import-scaleplan`) and scaleplan's own
tables (`scaleplan db import-recorded`) for the H100.
"""
from __future__ import annotations

import argparse
import json

from scaleplan.estimator import Estimator

from scaleplan.catalogue import spec_data
from scaleplan.specs import Layout, parse_spec

QWEN_FP8 = {"model": {"precision": "fp8"}, "data": {"gbs": 512, "seqlen": 4096, "microbatch_sz": 4}}
# Megatron-Bridge: the qwen3 recipe (moe_permute_fusion), set_qwen3_common_configs (router fusion, grad_reduce_in_fp32
# off, no recompute), the B200 workload (HybridEP, TE CUDA graphs over attn, moe_router, moe_preprocess) and
# bf16_with_mxfp8_mixed (MXFP8 with FP8 primary weights, fp8_param_gather)
PUBLISHED_QWEN = {"dispatcher": "hybridep", "cuda_graphs": ["attn", "moe_router", "moe_preprocess"],
                  "fp8_recipe": "mxfp8", "fp8_param": True, "permute_fusion": True, "router_fusion": True,
                  "grads_fp32": False}
GPT_OSS = {"data": {"gbs": 1280, "seqlen": 4096, "microbatch_sz": 4}}
# Megatron-Bridge: the gpt_oss recipe (moe_permute_fusion), set_gpt_oss_common_configs (router fusion,
# grad_reduce_in_fp32 off) and the B200 V2 workload (moe_flex_dispatcher_backend hybridep)
PUBLISHED_GPT_OSS_H100 = {"permute_fusion": True, "router_fusion": True, "grads_fp32": False}
PUBLISHED_GPT_OSS_B200 = {**PUBLISHED_GPT_OSS_H100, "dispatcher": "hybridep"}

# (name, catalogue model, spec overrides, stack block, profile, devices, layout)
EXAMPLES = [
    ("qwen3-30b-a3b fp8, paper stack", "qwen3-30b-a3b", QWEN_FP8, {}, "p6-b200.48xlarge", 8,
     Layout(ep=8, mbs=4, ckpt="none")),
    ("qwen3-30b-a3b fp8, published stack", "qwen3-30b-a3b", QWEN_FP8, PUBLISHED_QWEN, "p6-b200.48xlarge", 8,
     Layout(ep=8, mbs=4, ckpt="none")),
    ("qwen3-30b-a3b bf16, paper stack", "qwen3-30b-a3b", {**QWEN_FP8, "model": {}}, {}, "p6-b200.48xlarge", 8,
     Layout(ep=8, mbs=4, ckpt="none")),
    ("gpt-oss-120b bf16 64 B200, paper stack, no recompute", "gpt-oss-120b", GPT_OSS, {}, "p6-b200.48xlarge", 64,
     Layout(ep=8, mbs=4, ckpt="none")),
    ("gpt-oss-120b bf16 64 B200, published stack", "gpt-oss-120b", GPT_OSS, PUBLISHED_GPT_OSS_B200,
     "p6-b200.48xlarge", 64, Layout(ep=8, mbs=4, ckpt="super-selective")),
    ("gpt-oss-120b mxfp8 64 B200, published stack", "gpt-oss-120b", {**GPT_OSS, "model": {"precision": "fp8"}},
     {**PUBLISHED_GPT_OSS_B200, "fp8_recipe": "mxfp8", "fp8_param": True}, "p6-b200.48xlarge", 64,
     Layout(ep=8, mbs=4, ckpt="super-selective")),
    ("gpt-oss-120b bf16 64 H100, published stack, PP 4", "gpt-oss-120b",
     {"data": {**GPT_OSS["data"], "microbatch_sz": 1}}, PUBLISHED_GPT_OSS_H100, "p5.48xlarge", 64,
     Layout(pp=4, ep=8, mbs=1, ckpt="super-selective")),
]


def _spec(model: str, over: dict, stack: dict, profile: str):
    doc = spec_data(model)
    doc = {**doc, "model": {**doc["model"], **over.get("model", {})}, "data": {**doc["data"], **over["data"]},
           "hardware": {"node_type": profile}}
    if stack:
        doc["stack"] = stack
    return parse_spec(doc)


def run(db: str | None) -> list[dict]:
    out = []
    for name, model, over, stack, profile, n, layout in EXAMPLES:
        spec = _spec(model, over, stack, profile)
        est = Estimator(profile, db, use_calibration=False)
        r = est.estimate(spec, n, [layout])[0]
        top = sorted(r.breakdown_s.items(), key=lambda kv: -kv[1])[:6]
        out.append({"example": name, "t_iter_s": r.t_iter_s, "mfu": r.mfu, "feasible": r.feasible,
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
        comps = ", ".join(f"{k} {v:.2f}" for k, v in r["top_components_s"].items())
        mem = ", ".join(f"{k} {v:.1f}" for k, v in r["mem_breakdown_gb"].items() if v > 0.05)
        print(f"{r['example']}: step {r['t_iter_s']:.2f} s (MFU {100 * r['mfu']:.1f}%), memory {r['mem_gb']:.1f} GB "
              f"({'fits' if r['feasible'] else 'does not fit'})\n   top terms (s): {comps}\n   memory (GB): {mem}")


if __name__ == "__main__":
    main()
