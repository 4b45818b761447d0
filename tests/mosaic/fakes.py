"""A fake estimator of known MFU for the MOSAIC tests (no tables, no time model)."""
from __future__ import annotations

from dataclasses import dataclass, field

from scaleplan.profiles import load_profile


@dataclass
class FakeResult:
    layout: dict
    mfu: float
    tokens_per_s: float
    mem_per_device_gb: float = 100.0
    composed_share: float = 0.0
    sources: dict = field(default_factory=lambda: {"experts": "measured"})


class FakeEstimator:
    """MFU = mfu_fn(model, gbs, seqlen, optimizer); no plan when E > max_experts. Records best_plan calls.

    The layout's pp/ep follow G (pp = G, ep = 8), so candidates with the same G share a layout family.
    """

    def __init__(self, mfu_fn=None, max_experts: int = 256):
        self.profile = load_profile("p6-b200.48xlarge")
        self.mfu_fn = mfu_fn or (lambda m, gbs, seqlen, opt: 0.3 / (1.0 + 0.15 * m.moe.experts_per_token))
        self.max_experts = max_experts
        self.calls: list[tuple] = []

    def best_plans(self, models, n_devices, gbs, seqlen, optimizer="adamw", constraints=None):
        return [self.best_plan(m, n_devices, gbs, seqlen, optimizer, constraints) for m in models]

    def best_plan(self, model, n_devices, gbs, seqlen, optimizer="adamw", constraints=None):
        from scaleplan.geometry import spec_param_counts

        self.calls.append((n_devices, gbs, seqlen, optimizer, constraints))
        if model.moe.n_experts > self.max_experts:
            return None
        pc = spec_param_counts(model)
        mfu = self.mfu_fn(model, gbs, seqlen, optimizer)
        tps = mfu * self.profile.peak("bf16") * n_devices / (6 * pc.n_act)
        g = max(1, round(2.5 * model.hidden_sz / model.moe.expert_inter_sz))  # ladder: d_ff = 2.5 d
        lay = {"tp": 1, "cp": 1, "pp": int(min(g, 8)), "ep": 8, "dp": n_devices // int(min(g, 8)), "etp": 1,
               "vpp": 1, "mbs": 2, "ckpt": "selective"}
        return FakeResult(lay, mfu, tps)
