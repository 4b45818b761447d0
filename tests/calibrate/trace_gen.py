"""A synthetic torch.profiler Chrome trace of a training rank, written by a small discrete-event host/device
simulation: the host issues ops one after another (each a ``cpu_op`` around its launch call), one device
stream runs each kernel from max(launch + latency, previous kernel's end), and a sync blocks the host until
the stream is idle. The generator keeps its own totals (what it launched, how long it waited, how long the
device ran) so tests compare the reader against them, not against the reader's arithmetic."""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

HOST, DEV = (1, 1), (0, 7)  # (pid, tid) of the host thread and of the device stream
LATENCY_US = 3.0


@dataclass
class Totals:
    kernels: int = 0
    copies: int = 0
    launches: int = 0
    syncs: int = 0
    sync_us: float = 0.0
    device_us: float = 0.0
    step_us: list = field(default_factory=list)
    causes: dict = field(default_factory=dict)  # caller -> [count, us]


class Rank:
    """Builds the events; ``kernel``, ``sync`` and ``step`` advance the host clock ``t`` (us)."""

    def __init__(self, rank: int | None = 0, world_size: int = 8):
        self.t, self.corr = 0.0, 0
        self.stream_end: dict[int, float] = {}  # per device stream: when its last kernel ends
        self.events: list[dict] = []
        self.tot = Totals()
        self.meta = {} if rank is None else {"distributedInfo": {"backend": "nccl", "rank": rank,
                                                                "world_size": world_size}}

    def _x(self, cat, name, ts, dur, where=HOST, **args):
        ev = {"ph": "X", "cat": cat, "name": name, "pid": where[0], "tid": where[1], "ts": ts, "dur": dur}
        if args:
            ev["args"] = args
        self.events.append(ev)

    @property
    def dev_end(self) -> float:
        return max(self.stream_end.values(), default=0.0)

    def _device(self, cat, name, launch_ts, dur, stream=DEV[1]):
        start = max(launch_ts + LATENCY_US, self.stream_end.get(stream, 0.0))
        self.stream_end[stream] = start + dur
        self._x(cat, name, start, dur, (DEV[0], stream), correlation=self.corr, device=0, stream=stream)
        self.tot.device_us += dur

    def kernel(self, dur_us: float, gap_us: float, op: str = "aten::mm", name: str = "sm100_xmma_gemm",
               stream: int = DEV[1]):
        """One op: its cpu_op spans the host gap, the launch call sits inside it, the kernel follows on
        ``stream`` (each stream runs its kernels in order; streams run side by side)."""
        self.corr += 1
        self._x("cpu_op", op, self.t, gap_us)
        self._x("cuda_runtime", "cudaLaunchKernel", self.t + 0.25 * gap_us, 0.5 * gap_us, correlation=self.corr)
        self._device("kernel", name, self.t + 0.25 * gap_us, dur_us, stream)
        self.tot.kernels += 1
        self.tot.launches += 1
        self.t += gap_us

    def sync(self, caller: str | None, copy_us: float = 0.0):
        """A blocking sync under ``caller`` (a python_function; None: an explicit synchronize). With
        ``copy_us`` a device-to-host copy precedes it (``item()``: cudaMemcpyAsync + cudaStreamSynchronize)."""
        t0 = self.t
        if copy_us:
            self.corr += 1
            self._x("cuda_runtime", "cudaMemcpyAsync", self.t + 1, 2, correlation=self.corr)
            self._device("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", self.t + 1, copy_us)
            self.tot.copies += 1
            self.t += 3
        wait = max(self.dev_end - self.t, 0.0) + 1.0
        self._x("cuda_runtime", "cudaDeviceSynchronize" if caller is None else "cudaStreamSynchronize", self.t, wait)
        self.t += wait + 1.0
        if caller is not None:
            self._x("python_function", caller, t0 - 0.5, self.t - t0 + 0.5)
        key = caller or "(no enclosing op: an explicit synchronize)"
        c = self.tot.causes.setdefault(key, [0, 0.0])
        c[0] += 1
        c[1] += wait
        self.tot.syncs += 1
        self.tot.sync_us += wait

    def step(self, n: int, body):
        """ProfilerStep#n around ``body(self)``."""
        t0 = self.t
        body(self)
        self.sync(None)  # the step ends with the device drained, as a logged iteration does
        self.t += 5.0
        self._x("user_annotation", f"ProfilerStep#{n}", t0, self.t - t0)
        # the profiler mirrors the annotation on the device timeline: not a host step
        self._x("gpu_user_annotation", f"ProfilerStep#{n}", t0 + LATENCY_US, self.t - t0, DEV)
        self.tot.step_us.append(self.t - t0)

    def write(self, path: Path, gz: bool = False) -> Path:
        doc = json.dumps({**self.meta, "traceEvents": self.events})
        if gz:
            path.write_bytes(gzip.compress(doc.encode()))
        else:
            path.write_text(doc)
        return path


def host_bound_rank(kappa: int, gap_us: float, n_mb: int, layers: int, fixed_us: float) -> Rank:
    """n_mb micro-batches, each layers x kappa kernels issued gap_us apart and fixed_us of host work that
    launches nothing (the law's t_ep_host and t_host); kernels far shorter than the gap."""
    r = Rank(rank=1, world_size=2)

    def body(rr):
        for _ in range(n_mb):
            for _ in range(layers * kappa):
                rr.kernel(dur_us=1.0, gap_us=gap_us)
            rr.events.append({"ph": "X", "cat": "python_function", "name": "dispatcher host path", "pid": 1,
                              "tid": 1, "ts": rr.t, "dur": fixed_us})
            rr.t += fixed_us

    r.step(1, body)
    return r


def collective_group(delays_us: list[list[float]], transfer_us: float, compute_us: float) -> list[Rank]:
    """Ranks of one group that each run, per layer j, compute_us of work plus their own delay delays_us[r][j]
    and then one all-to-all: every rank's NCCL kernel starts when that rank arrives and ends together with
    the others', transfer_us after the last one arrived. One ProfilerStep#1 around it all."""
    n = len(delays_us)
    ranks = [Rank(rank=r, world_size=n) for r in range(n)]
    t_end = 0.0  # when the previous all-to-all ended (on every rank)
    for j in range(len(delays_us[0])):
        arrive = [t_end + compute_us + delays_us[r][j] for r in range(n)]
        t_end = max(arrive) + transfer_us
        for r, rk in enumerate(ranks):
            rk.corr += 1
            launch = arrive[r] - LATENCY_US
            rk._x("cuda_runtime", "cudaLaunchKernel", launch, 1.0, correlation=rk.corr)
            rk._device("kernel", "ncclDevKernel_SendRecv", launch, t_end - arrive[r], stream=13)
            rk.tot.kernels += 1
    for rk in ranks:
        rk._x("user_annotation", "ProfilerStep#1", -10.0, t_end + 20.0)
    return ranks
