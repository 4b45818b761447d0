"""The arguments `--emit megatron` prints are ones Megatron-LM accepts, checked by Megatron-LM's own
code: every flag and choice against the flag table of the targeted Megatron-LM version (tests/megatron/mlm.py),
and megatron-core's TransformerConfig built from them (its __post_init__ runs the MoE, recompute, fp8 and
parallelism checks), for a grid of models and layouts that includes the search's optimum (K=1), fp8, VPP, GQA with
TP, Muon, Scion, shared experts and a dense first block.

Needs the ``megatron`` test extra (the pinned megatron-core wheel; CI installs it). Stubbed, and only that, since a
CPU machine has no Transformer Engine: its version check for fp8 with moe_act/layernorm recompute, and the presence of
its fused RoPE kernel (Megatron-LM's default --apply-rope-fusion). Neither is a property of the plan.
"""
from __future__ import annotations

import copy

import pytest
import yaml

from scaleplan.specs import parse_spec

from . import mlm
from .conftest import SMALL_SEARCH

pytest.importorskip("megatron.core.transformer.transformer_config")


@pytest.fixture(autouse=True)
def _no_transformer_engine(monkeypatch):
    """fp8 with moe_act/layernorm recompute asks for Transformer Engine >= 2.6, RoPE fusion for its fused kernel; a
    CPU machine has neither."""
    import megatron.core.models.common.embeddings.rope_utils as rope
    import megatron.core.transformer.transformer_config as tc

    monkeypatch.setattr(tc, "is_te_min_version", lambda *a, **k: True)
    monkeypatch.setattr(rope, "fused_apply_rotary_pos_emb", lambda *a, **k: None)


@pytest.fixture(scope="module")
def models(validation_dir):
    """The three validation models (../shared/validation/models.yaml) by name, gbs 1024."""
    docs = yaml.safe_load((validation_dir / "models.yaml").read_text())
    return {k: {**v, "data": {**v["data"], "gbs": 1024}} for k, v in docs.items()}


def _spec(doc: dict, **over):
    d = copy.deepcopy(doc)
    for path, v in over.items():
        cur, keys = d, path.split(".")
        for k in keys[:-1]:
            cur = cur.setdefault(k, {})
        cur[keys[-1]] = v
    return parse_spec(d)


def _accepts(text: str, world: int):
    """Megatron-LM's verdict on emitted text: the TransformerConfig it builds (raises mlm.Rejected)."""
    ns, _ = mlm.parse(mlm.argv(text))
    mlm.validate(ns, world)
    return ns, mlm.transformer_config(ns)


# (name, validation model, spec overrides, devices, layout)
GRID = [
    ("700m scion (nearest: muon), EP 8", "moe-700m", {}, 32, "tp=1,pp=1,ep=8,ckpt=full"),
    ("700m adamw, TP 2 + SP, PP 2, VPP 2", "moe-700m", {"optimizer.optimizer_type": "adamw"}, 32,
     "tp=2,pp=2,ep=8,vpp=2,ckpt=full"),
    ("700m K=1", "moe-700m", {"model.moe.experts_per_token": 1, "optimizer.optimizer_type": "adamw"}, 32,
     "tp=1,pp=1,ep=8,ckpt=none"),
    ("5.4B muon, GQA 8 kv heads with TP 4", "moe-5p4b", {}, 64, "tp=4,pp=2,ep=8,ckpt=selective"),
    ("5.4B fp8 super-selective", "moe-5p4b", {"model.precision": "fp8"}, 64, "tp=1,pp=2,ep=8,ckpt=super-selective"),
    ("18B scion, PP 4 VPP 3, EP 16", "moe-18b", {}, 256, "tp=1,pp=4,ep=16,vpp=3,ckpt=full"),
    ("18B adamw, TP 16 > 8 kv heads", "moe-18b", {"optimizer.optimizer_type": "adamw"}, 256,
     "tp=16,etp=4,pp=2,ep=8,ckpt=full"),
    ("5.4B Megatron-LM's element-wise gate", "moe-5p4b", {"model.attn_gate": "element"}, 64,
     "tp=2,pp=2,ep=8,ckpt=full"),
    ("Qwen3-30B-A3B shape: 32 x 128 heads on d 2048 (--kv-channels)", "moe-700m",
     {"model.n_layers": 48, "model.n_q_heads": 32, "model.n_kv_heads": 4, "model.head_dim": 128,
      "model.inter_sz": 6144, "model.moe.n_experts": 128, "model.moe.experts_per_token": 8,
      "model.moe.expert_inter_sz": 768, "model.moe.shared_expert_inter_sz": 0, "model.moe.first_dense_layers": 0,
      "model.vocab_sz": 151936, "optimizer.optimizer_type": "adamw"}, 64, "tp=4,pp=2,ep=8,ckpt=selective"),
    ("GPT-OSS-120B shape: 64 x 64 heads on d 2880, element gate", "moe-700m",
     {"model.n_layers": 36, "model.hidden_sz": 2880, "model.n_q_heads": 64, "model.n_kv_heads": 8,
      "model.head_dim": 64, "model.inter_sz": 2880, "model.moe.n_experts": 128, "model.moe.experts_per_token": 4,
      "model.moe.expert_inter_sz": 2880, "model.moe.shared_expert_inter_sz": 0, "model.moe.first_dense_layers": 0,
      "model.vocab_sz": 201088, "model.attn_gate": "element", "optimizer.optimizer_type": "adamw"}, 128,
     "tp=8,pp=4,ep=4,ckpt=full"),
    # megatron-core 0.16.1's config refuses a shared expert's overlap with the flex dispatcher, which core_v0.19.0
    # allows (its TransformerConfig: alltoall or flex): this row has no shared expert. Its permute fusion needs
    # TE's fused permute, which megatron-core 0.16.1 imports only with Transformer Engine installed (the
    # check runs without): that flag is checked by the round trip of tests/cli/test_megatron_log.py
    ("5.4B fp8 MXFP8, fused permute and router, HybridEP, CUDA graphs, FP8 weights", "moe-5p4b",
     {"model.precision": "fp8", "model.moe.shared_expert_inter_sz": 0, "stack.fp8_recipe": "mxfp8",
      "stack.router_fusion": True, "stack.dispatcher": "hybridep",
      "stack.cuda_graphs": ["attn", "moe_router", "moe_preprocess"], "stack.fp8_param": True}, 64,
     "tp=1,pp=2,ep=8,ckpt=selective"),
    ("5.4B SequentialMLP, all-gather dispatcher, delayed scaling", "moe-5p4b",
     {"model.precision": "fp8", "stack.experts": "sequential", "stack.dispatcher": "allgather",
      "stack.fp8_recipe": "delayed"}, 64, "tp=2,pp=2,ep=8,ckpt=full"),
    ("18B capacity 1.25, 3 dense blocks, MoE every 2nd", "moe-18b",
     {"model.moe.capacity_factor": 1.25, "model.moe.first_dense_layers": 3, "model.moe.moe_frequency": 2}, 256,
     "tp=2,pp=4,ep=8,ckpt=selective"),
]


@pytest.mark.parametrize("name,model,over,n,layout", GRID, ids=[g[0] for g in GRID])
def test_megatron_accepts_the_grid(models, name, model, over, n, layout):
    from scaleplan.megatron.args import megatron_text
    from scaleplan.specs import parse_layout

    spec = _spec(models[model], **over)
    lo = parse_layout(layout, spec.default_layout()).model_dump()
    lo["dp"] = n // (lo["tp"] * lo["cp"] * lo["pp"])
    text = megatron_text(spec, lo, n, 8, name, tokens=1e11)
    ns, cfg = _accepts(text, n)
    m = spec.model
    # the config Megatron-LM builds is the planned model and layout
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.kv_channels, cfg.ffn_hidden_size) == \
        (m.n_layers, m.hidden_sz, m.n_q_heads, m.head_dim, m.inter_sz)
    assert (cfg.num_query_groups or cfg.num_attention_heads) == m.n_kv_heads
    assert (cfg.num_moe_experts, cfg.moe_router_topk, cfg.moe_ffn_hidden_size) == \
        (m.moe.n_experts, m.moe.experts_per_token, m.moe.expert_inter_sz)
    assert cfg.moe_shared_expert_intermediate_size == (m.moe.shared_expert_inter_sz or None)
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size, cfg.expert_model_parallel_size) == \
        (lo["tp"], lo["pp"], lo["ep"])
    assert (cfg.virtual_pipeline_model_parallel_size or 1) == lo["vpp"]
    # Megatron-LM's gate is element-wise: emitted for attn_gate "element" only (docs/megatron.md)
    assert cfg.attention_output_gate is (m.attn_gate == "element") and cfg.gated_linear_unit is m.glu
    # the vocabulary Megatron-LM builds (tokenizer padding: up to a multiple of divisible-by x TP, one row at a
    # time) is the one the plan's LM head is costed at
    built = m.vocab_sz
    while built % (ns["make_vocab_size_divisible_by"] * lo["tp"]):
        built += 1
    from scaleplan.estimator.model_dims import padded_vocab

    assert built == padded_vocab(m.vocab_sz, lo["tp"])
    pattern = ns["moe_layer_freq"]
    assert pattern[:m.moe.first_dense_layers] == [0] * m.moe.first_dense_layers
    # the token budget: D = 1e11 tokens in whole steps, the paper's WSD schedule
    steps = ns["train_samples"] // spec.data.gbs
    assert ns["train_samples"] % spec.data.gbs == 0 and (steps - 1) * spec.data.gbs * spec.data.seqlen < 1e11 <= \
        steps * spec.data.gbs * spec.data.seqlen
    assert ns["lr_decay_style"] == "WSD" and ns["lr_wsd_decay_samples"] == round(0.2 * ns["train_samples"])
    if m.precision == "fp8":
        # the stack's recipe (its default: current scaling, which super-selective recompute needs)
        assert cfg.fp8 == "hybrid" and cfg.fp8_recipe == spec.stack.recipe("fp8")
    if spec.optimizer.optimizer_type in ("muon", "scion"):
        assert ns["optimizer"] == "muon" and ns["use_distributed_optimizer"]
        assert "emerging-optimizers" in text


@pytest.mark.parametrize("topk", ["1,2", "1"], ids=["optimum", "optimum at K=1"])
def test_megatron_accepts_the_search_optimum(recorded_db, run, topk):
    """The search's own answer (shared experts, a dense first block; K=1 when the grid holds only top-1) is
    accepted as printed."""
    argv = list(SMALL_SEARCH)
    argv[argv.index("--topk") + 1] = topk
    code, out, err = run(*argv, "--db", recorded_db, "--emit", "megatron")
    assert code == 0, err
    ns, cfg = _accepts(out, 32)
    assert cfg.moe_router_pre_softmax is (cfg.moe_router_topk == 1)
    if topk == "1":
        assert cfg.moe_router_topk == 1
    assert ns["moe_layer_freq"][0] == 0 and cfg.moe_shared_expert_intermediate_size
    assert ns["train_samples"] > 0 and "# candidate: the search's optimum" in out


@pytest.mark.parametrize("text,why", [
    ("--num-layers 2 --optimizer dist_muon", "deprecated"),
    ("--num-layers 2 --moe-token-dispatcher-type all2all", "choices"),
    ("--num-layers 2 --moe-grouped-gemms", "unknown flag"),
    ("--num-layers 2 --swiglu 1", "no value"),
])
def test_the_command_line_check_refuses(text, why):
    """The checker is not a rubber stamp: a deprecated optimizer, a wrong choice, a misspelt flag, a value given to
    a switch are each refused."""
    with pytest.raises(mlm.Rejected, match=why):
        ns, _ = mlm.parse(text.split())
        mlm.validate({**ns, "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                      "context_parallel_size": 1, "micro_batch_size": 1, "global_batch_size": 8}, 8)


def test_the_config_check_refuses_what_the_issue_found(models):
    """What the emitted arguments once had: K=1 without --moe-router-pre-softmax, fp8's default delayed recipe with moe_act recompute.
    megatron-core refuses both, so the grid above would fail on them."""
    from scaleplan.emit import megatron_args, render_megatron

    k1 = _spec(models["moe-700m"], **{"model.moe.experts_per_token": 1})
    words = mlm.argv(render_megatron(megatron_args(k1, {**k1.default_layout().model_dump(), "dp": 32}), 32, 8))
    i = words.index("--moe-router-pre-softmax")
    ns, _ = mlm.parse(words[:i] + words[i + 1:])
    with pytest.raises(mlm.Rejected, match="pre-softmax"):
        mlm.transformer_config(ns)
    fp8 = _spec(models["moe-5p4b"], **{"model.precision": "fp8"})
    lo = {**fp8.default_layout().model_dump(), "dp": 64, "ckpt": "super-selective"}
    words = mlm.argv(render_megatron(megatron_args(fp8, lo), 64, 8))
    i = words.index("--fp8-recipe")
    ns, _ = mlm.parse(words[:i] + words[i + 2:])
    with pytest.raises(mlm.Rejected, match="Delayed scaling"):
        mlm.transformer_config(ns)


def test_flag_table_names_its_source():
    import json

    doc = json.loads(mlm.TABLE.read_text())
    assert doc["version"] in doc["source"] and len(doc["flags"]) > 500
    t = mlm.flag_table()
    assert "dist_muon" in t["--optimizer"]["choices"] and t["--disable-bias-linear"]["dest"] == "add_bias_linear"


def test_planner_tp_rule_is_megatrons():
    """The planner keeps a TP exactly when megatron-core's TransformerConfig accepts it: TP divides the query heads,
    and divides or is a multiple of the KV heads (with TP > KV heads Megatron-LM's attention all-gathers the QKV
    output over TP: supported, so the issue's 'TP divides the KV heads' would refuse layouts Megatron runs)."""
    from megatron.core.transformer.transformer_config import TransformerConfig
    from scaleplan.estimator.model_dims import geometry
    from scaleplan.estimator.plans import PlanConstraints, enumerate_plans

    from scaleplan.specs import ModelBlock

    for nkv in (1, 2, 4, 8, 16, 32):
        g = geometry(ModelBlock(n_layers=2, hidden_sz=4096, inter_sz=8192, n_q_heads=32, n_kv_heads=nkv,
                                head_dim=128, vocab_sz=1024))
        c = PlanConstraints(tp=(1, 2, 4, 8, 16, 32, 64), cp=(1,), pp=(1,), ep=(1,), mbs=(1,), ckpt=("full",),
                            max_tp=64)
        plans, _, _ = enumerate_plans(g, 64, 64, c)
        planner = {int(t) for t in plans.tp}
        megatron = set()
        for tp in (1, 2, 4, 8, 16, 32, 64):
            try:
                TransformerConfig(num_layers=2, hidden_size=4096, num_attention_heads=32, num_query_groups=nkv,
                                  tensor_model_parallel_size=tp)
                megatron.add(tp)
            except (ValueError, AssertionError):
                pass
        assert planner == megatron, (nkv, planner, megatron)
        assert 64 not in megatron  # 32 query heads over 64 ranks: refused by both


def test_the_all_to_all_overlap_round_trips_and_megatron_core_accepts_it(run, tmp_path, validation_dir):
    """--overlap-moe-expert-parallel-comm (stack.a2a_overlap, with the shared expert's overlap off as Megatron-Core
    requires): emitted with --delay-wgrad-compute on an interleaved pipeline, accepted by Megatron-LM's parser and
    megatron-core's TransformerConfig (which asserts the overlap's rules), read back from the run's log as the same
    stack."""
    from .test_megatron_log import _emit_and_read_back

    doc = yaml.safe_load((validation_dir / "models.yaml").read_text())["moe-5p4b"]
    doc = {**doc, "data": {**doc["data"], "gbs": 256}, "stack": {"a2a_overlap": True, "shared_expert_overlap": False}}
    emitted, r = _emit_and_read_back(run, tmp_path, doc, "tp=1,pp=2,vpp=2,ep=8,ckpt=selective")
    assert "--overlap-moe-expert-parallel-comm" in emitted and "--delay-wgrad-compute" in emitted
    assert "--moe-shared-expert-overlap" not in emitted
    ns, _ = mlm.parse(mlm.argv(emitted))
    mlm.validate(ns, 64)
    cfg = mlm.transformer_config(ns)
    assert cfg.overlap_moe_expert_parallel_comm and cfg.delay_wgrad_compute and not cfg.moe_shared_expert_overlap
    got, want = parse_spec(r["spec"]).stack, parse_spec(doc).stack
    assert got.model_dump() == want.model_dump() and got.key() != "megatron"
