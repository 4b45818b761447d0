"""Cluster profiles: one YAML per node type under ``cluster_profiles/`` (datasheet facts).

Units: peak FLOP/s per GPU per precision lane (dense), bytes, bytes/s per GPU per direction.
"""
from __future__ import annotations

import functools
import os
import re
import time
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from scaleplan.errors import SpecError
from scaleplan.yamlio import load_yaml

# The most nodes a profile can mean (2^16: 524,288 GPUs at 8 per node, beyond any cluster built so far).
# A profile may set a lower ``max_nodes``; the local machine (cpu-local) is one node.
MAX_NODES = 65_536
# the suites that measure one device alone, which device_tables may lend (scaleplan.db.measurements.DEVICE_SUITES
# says what tells one kind of their rows from another)
DeviceSuite = Literal["gemm", "grouped_gemm", "sdpa", "router", "elementwise", "vocab", "allocator"]


class DispatchDefaults(BaseModel):
    """A node type's CPU-dispatch law (sec:iteration-time-model): t_disp = L_stage kappa(E_loc) t_gap
    + n_moe_stage [EP>1] t_ep_host + t_host, kappa = kappa0 + kappa1 E_loc kernels per layer and
    micro-batch (full recompute). Seconds. A 'dispatch' calibration row overrides these."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    t_gap_s: float = Field(gt=0)
    kappa0: float = Field(ge=0)
    kappa1: float = Field(ge=0)
    t_ep_host_s: float = Field(default=0.0, ge=0)
    t_host_s: float = Field(default=0.0, ge=0)
    source: str


class PriceDefault(BaseModel):
    """A node type's price per GPU-hour as published on ``date`` (ISO, the day it was read) by ``source``.
    ``scaleplan plan`` prints it whenever it uses it; ``--price`` replaces it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    usd_per_gpu_hour: float = Field(gt=0, allow_inf_nan=False)
    date: str
    source: str


class ClusterProfile(BaseModel):
    """A node type. ``peak_flops[precision]`` is dense FLOP/s per GPU (C_peak uses bf16 by default)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    name: str
    gpu_name: str
    gpus_per_node: int = Field(gt=0)
    peak_flops: dict[str, float]
    hbm_bytes: float = Field(ge=0)
    hbm_bandwidth: float = Field(gt=0)
    scaleup_bandwidth: float = Field(ge=0)
    scaleout_bandwidth: float = Field(ge=0)
    measure_peak: bool = False
    dispatch: DispatchDefaults | None = None
    # another built-in profile whose traced dispatch law this node type uses (:func:`_lent_dispatch`; one place for a
    # law several node types share), its host terms scaled by the two hosts' measured launch gaps where
    # `scaleplan bench run --suite dispatch` has run on both (estimator/dispatch.lent_host_ratio)
    dispatch_from: str | None = None
    # the host issues each op on the cores that compute it (a CPU "device"): dispatch adds to compute
    serial_dispatch: bool = False
    # the largest cluster of this node type a plan may ask for (N_dev <= max_nodes * gpus_per_node)
    max_nodes: int = Field(default=MAX_NODES, gt=0, le=MAX_NODES)
    # GPUs in one scale-up (NVLink) domain, when it is larger than a node (GB200 NVL72: 72 GPUs over 18
    # 4-GPU trays); None: the node. The estimator places groups in this domain (:attr:`scaleup_domain`)
    scaleup_gpus: int | None = Field(default=None, gt=0)
    # How a job's nodes fill the scale-up domains where a domain spans nodes (:meth:`job_domain`): "segment", as
    # SLURM's --segment places them and Megatron-Bridge's GB200 launcher asks (each domain holds the job's node
    # count if one domain has room for it, else that count's largest divisor that fits), or "packed" (nodes fill
    # each domain in turn)
    scaleup_fill: Literal["segment", "packed"] = "segment"
    price: PriceDefault | None = None
    # profiles of the same GPU model whose single-device tables (GEMM, grouped GEMM, SDPA, router,
    # element-wise, vocabulary, allocator) fill the kinds of rows this node type's own runs lack
    # (scaleplan.db.measurements.load_frames); never the host (dispatch) or fabric (collectives) rows
    device_tables: tuple[str, ...] = ()
    # suites (of measurements.DEVICE_SUITES) in which the device_tables' rows come first: of every kind they hold,
    # this node type's own rows are not read. For a node type whose recorded rows of a suite time each call with
    # host work in it and whose device_tables measured the same GPU's device time (p5.48xlarge: dense GEMMs)
    device_tables_first: tuple[DeviceSuite, ...] = ()
    # profiles of another GPU on this GPU's die (:data:`DIES`: an H200 for an H100) whose measured dense FP8
    # and bf16 GEMM rows give, where this profile has no FP8 rows, its FP8 GEMM table: its bf16 table times
    # their FP8 / bf16 device-time ratio at each shape (estimator/table_build.py)
    fp8_ratio_tables: tuple[str, ...] = ()
    # profiles of another part of this GPU's tensor-core generation (:data:`TENSOR_CORE_GENERATION`: an HGX B200 for
    # a GB200, the same die at higher clocks, or for a B300, a new die) whose single-device rows stand in for the
    # kinds this profile and its device_tables lack, their times scaled by the two datasheets
    # (scaleplan.db.measurements.part_scales); every lookup of them is labelled composed
    scaled_device_tables: tuple[str, ...] = ()
    # profiles whose node has this node's scale-up fabric (the same NVLink generation, per-GPU bandwidth and node
    # size: an HGX B300's baseboard is an HGX B200's NVLink 5), whose collective rows of groups inside one node stand
    # in for the kinds this profile lacks (scaleplan.db.measurements.load_frames); never their inter-node rows
    fabric_tables: tuple[str, ...] = ()

    @property
    def scaleup_domain(self) -> int:
        """GPUs that reach each other over the scale-up fabric (NVLink): ``scaleup_gpus``, else the node.
        A parallel group inside it runs at ``scaleup_bandwidth``; one that leaves it at ``scaleout_bandwidth``
        (estimator.layout: which group leaves the domain)."""
        return int(self.scaleup_gpus or self.gpus_per_node)

    def job_domain(self, n_devices: int) -> int:
        """GPUs of one scale-up domain as a job of ``n_devices`` GPUs holds it: :attr:`scaleup_domain` where the
        domain is the node or ``scaleup_fill`` is "packed"; under "segment", the job's nodes taken ``s`` to a
        domain, ``s`` its node count where one domain holds that many nodes, else the largest divisor of the count
        that one domain holds (Megatron-Bridge 0.4.2 scripts/performance/utils/executors.py: sbatch --segment
        on 4-GPU GB200 trays; 256 GB200: 16 of a rack's 18 trays, 64 GPUs). Ranks then fill these domains in
        order (estimator/placement.py)."""
        node, domain = self.gpus_per_node, self.scaleup_domain
        if self.scaleup_fill == "packed" or domain <= node:
            return domain
        nodes, per_domain = max(-(-int(n_devices) // node), 1), domain // node
        if nodes <= per_domain:
            return nodes * node
        return node * next(s for s in range(per_domain, 0, -1) if nodes % s == 0)

    @property
    def max_devices(self) -> int:
        """The most devices (N_dev) a plan on this profile can mean: max_nodes * gpus_per_node."""
        return self.max_nodes * self.gpus_per_node

    def check_devices(self, n: int, field: str = "--devices") -> int:
        """``n`` if 1 <= n <= max_devices. Raises SpecError naming ``field`` otherwise."""
        if not 1 <= n <= self.max_devices:
            raise SpecError(field, n, f"1 to {self.max_devices} devices ({self.max_nodes} nodes x "
                            f"{self.gpus_per_node} per node of {self.name})")
        return n

    def peak(self, precision: str = "bf16") -> float:
        """Peak dense FLOP/s per device for ``precision``; falls back to bf16, then fp32.

        Raises SpecError when the profile has no lane for that precision.
        """
        for p in (precision, "bf16" if precision in ("fp16",) else precision):
            if p in self.peak_flops:
                return self.peak_flops[p]
        raise SpecError("precision", precision, f"a lane of profile {self.name}: {sorted(self.peak_flops)}")


# a GPU model token: B200, H100, H200, A100, GH200, L40, MI300 ...
_MODEL = re.compile(r"\b([A-Z]{1,2}\d{2,3}[A-Z]?)\b")


def gpu_model(name: str | None) -> str | None:
    """The model token of a GPU name ("NVIDIA H100 80GB HBM3" -> "H100"); "cpu" for a CPU; None if unknown."""
    if not name:
        return None
    if name.strip().lower() == "cpu":
        return "cpu"
    m = _MODEL.search(name.upper())
    return m.group(1) if m else name.strip().upper()


# the compute die of a GPU model: GPUs on one die have the same SMs and tensor-core lanes, so a device-time ratio
# between two lanes measured on one holds on the other. H100 SXM and H200 (GH100, 989 / 1979 TFLOP/s dense bf16 /
# FP8 each; NVIDIA H100 and H200 datasheets) share clocks too and differ in HBM; the B200 of an HGX board and a
# GB200's (one dual-die Blackwell GPU) differ in clocks and power as well (2.25 and 2.5 PFLOP/s dense bf16; NVIDIA
# HGX B200 and GB200 NVL72 datasheets): what fp8_ratio_tables asks of a lender
DIES = {"H100": "GH100", "H200": "GH100", "B200": "GB100", "GB200": "GB100"}
# the tensor-core generation of a GPU model: parts of one generation run the same tensor-core instructions at the
# same rate per SM and clock for the dtypes a measured table holds, so a device time carries from one part to
# another at the ratio of their datasheet peaks (scaled_device_tables; scaleplan.db.measurements.part_scales). A
# B300 (Blackwell Ultra) is a new die of the Blackwell generation: the HGX B300 and HGX B200 datasheets give the
# same dense bf16, FP8 and TF32 peaks per GPU (2.25, 4.5, 1.125 PFLOP/s), NVFP4 1.5x and the attention softmax's
# exponentials 2x (which the B200's rows at the datasheets' ratio do not see: a B300's attention is costed at the
# B200's speed)
TENSOR_CORE_GENERATION = {"H100": "Hopper", "H200": "Hopper", "GH200": "Hopper", "B200": "Blackwell",
                          "GB200": "Blackwell", "B300": "Blackwell", "GB300": "Blackwell"}
# CUDA compute capability of a GPU model (NVIDIA's CUDA GPUs list): what a library's choice of kernel turns on
COMPUTE_CAPABILITY = {"A100": 8.0, "H100": 9.0, "H200": 9.0, "GH200": 9.0, "B200": 10.0, "GB200": 10.0,
                      "B300": 10.3, "GB300": 10.3}


def _profile_dir() -> Path:
    return Path(str(resources.files("scaleplan.cluster_profiles")))


def profile_names() -> list[str]:
    """Names of the built-in profiles (file stems under cluster_profiles/)."""
    return sorted(p.stem for p in _profile_dir().glob("*.yaml"))


def measure_cpu_gemm_flops(n: int = 1024, reps: int = 5) -> float:
    """Best fp32 GEMM throughput of this machine in FLOP/s (numpy BLAS, n x n x n, best of reps)."""
    import numpy as np  # only cpu-local times a GEMM: the other profiles need no numpy

    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def _ram_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8e9


@functools.cache
def profile_file(name: str) -> ClusterProfile:
    """A profile as its YAML says (no measurement): a built-in node type or a path to a profile YAML.

    Raises SpecError (one line) for an unknown name, an unreadable file, bad YAML or an invalid field.
    """
    path = Path(name)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        path = _profile_dir() / f"{name}.yaml"
        if not path.exists():
            raise SpecError("profile", name, f"one of {', '.join(profile_names())} or a profile YAML path")
    try:
        data = load_yaml(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError("profile", str(path), f"a readable UTF-8 YAML file ({type(e).__name__})") from None
    except (yaml.YAMLError, RecursionError) as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise SpecError("profile", str(path), f"valid YAML (parse error{where})") from None
    if not isinstance(data, dict):
        raise SpecError("profile", str(path), "a YAML mapping of profile fields (name, gpu_name, ...)")
    try:
        prof = ClusterProfile.model_validate(data)
    except Exception as e:  # pydantic ValidationError -> one line naming the first bad field
        errs = getattr(e, "errors", None)
        if callable(errs) and errs():
            first = errs()[0]
            field = ".".join(str(x) for x in first["loc"]) or "<profile>"
            raise SpecError(f"profile {path.name}: {field}", first.get("input"), first["msg"]) from None
        raise SpecError(f"profile {path.name}", "...", str(e).splitlines()[0]) from None
    prof = _lent_dispatch(prof, path.name)
    _check_device_tables(prof, path.name)
    _check_same_kind(prof, path.name, "fp8_ratio_tables", DIES, "die")
    _check_same_kind(prof, path.name, "scaled_device_tables", TENSOR_CORE_GENERATION, "tensor-core generation",
                     other_part=True)
    _check_fabric(prof, path.name)
    return prof


def _named(prof: ClusterProfile, file: str, field: str, other: str) -> ClusterProfile:
    """The profile ``other`` that ``prof``'s ``field`` names. Raises SpecError (one line) unless it is another
    built-in profile."""
    if other == prof.name or other not in profile_names():
        raise SpecError(f"profile {file}: {field}", other, "another built-in profile")
    return profile_file(other)


def _check_fabric(prof: ClusterProfile, file: str) -> None:
    """Each of ``prof.fabric_tables`` is another known profile whose node has this node's scale-up fabric: the same
    GPUs per node and scale-up domain and the same scale-up bandwidth. Raises SpecError naming the first that is
    not."""
    for other in prof.fabric_tables:
        theirs = _named(prof, file, "fabric_tables", other)
        mine_f = (prof.gpus_per_node, prof.scaleup_domain, prof.scaleup_bandwidth)
        their_f = (theirs.gpus_per_node, theirs.scaleup_domain, theirs.scaleup_bandwidth)
        if mine_f != their_f:
            raise SpecError(f"profile {file}: fabric_tables", other,
                            f"a profile of the same scale-up fabric (GPUs per node, scale-up domain, scale-up bytes/s: "
                            f"{mine_f} here, {their_f} there)")


def _lent_dispatch(prof: ClusterProfile, file: str) -> ClusterProfile:
    """``prof`` with ``dispatch`` set to the law of the profile its ``dispatch_from`` names, its source saying whose
    law it is and that this node type's host was not traced; ``prof`` itself where it names none. Raises
    SpecError (one line) where the field names no other built-in profile with a dispatch law, or stands beside a
    dispatch block of its own."""
    other = prof.dispatch_from
    if other is None:
        return prof
    if prof.dispatch is not None:
        raise SpecError(f"profile {file}: dispatch_from", other, "only without a dispatch block (one law a profile)")
    law = _named(prof, file, "dispatch_from", other).dispatch
    if law is None:
        raise SpecError(f"profile {file}: dispatch_from", other, "a profile with a dispatch law (its YAML has none)")
    source = f"{other}'s law from {law.source}; {prof.name}'s own host not traced"
    return prof.model_copy(update={"dispatch": law.model_copy(update={"source": source})})


def _check_device_tables(prof: ClusterProfile, file: str) -> None:
    """Each of ``prof.device_tables`` is another known profile of the same GPU model (a table of another
    GPU would stand in for this one's), and ``prof.device_tables_first`` names suites only where some profile
    lends them. Raises SpecError naming the first that is not."""
    if prof.device_tables_first and not prof.device_tables:
        raise SpecError(f"profile {file}: device_tables_first", ", ".join(prof.device_tables_first),
                        "suites some profile in device_tables lends (it names none)")
    for other in prof.device_tables:
        theirs = _named(prof, file, "device_tables", other).gpu_name
        if gpu_model(theirs) != gpu_model(prof.gpu_name):
            raise SpecError(f"profile {file}: device_tables", other,
                            f"a profile of the same GPU ({prof.gpu_name}; {other} is {theirs})")


def _check_same_kind(prof: ClusterProfile, file: str, field: str, kinds: dict[str, str], kind: str,
                     other_part: bool = False) -> None:
    """Each profile ``prof`` names in ``field`` is another known profile whose GPU is of this GPU's ``kind`` in
    ``kinds`` (fp8_ratio_tables: the same die, :data:`DIES`; scaled_device_tables: the same tensor-core
    generation, :data:`TENSOR_CORE_GENERATION`), with ``other_part`` of another GPU model (rows of the same model
    are lent as measured: device_tables). Raises SpecError naming the first that is not."""
    for other in getattr(prof, field):
        theirs = _named(prof, file, field, other).gpu_name
        mine = kinds.get(gpu_model(prof.gpu_name) or "")
        if mine is None or kinds.get(gpu_model(theirs) or "") != mine:
            raise SpecError(f"profile {file}: {field}", other,
                            f"a profile of a GPU of the same {kind} ({prof.gpu_name}; {other} is {theirs}; known: "
                            + ", ".join(sorted(set(kinds.values()))) + ")")
        if other_part and gpu_model(theirs) == gpu_model(prof.gpu_name):
            raise SpecError(f"profile {file}: {field}", other,
                            f"another GPU model of the {kind} ({other} is {theirs} too: name it in device_tables)")


def max_devices(name: str) -> int:
    """The most devices a plan on profile ``name`` can mean (no GEMM is timed for cpu-local).

    Raises SpecError for an unknown or invalid profile.
    """
    prof = profile_file(name)
    return usable_cpus() if prof.measure_peak else prof.max_devices


@functools.cache
def load_profile(name: str) -> ClusterProfile:
    """Load a built-in profile by node type (or a path to a profile YAML).

    Raises SpecError for an unknown name or an invalid file.
    """
    prof = profile_file(name)
    if prof.measure_peak:
        flops = measure_cpu_gemm_flops()
        lanes = {p: flops for p in ("fp32", "tf32", "bf16", "fp16")}
        # every "device" of the local machine (one core at the default one thread per process) is on
        # this one node: a DP group of processes here talks over loopback, intra-node
        prof = prof.model_copy(update={"peak_flops": lanes, "hbm_bytes": prof.hbm_bytes or _ram_bytes(),
                                       "gpus_per_node": usable_cpus(), "max_nodes": 1})
    return prof


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
