"""In-flight update hooks with known faults, for the in-flight tests (``weight_sync.inflight.updates``).

Signature: ``fn(engine, state_dict) -> None``: ``engine`` is gate.worker.inflight.InflightEngine
(each call runs between two steps of the running engine, as vLLM's engine core runs client calls),
``state_dict`` the full new weights. They run in the engine environment.
"""

from __future__ import annotations

import re


def per_layer_without_pause(engine, state_dict):
    """One RPC per decoder layer and none around them (open-instruct PR #1535's per-parameter RPCs):
    decode steps run between the calls, on partly updated weights."""
    groups: dict[str, list] = {}
    for name, tensor in state_dict.items():
        layer = re.match(r"(.*\.layers\.\d+)\.", name)
        groups.setdefault(layer.group(1) if layer else "rest", []).append((name, tensor))
    for items in groups.values():
        engine.collective_rpc(_reload_some, args=(items,))


def _reload_some(worker, items):
    # Every tensor of whole modules: vLLM's layerwise reload keeps the layers it is not given.
    worker.reload_weights(weights_iterator=iter(items))


def abort_without_resubmit(engine, state_dict):
    """AReaL's abort, push, resume, without the client's resubmission: the running requests are lost."""
    engine.pause("abort", clear_cache=True)
    engine.push(state_dict)
    engine.resume()


def pause_without_push(engine, state_dict):
    """Pauses and resumes around a push that never happens: the engine keeps the old weights."""
    engine.pause("keep")
    engine.resume()


def never_resume(engine, state_dict):
    """Pushes under a pause and forgets to resume: the requests never finish."""
    engine.pause("keep")
    engine.push(state_dict)


# -- tensor parallel: the ranks are other processes, reached by method name (or, with
# VLLM_ALLOW_INSECURE_SERIALIZATION=1 in the engine's env, by a pickled function) --------------------


def _folder(items):
    """A fresh /dev/shm folder holding ``items`` as one safetensors file (tied names copied apart)."""
    import tempfile

    from safetensors.torch import save_file

    seen, tensors = set(), {}
    for name, tensor in items:
        t = tensor.detach()
        key = t.untyped_storage().data_ptr()
        tensors[name] = t.clone() if key in seen and t.numel() else t.contiguous()
        seen.add(key)
    folder = tempfile.mkdtemp(prefix="inflight-hook-", dir="/dev/shm")
    save_file(tensors, f"{folder}/model.safetensors", metadata={"format": "pt"})
    return folder


def per_layer_folders_without_pause(engine, state_dict):
    """Torn at TP=2: one folder reload per decoder layer, by name on every rank, no pause."""
    import shutil

    groups: dict[str, list] = {}
    for name, tensor in state_dict.items():
        layer = re.match(r"(.*\.layers\.\d+)\.", name)
        groups.setdefault(layer.group(1) if layer else "rest", []).append((name, tensor))
    for items in groups.values():
        folder = _folder(items)
        try:
            engine.collective_rpc("reload_weights", kwargs={"weights_path": folder})
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def rank0_only(engine, state_dict):
    """Partial at TP=2: paused, one push, but only rank 0 loads it; rank 1 keeps the old shard."""
    import shutil

    folder = _folder(state_dict.items())
    try:
        engine.pause("keep")
        engine.collective_rpc(_reload_on_rank_0, args=(folder,))
        engine.resume()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _reload_on_rank_0(worker, folder):
    if worker.rank == 0:
        worker.reload_weights(weights_path=folder)
