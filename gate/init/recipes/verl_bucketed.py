"""verl's colocated weight push (``actor_rollout_ref.rollout.checkpoint_engine.backend: naive``, its
default), as a gate hook. Written by ``gate init --stack verl``; it needs only the engine's
environment (torch, pyzmq and vLLM), not verl. ``gate init`` copies this file alone beside gate.yaml, so
it shares no helper with the other recipes (the layerwise-reload bracket is repeated in each).

What verl 0.9 does (verl/workers/rollout/vllm_rollout/), mirrored call for call:

- **Trainer side** (``BucketedWeightSender``): binds a ZMQ REQ socket on an IPC path, hands the
  receiver one reusable byte buffer (a CUDA-IPC handle, or a POSIX shared-memory segment where CUDA
  IPC is not supported: verl's ``use_shm``), packs the tensors into it at dtype-aligned offsets and
  sends each full bucket's metadata (name, shape, dtype, offset), waiting for an ack before it
  overwrites the buffer; the last bucket is marked ``is_last``. Bucket size:
  ``checkpoint_engine.update_weights_bucket_megabytes`` (verl's default 2048; ``BUCKET_MEGABYTES``).
- **Worker side** (``vLLMColocateWorkerExtension.update_weights_from_ipc``): a REP socket, each
  bucket's tensors viewed out of the buffer and given to ``model.load_weights``, then
  ``process_weights_after_loading`` once after the last bucket.
- Then the trainer clears the KV cache (``clear_kv_cache``: ``reset_prefix_cache``).

verl runs the receiver inside vLLM's worker through ``collective_rpc`` while the trainer sends; here
``llm.collective_rpc`` runs it while a thread sends, with the model in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0`` in gate.yaml).

**On vLLM's CPU platform** (CPU CI) the transport is verl's shared-memory fallback, and the loads
run inside vLLM's layerwise reload instead of before ``process_weights_after_loading``: the CPU
platform repacks each linear weight into a kernel handle and drops its ``weight_loader``, so a bare
``load_weights`` raises; ``initialize_layerwise_reload`` / ``finalize_layerwise_reload`` restore the
loaders and repack what was loaded (vLLM's own ``reload_weights`` is this bracket). The layerwise
reload holds each loaded tensor until its layer is complete, and a layer can straddle two buckets,
so each bucket's tensors are copied out of the shared buffer before they are loaded (verl's
``tensor.to(device)`` copies on an accelerator and is a no-op on a CPU device).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from multiprocessing import shared_memory
from pathlib import Path
from tempfile import gettempdir

BUCKET_MEGABYTES = 2048  # verl's checkpoint_engine.update_weights_bucket_megabytes default
TIMEOUT_MS = 600_000  # either side gives up on a silent peer instead of hanging the run


def update(llm, state_dict) -> None:
    push(llm, state_dict, BUCKET_MEGABYTES << 20)
    llm.reset_prefix_cache()  # verl's clear_kv_cache after update_weights


def push(llm, state_dict, bucket_bytes: int, copy_out: bool = True) -> None:
    """The receiver on every engine rank (``collective_rpc``); one sender thread a rank, as each of
    verl's trainer ranks sends the full weights to its colocated rollout rank over its own socket."""
    import torch

    use_shm = not (torch.cuda.is_available() and all(t.is_cuda for t in state_dict.values()))
    ranks = llm.llm_engine.vllm_config.parallel_config.world_size
    handle = f"ipc://{Path(gettempdir()) / f'gate-verl-zmq-{uuid.uuid4().hex}'}-rank-{{rank}}.sock"
    failures: list[BaseException] = []

    def send(rank: int) -> None:
        try:
            send_buckets(handle.format(rank=rank), state_dict.items(), bucket_bytes, use_shm)
        except BaseException as exc:  # re-raised in the caller's thread below
            failures.append(exc)

    senders = [
        threading.Thread(target=send, args=(rank,), name=f"gate-verl-sender-{rank}", daemon=True)
        for rank in range(ranks)
    ]
    for sender in senders:
        sender.start()
    llm.collective_rpc(
        receive_and_load,
        kwargs={"zmq_handle": handle, "use_shm": use_shm, "copy_out": copy_out},
    )
    for sender in senders:  # every receiver has acked its last bucket: they return at once
        sender.join(TIMEOUT_MS / 1000)
    if failures:
        raise RuntimeError(f"verl's bucketed sender failed: {failures[0]!r}") from failures[0]


def send_buckets(zmq_handle: str, weights: Iterable, bucket_bytes: int, use_shm: bool) -> None:
    """verl's ``BucketedWeightSender.async_send_weights``."""
    import torch
    import zmq

    socket = _socket(zmq.REQ)
    socket.bind(zmq_handle)
    shm = buffer = view = None
    try:
        if use_shm:
            shm = shared_memory.SharedMemory(
                name=f"gate_verl_{uuid.uuid4().hex}", create=True, size=bucket_bytes
            )
            buffer = torch.frombuffer(shm.buf, dtype=torch.uint8)
            socket.send_pyobj({"name": shm.name, "size": bucket_bytes})
        else:
            from torch.multiprocessing.reductions import reduce_tensor

            buffer = torch.empty(bucket_bytes, dtype=torch.uint8, device="cuda")
            socket.send_pyobj(reduce_tensor(buffer))
        socket.recv()
        offset = 0
        bucket: dict[str, dict] = {}
        for name, weight in weights:
            weight = weight.detach()
            alignment = weight.element_size()  # the receiver views the bytes as this dtype
            offset = (offset + alignment - 1) // alignment * alignment
            if offset + weight.nbytes > bucket_bytes and bucket:
                _send_bucket(socket, bucket, is_last=False)
                offset, bucket = 0, {}
            if offset + weight.nbytes > bucket_bytes:
                raise ValueError(
                    f"{name} ({weight.nbytes} bytes) does not fit a {bucket_bytes}-byte bucket: "
                    "raise checkpoint_engine.update_weights_bucket_megabytes (BUCKET_MEGABYTES)"
                )
            bucket[name] = {"shape": weight.shape, "dtype": weight.dtype, "offset": offset}
            view = buffer[offset : offset + weight.nbytes].view(weight.dtype).view(weight.shape)
            view.copy_(weight)
            offset += weight.nbytes
        _send_bucket(socket, bucket, is_last=True)
    finally:
        socket.close()
        buffer = view = None  # torch's views pin shm.buf; close() refuses while one lives
        if shm is not None:
            with suppress(BufferError):
                shm.close()
            shm.unlink()  # the segment goes whatever this process still maps


def _send_bucket(socket, bucket: dict, is_last: bool) -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    socket.send_pyobj({"bucket_meta": bucket, "is_last": is_last})
    socket.recv()


def receive_and_load(worker, zmq_handle: str, use_shm: bool, copy_out: bool = True) -> int:
    """verl's ``update_weights_from_ipc`` on one worker (``zmq_handle`` with ``{rank}`` for its
    rank): every bucket into ``model.load_weights``. Returns the number of tensors loaded."""
    runner = worker.model_runner
    model = runner.model
    handle = zmq_handle.format(rank=worker.rank)
    loaded = 0
    with _processed_after_loading(model, runner.model_config, _device(worker)):
        for weights in receive_buckets(handle, use_shm, _device(worker), copy_out):
            model.load_weights(weights)
            loaded += len(weights)
    return loaded


def receive_buckets(zmq_handle: str, use_shm: bool, device, copy_out: bool) -> Iterator[list]:
    """verl's ``BucketedWeightReceiver``: yields each bucket's (name, tensor) list; the ack that lets
    the sender overwrite the buffer goes out when the caller asks for the next bucket."""
    import torch
    import zmq

    socket = _socket(zmq.REP)
    socket.connect(zmq_handle)
    shm = None
    try:
        comm = socket.recv_pyobj()
        if use_shm:
            shm = shared_memory.SharedMemory(name=comm["name"])
            assert shm.buf is not None  # None only once closed
            buffer = torch.frombuffer(shm.buf[: comm["size"]], dtype=torch.uint8)
        else:
            func, args = comm
            args = list(args)
            args[6] = device.index  # the receiver's own device, as verl's rebuild_ipc
            buffer = func(*args)
        socket.send(b"")
        while True:
            message = socket.recv_pyobj()
            weights = []
            for name, meta in message["bucket_meta"].items():
                size = meta["dtype"].itemsize * meta["shape"].numel()
                tensor = buffer[meta["offset"] : meta["offset"] + size]
                tensor = tensor.view(meta["dtype"]).view(meta["shape"]).to(device)
                weights.append((name, tensor.clone() if copy_out and use_shm else tensor))
            yield weights
            del weights, tensor  # as verl, before the ack that lets the sender reuse the buffer
            socket.send(b"")
            if message["is_last"]:
                return
    finally:
        socket.close()
        if shm is not None:
            del buffer
            # a loader still holding a view keeps the mapping; it goes with the last view
            with suppress(BufferError):
                shm.close()


@contextmanager
def _processed_after_loading(model, model_config, device) -> Iterator[None]:
    """verl's step 3 (``process_weights_after_loading`` once, after every bucket) on an accelerator;
    vLLM's layerwise-reload bracket on the CPU platform (the module docstring says why)."""
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
