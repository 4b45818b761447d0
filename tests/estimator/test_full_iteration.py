"""A step captured whole (stack cuda_graphs: full_iteration, Megatron-LM's --cuda-graph-impl full_iteration): the
host launches nothing one by one, so the step is the GPU's work alone, whatever the host law says."""
from __future__ import annotations

import pytest

from scaleplan.estimator.api import Estimator
from scaleplan.specs import Layout, parse_spec

B200 = "p6-b200.48xlarge"
MODEL = {"n_layers": 8, "hidden_sz": 2048, "inter_sz": 4096, "n_q_heads": 16, "n_kv_heads": 8, "head_dim": 128,
         "vocab_sz": 32000, "moe": {"n_experts": 64, "experts_per_token": 4, "expert_inter_sz": 768}}
# per-layer graphs over the attention and the router: the same device work, launched layer by layer
LAYERS = {"cuda_graphs": ["attn", "moe_router", "moe_preprocess"], "nan_check": False, "dispatcher": "hybridep"}
STEP = {**LAYERS, "cuda_graphs": ["full_iteration"]}


def _est(db, stack: dict, ckpt: str, host_scale: float | None = None):
    spec = parse_spec({"model": MODEL, "data": {"gbs": 64, "seqlen": 4096}, "stack": stack,
                       "hardware": {"node_type": B200}})
    est = Estimator(B200, db, use_calibration=False, host_scale=host_scale)
    return est.estimate(spec, 8, [Layout(ep=8, mbs=1, ckpt=ckpt)])[0]


@pytest.mark.recorded
def test_a_captured_step_is_the_gpus_work_alone(recorded_db):
    step = _est(recorded_db, STEP, "none")
    assert step.breakdown_s.get("dispatch_floor", 0.0) == 0.0
    # the host law does not reach it: ten times the host cost changes nothing, while per-layer graphs still pay it
    assert _est(recorded_db, STEP, "none", host_scale=10.0).t_iter_s == pytest.approx(step.t_iter_s, rel=1e-12)
    layers = _est(recorded_db, LAYERS, "none")
    assert _est(recorded_db, LAYERS, "none", host_scale=10.0).t_iter_s > 1.5 * layers.t_iter_s
    # and it is what the per-layer stack comes to as its host cost vanishes (the host-free scale of the estimator)
    assert step.t_iter_s == pytest.approx(_est(recorded_db, LAYERS, "none", host_scale=1e-9).t_iter_s, rel=1e-6)




def test_per_layer_graphs_refuse_full_recompute_and_a_captured_step_takes_it(recorded_db):
    """core_v0.19.0 TransformerConfig: with CUDA graphs, full recompute only under full_iteration. A layout asking
    for it under per-layer graphs is one line naming ckpt, and a search under them never enumerates it; a captured
    step runs it."""
    from scaleplan.errors import SpecError
    from scaleplan.estimator.layout import LayoutContext, ParallelLayout, stack_rules
    from scaleplan.estimator.model_dims import geometry
    from scaleplan.estimator.plans import PlanConstraints

    with pytest.raises(SpecError) as e:
        _est(recorded_db, LAYERS, "full")
    assert e.value.field.endswith("ckpt") and "full_iteration" in str(e.value) and "\n" not in str(e.value)
    assert _est(recorded_db, STEP, "full").t_iter_s > 0
    spec = parse_spec({"model": MODEL, "data": {"gbs": 64, "seqlen": 4096}, "stack": LAYERS})
    plans = ParallelLayout.from_specs([Layout(ep=8, mbs=1, ckpt=m) for m in ("none", "full")], 8)
    why = plans.reasons(LayoutContext(geometry(spec.model), 8, 64, 4096, **stack_rules(spec.stack)))
    assert list(why) == [None, "layer_graphs_not_full"]
    est = Estimator(B200, recorded_db, use_calibration=False)
    assert est.for_stack(spec.stack, "bf16").runnable(PlanConstraints()).layer_graphs
    captured = parse_spec({"model": MODEL, "data": {"gbs": 64, "seqlen": 4096}, "stack": STEP}).stack
    assert not est.for_stack(captured, "bf16").runnable(PlanConstraints()).layer_graphs
