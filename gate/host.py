"""Facts about the machine the gate runs on, each read in one place.

- Every ``GATE_*`` environment variable gate reads: :class:`HostSettings`, parsed from one environ
  mapping at a time; a malformed value is a one-line error naming the variable.
- The cache root (``$GATE_CACHE_DIR``, default ``~/.cache/gate``): :func:`cache_root`.
- The GPUs a process or an engine sees: :func:`probe_gpus` (nvidia-smi) narrowed by
  :func:`cuda_visible` (CUDA's own reading of ``CUDA_VISIBLE_DEVICES``) and :func:`engine_gpus`.
- The ranks an engine's arguments ask for (one device each): :func:`parallel_ranks`.
- The checkout holding a path: :func:`repository_root`.

CPU lists (``0-2,5``) have their home in :mod:`gate.cpu_list`.

Standard library only (and :mod:`gate.errors`): the engine worker reads its variables here too,
inside engine environments that hold none of the orchestrator's dependencies. Nothing here is read
at import time: a test or a command that sets a variable sees it on the next call.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate.errors import ConfigError

# -- the GATE_* variables -------------------------------------------------------------------------

CACHE_DIR_ENV = "GATE_CACHE_DIR"
EVIDENCE_DIR_ENV = "GATE_EVIDENCE_DIR"
VLLM_SOURCE_DIR_ENV = "GATE_VLLM_SOURCE_DIR"
MODEL_WHEELS_ENV = "GATE_MODEL_WHEELS"
SOURCE_DIR_ENV = "GATE_SOURCE_DIR"
PUSH_DIR_ENV = "GATE_PUSH_DIR"
RPC_TIMEOUT_ENV = "GATE_WORKER_RPC_TIMEOUT_S"
PHASE_TIMEOUT_ENV = "GATE_WORKER_PHASE_TIMEOUT_S"
DEFAULT_RPC_TIMEOUT_S = 600.0


class HostSettingError(ConfigError, ValueError):
    """A ``GATE_*`` variable holds a value gate cannot use; the message names it (exit code 2)."""


@dataclass(frozen=True)
class HostSettings:
    """Every ``GATE_*`` variable gate reads. An unset or empty variable takes its default."""

    # GATE_CACHE_DIR: where venvs, uv's wheel cache, converted models, Docker caches, the evidence
    # cache and vLLM sources live by default.
    cache_dir: Path
    # GATE_EVIDENCE_DIR: the old engine's evidence kept between runs (default <cache>/evidence).
    evidence_dir: Path
    # GATE_VLLM_SOURCE_DIR: extracted vLLM release sources (default <cache>/vllm-source); its own
    # variable, so CI can keep it while the gate cache starts empty.
    vllm_source_dir: Path
    # GATE_MODEL_WHEELS: a folder of downloaded wheels for model.builtin (an offline machine).
    model_wheels: Path | None
    # GATE_SOURCE_DIR: the gate checkout holding the Dockerfile (the Action sets it).
    source_dir: Path | None
    # GATE_PUSH_DIR (worker): a folder every rank can read, tried first for a weight push.
    push_dir: Path | None
    # GATE_WORKER_RPC_TIMEOUT_S (worker): seconds one call into the engine's workers may take (> 0).
    worker_rpc_timeout_s: float
    # GATE_WORKER_PHASE_TIMEOUT_S (worker): seconds one pass may take; None (unset or <= 0): no bound.
    worker_phase_timeout_s: float | None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> HostSettings:
        """The settings ``environ`` (default: this process's environment) holds.

        Raises :class:`HostSettingError` (a ConfigError and a ValueError) naming the variable.
        """
        env = os.environ if environ is None else environ

        def path(name: str) -> Path | None:
            value = env.get(name)
            return Path(value) if value else None

        cache = path(CACHE_DIR_ENV) or Path.home() / ".cache" / "gate"
        rpc = _seconds(env, RPC_TIMEOUT_ENV)
        if rpc is not None and rpc <= 0:
            raise HostSettingError(f"{RPC_TIMEOUT_ENV}={env[RPC_TIMEOUT_ENV]!r}: must be > 0")
        phase = _seconds(env, PHASE_TIMEOUT_ENV)
        return cls(
            cache_dir=cache,
            evidence_dir=path(EVIDENCE_DIR_ENV) or cache / "evidence",
            vllm_source_dir=path(VLLM_SOURCE_DIR_ENV) or cache / "vllm-source",
            model_wheels=path(MODEL_WHEELS_ENV),
            source_dir=path(SOURCE_DIR_ENV),
            push_dir=path(PUSH_DIR_ENV),
            worker_rpc_timeout_s=DEFAULT_RPC_TIMEOUT_S if rpc is None else rpc,
            worker_phase_timeout_s=phase if phase is not None and phase > 0 else None,
        )


def _seconds(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name)
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise HostSettingError(f"{name}={raw!r}: expected a number of seconds") from None


def settings() -> HostSettings:
    """This process's settings, read now."""
    return HostSettings.from_environ(os.environ)


def cache_root() -> Path:
    """``$GATE_CACHE_DIR``, else ``~/.cache/gate``."""
    return settings().cache_dir


# -- GPUs ------------------------------------------------------------------------------------------
#
# One rule for "which GPUs does it see", used by the device class (run.json, baselines, the evidence
# key), the memory plan and the check that an engine's ranks fit. It is the memory plan's rule, the
# one of the three earlier copies that modelled the engine's real environment: the worker is started
# with the gate's environment and the engine's `env` over it (gate/runners/base.py), so the engine's
# CUDA_VISIBLE_DEVICES wins over the gate's; a container gets docker.gpus and none of the host's
# variables, so there only docker.gpus and the engine's own `env` narrow. The device class's copy
# read a set-but-empty CUDA_VISIBLE_DEVICES as "all GPUs" (CUDA reads it as none), and the config
# check capped the gate's GPUs by the *length* of the engine's list (an engine's own list replaces
# the gate's, it does not narrow it). Entries are read as CUDA reads them: indices or GPU UUIDs
# (a unique prefix is enough), and the list ends at the first entry that names no GPU.

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
_SMI_FIELDS = "index,uuid,name,memory.total,memory.used,driver_version"


@dataclass(frozen=True)
class Gpu:
    """One NVIDIA GPU as nvidia-smi lists it."""

    index: int
    uuid: str
    name: str
    memory: str  # memory.total as nvidia-smi prints it: "81559 MiB"
    driver: str
    total_bytes: int
    used_bytes: int

    @property
    def record(self) -> str:
        """``name, memory, driver``: how the device class records a GPU (run.json, baselines)."""
        return f"{self.name}, {self.memory}, {self.driver}"


def probe_gpus(smi: str | None = None) -> list[Gpu] | None:
    """Every GPU nvidia-smi lists, in its index order; None where that cannot be told (no
    nvidia-smi, or it fails). Runs nvidia-smi: call it where a command needs the answer."""
    smi = smi or shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return parse_gpus(out.stdout)


def parse_gpus(text: str) -> list[Gpu]:
    """nvidia-smi's ``--query-gpu=index,uuid,name,memory.total,memory.used,driver_version``
    ``--format=csv,noheader`` output as :class:`Gpu` entries (a line it cannot read is left out)."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(", ")]
        if len(parts) < 6 or not parts[0].isdigit():
            continue
        index, uuid, *name, total, used, driver = parts
        gpus.append(Gpu(int(index), uuid, ", ".join(name), total, driver, _mib(total), _mib(used)))
    return gpus


def _mib(value: str) -> int:
    try:
        return int(float(value.split()[0]) * 2**20)
    except (ValueError, IndexError):  # "[N/A]"
        return 0


def cuda_visible(gpus: Sequence[Gpu], devices: str | None) -> list[Gpu] | None:
    """The GPUs of ``gpus`` (in the order a process sees them) that a ``CUDA_VISIBLE_DEVICES`` of
    ``devices`` leaves, in its order; all of them when it is unset (None), none when it is empty.

    An entry is a position in ``gpus`` or a GPU UUID (or a unique prefix of one); the list ends at
    the first entry that names no GPU, as CUDA ends it. None where an entry names something this
    probe cannot resolve (a MIG instance): then it cannot be told.
    """
    if devices is None:
        return list(gpus)
    seen: list[Gpu] = []
    for entry in (e.strip() for e in devices.split(",")):
        if entry.upper().startswith("MIG-"):
            return None
        if entry.isdigit():
            found = [gpus[int(entry)]] if int(entry) < len(gpus) else []
        else:
            found = [g for g in gpus if entry and g.uuid.startswith(entry)]
        if len(found) != 1:
            break
        if found[0] not in seen:
            seen.append(found[0])
    return seen


def engine_gpus(
    gpus: Sequence[Gpu],
    runner: str,
    docker_gpus: str | Sequence[str],
    engine_env: Mapping[str, str],
    environ: Mapping[str, str] | None = None,
) -> list[Gpu] | None:
    """The GPUs of ``gpus`` (:func:`probe_gpus`) an engine will see; None where it cannot be told.

    ``runner`` docker: ``docker_gpus`` ("all", "none" or device ids) gives the container its GPUs
    and the engine's own ``CUDA_VISIBLE_DEVICES`` narrows them inside; the gate's is not passed
    in. Otherwise the engine's variable, else the gate's (``environ``, default this process's).
    """
    if runner == "docker":
        if docker_gpus == "none":
            return []
        given = list(gpus) if docker_gpus == "all" else cuda_visible(gpus, ",".join(docker_gpus))
        return None if given is None else cuda_visible(given, engine_env.get(CUDA_VISIBLE_DEVICES))
    env = os.environ if environ is None else environ
    devices = engine_env.get(CUDA_VISIBLE_DEVICES, env.get(CUDA_VISIBLE_DEVICES))
    return cuda_visible(gpus, devices)


# -- engine layout ---------------------------------------------------------------------------------


def parallel_ranks(engine_args: Mapping[str, Any]) -> int:
    """Tensor x pipeline parallel ranks the engine arguments ask for: one process, and one device
    (GPU, or CPUs of its own), per rank. Unset or 0 counts as 1; the config refuses values that are
    not integers >= 1 before this is asked (gate.config.load)."""
    tp = int(engine_args.get("tensor_parallel_size") or 1)
    pp = int(engine_args.get("pipeline_parallel_size") or 1)
    return tp * pp


# -- the checkout ----------------------------------------------------------------------------------


def repository_root(start: Path) -> Path | None:
    """The nearest folder at or above ``start`` that holds a ``.git``; None outside a repository
    (the caller knows its fallback: the working directory for report paths, the output folder for
    ``gate init``)."""
    start = Path(start).resolve()
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return None
