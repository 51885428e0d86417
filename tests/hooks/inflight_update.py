"""In-flight update hooks with known faults, for the in-flight tests (``weight_sync.inflight.updates``).

Signature: ``fn(engine, state_dict) -> None``: ``engine`` is the in-flight handle, offline
gate.worker.inflight_offline.InflightEngine (each call runs between two steps of the running engine,
as vLLM's engine core runs client calls) or in server mode gate.worker.inflight_server.ServerInflightEngine
(the same methods over the server's development endpoints; workers are called by method name);
``state_dict`` the full new weights. They run in the engine environment.
"""

from __future__ import annotations

import re
import time


def by_layer(state_dict) -> list[dict]:
    """The state dict split into one part per decoder layer, and one for everything else."""
    groups: dict[str, dict] = {}
    for name, tensor in state_dict.items():
        layer = re.match(r"(.*\.layers\.\d+)\.", name)
        groups.setdefault(layer.group(1) if layer else "rest", {})[name] = tensor
    return list(groups.values())


def per_layer_without_pause(engine, state_dict):
    """One RPC per decoder layer and none around them (open-instruct PR #1535's per-parameter RPCs):
    decode steps run between the calls, on partly updated weights."""
    for part in by_layer(state_dict):
        engine.collective_rpc(_reload_some, args=(list(part.items()),))


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


_SLOW_ONCE: list[float] = []  # the worker process runs each hook's update once per run of it


def slow_first_time(engine, state_dict):
    """keep's path (pause keeping the KV, push, resume) whose trainer-side work before its first
    call outlasts every request the first time it runs (5 s; the tiny model's 48 tokens take well
    under one): the phase sees it land late and runs it again, earlier, from the old weights."""
    if not _SLOW_ONCE:
        _SLOW_ONCE.append(time.monotonic())
        time.sleep(5)
    engine.pause("keep")
    engine.push(state_dict)
    engine.resume()


def never_resume(engine, state_dict):
    """Pushes under a pause and forgets to resume: the requests never finish."""
    engine.pause("keep")
    engine.push(state_dict)


# -- tensor parallel: the ranks are other processes, reached by method name (or, with
# VLLM_ALLOW_INSECURE_SERIALIZATION=1 in the engine's environment, by a pickled function). The
# weights travel as a safetensors folder, written by the gate's own staging (its multi-process push).


def _staged(state_dict):
    from gate.worker.weight_push import SHARED_MEMORY, staged_weights

    return staged_weights(state_dict, (SHARED_MEMORY,))


def per_layer_folders_without_pause(engine, state_dict):
    """Torn at TP=2: one folder reload per decoder layer, by name on every rank, no pause."""
    for part in by_layer(state_dict):
        with _staged(part) as folder:
            engine.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})


def rank0_only(engine, state_dict):
    """Partial at TP=2: paused, one push, but only rank 0 loads it; rank 1 keeps the old shard."""
    with _staged(state_dict) as folder:
        engine.pause("keep")
        engine.collective_rpc(_reload_on_rank_0, args=(str(folder),))
        engine.resume()


def _reload_on_rank_0(worker, folder):
    if worker.rank == 0:
        worker.reload_weights(weights_path=folder)


# -- by method name and folder: the same hook offline (any TP) and in server mode ------------------


def half_the_layers_paused(engine, state_dict):
    """Partial: paused, one reload, but of the first half of the decoder layers only (the rest of the
    model keeps the old weights); no step runs inside the update."""
    parts = by_layer(state_dict)
    layers = [p for p in parts if any(".layers." in name for name in p)]
    half = {name: t for part in layers[: max(len(layers) // 2, 1)] for name, t in part.items()}
    with _staged(half) as folder:
        engine.pause("keep")
        engine.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
        engine.resume()


def label_before_push(engine, state_dict):
    """Correct weights, wrong bookkeeping: the new weight version is announced while requests still
    run on the old weights (for 20 ms: a few steps of the tiny model), then the pause and the push
    follow, so the engine's version spans start before the tokens the new weights computed."""
    engine.set_weight_version("gate-new")
    time.sleep(0.02)
    engine.pause("keep")
    engine.push(state_dict)
    engine.resume()
