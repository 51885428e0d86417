"""NeMo-RL's colocated refit (``policy.generation.colocated.enabled: true``, its default), as a gate
hook. Written by ``gate init --stack nemo-rl``; it needs only the engine's environment (torch, pyzmq
and vLLM), not NeMo-RL. ``gate init`` copies this file alone beside gate.yaml, so
it shares no helper with the other recipes (the layerwise-reload bracket is repeated in each).

What NeMo-RL does (nemo_rl/models/policy/utils.py ``stream_weights_via_ipc_zmq_impl``,
nemo_rl/models/generation/vllm/vllm_backend.py ``VllmInternalWorkerExtension``), mirrored:

- **Once, at setup**: ``prepare_refit_info({name: (shape, dtype)})`` on every worker. The worker
  reads every later batch by this info; the batches carry names only.
- **Trainer side**: a ZMQ REQ socket bound on the worker's IPC path; two staging buffers of half the
  refit buffer each (ping-pong: one is packed while the receiver loads the other); each tensor packed
  at a 512-byte-aligned offset; a batch is ``(buffer handle, names, used bytes)``, sent after the
  previous batch's ack; then ``COMPLETE``, acked once the worker has finished.
- **Worker side** (``update_weights_via_ipc_zmq``): a REP socket; each batch's names checked against
  the refit info, the tensors viewed out of the buffer by it (the offsets must add up to the used
  bytes) and given to ``model.load_weights``; a failed batch is recorded and acked, not raised; at
  ``COMPLETE``, if every name arrived, ``process_weights_after_loading``. It **returns False on any
  failure instead of raising**; NeMo-RL's GRPO loop raises when a worker returned False, and so does
  ``update`` here.
- Then the prefix cache is reset (NeMo-RL resets it through sleep/wake on colocated runs).

NeMo-RL's buffers are CUDA tensors shared by CUDA-IPC handle; where CUDA is not there (CPU CI) they
are POSIX shared-memory segments, named in the batch instead. NeMo-RL sizes the refit buffer from
free GPU memory (``NRL_REFIT_BUFFER_MEMORY_RATIO``, 0.3); ``REFIT_BUFFER_BYTES`` fixes it here.
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (gate.yaml) keeps the model in this process, so
``collective_rpc`` runs the worker side while a thread sends.

**On vLLM's CPU platform** the loads run inside vLLM's layerwise reload (the CPU platform repacks each
linear weight and drops its ``weight_loader``; ``initialize_layerwise_reload`` /
``finalize_layerwise_reload`` restore the loaders and repack what was loaded, as vLLM's own
``reload_weights`` does), and, because that reload holds a layer's tensors until the layer is
complete while the sender reuses each staging buffer, each batch's tensors are copied out first.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from multiprocessing import shared_memory
from pathlib import Path
from tempfile import gettempdir

REFIT_BUFFER_BYTES = 1 << 30  # both staging buffers together, as NeMo-RL's buffer_size_bytes
ALIGNMENT = 512  # NeMo-RL's calculate_aligned_size
COMPLETE = "complete"
ACK = b"ack"
TIMEOUT_MS = 600_000  # either side gives up on a silent peer instead of hanging the run

log = logging.getLogger(__name__)


def update(llm, state_dict) -> None:
    prepare_refit_info_once(llm, state_dict)
    if not all(push(llm, state_dict, REFIT_BUFFER_BYTES)):
        raise RuntimeError("NeMo-RL's refit failed on a worker (update_weights_via_ipc_zmq: False)")
    llm.reset_prefix_cache()


def refit_info(state_dict) -> dict:
    return {name: (tuple(t.shape), t.dtype) for name, t in state_dict.items()}


def prepare_refit_info_once(llm, state_dict) -> None:
    """NeMo-RL calls ``prepare_refit_info`` once at setup; the first update stands in for it."""
    prepare_refit_info(llm, refit_info(state_dict), force=False)


def prepare_refit_info(llm, info: dict, force: bool = True) -> None:
    llm.collective_rpc(_prepare_refit_info, kwargs={"info": info, "force": force})


def _prepare_refit_info(worker, info: dict, force: bool) -> None:
    if force or getattr(worker, "gate_refit_info", None) is None:
        worker.gate_refit_info = info


def push(llm, state_dict, buffer_bytes: int) -> list[bool]:
    """The worker side on every rank (``collective_rpc``), the trainer side in one thread a rank;
    each worker's True or False, as NeMo-RL's futures return them."""
    import torch

    use_shm = not (torch.cuda.is_available() and all(t.is_cuda for t in state_dict.values()))
    ranks = llm.llm_engine.vllm_config.parallel_config.world_size
    address = f"ipc://{Path(gettempdir()) / f'gate-nemo-rl-{uuid.uuid4().hex}'}-rank-{{rank}}.sock"
    failures: list[BaseException] = []

    def stream(rank: int) -> None:
        try:
            stream_weights(address.format(rank=rank), state_dict.items(), buffer_bytes, use_shm)
        except BaseException as exc:  # re-raised in the caller's thread below
            failures.append(exc)

    senders = [
        threading.Thread(
            target=stream, args=(rank,), name=f"gate-nemo-rl-sender-{rank}", daemon=True
        )
        for rank in range(ranks)
    ]
    for sender in senders:
        sender.start()
    results = llm.collective_rpc(
        update_weights_via_ipc_zmq, kwargs={"address": address, "use_shm": use_shm}
    )
    for sender in senders:
        sender.join(TIMEOUT_MS / 1000)
    if failures:
        raise RuntimeError(f"NeMo-RL's refit sender failed: {failures[0]!r}") from failures[0]
    return list(results)


def aligned(nbytes: int) -> int:
    return (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def stream_weights(address: str, weights, buffer_bytes: int, use_shm: bool) -> None:
    """``stream_weights_via_ipc_zmq_impl``: ping-pong staging buffers, one batch in flight."""
    import zmq

    half = aligned(buffer_bytes // 2)
    socket = _socket(zmq.REQ)
    socket.bind(address)
    buffers = [_StagingBuffer(half, use_shm), _StagingBuffer(half, use_shm)]
    current, used, awaiting_ack = 0, 0, False
    names: list[str] = []

    def send(buffer: _StagingBuffer, batch: list[str], nbytes: int) -> None:
        nonlocal awaiting_ack
        if awaiting_ack:
            socket.recv()
        socket.send_pyobj((buffer.handle, batch, nbytes))
        awaiting_ack = True

    try:
        for name, tensor in weights:
            size = aligned(tensor.nbytes)
            if size > half:
                raise ValueError(
                    f"{name} ({tensor.nbytes} bytes) exceeds a staging buffer ({half})"
                )
            if used + size > half:
                send(buffers[current], names, used)
                current, used, names = 1 - current, 0, []
            buffers[current].pack(tensor, used)
            names.append(name)
            used += size
        if names:
            send(buffers[current], names, used)
        if awaiting_ack:
            socket.recv()
        socket.send_pyobj(COMPLETE)
        socket.recv()
    finally:
        socket.close()
        for buffer in buffers:
            buffer.release()


class _StagingBuffer:
    """A CUDA tensor shared by IPC handle (NeMo-RL's), or a shared-memory segment where there is no
    CUDA (the CPU swap); ``handle`` is what a batch carries."""

    def __init__(self, nbytes: int, use_shm: bool) -> None:
        import torch

        self._shm = None
        if use_shm:
            self._shm = shared_memory.SharedMemory(
                name=f"gate_nemo_rl_{uuid.uuid4().hex}", create=True, size=nbytes
            )
            self.tensor = torch.frombuffer(self._shm.buf, dtype=torch.uint8)
            self.handle: object = ("shm", self._shm.name, nbytes)
        else:
            from torch.multiprocessing.reductions import reduce_tensor

            self.tensor = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            self.handle = ("cuda", reduce_tensor(self.tensor))

    def pack(self, tensor, offset: int) -> None:
        import torch

        data = tensor.detach().reshape(-1).view(torch.uint8)
        self.tensor[offset : offset + data.numel()].copy_(data)
        if self.tensor.is_cuda:
            torch.cuda.current_stream().synchronize()

    def release(self) -> None:
        self.tensor = None
        if self._shm is not None:
            with suppress(BufferError):  # a view still alive keeps the mapping until it goes
                self._shm.close()
            self._shm.unlink()


def update_weights_via_ipc_zmq(worker, address: str, use_shm: bool) -> bool:
    """The worker extension's method on one rank (``address`` with ``{rank}``): True when every name
    in the refit info was loaded and processed, False (logged) on any failure."""
    import zmq

    info = worker.gate_refit_info
    runner = worker.model_runner
    model = runner.model
    device = _device(worker)
    socket = _socket(zmq.REP)
    socket.connect(address.format(rank=worker.rank))
    loaded: set[str] = set()
    errors: list[str] = []
    try:
        with _processed_after_loading(model, runner.model_config, device):
            while True:
                payload = socket.recv_pyobj()
                if payload == COMPLETE:
                    missing = set(info) - loaded
                    if missing or errors:
                        socket.send(ACK)
                        raise RuntimeError(
                            "; ".join(errors) or f"{len(missing)} names never arrived"
                        )
                    break
                try:
                    handle, names, used = payload
                    model.load_weights(_batch(handle, names, used, info, device, copy_out=use_shm))
                    loaded.update(names)
                except Exception as exc:  # recorded and acked, as NeMo-RL's manifest does
                    log.exception("refit batch failed")
                    errors.append(f"{type(exc).__name__}: {exc}")
                socket.send(ACK)
        socket.send(ACK)  # COMPLETE's ack once processing is done
        return True
    except Exception:
        log.exception("update_weights_via_ipc_zmq failed")
        return False
    finally:
        socket.close()


def _batch(handle, names: list[str], used: int, info: dict, device, copy_out: bool) -> list:
    """The batch's tensors, viewed out of the staging buffer by the refit info."""
    import torch

    unknown = [n for n in names if n not in info]
    if unknown:
        raise KeyError(f"not in the refit info: {unknown[:5]}")
    with _mapped(handle, device) as buffer:
        weights, offset = [], 0
        for name in names:
            shape, dtype = info[name]
            nbytes = dtype.itemsize * torch.Size(shape).numel()
            view = buffer[offset : offset + nbytes].view(dtype).view(shape)
            weights.append((name, view.clone() if copy_out else view))
            offset += aligned(nbytes)
        del view, buffer  # the mapping closes once no view of it is left
        if offset != used:
            raise AssertionError(
                f"offsets add up to {offset} of {used} used bytes: the refit info is stale"
            )
        return weights


@contextmanager
def _mapped(handle, device) -> Iterator:
    import torch

    if handle[0] == "shm":
        _, name, nbytes = handle
        shm = shared_memory.SharedMemory(name=name)
        assert shm.buf is not None  # None only once closed
        buffer = torch.frombuffer(shm.buf[:nbytes], dtype=torch.uint8)
        try:
            yield buffer
        finally:
            del buffer
            with suppress(BufferError):  # a view still alive keeps the mapping until it goes
                shm.close()
        return
    func, args = handle[1]
    args = list(args)
    args[6] = device.index  # the receiver's own device, as NeMo-RL's rebuild_cuda_tensor_from_ipc
    yield func(*args)


@contextmanager
def _processed_after_loading(model, model_config, device) -> Iterator[None]:
    """NeMo-RL's ``process_weights_after_loading`` at ``COMPLETE`` on an accelerator; vLLM's
    layerwise-reload bracket on the CPU platform (the module docstring says why)."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        initialize_layerwise_reload(model)
        try:
            yield
        finally:  # a failed load too: layers left unloaded get their old kernels back
            finalize_layerwise_reload(model, model_config)
        return
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    yield
    process_weights_after_loading(model, model_config, device)


def _device(worker):
    import torch

    device = getattr(worker, "device", None)
    return device if isinstance(device, torch.device) else torch.device("cpu")


def _socket(kind: int):
    """A ZMQ socket that gives up on a silent peer after ``TIMEOUT_MS`` and never lingers."""
    import zmq

    socket = zmq.Context.instance().socket(kind)
    socket.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
    socket.setsockopt(zmq.LINGER, 0)
    return socket
