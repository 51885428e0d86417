"""gate init's recipes for the stacks that drive vLLM's server (gate/init/recipes/server_folder_reload.py)
with the faults their own code guards against, each through the recipe's own calls.

- prime-rl, a checkpoint read half-written: the reload starts before the trainer has finished the
  step's folder (prime-rl's orchestrator waits for it to be marked stable). The ranks find the first
  half of the decoder layers; vLLM's layerwise reload keeps the old weights of the others, silently.
- AReaL, aborted requests dropped: the pause aborts the running requests, and a client without
  AReaL's resubmission loop loses them.

and for the three that run vLLM in the trainer's process (gate/init/recipes/trl_colocate.py,
verl_bucketed.py and nemo_rl_ipc_zmq.py):

- TRL colocate without its prefix-cache reset: the prompts' cached KV, computed with the old weights,
  is served after the load (vLLM's default turns prefix caching on, and TRL passes no setting).
- verl, buckets a quarter MiB (so that layers straddle buckets; the largest tensor of gate's tiny
  model fills one; on a model with larger tensors, the largest), correct and with each bucket's
  tensors loaded as views of the reused buffer: vLLM's layerwise reload holds a layer's loaded
  tensors until the layer is complete, so the next bucket overwrites what it holds.
- NeMo-RL, its refit info gone stale (prepared for bf16 while the trainer streams fp32, or for
  fp32 while it streams bf16: no batch adds up, each is refused and acked) behind a caller that
  ignores the workers' False, which NeMo-RL's GRPO loop raises on. Every batch, not one: a layer
  loaded in part is materialized by vLLM's layerwise reload with its missing tensors uninitialized,
  whose outputs vary from run to run (finite or NaN); a layer loaded not at all gets its old kernels
  back.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

_RECIPES = Path(__file__).resolve().parents[2] / "gate" / "init" / "recipes"


def _recipe(name: str):
    spec = importlib.util.spec_from_file_location(name, _RECIPES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


recipe = _recipe("server_folder_reload")
trl_colocate = _recipe("trl_colocate")
verl_bucketed = _recipe("verl_bucketed")
nemo_rl = _recipe("nemo_rl_ipc_zmq")
QUARTER_MIB = 1 << 18

_LAYER = re.compile(r"\.layers\.(\d+)\.")


def written_so_far(state_dict) -> dict:
    """What a reader finds halfway through the trainer's write: the first half of the decoder layers."""
    layers = sorted({int(m.group(1)) for n in state_dict if (m := _LAYER.search(n))})
    done = set(layers[: max(len(layers) // 2, 1)])
    return {
        n: t for n, t in state_dict.items() if (m := _LAYER.search(n)) and int(m.group(1)) in done
    }


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


def trl_without_cache_reset(llm, state_dict):
    trl_colocate.load_one_at_a_time(llm, state_dict)


def _holding_the_largest(size: int, state_dict, parts: int = 1) -> int:
    """``size``, or enough for each of ``parts`` equal parts of it to hold the largest tensor."""
    return max(size, parts * max(t.nbytes for t in state_dict.values()))


def verl_quarter_mib_buckets(llm, state_dict):
    verl_bucketed.push(llm, state_dict, QUARTER_MIB)
    llm.reset_prefix_cache()


def verl_views_of_the_reused_bucket(llm, state_dict):
    # a quarter MiB, or the largest tensor where it is larger (SmolLM2's embedding: 113 MB in fp32,
    # 57 MB in bf16): verl raises on a tensor its bucket cannot hold, and layers still straddle buckets
    verl_bucketed.push(
        llm, state_dict, _holding_the_largest(QUARTER_MIB, state_dict), copy_out=False
    )
    llm.reset_prefix_cache()


def nemo_rl_stale_refit_info_unchecked(llm, state_dict):
    import torch

    # prepared for another dtype than the trainer streams: bf16 for an fp32 trainer, fp32 for a bf16 one
    info = {name: (shape, torch.float32 if dtype == torch.bfloat16 else torch.bfloat16)
            for name, (shape, dtype) in nemo_rl.refit_info(state_dict).items()}  # fmt: skip
    nemo_rl.prepare_refit_info(llm, info)
    # half a MiB, or where the largest tensor is larger, enough for each of NeMo-RL's two staging
    # buffers (ping-pong halves of the refit buffer) to hold it, as verl's buckets above
    nemo_rl.push(
        llm, state_dict, _holding_the_largest(2 * QUARTER_MIB, state_dict, parts=2)
    )  # its [False] goes unread
    llm.reset_prefix_cache()
