"""The device class a run executes on: what must match for two runs' engine numerics to be comparable.

Read on the orchestrator's host, which is where the engine's worker runs (the venv and local
runners) or where its container gets the devices from (the docker runner).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path


def device_class() -> dict[str, object]:
    """CPU model and usable cores (CPU kernels' threading), and each visible GPU's model and driver."""
    return {
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpus": len(os.sched_getaffinity(0)),
        "gpus": _gpus(),
    }


def _cpu_model() -> str:
    try:
        for line in (
            Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
        ):
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _gpus() -> list[str]:
    """``name, memory, driver`` per visible NVIDIA GPU; empty where there is none (or no nvidia-smi)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = (
        [line.strip() for line in out.stdout.splitlines() if line.strip()]
        if out.returncode == 0
        else []
    )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if (
        visible is not None
        and visible.strip()
        and all(v.strip().isdigit() for v in visible.split(","))
    ):
        gpus = [gpus[int(v)] for v in visible.split(",") if int(v) < len(gpus)]
    return gpus
