"""gate init's recipes for the stacks that drive vLLM's server (gate/init/recipes/server_folder_reload.py)
with the faults their own code guards against, each through the recipe's own calls.

- prime-rl, a checkpoint read half-written: the reload starts before the trainer has finished the
  step's folder (prime-rl's orchestrator waits for it to be marked stable). The ranks find the first
  half of the decoder layers; vLLM's layerwise reload keeps the old weights of the others, silently.
- AReaL, aborted requests dropped: the pause aborts the running requests, and a client without
  AReaL's resubmission loop loses them.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

_RECIPE = Path(__file__).resolve().parents[2] / "gate" / "init" / "recipes" / "server_folder_reload.py"
_spec = importlib.util.spec_from_file_location("server_folder_reload", _RECIPE)
assert _spec is not None and _spec.loader is not None
recipe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recipe)

_LAYER = re.compile(r"\.layers\.(\d+)\.")


def written_so_far(state_dict) -> dict:
    """What a reader finds halfway through the trainer's write: the first half of the decoder layers."""
    layers = sorted({int(m.group(1)) for n in state_dict if (m := _LAYER.search(n))})
    done = set(layers[: max(len(layers) // 2, 1)])
    return {n: t for n, t in state_dict.items() if (m := _LAYER.search(n)) and int(m.group(1)) in done}


def prime_rl_half_written(base_url, state_dict):
    recipe.prime_rl_update(base_url, written_so_far(state_dict))


def prime_rl_half_written_inflight(engine, state_dict):
    recipe.prime_rl_update_inflight(engine, written_so_far(state_dict))


class _DropsAborted:
    """The in-flight handle, behind a client that drops what the pause aborted."""

    def __init__(self, engine) -> None:
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def resubmit_aborted(self) -> None:
        pass


def areal_without_resubmission_inflight(engine, state_dict):
    recipe.areal_update_inflight(_DropsAborted(engine), state_dict)
