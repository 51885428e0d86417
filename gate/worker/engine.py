"""Start a vLLM engine and read back who it is and what it actually runs with.

vLLM's Python API moves between releases, so everything here probes features (an attribute, a
field of ``EngineArgs``) rather than comparing version strings. Settings are read from the live
engine after vLLM applied its defaults, not echoed from what was requested.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import platform
import sys
from collections.abc import Sequence
from typing import Any

import torch

from gate.worker import matmul_precision, model_runner
from gate.worker.layout import GateSetting, env_settings

# Dotted attribute paths into the live engine, tried in order (V1 first, then V0 layouts).
_SETTINGS: dict[str, tuple[str, ...]] = {
    "logprobs_mode": ("vllm_config.model_config.logprobs_mode", "model_config.logprobs_mode"),
    "enable_prefix_caching": (
        "vllm_config.cache_config.enable_prefix_caching",
        "cache_config.enable_prefix_caching",
    ),
    "async_scheduling": (
        "vllm_config.scheduler_config.async_scheduling",
        "scheduler_config.async_scheduling",
    ),
    "enable_chunked_prefill": (
        "vllm_config.scheduler_config.enable_chunked_prefill",
        "vllm_config.scheduler_config.chunked_prefill_enabled",
        "scheduler_config.chunked_prefill_enabled",
    ),
    "dtype": ("vllm_config.model_config.dtype", "model_config.dtype"),
    "kv_cache_dtype": ("vllm_config.cache_config.cache_dtype", "cache_config.cache_dtype"),
    "max_num_batched_tokens": (
        "vllm_config.scheduler_config.max_num_batched_tokens",
        "scheduler_config.max_num_batched_tokens",
    ),
    "max_num_seqs": ("vllm_config.scheduler_config.max_num_seqs", "scheduler_config.max_num_seqs"),
    "max_model_len": ("vllm_config.model_config.max_model_len", "model_config.max_model_len"),
    "enforce_eager": ("vllm_config.model_config.enforce_eager", "model_config.enforce_eager"),
    "compilation_mode": (
        "vllm_config.compilation_config.mode",
        "vllm_config.compilation_config.level",
        "compilation_config.level",
    ),
    "cudagraph_mode": ("vllm_config.compilation_config.cudagraph_mode",),
    "seed": ("vllm_config.model_config.seed", "model_config.seed"),
    "generation_config": (
        "vllm_config.model_config.generation_config",
        "model_config.generation_config",
    ),
    "override_generation_config": (
        "vllm_config.model_config.override_generation_config",
        "model_config.override_generation_config",
    ),
    "quantization": ("vllm_config.model_config.quantization", "model_config.quantization"),
    "logits_processors": (
        "vllm_config.model_config.logits_processors",
        "model_config.logits_processors",
    ),
    "attention_backend": ("vllm_config.attention_config.backend",),
    "tensor_parallel_size": (
        "vllm_config.parallel_config.tensor_parallel_size",
        "parallel_config.tensor_parallel_size",
    ),
    "device": ("vllm_config.device_config.device", "device_config.device"),
}

# skip_special_tokens decides the text a reward reads; from 0.33 generation_config.json sets it too
# (ModelConfig.get_diff_sampling_param).
_DEFAULT_SAMPLING_FIELDS = (
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
    "presence_penalty", "frequency_penalty", "max_tokens", "seed", "skip_special_tokens",
)  # fmt: skip


def prepare_process() -> None:
    """Per-process set-up that must happen before the engine starts."""
    # Keep the engine in this process: weight pushes and config reads reach it directly.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # Tensor-parallel workers are started by spawn: this process touches CUDA first (below, and the
    # reference), and a forked child of a process with CUDA initialised cannot use it.
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    # bf16 attention on CPU needs AMX permission, asked per process (brief: "Illegal instruction").
    init_amx = getattr(getattr(torch._C, "_cpu", None), "_init_amx", None)
    if init_amx is not None and not torch.cuda.is_available():
        init_amx()


def on_cpu_platform() -> bool:
    """vLLM's own answer (the CPU wheel's platform), after ``import vllm``."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def supported_engine_args() -> set[str]:
    from vllm.engine.arg_utils import EngineArgs

    return {f.name for f in dataclasses.fields(EngineArgs)}


def split_engine_args(
    requested: dict[str, Any], optional: Sequence[str], known: set[str] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Drop optional arguments this release does not know (``known``: EngineArgs' fields, read from
    vLLM when not given); unknown required ones raise ValueError."""
    known = supported_engine_args() if known is None else known
    dropped = [k for k in requested if k not in known and k in optional]
    unknown = [k for k in requested if k not in known and k not in optional]
    if unknown:
        raise ValueError(f"this vLLM release has no engine argument(s) {unknown}")
    return {k: v for k, v in requested.items() if k not in dropped}, dropped


def start_engine(model: str, tokenizer: str | None, engine_args: dict[str, Any]):
    from vllm import LLM

    kwargs = dict(engine_args)
    if tokenizer:
        kwargs["tokenizer"] = tokenizer
    return LLM(model=model, **kwargs)


def shutdown(llm) -> None:
    """Stop the engine's core and its parallel state; the caller then drops its last reference.

    ``del llm`` alone is not enough on every release: in 0.18/0.19 the engine core holds a
    reference to itself and freezes the GC heap, so its memory (about gpu_memory_utilization of the
    device) stays held while the reference model loads.
    """
    core = getattr(llm.llm_engine, "engine_core", None)
    stop = getattr(core, "shutdown", None)
    if callable(stop):
        stop()
    try:
        from vllm.distributed.parallel_state import (
            destroy_distributed_environment,
            destroy_model_parallel,
        )
    except ImportError:
        return
    destroy_model_parallel()
    destroy_distributed_environment()


def release_memory() -> None:
    """Collect what the stopped engine left: unfreeze the heap vLLM froze, drop compiled graphs, empty the cache."""
    import gc

    gc.unfreeze()  # objects frozen by vLLM's engine core are never collected otherwise
    gc.collect()
    dynamo = getattr(torch, "_dynamo", None)
    if dynamo is not None:
        dynamo.reset()  # its process-wide caches keep the compiled model (and its weights) alive
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def memory_in_use() -> dict[str, Any]:
    """Device memory in use (CUDA: the whole device, as other processes see it) and this process's RSS."""
    found: dict[str, Any] = {"rss_bytes": _rss_bytes()}
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        found["device_used_bytes"] = int(total - free)
    return found


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/status", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def effective_settings(llm, gate_settings: Sequence[GateSetting] = ()) -> dict[str, Any]:
    """The live engine's settings (``_SETTINGS``), plus ``env.<NAME>`` for each variable the gate set."""
    engine = llm.llm_engine
    found = {name: _jsonable(_first_attr(engine, paths)) for name, paths in _SETTINGS.items()}
    found["model_runner"] = model_runner.of_config(
        _first_attr(engine, ("vllm_config", "engine_core.vllm_config"))
    )
    found |= {f"env.{s.name}": s.value for s in env_settings(gate_settings)}
    return found


# vLLM environment variables that change kernels or precision for the whole process, the
# in-process reference included (VLLM_BATCH_INVARIANT overrides aten mm, linear and log_softmax).
_NUMERICS_ENV = ("VLLM_BATCH_INVARIANT", "VLLM_FLOAT32_MATMUL_PRECISION", "VLLM_USE_FLASHINFER_SAMPLER",
                 "VLLM_ATTENTION_BACKEND")  # fmt: skip


def numerics(llm) -> dict[str, Any]:
    """What drives the engine's numerics, as chosen at run time rather than as requested.

    The attention backend and the top-k/top-p sampler are read from the live model runner (the
    config holds only a request, often None); vLLM's own reading of the environment variables
    above; whether Triton is importable (the GPU top-k/top-p kernel); torch's fp32 matmul precision
    as the engine left it. A release or executor that hides the runner records why instead.
    """
    import vllm.envs as vllm_envs

    found: dict[str, Any] = {
        "env": {name: _jsonable(getattr(vllm_envs, name, None)) for name in _NUMERICS_ENV},
        "triton": model_runner.triton_present(),
        **matmul_precision.recorded(),
    }
    try:
        # A function reaches in-process workers only; across processes vLLM refuses to send one.
        found |= llm.collective_rpc(runtime_choices, timeout=RUNTIME_PROBE_TIMEOUT_S)[0]
    except Exception as exc:
        found["runtime_probe_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return found


RUNTIME_PROBE_TIMEOUT_S = 120.0


def runtime_choices(worker) -> dict[str, Any]:
    """Runs on the engine's worker: its model runner, and the attention backends and the sampler it chose."""
    runner = getattr(worker, "model_runner", None)
    groups = getattr(runner, "attn_groups", None) or []
    backends = sorted(
        {g.backend.get_name() for group in groups for g in group if hasattr(g.backend, "get_name")}
    )
    sampler = getattr(getattr(runner, "sampler", None), "topk_topp_sampler", None)
    forward = getattr(sampler, "forward", None)
    return {
        "model_runner_class": f"{type(runner).__module__}.{type(runner).__qualname__}"
        if runner is not None
        else None,
        "attention_backends": backends or None,
        "topk_topp_sampler": f"{type(sampler).__name__}.{forward.__name__}"
        if sampler is not None and forward
        else None,
    }


def default_sampling(llm) -> dict[str, Any] | None:
    """The defaults the engine derives for requests that set nothing (generation_config.json)."""
    getter = getattr(llm, "get_default_sampling_params", None)
    if getter is None:
        return None
    params = getter()
    return {name: _jsonable(getattr(params, name, None)) for name in _DEFAULT_SAMPLING_FIELDS}


def generation_config_overrides(llm) -> dict[str, Any] | None:
    model_config = _first_attr(llm.llm_engine, ("vllm_config.model_config", "model_config"))
    getter = getattr(model_config, "get_diff_sampling_param", None)
    return None if getter is None else {k: _jsonable(v) for k, v in getter().items()}


def identity(llm) -> dict[str, Any]:
    import transformers
    import vllm

    engine_cls = type(llm.llm_engine)
    return {
        "vllm": getattr(vllm, "__version__", "unknown"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "engine_class": f"{engine_cls.__module__}.{engine_cls.__qualname__}",
        "engine_generation": "V1" if ".v1." in f".{engine_cls.__module__}." else "V0",
        "device_kind": "cuda" if torch.cuda.is_available() else "cpu",
        "device_name": device_name(),
        "platform": platform.platform(),
        "executable": sys.executable,
        "worker_multiproc_method": os.environ.get("VLLM_WORKER_MULTIPROC_METHOD"),
    }


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def _first_attr(obj: Any, paths: tuple[str, ...]) -> Any:
    for path in paths:
        cur = obj
        for part in path.split("."):
            cur = getattr(cur, part, None)
            if cur is None:
                break
        if cur is not None:
            return cur
    return None


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):  # before int: CompilationMode is an IntEnum
        return value.name
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, type):  # e.g. a logits processor class
        return f"{value.__module__}:{value.__qualname__}"
    return str(value)
