"""The folder-reload pushes of two stacks that drive vLLM's OpenAI server, as gate hooks against
vLLM's own server in development mode: ``/pause``, ``/collective_rpc`` ``reload_weights(weights_path)``
on every rank (vLLM's layerwise reload), ``/resume``. The trainer's side writes the step's weights
as a safetensors folder first. ``*_update(base_url, state_dict)`` is ``weight_update.hook`` (server
mode); ``*_update_inflight(engine, state_dict)`` the same push while requests stream
(``weight_sync.inflight.updates``). Written by ``gate init``; it needs only the engine's environment.

**prime-rl** (``inference.weight_broadcast.type = "filesystem"``): its orchestrator pauses with the
running requests kept (``mode=keep&clear_cache=false``), has every worker reload the folder
(``update_weights_from_path``: the layerwise reload behind ``reload_weights``) and resumes. It never
resets the prefix cache: new requests carry a per-version ``cache_salt``. gate's probe requests carry
none, so the idle push resets the cache where prime-rl would salt; in flight nothing is reset, and the
running requests go on over the old weights' KV, as under prime-rl.

**AReaL** (``actor.weight_update_mode: disk``): its server's ``/areal_update_weights`` pauses with
every request aborted and the cache cleared (``pause_generation(wait_for_inflight_requests=False,
clear_cache=True)``), has the workers load the folder and resumes; its client sends each aborted
request again as prompt + partial output for the tokens it had left. AReaL's worker extension loads
with ``model_loader.load_weights`` on the model, which vLLM's CPU platform cannot take (as TRL's
colocate push: docs/adopt.md); ``reload_weights`` is the same loader with the repacked layers restored.
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


def prime_rl_update(base_url: str, state_dict) -> None:
    with checkpoint(state_dict) as folder:
        reload_paused(base_url, folder, "/pause?mode=keep&clear_cache=false")
    post(base_url, "/reset_prefix_cache")  # stands in for prime-rl's per-version cache_salt


def prime_rl_update_inflight(engine, state_dict) -> None:
    with checkpoint(state_dict) as folder:
        reload_paused_inflight(engine, folder, "keep", clear_cache=False)


def areal_update(base_url: str, state_dict) -> None:
    with checkpoint(state_dict) as folder:
        reload_paused(base_url, folder, "/pause?mode=abort&clear_cache=true")


def areal_update_inflight(engine, state_dict) -> None:
    with checkpoint(state_dict) as folder:
        reload_paused_inflight(engine, folder, "abort", clear_cache=True)
    engine.resubmit_aborted()  # AReaL's client: prompt + partial output, for the tokens left


def reload_paused(base_url: str, folder: Path, pause: str) -> None:
    """Every rank reloads ``folder`` between ``pause`` (the stack's query) and ``/resume``."""
    post(base_url, pause)
    try:
        post(base_url, "/collective_rpc", reload_request(folder))
    finally:
        post(base_url, "/resume")


def reload_paused_inflight(engine, folder: Path, mode: str, clear_cache: bool) -> None:
    """The same through gate's in-flight handle, which places each call among the streamed tokens."""
    engine.pause(mode, clear_cache=clear_cache)
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
    as both stacks wait for the trainer to finish the step's folder."""
    from safetensors.torch import save_file

    parent = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    folder = Path(tempfile.mkdtemp(prefix="gate-hook-step-", dir=parent))
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
