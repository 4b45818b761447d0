"""The ops:* dispatch rows on a CUDA device, checked on CPU: the host issue timing against a simulated
device, and measure()'s per-part arithmetic (no uncosted-compute term on a GPU) against a stand-in probe."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from scaleplan.bench import harness as h
from scaleplan.bench.suites import model_ops


class _SimDevice:
    """A host clock and an asynchronous device queue: issuing costs host time, the work runs later."""

    def __init__(self):
        self.now = 0.0          # host clock, seconds
        self.free_at = 0.0      # when the device finishes its queue
        self.events: list[str] = []

    def clock(self) -> float:
        return self.now

    def issue(self, name: str, host_s: float, device_s: float):
        def run():
            self.events.append(name)
            self.now += host_s
            self.free_at = max(self.free_at, self.now) + device_s
        return run

    def sync(self):
        self.events.append("sync")
        self.now = max(self.now, self.free_at)


def test_issue_walls_time_the_host_launch_not_the_device_work():
    dev = _SimDevice()
    # fb: 2 ms to issue, 50 ms of device work; step: 0.5 ms to issue, 8 ms of device work
    fb, st = dev.issue("fb", 2e-3, 50e-3), dev.issue("step", 5e-4, 8e-3)
    fbs, sts = model_ops.issue_walls(fb, st, 3, sync=dev.sync, clock=dev.clock)
    assert fbs == pytest.approx([2e-3] * 3, abs=1e-15)
    # the step starts on a drained queue: fb's 50 ms of device work are not charged to it
    assert sts == pytest.approx([5e-4] * 3, abs=1e-15)
    assert dev.events == ["sync", "fb", "sync", "step"] * 3


def test_issue_walls_without_sync_are_back_to_back_host_walls():
    dev = _SimDevice()
    fb, st = dev.issue("fb", 3e-3, 0.0), dev.issue("step", 1e-3, 0.0)
    fbs, sts = model_ops.issue_walls(fb, st, 2, clock=dev.clock)
    assert (fbs, sts) == (pytest.approx([3e-3, 3e-3]), pytest.approx([1e-3, 1e-3]))
    assert dev.events == ["fb", "step"] * 2  # the CPU path never synchronises


# a stand-in probe: the model issues BASE ops outside its layers, DENSE per dense layer, MOE per MoE
# layer (the first block is dense), every op costing T_OP host seconds at the tiny widths
BASE, DENSE, MOE, T_OP = 50, 20, 30, 1e-5
ST_BASE, ST_DENSE, ST_MOE, T_ST = 4, 2, 3, 2e-6


def _fake_probe(calls):
    def probe(tokens, hidden, experts, layers, moe, ckpt, prec, dn, dev="cpu"):
        calls.append((tokens, hidden, experts, dev))
        n_dense, n_moe = (1, layers - 1) if moe else (layers, 0)
        n = BASE + DENSE * n_dense + MOE * n_moe
        ns = ST_BASE + ST_DENSE * n_dense + ST_MOE * n_moe
        big = (tokens, hidden, experts) != model_ops.TINY
        unc = (1e-3 if big else 1e-4) * n_moe  # uncosted compute grows with MoE layers and widths
        return n, ns, n * T_OP, ns * T_ST, unc, 0.0
    return probe


@dataclasses.dataclass
class _CudaCtx(h.Context):
    @property
    def is_cuda(self) -> bool:
        return True


@pytest.mark.parametrize("part,n_ops,t_op", [("moe", MOE, T_OP), ("dense", DENSE, T_OP), ("microbatch", BASE, T_OP),
                                             ("step_moe", ST_MOE, T_ST), ("step", ST_BASE, T_ST)])
def test_measure_on_cuda_is_op_count_times_issue_time_without_uncosted_compute(monkeypatch, part, n_ops, t_op):
    calls = []
    monkeypatch.setattr(model_ops, "_probe", _fake_probe(calls))
    ctx = _CudaCtx(device=torch.device("cpu"), timing=h.Timing(warmup=1, reps=3, min_reps=3))
    mode = f"ops:{part}" if part.startswith("step") else f"ops:{part}:none"
    r = model_ops.measure(dict(mode=mode, m=512, n=256, k=8), torch.bfloat16, ctx)
    assert r["wall_per_kernel_s"] == pytest.approx(n_ops * t_op, rel=1e-12)
    assert r["note"].startswith(f"n_ops={n_ops};") and "host issue time" in r["note"]
    # only the tiny probe runs: the point's widths would only time the uncosted compute
    assert {c[:3] for c in calls} == {model_ops.TINY}


def test_measure_on_cpu_still_adds_the_uncosted_compute(monkeypatch):
    monkeypatch.setattr(model_ops, "_probe", _fake_probe([]))
    ctx = h.Context(device=torch.device("cpu"), timing=h.Timing(warmup=1, reps=3, min_reps=3))
    r = model_ops.measure(dict(mode="ops:moe:none", m=512, n=256, k=8), torch.bfloat16, ctx)
    # one MoE layer's uncosted compute at the point's widths minus the tiny probe's
    assert r["wall_per_kernel_s"] == pytest.approx(MOE * T_OP + (1e-3 - 1e-4), rel=1e-12)
    assert "host issue time" not in r["note"]
