"""The dispatch suite's sync:<every> rows (what a device synchronisation costs a kernel stream),
checked on CPU: sync_walls against a simulated device whose host issues kernels ahead of it, and the row's
derived exposed seconds per synchronisation against the hand-computed timeline."""
from __future__ import annotations

import pytest
import torch
from scaleplan.bench import harness as h
from scaleplan.bench.suites import dispatch


class _SimDevice:
    """A host clock and an in-order device queue: a launch costs the host ``launch_s`` and queues ``kernel_s``
    of device work; a sync waits for the queue to drain, then costs the host ``wake_s`` to return."""

    def __init__(self, launch_s: float, kernel_s: float, wake_s: float):
        self.launch_s, self.kernel_s, self.wake_s = launch_s, kernel_s, wake_s
        self.now = 0.0
        self.free_at = 0.0
        self.syncs = 0

    def clock(self) -> float:
        return self.now

    def issue(self):
        self.now += self.launch_s
        self.free_at = max(self.free_at, self.now) + self.kernel_s

    def sync(self):
        self.syncs += 1
        self.now = max(self.now, self.free_at) + self.wake_s


def _walls(dev: _SimDevice, n: int, every: int | None):
    return dispatch.sync_walls(dev.issue, n, every, dev.sync, clock=dev.clock)


N = 512
LAUNCH, KERNEL, WAKE = 7e-6, 50e-6, 3e-6  # host ahead: a kernel lasts longer than its launch


def test_without_a_sync_the_host_runs_ahead_and_the_wall_is_the_device_work():
    dev = _SimDevice(LAUNCH, KERNEL, WAKE)
    wall, issued = _walls(dev, N, None)
    # the first launch, then N kernels back to back, then the final sync's wake-up
    assert wall == pytest.approx(LAUNCH + N * KERNEL + WAKE, rel=1e-12)
    assert issued == pytest.approx(N * LAUNCH, rel=1e-12)
    assert dev.syncs == 2  # the empty queue at the start, the end


@pytest.mark.parametrize("every", [1, 8, 64])
def test_each_sync_exposes_the_next_launch_and_the_wake_up(every):
    dev = _SimDevice(LAUNCH, KERNEL, WAKE)
    wall_s, _ = _walls(dev, N, every)
    # per group of `every` kernels: the first launch on an idle device, the group's kernels, the wake-up
    assert wall_s == pytest.approx(N / every * (LAUNCH + every * KERNEL + WAKE), rel=1e-12)
    assert dev.syncs == 1 + N // every  # no second sync at the end of a synchronised chain
    wall_f, _ = _walls(_SimDevice(LAUNCH, KERNEL, WAKE), N, None)
    got = dispatch.exposed_per_sync_s(wall_s / N, wall_f / N, every)
    assert got == pytest.approx((LAUNCH + WAKE) * (1 - every / N), rel=1e-9)


def test_a_host_bound_stream_pays_the_kernel_it_could_not_overlap():
    """Kernels shorter than their launch: without syncs the device waits on the host anyway; a sync after
    every kernel adds the kernel's own time and the wake-up, the launch being paid either way."""
    launch, kernel = 10e-6, 4e-6
    wall_s, _ = _walls(_SimDevice(launch, kernel, WAKE), N, 1)
    wall_f, _ = _walls(_SimDevice(launch, kernel, WAKE), N, None)
    assert wall_f == pytest.approx(N * launch + kernel + WAKE, rel=1e-12)
    got = dispatch.exposed_per_sync_s(wall_s / N, wall_f / N, 1)
    assert got == pytest.approx((kernel + WAKE) * (1 - 1 / N), rel=1e-9)


def test_sync_rows_are_cuda_only_and_expand_from_the_chain_grid():
    ctx = h.Context(device=torch.device("cpu"), timing=h.Timing(warmup=1, reps=3, min_reps=3))
    with pytest.raises(h.Unsupported, match="CUDA only"):
        dispatch.measure(dict(mode="sync:8", m=8, n=64, k=64, dtype="fp32", chain_len=64), ctx)
    cfg = dispatch.Config(modes=["sync:1", "sync:16"], m=[8, 2048], k=[2048], chain_len=[512])
    pts = dispatch.expand(cfg, ctx)
    assert sorted((p["mode"], p["m"]) for p in pts) == [("sync:1", 8), ("sync:1", 2048), ("sync:16", 8),
                                                         ("sync:16", 2048)]
    assert all(p["n"] == p["k"] == 2048 and p["chain_len"] == 512 for p in pts)


def test_the_host_is_ahead_only_when_the_device_sets_the_pace():
    """A host-bound chain's wall is its issue time plus the last kernel, so issue < wall always: the label
    needs a margin (an H200 m=8 chain: 19.0 us issued, 19.0 us wall; m=8192: 21 us issued, 89 us wall)."""
    assert dispatch.host_state(19.0e-6, 19.0e-6) == "host-bound"
    assert dispatch.host_state(19.8e-6, 20.5e-6) == "host-bound"
    assert dispatch.host_state(21.4e-6, 89.0e-6) == "host ahead"
