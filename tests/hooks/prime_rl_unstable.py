"""gate init's prime-rl recipe (gate/init/recipes/prime_rl_filesystem.py) with the race its
orchestrator guards against: the reload starts before the trainer has finished writing the step's
checkpoint (prime-rl waits for the folder to be marked stable). The ranks read the first half of the
decoder layers; vLLM's layerwise reload keeps the old weights of the layers the folder lacks, and
says nothing. The recipe's own calls, given what the reader found.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

_RECIPE = Path(__file__).resolve().parents[2] / "gate" / "init" / "recipes" / "prime_rl_filesystem.py"
_spec = importlib.util.spec_from_file_location("prime_rl_filesystem", _RECIPE)
assert _spec is not None and _spec.loader is not None
recipe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recipe)


def written_so_far(state_dict) -> dict:
    """What a reader finds halfway through the trainer's write: the first half of the decoder layers."""
    layers = sorted({int(m.group(1)) for n in state_dict if (m := re.search(r"\.layers\.(\d+)\.", n))})
    done = set(layers[: max(len(layers) // 2, 1)])
    return {n: t for n, t in state_dict.items() if (m := re.search(r"\.layers\.(\d+)\.", n)) and int(m.group(1)) in done}


def update(base_url, state_dict):
    recipe.update(base_url, written_so_far(state_dict))


def update_inflight(engine, state_dict):
    recipe.update_inflight(engine, written_so_far(state_dict))
