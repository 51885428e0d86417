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
