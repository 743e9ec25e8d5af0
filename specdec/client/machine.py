"""The machine a measurement ran on: CPU model, cores, memory, GPUs; stored with every report."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import psutil


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def gpus() -> list[str]:
    """GPU names from nvidia-smi; empty on a machine without one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def describe() -> dict[str, object]:
    vm = psutil.virtual_memory()
    return {
        "cpu": cpu_model(),
        "logical_cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "cores_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": round(vm.total / 2**30, 1),
        "gpus": gpus(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }


def summary_line(machine: dict[str, object]) -> str:
    gpu = ", ".join(machine.get("gpus") or []) or "no GPU"  # type: ignore[arg-type]
    load = machine.get("load_average")
    busy = f", 1-minute load average {load[0]} when written" if load else ""  # type: ignore[index]
    return f"{machine['cpu']}, {machine['logical_cores']} cores, {machine['memory_gib']} GiB, {gpu}{busy}"
