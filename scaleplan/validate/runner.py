"""Real training steps of the reference model: forward + backward + AdamW, DP over processes.

One layout runs in ``nproc`` fresh worker processes (``torch.multiprocessing`` spawn; also usable
under ``torchrun`` through :func:`main`), so each measurement starts from a clean allocator and a
clean RSS high-water mark. Process group: gloo on CPU, NCCL on GPU; the model is wrapped in DDP
(gradients all-reduced, overlapped with the backward of the last micro-batch). Each optimizer step
runs n_mb = gbs / (dp * mbs) micro-batches with gradient accumulation (``no_sync`` on all but the
last), one AdamW step (fp32 master weights when the model is bf16/fp16), then the LFLB bias
update of every router (eq:bias-update, counts summed over micro-batches and DP ranks).

Measured (all SI): per-step wall time in seconds (CUDA-synchronised on GPU; the max over ranks),
the median after ``warmup`` steps; peak memory in bytes: ``torch.cuda.max_memory_allocated`` on
GPU, on CPU the growth of the peak RSS (getrusage ru_maxrss) over its value after imports, i.e.
what the model, optimizer and activations added (the raw peak RSS is reported beside it).
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scaleplan.errors import ScaleplanError, SpecError
from scaleplan.estimator.layout import LayoutContext, ParallelLayout
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.shapes import plan_shapes
from scaleplan.specs import Layout, Spec
from scaleplan.validate.load import machine_busy_s

RUNNABLE_PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


@dataclass
class RunConfig:
    spec: dict[str, Any]
    layout: dict[str, Any]
    steps: int = 5
    warmup: int = 2
    device: str = "cpu"
    nproc: int = 1
    threads: int | None = None  # CPU threads per process; None = cores // nproc
    seed: int = 0
    loadavg_before: float | None = None  # 1-minute load average before the workers started (run_layout)
    trace_dir: str | None = None  # record a torch.profiler trace of TRACE_STEPS extra steps here (rank 0)
    trace_tag: str | None = None  # subdirectory of trace_dir for this layout


@dataclass
class RunResult:
    step_times_s: list[float]
    t_iter_s: float  # median after warm-up
    peak_mem_bytes: float  # see module docstring
    peak_rss_bytes: float | None
    rss_baseline_bytes: float | None
    n_mb: int
    world_size: int
    threads: int
    grouped_impl: str
    device_name: str
    torch_version: str
    backend: str
    final_loss: float
    starved_experts: float  # mean over MoE layers, last step (app:train_dynamics)
    extra: dict[str, Any] = field(default_factory=dict)


def check_layout(spec: Spec, layout: Layout, nproc: int) -> int:
    """Refuse what this runner cannot execute; return n_mb. Raises SpecError naming the field."""
    from scaleplan.estimator.layout import FIELDS

    for name in (f for f in FIELDS if f not in ("dp", "mbs", "ckpt")):  # every parallel degree but DP
        if getattr(layout, name) != 1:
            raise SpecError(f"--layout {name}", getattr(layout, name),
                            "validate runs data parallelism only: tp=cp=pp=ep=etp=vpp=1")
    if layout.dp not in (None, nproc):
        raise SpecError("--layout dp", layout.dp, f"dp must equal --nproc ({nproc})")
    for name in ("precision", "sdpa_precision"):
        if getattr(spec.model, name) not in RUNNABLE_PRECISIONS:
            raise SpecError(f"model.{name}", getattr(spec.model, name), f"validate runs {', '.join(RUNNABLE_PRECISIONS)}")
    if spec.model.dropout:
        raise SpecError("model.dropout", True, "false: the reference model has no dropout layers "
                        "(the estimator costs Megatron's dropout for a prediction)")
    _check_features(spec)
    gbs, g = spec.data.gbs, geometry(spec.model)
    lay = ParallelLayout.from_specs([layout.model_copy(update={"dp": nproc})], nproc)
    lay.validate(LayoutContext(g, nproc, gbs, spec.data.seqlen))  # the estimator's rules
    return int(plan_shapes(g, lay, spec.data.seqlen, gbs).one().n_mb)


def _check_features(spec: Spec) -> None:
    """The reference model is the paper's architecture: refuse a model feature it does not build."""
    m, moe = spec.model, spec.model.moe
    unset = {"model.mla": m.mla, "model.mtp_layers": m.mtp_layers or None, "model.sliding_window": m.sliding_window,
             "model.qk_norm": m.qk_norm or None, "model.attention_sinks": m.attention_sinks or None,
             "model.linear_bias": None if m.linear_bias == "none" else m.linear_bias,
             "model.swiglu_limit": m.swiglu_limit,
             "model.moe.router_score": None if moe is None or moe.router_score == "softmax" else moe.router_score,
             "model.moe.expert_bias": moe.expert_bias or None if moe else None}
    for field_name, value in unset.items():
        if value is not None:
            raise SpecError(field_name, value if not hasattr(value, "model_dump") else value.model_dump(),
                            "unset: the reference model that validate runs is the paper's architecture (GQA, "
                            "SwiGLU, softmax router, no biases); the estimator and --emit megatron cover this feature")


def _max_rss_bytes() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return float(r if sys.platform == "darwin" else r * 1024)


def _proc_status_kb(field: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_rss() -> float:
    """Reset the RSS high-water mark where the OS allows it (Linux: clear_refs 5) and return the
    current RSS in bytes, the baseline the training peak is measured against."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    cur = _proc_status_kb("VmRSS")
    return cur if cur is not None else _max_rss_bytes()


def peak_rss() -> float:
    """Peak RSS in bytes since the last :func:`reset_peak_rss` (VmHWM), else ru_maxrss."""
    hwm = _proc_status_kb("VmHWM")
    return hwm if hwm is not None else _max_rss_bytes()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_threads(nproc: int) -> int:
    """torch threads per process when ``--threads`` is not given: the CPUs shared by the processes."""
    return max(1, (os.cpu_count() or 1) // nproc)


@dataclass
class _Replica:
    """One DP rank's training job: the model (and its DDP wrapper), the optimizer and the rank's fixed
    micro-batches, on its device."""

    model: Any
    net: Any  # the model, or its DDP wrapper when world > 1
    opt: Any
    batches: list[tuple[Any, Any]]  # n_mb (tokens, labels) pairs of shape [mbs, S]
    device: Any
    threads: int
    impl: str  # the grouped-GEMM implementation select_impl chose
    rss0: float  # RSS in bytes before the model was built (the CPU peak's baseline)


def _replica(rank: int, world: int, cfg: RunConfig, spec: Spec, layout: Layout, n_mb: int) -> _Replica:
    """Set up the device and threads, then build the model, its DDP wrapper, AdamW and the batches; the
    memory baselines are taken before the model exists."""
    import torch

    from scaleplan.reference.grouped import select_impl
    from scaleplan.reference.model import build_model
    from scaleplan.reference.optim import MasterAdamW, torch_dtype

    cuda = cfg.device == "cuda"
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}") if cuda else torch.device("cpu")
    threads = cfg.threads or default_threads(world)
    torch.set_num_threads(threads)
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = spec.model.precision == "tf32"
        torch.cuda.reset_peak_memory_stats(device)
    rss0 = reset_peak_rss()
    dtype = torch_dtype(spec.model.precision)
    torch.manual_seed(cfg.seed)  # same initial weights on every rank
    model = build_model(spec.model, layout.ckpt, device, dtype)
    impl = select_impl(device, dtype)
    net = model
    if world > 1:
        # phi is kept identical on all ranks by the all-reduced counts: no buffer broadcast per forward
        try:
            net = torch.nn.parallel.DistributedDataParallel(model, forward_sync_buffers=False)
        except TypeError:  # older torch
            net = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    opt = MasterAdamW(model.parameters())
    g = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
    S, V, mbs = spec.data.seqlen, spec.model.vocab_sz, layout.mbs
    batches = [(torch.randint(0, V, (mbs, S), generator=g).to(device),
                torch.randint(0, V, (mbs, S), generator=g).to(device)) for _ in range(n_mb)]
    return _Replica(model, net, opt, batches, device, threads, impl, rss0)


def _step_of(rep: _Replica, world: int) -> Callable[[], float]:
    """One optimizer step of ``rep``: n_mb micro-batches (DDP all-reduce on the last), AdamW, bias update;
    returns the step's loss."""
    n_mb = len(rep.batches)

    def one_step() -> float:
        rep.opt.zero_grad()
        total = 0.0
        for i, (tok, lab) in enumerate(rep.batches):
            rep.model.set_microbatch(i)
            sync_ctx = rep.net.no_sync() if world > 1 and i < n_mb - 1 else contextlib.nullcontext()
            with sync_ctx:
                loss = rep.net(tok, lab) / n_mb
                loss.backward()
            total += loss.detach()
        with _region("optimizer"):
            rep.opt.step()
        with _region("bias_update"):
            for r in rep.model.routers():
                r.update_bias()
        return float(total)

    return one_step


def _timed_steps(one_step: Callable[[], float], cfg: RunConfig, device) -> tuple[list[float], list[float], float, tuple]:
    """Run warm-up and timed steps: (wall seconds per step, this process's CPU seconds per step, the last
    loss, the (wall, CPU, machine-busy) probe taken when the timed steps start)."""
    import torch

    cuda = device.type == "cuda"
    times, cpu_times, loss_val, probe0 = [], [], float("nan"), None
    for step in range(cfg.warmup + cfg.steps):
        if cuda:
            torch.cuda.synchronize(device)
        if step == cfg.warmup:  # the timed steps start: what the machine and this process have spent so far
            probe0 = (time.perf_counter(), time.process_time(), machine_busy_s())
        t0, c0 = time.perf_counter(), time.process_time()
        loss_val = one_step()
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    return times, cpu_times, loss_val, probe0


def _train(rank: int, world: int, cfg: RunConfig) -> dict[str, Any]:
    """Every rank's body: build the replica, run the steps, gather the slowest step times and the largest
    memory over the ranks; the dict :func:`_to_result` reads (meaningful on rank 0)."""
    import torch
    import torch.distributed as dist

    from scaleplan.specs import parse_spec

    spec, layout = parse_spec(cfg.spec), Layout(**cfg.layout)
    n_mb = check_layout(spec, layout, world)
    rep = _replica(rank, world, cfg, spec, layout, n_mb)
    device, cuda = rep.device, cfg.device == "cuda"
    one_step = _step_of(rep, world)
    times, cpu_times, loss_val, probe0 = _timed_steps(one_step, cfg, device)
    load = _load_report(probe0, world, rep.threads, cfg.loadavg_before, device)
    peak = float(torch.cuda.max_memory_allocated(device)) if cuda else peak_rss() - rep.rss0
    reserved = float(torch.cuda.max_memory_reserved(device)) if cuda else None
    rss_peak = None if cuda else peak_rss()
    trace = _traced_steps(one_step, cfg, rank, device) if cfg.trace_dir else None  # after the memory peaks
    stats = torch.tensor([peak, *times], dtype=torch.float64, device=device)
    if world > 1:
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)  # slowest rank per step; largest memory
    routers = rep.model.routers()
    stats = stats.cpu()
    in_sync = _replicas_in_sync(rep.model, world, device)
    return {"dp_replicas_in_sync": in_sync, "times": stats[1:].tolist(), "peak": float(stats[0]),
            "rss_peak": rss_peak, "rss0": None if cuda else rep.rss0, "n_mb": n_mb, "threads": rep.threads,
            "impl": rep.impl, "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
            "torch_version": torch.__version__, "loss": loss_val,
            "cpu_times": cpu_times, "load": load, "reserved": reserved, "trace": trace,
            "starved": sum(r.last_starved for r in routers) / len(routers) if routers else 0.0}


TRACE_STEPS = 2  # profiled steps after the timed ones (their times are not in the median)


def _region(name: str):
    from scaleplan.reference.model import scope

    return scope(name)


def _traced_steps(one_step, cfg: "RunConfig", rank: int, device) -> dict | None:
    """TRACE_STEPS more steps on every rank (DDP needs them all); rank 0 records them with
    torch.profiler (CPU, plus CUDA on a GPU), saves the Chrome trace and attributes its time to the
    estimator's components (scaleplan.validate.trace)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from scaleplan.reference import model as vmodel
    from scaleplan.validate import trace as vtrace

    cuda = device.type == "cuda"
    vmodel.TRACE_SCOPES["on"] = True
    try:
        if rank != 0:
            for _ in range(TRACE_STEPS):
                one_step()
            return None
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            if cuda:
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            for _ in range(TRACE_STEPS):
                one_step()
            if cuda:
                torch.cuda.synchronize(device)
            wall = time.perf_counter() - t0
    finally:
        vmodel.TRACE_SCOPES["on"] = False
    path = vtrace.trace_file(cfg.trace_dir, cfg.trace_tag or "layout")
    prof.export_chrome_trace(str(path))
    got = vtrace.attribute(prof.events(), wall, device.type, TRACE_STEPS)
    return {"path": str(path), "steps": TRACE_STEPS, "step_wall_s": wall / TRACE_STEPS,
            "in_trace": vtrace.chrome_totals(path, TRACE_STEPS), **got}


def _load_report(probe0, world: int, threads: int, loadavg_before, device) -> dict:
    """The timed steps' load (scaleplan.validate.load): own CPU seconds summed over the ranks."""
    import torch
    import torch.distributed as dist

    from scaleplan.validate.load import assess, loadavg_1m, usable_cpus

    wall0, cpu0, busy0 = probe0
    own = torch.tensor([time.process_time() - cpu0], dtype=torch.float64, device=device)
    if world > 1:
        dist.all_reduce(own)  # every rank's process time: the run's own share of the machine
    busy1 = machine_busy_s()
    busy = None if busy0 is None or busy1 is None else busy1 - busy0
    return assess(cpus=usable_cpus(), threads=threads, world_size=world, loadavg_before=loadavg_before,
                  loadavg_after=loadavg_1m(), wall_s=time.perf_counter() - wall0, own_cpu_s=float(own.item()),
                  machine_busy_s=busy).to_dict()


def _replicas_in_sync(model, world: int, device) -> bool:
    """True when every DP rank holds the same weights and LFLB biases (a check that DP really ran)."""
    import torch
    import torch.distributed as dist

    if world == 1:
        return True
    with torch.no_grad():
        parts = [p.float().sum() for p in model.parameters()] + [r.phi.sum() for r in model.routers()]
        local = torch.stack(parts).to(torch.float64).to(device)
    lo, hi = local.clone(), local.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    return bool(torch.allclose(lo, hi, rtol=1e-6, atol=1e-9))


def _worker(rank: int, world: int, cfg: RunConfig, port: int, out: str) -> None:
    import torch.distributed as dist

    if cfg.device == "cuda":
        import torch

        torch.cuda.set_device(rank % torch.cuda.device_count())  # before NCCL binds a device
    if world > 1:
        backend = "nccl" if cfg.device == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        res = _train(rank, world, cfg)
        if rank == 0:
            Path(out).write_text(json.dumps(res))
        if world > 1:
            dist.barrier()  # nobody tears down while a peer still has collectives in flight
    finally:
        if world > 1:
            dist.destroy_process_group()


def _to_result(raw: dict[str, Any], cfg: RunConfig) -> RunResult:
    times = raw["times"][cfg.warmup:]
    return RunResult(step_times_s=times, t_iter_s=statistics.median(times), peak_mem_bytes=raw["peak"],
                     peak_rss_bytes=raw["rss_peak"], rss_baseline_bytes=raw["rss0"], n_mb=raw["n_mb"],
                     world_size=cfg.nproc, threads=raw["threads"], grouped_impl=raw["impl"],
                     device_name=raw["device_name"], torch_version=raw["torch_version"],
                     backend=("nccl" if cfg.device == "cuda" else "gloo") if cfg.nproc > 1 else "none",
                     final_loss=raw["loss"], starved_experts=raw["starved"],
                     extra={"warmup_times_s": raw["times"][:cfg.warmup],
                            "step_cpu_s_rank0": raw["cpu_times"][cfg.warmup:],
                            "dp_replicas_in_sync": raw["dp_replicas_in_sync"], "load": raw.get("load"),
                            "peak_reserved_bytes": raw.get("reserved"), "trace": raw.get("trace")})


def run_layout(cfg: RunConfig) -> RunResult:
    """Run ``cfg.warmup + cfg.steps`` optimizer steps in ``cfg.nproc`` spawned processes.

    Raises SpecError for an unrunnable layout (checked before spawning) and ScaleplanError when a
    worker fails (its last error line) or CUDA is requested but absent.
    """
    import torch
    import torch.multiprocessing as mp

    check_layout(Spec.model_validate(cfg.spec), Layout(**cfg.layout), cfg.nproc)
    if cfg.steps < 1 or cfg.warmup < 0:
        raise SpecError("--steps/--warmup", (cfg.steps, cfg.warmup), "steps >= 1 and warmup >= 0")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise SpecError("--device", "cuda", "no CUDA device is visible; use --device cpu")
    if cfg.device == "cuda" and cfg.nproc > torch.cuda.device_count():
        raise SpecError("--nproc", cfg.nproc, f"at most the {torch.cuda.device_count()} visible GPUs")
    from scaleplan.validate.load import loadavg_1m

    if cfg.loadavg_before is None:
        cfg.loadavg_before = loadavg_1m()
    with tempfile.TemporaryDirectory(prefix="scaleplan-validate-") as tmp:
        out = os.path.join(tmp, "result.json")
        try:
            mp.start_processes(_worker, args=(cfg.nproc, cfg, _free_port(), out), nprocs=cfg.nproc,
                               join=True, start_method="spawn")
        except mp.ProcessRaisedException as e:
            last = [ln for ln in str(e).strip().splitlines() if ln.strip()][-1]
            raise ScaleplanError(f"validate worker failed: {last}") from None
        except mp.ProcessExitedException as e:
            # a gloo worker can abort in its teardown after rank 0 wrote the complete result
            if not os.path.exists(out):
                raise ScaleplanError(f"validate worker died: {e}") from None
            print(f"warning: a worker died after the measurement ({e}); result kept", file=sys.stderr)
        return _to_result(json.loads(Path(out).read_text()), cfg)


def main() -> None:
    """torchrun entry: ``torchrun --nproc-per-node P -m scaleplan.validate.runner CONFIG.json OUT.json``."""
    import torch.distributed as dist

    cfg = RunConfig(**json.loads(Path(sys.argv[1]).read_text()))
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    cfg.nproc = world
    if cfg.device == "cuda":
        import torch

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if world > 1:
        dist.init_process_group("nccl" if cfg.device == "cuda" else "gloo")
    try:
        raw = _train(rank, world, cfg)
        if rank == 0:
            Path(sys.argv[2]).write_text(json.dumps(asdict(_to_result(raw, cfg))))
    finally:
        if world > 1:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
