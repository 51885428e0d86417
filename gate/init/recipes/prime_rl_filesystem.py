"""prime-rl's filesystem weight broadcast (``inference.weight_broadcast.type = "filesystem"``) as gate
hooks, against vLLM's own OpenAI server in development mode.

prime-rl's trainer writes each step's weights as a safetensors checkpoint folder; its orchestrator
pauses the server with the running requests kept (``/pause?mode=keep&clear_cache=false``), has every
worker reload the folder layer by layer (``update_weights_from_path``: vLLM's layerwise reload, the
loader behind the workers' ``reload_weights(weights_path=...)``) and resumes. It never resets the
prefix cache: new requests carry a per-version ``cache_salt`` instead.

``update`` is that push for ``weight_update.hook`` (server mode: ``fn(base_url, state_dict)``). gate's
probe requests carry no salt, so it resets the prefix cache where prime-rl would salt the next
requests. ``update_inflight`` is the same push while requests stream (``weight_sync.inflight``):
paused with their KV kept and no reset, so they go on over the old weights' cache as under prime-rl.
Written by ``gate init --stack prime-rl``; it needs only the engine's environment (torch, safetensors).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

RPC_TIMEOUT_S = 600.0  # one reload of the whole model by every rank


def update(base_url: str, state_dict) -> None:
    with checkpoint(state_dict) as folder:
        post(base_url, "/pause?mode=keep&clear_cache=false")
        try:
            post(base_url, "/collective_rpc", reload_request(folder))
        finally:
            post(base_url, "/resume")
    post(base_url, "/reset_prefix_cache")  # stands in for prime-rl's per-version cache_salt


def update_inflight(engine, state_dict) -> None:
    with checkpoint(state_dict) as folder:
        engine.pause("keep", clear_cache=False)
        try:
            engine.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
        finally:
            engine.resume()


def reload_request(folder: Path) -> dict:
    return {
        "method": "reload_weights",
        "kwargs": {"weights_path": str(folder)},
        "timeout": RPC_TIMEOUT_S,
    }


@contextmanager
def checkpoint(state_dict) -> Iterator[Path]:
    """The trainer's side: the weights as one safetensors file in a fresh folder (in shared memory
    where there is one), removed once the ranks have read it. Complete before any rank reads it,
    as prime-rl's orchestrator waits for the trainer to mark the step's folder stable."""
    from safetensors.torch import save_file

    parent = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    folder = Path(tempfile.mkdtemp(prefix="prime-rl-step-", dir=parent))
    try:
        save_file(
            _distinct_storages(state_dict),
            str(folder / "model.safetensors"),
            metadata={"format": "pt"},
        )
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _distinct_storages(state_dict) -> dict:
    """safetensors refuses two names on one storage (a tied head): later names get a copy."""
    seen, out = set(), {}
    for name, tensor in state_dict.items():
        t = tensor.detach()
        key = (str(t.device), t.untyped_storage().data_ptr())
        out[name] = t.clone().contiguous() if key in seen and t.numel() else t.contiguous()
        seen.add(key)
    return out


def post(base_url: str, path: str, body: dict | None = None) -> dict:
    """POST JSON to the server; an HTTP error raises with the server's answer."""
    request = urllib.request.Request(
        base_url.rstrip("/") + path,
        data=json.dumps(body or {}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=RPC_TIMEOUT_S) as answer:
            text = answer.read().decode() or "{}"
    except urllib.error.HTTPError as exc:
        raise RuntimeError(
            f"POST {path} answered HTTP {exc.code}: {exc.read().decode()[:500]}"
        ) from None
    try:
        return json.loads(text)
    except ValueError:
        return {}
