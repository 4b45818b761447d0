"""Provenance of a benchmark run: host, library versions, git revision, and NVML device state.

NVML (nvidia-ml-py) is read at the start and at the end of a run: GPU name and UUID, driver,
SM/memory clocks (current and max), enforced power limit, power draw, temperature and
performance state. Without a GPU or driver, NVML initialisation fails and the snapshot is
``{"error": "..."}``; nothing here raises.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

REPO_DIR = Path(__file__).resolve().parents[1]


def git_rev(repo: Path = REPO_DIR) -> str | None:
    """``HEAD`` of the project checkout (suffix ``+dirty`` when tracked files differ); where the code
    does not run from a git checkout (an installed wheel, a copy of the tree shipped to a GPU host),
    the revision that copy was made from as ``$SCALEPLAN_GIT_REV`` names it, else None."""
    return _git_head(repo) or os.environ.get("SCALEPLAN_GIT_REV") or None


def _git_head(repo: Path) -> str | None:
    try:
        rev = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _pkg_version(*names: str) -> str | None:
    for n in names:
        try:
            return metadata.version(n)
        except metadata.PackageNotFoundError:
            continue
    return None


def cpu_model() -> str:
    """The CPU model name (from /proc/cpuinfo on Linux) and logical core count."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} ({os.cpu_count()} logical cores)"


def versions(device_type: str) -> dict[str, str | None]:
    """torch / CUDA / NCCL / Transformer Engine versions (NCCL only when CUDA is in use)."""
    import torch

    nccl = None
    if device_type == "cuda":
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:  # a build without NCCL
            nccl = None
    return {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda if device_type == "cuda" else None,
        "nccl_version": nccl,
        "te_version": _pkg_version("transformer_engine", "transformer-engine"),
    }


def _nvml_index(device_index: int) -> int:
    """NVML numbers physical GPUs; map torch's index through CUDA_VISIBLE_DEVICES when it is numeric."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    parts = [p.strip() for p in vis.split(",") if p.strip()]
    if parts and all(p.isdigit() for p in parts) and device_index < len(parts):
        return int(parts[device_index])
    return device_index


def nvml_snapshot(device_index: int = 0) -> dict[str, Any]:
    """Clocks, power limit, temperature etc. of one GPU now; ``{"error": ...}`` when NVML is absent."""
    try:
        import pynvml as nv
    except ImportError as e:
        return {"error": f"nvidia-ml-py not importable: {e}"}
    try:
        nv.nvmlInit()
    except Exception as e:  # no driver / no GPU: expected on CPU machines
        return {"error": f"NVML unavailable: {e}"}
    try:
        h = nv.nvmlDeviceGetHandleByIndex(_nvml_index(device_index))
        snap: dict[str, Any] = {"time": dt.datetime.now(dt.timezone.utc).isoformat()}
        probes = {
            "name": lambda: nv.nvmlDeviceGetName(h),
            "uuid": lambda: nv.nvmlDeviceGetUUID(h),
            "driver_version": nv.nvmlSystemGetDriverVersion,
            "sm_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            "sm_clock_max_mhz": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
            "mem_clock_max_mhz": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM),
            "power_limit_w": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
            "power_draw_w": lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "temperature_c": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "pstate": lambda: int(nv.nvmlDeviceGetPerformanceState(h)),
            "clocks_event_reasons": lambda: int(nv.nvmlDeviceGetCurrentClocksEventReasons(h)),
        }
        for key, probe in probes.items():
            try:
                v = probe()
                snap[key] = v.decode() if isinstance(v, bytes) else v
            except Exception as e:  # one missing probe (old driver) must not lose the rest
                snap[key] = None
                snap.setdefault("missing", []).append(f"{key}: {type(e).__name__}")
        return snap
    except Exception as e:
        return {"error": f"NVML query failed: {e}"}
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass


def run_provenance(device_type: str, device_index: int = 0) -> dict[str, Any]:
    """BenchRun provenance columns for this process: host, versions, git rev, NVML start snapshot."""
    prov: dict[str, Any] = {
        "host": socket.gethostname(),
        "device": device_type,
        "git_rev": git_rev(),
        **versions(device_type),
    }
    if device_type == "cuda":
        snap = nvml_snapshot(device_index)
        prov.update(
            nvml_start=snap,
            gpu_name=snap.get("name"),
            gpu_uuid=snap.get("uuid"),
            driver_version=snap.get("driver_version"),
        )
        if not prov["gpu_name"]:
            import torch

            prov["gpu_name"] = torch.cuda.get_device_name(device_index)
    else:
        prov.update(nvml_start=None, gpu_name=None, notes=f"cpu: {cpu_model()}")
    return prov
