"""The EP all-to-all under --overlap-moe-expert-parallel-comm (estimator/ep_overlap.py): the merged layer pair's
closed form against a generic two-stream event simulation of Megatron-Core's issue order, the unmerged passes,
and what a plan on that stack is then charged (and refused)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaleplan.errors import SpecError
from scaleplan.estimator.ep_overlap import exposed_a2a, layer_pair_time, unmerged_microbatches
from scaleplan.estimator.kernels import LayerKernels
from scaleplan.specs import Layout

# core_v0.19.0 TransformerLayerSchedulePlan.run, in the host's issue order: (part, stream, the parts it reads)
SCHEDULE = [("combine_bwd", "comm", ()), ("pre_dispatch_fwd", "comp", ()), ("mlp_bwd", "comp", ("combine_bwd",)),
            ("dispatch_fwd", "comm", ("pre_dispatch_fwd",)), ("mlp_bwd_dw", "comp", ("mlp_bwd",)),
            ("dispatch_bwd", "comm", ("mlp_bwd",)), ("mlp_fwd", "comp", ("dispatch_fwd",)),
            ("combine_fwd", "comm", ("mlp_fwd",)), ("pre_dispatch_bwd", "comp", ("dispatch_bwd",))]


def simulate(durations: dict[str, float]) -> float:
    """When the last part ends: each stream runs its parts in issue order, each part starts when its stream is
    free and its inputs have ended."""
    free, end = {"comm": 0.0, "comp": 0.0}, {}
    for name, stream, deps in SCHEDULE:
        start = max([free[stream]] + [end[d] for d in deps])
        end[name] = free[stream] = start + durations[name]
    return max(end.values())


seconds = st.floats(0.0, 5.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(a=seconds, pre_f=seconds, pre_b=seconds, mlp_f=seconds, mlp_b=seconds, wgrad=seconds)
def test_the_layer_pair_ends_when_the_event_simulation_does(a, pre_f, pre_b, mlp_f, mlp_b, wgrad):
    want = simulate({"combine_bwd": a, "dispatch_fwd": a, "dispatch_bwd": a, "combine_fwd": a,
                     "pre_dispatch_fwd": pre_f, "pre_dispatch_bwd": pre_b, "mlp_fwd": mlp_f, "mlp_bwd": mlp_b,
                     "mlp_bwd_dw": wgrad})
    assert float(layer_pair_time(a, pre_f, pre_b, mlp_f, mlp_b, wgrad)) == pytest.approx(want, abs=1e-12)
    compute = pre_f + pre_b + mlp_f + mlp_b + wgrad
    assert compute - 1e-12 <= want <= compute + 4 * a + 1e-12  # hidden at best, all four exchanges at worst


def _kernels(a2a: float, attn: float, experts: float) -> LayerKernels:
    """A layer whose only work is its attention projections, its experts and the exchanges (one plan)."""
    names = LayerKernels.__dataclass_fields__
    k = {n: np.zeros(1) for n in names}
    k.update(a2a_f=np.array([2 * a2a]), a2a_b=np.array([2 * a2a]), attn_f=np.array([attn]),
             attn_b=np.array([2 * attn]), ex_f=np.array([experts]), ex_b=np.array([2 * experts]))
    return LayerKernels(**k)


def test_exposure_by_hand_and_the_unmerged_passes():
    # a = 1 per exchange; windows: pre_f 0.3, mlp_b 0.5 (half of ex_b = 1), wgrad 0.5 + mlp_f 0.5, pre_b 0.6.
    # By hand on the two streams: combine_bwd [0,1]; mlp_bwd [1,1.5]; dispatch_fwd [1,2]; dispatch_bwd [2,3];
    # dw [1.5,2]; mlp_fwd [2,2.5]; combine_fwd [3,4]; pre_dispatch_bwd [3,3.6] -> 4, compute 2.4: 1.6 exposed
    k = _kernels(1.0, 0.3, 0.5)
    assert float(exposed_a2a(k, 1, 1, 10**9)[0]) == pytest.approx(1.6, rel=1e-6)
    # PP = 1: the first forward and the last backward run alone, 1 of n_mb micro-batches all exposed
    assert float(exposed_a2a(k, 1, 1, 4)[0]) == pytest.approx(1.6 + (4.0 - 1.6) / 4)
    # interleaved: Megatron-Core's warm-up at rank 0, (PP - 1) 2 + (VPP - 1) PP chunks and the one more the
    # overlap schedules (core_v0.19.0 schedules.py), in micro-batches
    assert unmerged_microbatches(8, 2, 128) == pytest.approx((7 * 2 + 1 * 8 + 1) / 2)
    assert unmerged_microbatches(4, 4, 2) == 2  # never more than there are
    assert float(exposed_a2a(_kernels(0.0, 0.3, 0.5), 1, 1, 4)[0]) == 0.0


def test_a_plan_on_the_overlap_stack_is_charged_less_and_refused_where_megatron_core_refuses(recorded_db):
    from scaleplan import catalogue
    from scaleplan.estimator import Estimator
    from scaleplan.specs import parse_spec

    doc = catalogue.spec_data("qwen3-235b-a22b")
    doc = {**doc, "data": {**doc["data"], "gbs": 2048}}
    est = Estimator("p6-b200.48xlarge", recorded_db, use_calibration=False)
    lay = Layout(pp=8, vpp=2, ep=32, mbs=1, ckpt="none", decoder_first_pipeline_num_layers=11,
                 decoder_last_pipeline_num_layers=11)
    plain = parse_spec({**doc, "stack": {"shared_expert_overlap": False}})
    merged = parse_spec({**doc, "stack": {"shared_expert_overlap": False, "a2a_overlap": True}})
    [r0], [r1] = est.estimate(plain, 256, [lay]), est.estimate(merged, 256, [lay])
    assert 0 < r1.breakdown_s["ep_a2a"] < r0.breakdown_s["ep_a2a"]
    assert r1.t_iter_s < r0.t_iter_s
    says = [w for w in r1.warnings if "exposed part of the all-to-all" in w]  # the plan says what it hides
    assert len(says) == 1 and not [w for w in r0.warnings if "exposed part" in w]
    for bad, field in ((dict(vpp=1), "vpp"), (dict(ckpt="full"), "ckpt"), (dict(ep=1, vpp=2), "ep")):
        with pytest.raises(SpecError, match="a2a_overlap"):
            est.estimate(merged, 256, [lay.model_copy(update=bad)])
    with pytest.raises(SpecError, match="shared_expert_overlap"):
        parse_spec({**doc, "stack": {"a2a_overlap": True}})
    with pytest.raises(SpecError, match="dispatcher"):
        parse_spec({**doc, "stack": {"a2a_overlap": True, "shared_expert_overlap": False, "dispatcher": "allgather"}})
