"""stack="reference" on a GPU profile: the reference model's measured host rows (ops:*) replace the
Megatron kernel-count law, max'ed with the GPU time (not added); stack="megatron" ignores them."""
from __future__ import annotations

import pytest
from scaleplan.estimator import Estimator

from scaleplan.errors import SpecError
from scaleplan.profiles import DispatchDefaults, load_profile
from scaleplan.specs import Layout, parse_spec
from tests.estimator.conftest import frame

GPU = load_profile("h200-single")
assert not GPU.serial_dispatch
# a law that costs nothing and counts no framework kernels (kappa0 / 4 = COSTED_KERNELS_PER_FWD)
FREE_LAW = GPU.model_copy(update={"dispatch": DispatchDefaults(t_gap_s=1e-15, kappa0=80, kappa1=0, source="test")})
# a law that would dominate everything if it were used
HEAVY_LAW = GPU.model_copy(update={"dispatch": DispatchDefaults(t_gap_s=1e-2, kappa0=5000, kappa1=50,
                                                                t_host_s=3.0, source="test")})
L, N_MB, E = 3, 4, 8  # 1 dense + 2 MoE layers; gbs 4, mbs 1
LAY = [Layout(mbs=1, ckpt="none", dp=1)]
# the per-micro-batch components of the slowest stage (their sum is n_mb x the stage's GPU time)
LAYER_COMPS = ("attn_proj", "sdpa", "experts", "router", "permute", "shared_expert", "ep_a2a", "dense_mlp",
               "elementwise", "framework_kernels", "tp_comm", "cp_comm")


def _spec(ckpt="none"):
    return parse_spec({"model": {"n_layers": L, "hidden_sz": 128, "inter_sz": 320, "n_q_heads": 4,
                                 "n_kv_heads": 2, "head_dim": 32, "vocab_sz": 2048, "precision": "bf16",
                                 "moe": {"n_experts": E, "experts_per_token": 2, "expert_inter_sz": 160,
                                         "shared_expert_inter_sz": 160}},
                       "performance": {"activation_checkpointing_type": ckpt},
                       "data": {"gbs": N_MB, "seqlen": 128, "microbatch_sz": 1},
                       "hardware": {"node_type": "h200-single"}})


def _ops_frame(host: dict, ckpt="none"):
    rows = []
    for part, t in host.items():
        mode = f"ops:{part}" if part.startswith("step") else f"ops:{part}:{ckpt}"
        rows.append(dict(mode=mode, m=128, n=128, k=E, dtype="bf16", chain_len=1, wall_per_kernel_s=t,
                         active_per_kernel_s=None))
    return frame(rows)


# host seconds of the reference model's parts, far above the tiny model's GPU time on an H200
SLOW = {"moe": 1e-2, "dense": 5e-3, "microbatch": 2e-3, "step_moe": 3e-2, "step_dense": 2e-2, "step": 1e-2}
SLOW_MB = SLOW["dense"] + 2 * SLOW["moe"] + SLOW["microbatch"]        # 1 dense + 2 MoE layers per micro-batch
SLOW_STEP = SLOW["step_dense"] + 2 * SLOW["step_moe"] + SLOW["step"]  # per optimizer step
FAST = {k: 1e-12 for k in SLOW}  # host time negligible against any kernel


def _run(profile, host=None, stack="megatron", ckpt="none"):
    frames = {"dispatch": _ops_frame(host, ckpt)} if host else {}
    est = Estimator.from_frames(profile, frames, extrapolate="clamp", stack=stack)
    return est.estimate(_spec(ckpt), 1, [Layout(mbs=1, ckpt=ckpt, dp=1)])[0]


def test_reference_stack_takes_the_max_of_measured_host_and_gpu_time():
    r = _run(GPU, SLOW, "reference")
    assert r.sources["dispatch_floor"] == "measured"
    gpu = sum(r.breakdown_s[k] for k in LAYER_COMPS)
    assert 0 < gpu < N_MB * SLOW_MB  # host-bound: the GPU time hides behind the host
    # max(GPU, host) per micro-batch: the layer compute plus the floor is the host time, not host + GPU
    assert gpu + r.breakdown_s["dispatch_floor"] == pytest.approx(N_MB * SLOW_MB, rel=1e-9)
    assert r.breakdown_s["framework_kernels"] == 0.0  # Megatron's uncounted kernels are not charged
    # the optimizer: the host issue time of its ops, max'ed with (not added to) its GPU time
    assert r.breakdown_s["optimizer"] == pytest.approx(SLOW_STEP, rel=1e-9)
    assert r.t_analytic_s == pytest.approx(sum(r.breakdown_s.values()), rel=1e-12)


def test_reference_stack_does_not_use_the_megatron_law():
    light, heavy = _run(FREE_LAW, SLOW, "reference"), _run(HEAVY_LAW, SLOW, "reference")
    assert heavy.breakdown_s == pytest.approx(light.breakdown_s, rel=1e-12)
    assert heavy.t_analytic_s == pytest.approx(light.t_analytic_s, rel=1e-12)


def test_gpu_bound_reference_stack_is_the_gpu_time():
    # negligible host rows: nothing is added on top of the GPU work; a free law without framework
    # kernels gives the same GPU time on the Megatron stack
    ref, meg = _run(GPU, FAST, "reference"), _run(FREE_LAW, None, "megatron")
    assert ref.breakdown_s["dispatch_floor"] == 0.0
    assert meg.breakdown_s["framework_kernels"] == 0.0
    for k, v in meg.breakdown_s.items():
        assert ref.breakdown_s[k] == pytest.approx(v, rel=1e-9, abs=1e-15), k


def test_megatron_stack_ignores_the_ops_rows_on_a_gpu():
    with_rows, without = _run(GPU, SLOW), _run(GPU, None)
    assert with_rows.breakdown_s == pytest.approx(without.breakdown_s, rel=1e-12)
    assert with_rows.sources == without.sources
    assert with_rows.breakdown_s["framework_kernels"] > 0  # Megatron's uncounted kernels still charged


def test_reference_stack_without_rows_for_the_mode_falls_back_to_the_law():
    # rows for full recompute only; the plan runs without checkpointing
    frames = {"dispatch": _ops_frame(SLOW, ckpt="full")}
    r = Estimator.from_frames(GPU, frames, extrapolate="clamp", stack="reference").estimate(_spec(), 1, LAY)[0]
    assert r.sources["dispatch_floor"] == "analytic"
    # the profile's law, one micro-batch of the one stage (ckpt none: 3 of the law's 4 forward units;
    # EP = 1: no EP host term): L (kappa0 + kappa1 E) 3/4 t_gap + t_host
    law = GPU.dispatch
    t_law = L * (law.kappa0 + law.kappa1 * E) * 0.75 * law.t_gap_s + law.t_host_s
    gpu = sum(r.breakdown_s[k] for k in LAYER_COMPS)
    assert gpu < N_MB * t_law
    assert gpu + r.breakdown_s["dispatch_floor"] == pytest.approx(N_MB * t_law, rel=1e-9)


def test_a_bad_stack_is_refused_naming_field_value_and_choices():
    with pytest.raises(SpecError) as e:
        Estimator.from_frames(GPU, {}, stack="deepspeed")
    msg = str(e.value)
    assert "stack" in msg and "deepspeed" in msg and "megatron" in msg and "reference" in msg


def test_reference_lookups_ask_for_the_host_rows_on_a_gpu():
    def modes(stack):
        est = Estimator.from_frames(GPU, {}, stack=stack)
        return {p["mode"] for p in est.lookups(_spec("selective"), 1, [Layout(mbs=1, ckpt="selective", dp=1)])
                ["dispatch"]}

    assert modes("reference") >= {"ops:moe:selective", "ops:dense:selective", "ops:microbatch:selective",
                                  "ops:step_moe", "ops:step_dense", "ops:step"}
    assert not any(m.startswith("ops:") for m in modes("megatron"))


def test_validate_predicts_with_the_reference_stack(monkeypatch):
    import scaleplan.estimator as est_mod
    from scaleplan.validate import compare

    seen = {}

    class Spy:
        def __init__(self, *a, **kw):
            seen.update(kw)

        def estimate(self, spec, n, layouts):
            return []

    monkeypatch.setattr(est_mod, "Estimator", Spy)
    compare.predict(_spec(), LAY, 1, "h200-single", None)
    assert seen.get("stack") == "reference"
