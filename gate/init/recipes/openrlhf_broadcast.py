"""OpenRLHF's weight sync from its DeepSpeed actor into vLLM (``--vllm.sync_backend nccl``, its
default, without ``--train.colocate_all``: the broadcast path), as a gate hook. Written by
``gate init --stack openrlhf``; it needs only the engine's environment (torch and vLLM), not
OpenRLHF, whose package pulls Ray and DeepSpeed. ``gate init`` copies this file alone beside
gate.yaml, so it shares no helper with the other recipes.

What OpenRLHF 0.11.2 does (openrlhf/trainer/ray/ppo_actor.py and vllm_worker_wrap.py), mirrored
call for call:

- **Once** (``_init_vllm_sync_group``): every vLLM worker joins one process group with the
  trainer's rank 0, outside vLLM's own (``WorkerWrap.init_process_group`` through
  ``collective_rpc``): rank 0 the trainer, rank 1 + the worker's own rank each engine worker, over
  vLLM's ``StatelessProcessGroup`` with a ``PyNcclCommunicator``.
- **Each sync** (``broadcast_to_vllm``): where ``--vllm.enable_prefix_caching`` is on, the trainer
  asks for ``reset_prefix_cache`` first, and does not read its result. Then, for each parameter of
  ``model.named_parameters()`` (a tied head is one parameter, sent under the embedding's name),
  every worker's ``update_weight(name, dtype, shape)`` allocates an empty tensor, asserts its dtype
  is the engine's (OpenRLHF hard-codes ``bfloat16`` on both sides), receives the trainer's
  broadcast from rank 0 and hands it to ``model_runner.model.load_weights``: one parameter a call,
  and no ``process_weights_after_loading``.

**The transport.** OpenRLHF's actor holds a GPU of its own, and NCCL takes one rank a GPU: where
the runner has a GPU past the engine's, rank 0 broadcasts from it over PyNccl, as OpenRLHF does.
Elsewhere (a one-GPU runner, vLLM's CPU platform in CPU CI) the group is a gloo one, made the same
stateless way (a TCP store of its own, outside torch.distributed's default group), the tensors
broadcast from host memory and copied to each worker's device to load. That is the only swap.

**On vLLM's CPU platform** the loads run inside vLLM's layerwise reload: the CPU platform repacks
each linear weight into a kernel handle and drops its ``weight_loader``, so a bare ``load_weights``
raises; ``initialize_layerwise_reload`` / ``finalize_layerwise_reload`` (what vLLM's own
``reload_weights`` puts around the same loader) restore the loaders and repack what was loaded. One
consequence that is the CPU platform's alone: the head of a tied model is a repacked copy of the
embedding there, which a push of the embedding alone does not rebuild (docs/validation.md, row
25b); on a GPU the head is the embedding's tensor.

gate pushes from this process with the engine's model in it (``VLLM_ENABLE_V1_MULTIPROCESSING=0``
in gate.yaml) or in its worker processes at tensor parallelism: ``collective_rpc`` runs each
worker's side while a thread here broadcasts, as OpenRLHF's rank 0 broadcasts while its Ray calls
to the engines wait.
"""

from __future__ import annotations

import socket
import threading
import weakref
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, NamedTuple

TIMEOUT_S = 600.0  # a rank that never joins fails the push instead of hanging the run
GROUP_NAME = "openrlhf"

# the trainer's side of each engine's group, made at its first push (OpenRLHF: once, at start-up)
_GROUPS: weakref.WeakKeyDictionary[Any, SyncGroup] = weakref.WeakKeyDictionary()


def update(llm, state_dict) -> None:
    """``broadcast_to_vllm`` of OpenRLHF's actor, rank 0: the cache reset, then every parameter."""
    group = _GROUPS.get(llm)
    if group is None:
        group = _GROUPS[llm] = init_sync_group(llm)
    if llm.llm_engine.vllm_config.cache_config.enable_prefix_caching:
        llm.reset_prefix_cache()  # OpenRLHF fires it before the broadcast and ignores its result
    try:
        broadcast_parameters(llm, group, state_dict)
    except BaseException:
        _GROUPS.pop(llm, None)  # a broadcast left half done: the next push makes a new group
        raise


class SyncGroup(NamedTuple):  # not a dataclass: gate loads this file without a module name
    """The trainer's side of the group, and the device its tensors are broadcast from."""

    group: Any
    device: Any


def init_sync_group(llm) -> SyncGroup:
    """``_init_vllm_sync_group``: the trainer as rank 0 of a group with every engine worker."""
    ranks = llm.llm_engine.vllm_config.parallel_config.world_size
    host = "127.0.0.1"
    with socket.socket() as sock:  # as OpenRLHF: a free port, read then released
        sock.bind((host, 0))
        port = sock.getsockname()[1]
    device = trainer_device(ranks)
    made: list[Any] = []
    trainer = _beside(lambda: made.append(process_group(host, port, 0, ranks + 1, device)))
    llm.collective_rpc(init_process_group, args=(host, port, 1, ranks + 1, GROUP_NAME, device.type))
    trainer.join(TIMEOUT_S)
    return SyncGroup(made[0], device) if made else _raise(trainer)


def trainer_device(engine_ranks: int):
    """OpenRLHF's actor holds a GPU of its own, and NCCL takes one rank a GPU: PyNccl from the
    first GPU past the engine's where there is one; else gloo from host memory (a one-GPU runner,
    vLLM's CPU platform), the workers copying each tensor to their own device to load it."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > engine_ranks:
        return torch.device(f"cuda:{engine_ranks}")
    return torch.device("cpu")


def broadcast_parameters(llm, sync: SyncGroup, state_dict) -> None:
    """Each parameter: ``update_weight`` on every worker while rank 0 broadcasts it. On the CPU
    platform between a layerwise-reload begin and finish on every worker (the docstring says why)."""
    llm.collective_rpc(begin_loads)
    try:
        for name, parameter in named_parameters(state_dict):
            tensor = parameter.detach().to(sync.device)
            sender = _beside(partial(broadcast, sync.group, tensor))
            llm.collective_rpc(update_weight, args=(name, tensor.dtype, tuple(tensor.shape)))
            sender.join(TIMEOUT_S)
            if sender.error is not None or sender.is_alive():
                _raise(sender)
    finally:  # a failed load too: layers left unloaded get their old kernels back
        llm.collective_rpc(finish_loads)


def named_parameters(state_dict) -> Iterator[tuple[str, Any]]:
    """``model.named_parameters()``'s view of a state dict: a tensor held under two names (a tied
    head) once, under the first."""
    seen: set[tuple[int, int]] = set()
    for name, tensor in state_dict.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if key not in seen:
            seen.add(key)
            yield name, tensor


# -- the process group: OpenRLHF's stateless_init_process_group, gloo where there is no CUDA ------


def process_group(host: str, port: int, rank: int, world_size: int, device):
    if device.type == "cuda":
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        group = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)
        return PyNcclCommunicator(group, device=device)
    # gloo straight from torch: vLLM's stateless helper silences stdout around the group's
    # creation by swapping file descriptor 1, and the trainer's and a worker's creation run at once
    # in this process (the model in gate's process), which would leave stdout on /dev/null.
    from datetime import timedelta

    from torch.distributed import PrefixStore, TCPStore
    from torch.distributed.distributed_c10d import ProcessGroupGloo

    timeout = timedelta(seconds=TIMEOUT_S)
    store = TCPStore(host, port, world_size, rank == 0, timeout=timeout, wait_for_workers=False)
    return ProcessGroupGloo(PrefixStore(GROUP_NAME, store), rank, world_size, timeout)


def broadcast(group, tensor) -> None:
    """One tensor from rank 0 to every rank: PyNccl on the current stream, or gloo."""
    import torch

    if tensor.is_cuda:
        group.broadcast(tensor, src=0, stream=torch.cuda.current_stream())
    else:
        group.broadcast(tensor, 0).wait()


# -- the worker's side (WorkerWrap), each run on every engine worker by collective_rpc ------------


def init_process_group(
    worker, host: str, port: int, rank_offset: int, world_size: int, group_name: str, transport: str
) -> None:
    """``WorkerWrap.init_process_group``: this worker as rank ``rank_offset`` + its own rank, on
    the trainer's transport (``cuda``: PyNccl on this worker's GPU; ``cpu``: gloo)."""
    import torch

    assert torch.distributed.is_initialized(), "default torch process group must be initialized"
    assert group_name != "", "group name must not be empty"
    rank = torch.distributed.get_rank() + rank_offset
    device = _device(worker) if transport == "cuda" else torch.device("cpu")
    worker._model_update_group = process_group(host, port, rank, world_size, device)
    worker._model_update_device = device


def update_weight(worker, name: str, dtype, shape: tuple[int, ...]) -> None:
    """``WorkerWrap.update_weight``: receive one parameter from rank 0 and load it."""
    import torch

    assert dtype == worker.model_config.dtype, (
        f"mismatch dtype: src {dtype}, dst {worker.model_config.dtype}"
    )
    weight = torch.empty(shape, dtype=dtype, device=worker._model_update_device)
    broadcast(worker._model_update_group, weight)
    worker.model_runner.model.load_weights(weights=[(name, weight.to(_device(worker)))])
    del weight


def begin_loads(worker) -> None:
    """vLLM's layerwise reload opened on the CPU platform; nothing on a GPU (OpenRLHF loads bare)."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(worker.model_runner.model)


def finish_loads(worker) -> None:
    """The layerwise reload closed on the CPU platform: what was loaded repacked, the rest restored."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        runner = worker.model_runner
        finalize_layerwise_reload(runner.model, runner.model_config)


def _device(worker):
    import torch

    device = getattr(worker, "device", None)
    return device if isinstance(device, torch.device) else torch.device("cpu")


# -- a thread beside a blocking collective_rpc, its failure kept for the caller -------------------


class _Beside(threading.Thread):
    def __init__(self, fn: Callable[[], None]) -> None:
        super().__init__(name="gate-openrlhf-rank-0", daemon=True)
        self._fn = fn
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._fn()
        except BaseException as exc:  # re-raised in the caller's thread
            self.error = exc


def _beside(fn: Callable[[], None]) -> _Beside:
    thread = _Beside(fn)
    thread.start()
    return thread


def _raise(thread: _Beside):
    if thread.error is not None:
        raise RuntimeError(f"OpenRLHF's rank 0 failed: {thread.error!r}") from thread.error
    raise TimeoutError(f"OpenRLHF's rank 0 did not finish within {TIMEOUT_S:g} s")
