"""Estimator/memory.py against the reference model's real tensors on CPU.

Static memory (weights, gradients, fp32 master weights and gradients, AdamW moments) is compared
exactly with the tensors of a built model after one optimizer step; activation memory, per layer
and checkpointing mode, with the bytes torch saves for backward (saved_tensors_hooks)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from scaleplan.estimator import memory as mm
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.layout import ParallelLayout

from scaleplan.reference.model import build_model, moe_block_flags
from scaleplan.reference.optim import MasterAdamW
from scaleplan.specs import Layout, parse_spec
from scaleplan.validate.memory import saved_activation_bytes, state_bytes

MODEL = {"n_layers": 3, "hidden_sz": 64, "inter_sz": 160, "n_q_heads": 4, "n_kv_heads": 2, "head_dim": 16,
         "vocab_sz": 512, "moe": {"n_experts": 8, "experts_per_token": 2, "expert_inter_sz": 40,
                                  "shared_expert_inter_sz": 40, "first_dense_layers": 1}}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MODES = ("none", "selective", "super-selective", "full")
B, S = 2, 32


def _spec(precision="fp32", **over):
    return parse_spec({"model": {**MODEL, "precision": precision, **over}, "hardware": {"node_type": "cpu-local"}})


def _stepped(spec, precision):
    torch.manual_seed(0)
    model = build_model(spec.model, "none", "cpu", DTYPES[precision])
    opt = MasterAdamW(model.parameters())
    tok = torch.randint(0, spec.model.vocab_sz, (B, S))
    model(tok, tok).backward()
    opt.step()
    return model, opt


def _predict(spec, dp=1, ckpt="none", **kw):
    g = geometry(spec.model)
    pl = ParallelLayout.from_specs([Layout(dp=dp, mbs=B, ckpt=ckpt)], dp)
    m = mm.memory_breakdown(g, pl, gbs=dp * B, seqlen=S, optimizer="adamw", state=mm.REFERENCE_DDP,
                            rope=spec.model.rotary_embeds, **kw)
    return {k: float(v[0]) for k, v in m.items()}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("over", [{}, {"tie_embeddings": True}, {"moe": {**MODEL["moe"], "moe_frequency": 2}}])
def test_static_memory_equals_the_reference_models_tensors(precision, over):
    spec = _spec(precision, **over)
    model, opt = _stepped(spec, precision)
    real = state_bytes(model, opt)
    pred = _predict(spec)
    assert pred["weights"] == real["weights"]
    assert pred["grads"] == real["grads"]
    # master copies and their fp32 gradients exist only for a low-precision model
    assert (real["master"] > 0) == (precision == "bf16") and real["master_grads"] == real["master"]
    assert pred["optimizer"] == real["master"] + real["moments"]
    assert pred["master_grads"] == real["master_grads"] and pred["ddp_buckets"] == 0
    n_tensors = len(opt.params)
    assert real["step_counters"] == 4 * n_tensors  # one fp32 scalar per tensor, not modelled (bytes)


def test_ddp_buckets_double_the_gradients_at_dp2():
    import torch.distributed as dist

    from scaleplan.validate.runner import _free_port

    spec = _spec("bf16")
    model, opt = _stepped(spec, "bf16")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        buckets = sum(int(x) for x in ddp._get_ddp_logging_data()["bucket_sizes"].split(","))
    finally:
        dist.destroy_process_group()
    real = state_bytes(model, opt)
    assert buckets == real["grads"]  # the reducer's copy of every gradient
    assert _predict(spec, dp=2)["ddp_buckets"] == buckets
    assert _predict(spec, dp=2)["grads"] == _predict(spec, dp=1)["grads"] == real["grads"]


def _measured_blocks(spec, precision, ckpt):
    torch.manual_seed(0)
    model = build_model(spec.model, ckpt, "cpu", DTYPES[precision])
    g = torch.Generator().manual_seed(1)
    tok = torch.randint(0, spec.model.vocab_sz, (B, S), generator=g)
    lab = torch.randint(0, spec.model.vocab_sz, (B, S), generator=g)
    return saved_activation_bytes(model, tok, lab)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("ckpt", MODES)
@pytest.mark.parametrize("over", [{}, {"attn_gate": False, "rotary_embeds": False},
                                  {"n_kv_heads": 4, "moe": {**MODEL["moe"], "shared_expert_inter_sz": 0}},
                                  {"moe": {**MODEL["moe"], "experts_per_token": 4, "n_experts": 16}}])
def test_activation_bytes_per_layer_match_saved_tensors(precision, ckpt, over):
    spec = _spec(precision, **over)
    got = _measured_blocks(spec, precision, ckpt)
    g = geometry(spec.model)
    a = mm.act_bytes(precision)
    mode = np.array(MODES.index(ckpt))
    for i, is_moe in enumerate(moe_block_flags(spec.model)):
        pred = float(mm.block_activation_bytes(S, B, g, 1, 1, is_moe, mode, a, spec.model.rotary_embeds))
        if i == 0 and spec.model.rotary_embeds:
            pred += a * S * spec.model.head_dim  # the cos/sin tables, first saved by block 0
        # exact in fp32; bf16 on CPU keeps LayerNorm statistics in bf16 (fp32 on CUDA, as modelled)
        assert pred == pytest.approx(got[f"block{i}"], rel=0.0 if precision == "fp32" else 0.01), (i, ckpt)


@pytest.mark.parametrize("precision,sdpa", [("fp32", "bf16"), ("bf16", "fp32")])
@pytest.mark.parametrize("ckpt", MODES)
@pytest.mark.parametrize("gate", [True, False])
def test_attention_in_another_dtype_saves_the_cast_copies(precision, sdpa, ckpt, gate):
    """sdpa_precision != precision: the reference model casts Q, K, V for SDPA and its output back;
    the terms for the cast copies must match what torch saves, and differ from the uncast model's."""
    spec = _spec(precision, sdpa_precision=sdpa, attn_gate=gate)
    got = _measured_blocks(spec, precision, ckpt)
    g = geometry(spec.model)
    assert mm.sdpa_cast(g)
    a = mm.act_bytes(precision)
    mode = np.array(MODES.index(ckpt))
    same = geometry(_spec(precision, attn_gate=gate).model)
    for i, is_moe in enumerate(moe_block_flags(spec.model)):
        pred = float(mm.block_activation_bytes(S, B, g, 1, 1, is_moe, mode, a, True))
        if i == 0:
            pred += a * S * spec.model.head_dim  # the cos/sin tables, first saved by block 0
        assert pred == pytest.approx(got[f"block{i}"], rel=0.0 if precision == "fp32" else 0.01), (i, ckpt)
        if ckpt != "full":
            assert pred != float(mm.block_activation_bytes(S, B, same, 1, 1, is_moe, mode, a, True)) + \
                (a * S * spec.model.head_dim if i == 0 else 0.0)


@pytest.mark.parametrize("ckpt", MODES)
def test_whole_model_activations_match_within_5_percent(ckpt):
    spec = _spec("fp32")
    got = sum(_measured_blocks(spec, "fp32", ckpt).values())
    pred = _predict(spec, ckpt=ckpt)
    peak_layer = 0.0
    if ckpt == "full":  # the prediction adds one layer's activations, live while it is recomputed
        g = geometry(spec.model)
        peak_layer = float(mm.block_activation_bytes(S, B, g, 1, 1, True, np.array(0), 4.0))
    assert pred["activations"] - peak_layer == pytest.approx(got, rel=0.05)
    assert pred["activations"] - peak_layer == pytest.approx(got, abs=8)  # the CE's scalar is not modelled


def test_allocator_term_is_labelled_and_splits_allocated_from_reserved():
    spec = _spec("bf16")
    legacy = _predict(spec, reserve_bytes=5e9)
    assert legacy["reserve"] == 5e9 and "allocator" not in legacy
    m = _predict(spec, allocator_fraction=0.1, context_bytes=7e8)
    alloc = sum(m[k] for k in ("weights", "grads", "optimizer", "activations", "logits", "ddp_buckets",
                               "master_grads"))
    assert m["allocator"] == pytest.approx(0.1 * alloc) and m["context"] == 7e8 and "reserve" not in m
    a, r, total = (float(x) for x in mm.allocated_reserved({k: np.array(v) for k, v in m.items()}))
    assert a == pytest.approx(alloc) and r == pytest.approx(1.1 * alloc) and total == pytest.approx(r + 7e8)


def test_reference_peak_counts_gradients_only_where_they_are_live():
    mem = {k: np.array([v]) for k, v in {"weights": 2.0, "optimizer": 12.0, "ddp_buckets": 2.0, "grads": 2.0,
                                           "master_grads": 4.0, "activations": 30.0, "logits": 5.0}.items()}
    # one micro-batch: no gradient exists during the forward; the step (6) is smaller than fwd/bwd (35)
    assert float(mm.reference_peak_allocated(mem, 1)[0]) == 16.0 + 35.0
    assert float(mm.reference_peak_allocated(mem, 4)[0]) == 16.0 + 37.0  # earlier micro-batches' grads
    small = {**mem, "activations": np.array([0.5]), "logits": np.array([0.0])}
    assert float(mm.reference_peak_allocated(small, 1)[0]) == 16.0 + 6.0  # the optimizer step is the peak
