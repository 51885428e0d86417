"""What the engine worker needs from each vLLM release, and which weight-push path it takes.

This is the one place that states the worker's vLLM requirements. Three readers share it:

* ``gate.vllm_source`` checks each requirement statically against a release's source (the wheel's
  ``.py`` files, never imported) and yields a ``{feature key: bool}`` map per release;
* ``tests/compat`` and ``scripts/make_compat_table.py`` turn those maps into the compatibility
  test and ``docs/compatibility.md``;
* the worker (``gate/worker/weight_push.py``) probes the same features on a live engine and
  picks its push by the same rule as :func:`worker_path` (an equivalence test holds them together;
  the worker may not import this module).

Standard library only: the worker imports it inside engine environments, the orchestrator without
vLLM or torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# The last patch of every minor release from 0.10 on (``pip index versions vllm``). The worker
# targets the V1 engine, the default from 0.10. A new minor release belongs here, followed by
# ``python scripts/make_compat_table.py`` to refresh docs/compatibility.md.
RELEASES: tuple[str, ...] = (
    "0.10.2", "0.11.2", "0.12.0", "0.13.0", "0.14.1", "0.15.1", "0.16.0", "0.17.1",
    "0.18.1", "0.19.1", "0.20.2", "0.21.0", "0.22.1", "0.23.0", "0.24.0", "0.25.1",
    "0.26.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0",
    "0.34.0",
)  # fmt: skip


@dataclass(frozen=True)
class Feature:
    key: str
    label: str  # short column heading for the table
    needs: str  # what the worker does with it, and what happens without it


# Feature keys. The worker and the static checker use these names; keep them stable.
COLLECTIVE_RPC = "llm.collective_rpc"
RESET_PREFIX_CACHE = "llm.reset_prefix_cache"
DEFAULT_SAMPLING_PARAMS = "llm.get_default_sampling_params"
DIFF_SAMPLING_PARAM = "model_config.get_diff_sampling_param"
LOGPROBS_MODE = "engine_args.logprobs_mode"
FLAT_LOGPROBS = "sampling_params.flat_logprobs"
RELOAD_WEIGHTS = "worker.reload_weights"
RELOAD_WEIGHTS_ITERATOR = "worker.reload_weights.weights_iterator"
RELOAD_WEIGHTS_PATH = "worker.reload_weights.weights_path"
RUNNER_LOAD_WEIGHTS = "worker.model_runner.model.load_weights"
WT_INIT = "worker.init_weight_transfer_engine"
WT_START = "worker.start_weight_update"
WT_UPDATE = "worker.update_weights"
WT_FINISH = "worker.finish_weight_update"

FEATURES: tuple[Feature, ...] = (
    Feature(COLLECTIVE_RPC, "collective_rpc(fn)",
            "LLM.collective_rpc accepting a callable: every weight push runs on each worker through it (a "
            "function in-process, a method name across processes). Without it the worker has no in-place "
            "push (unsupported release)."),
    Feature(RESET_PREFIX_CACHE, "reset_prefix_cache",
            "LLM.reset_prefix_cache(): after a push, drops KV blocks computed with the old weights. Without "
            "it prefix-cached prompts keep sampling from the old policy (unsupported release)."),
    Feature(RELOAD_WEIGHTS, "reload_weights",
            "Worker.reload_weights exists (the worker's first probe)."),
    Feature(RELOAD_WEIGHTS_ITERATOR, "reload_weights(weights_iterator)",
            "Worker.reload_weights accepts weights_iterator=: loads the pushed tensors in place, with the "
            "release's layerwise reload handling. Without it (reload_weights(self) re-reads the checkpoint "
            "from disk) the push must fall back to model_runner.model.load_weights."),
    Feature(RELOAD_WEIGHTS_PATH, "reload_weights(weights_path)",
            "Worker.reload_weights accepts weights_path=: each rank reloads in place from a safetensors folder. "
            "The only push when the workers are other processes (tensor/pipeline parallel, mp or ray "
            "executor), since no function or tensor can be sent to them; without it such engines need a hook."),
    Feature(RUNNER_LOAD_WEIGHTS, "model_runner.model.load_weights",
            "Worker.model_runner.model reaches the model's load_weights (wrappers such as CUDAGraphWrapper "
            "forward attributes): the fallback push for releases whose reload_weights takes no weights."),
    Feature(LOGPROBS_MODE, "logprobs_mode",
            "EngineArgs.logprobs_mode: the engine reports processed logprobs, as RL needs. Without it the "
            "argument is dropped (optional) and the logprob checks see raw logprobs."),
    Feature(FLAT_LOGPROBS, "flat_logprobs",
            "SamplingParams.flat_logprobs: logprobs as flat arrays. Without it the worker reads the "
            "dict-per-token layout (slower, same values)."),
    Feature(DEFAULT_SAMPLING_PARAMS, "get_default_sampling_params",
            "LLM.get_default_sampling_params(): recorded as the engine's defaults; without it recorded as null."),
    Feature(DIFF_SAMPLING_PARAM, "get_diff_sampling_param",
            "ModelConfig.get_diff_sampling_param(): the generation_config overrides, recorded; else null."),
    Feature(WT_INIT, "init_weight_transfer_engine",
            "Native weight-transfer API (Worker): recorded for hooks; the built-in push does not use it."),
    Feature(WT_START, "start_weight_update", "Native weight-transfer API (Worker), as above."),
    Feature(WT_UPDATE, "update_weights", "Native weight-transfer API (Worker), as above."),
    Feature(WT_FINISH, "finish_weight_update", "Native weight-transfer API (Worker), as above."),
)  # fmt: skip

FEATURE_KEYS: tuple[str, ...] = tuple(f.key for f in FEATURES)

# Effective-setting features are named "setting.<name>" after the worker's own table
# (gate/worker/engine.py ``_SETTINGS``): present when at least one of its attribute paths exists.
SETTING_PREFIX = "setting."

SUPPORTED = "supported"
UNSUPPORTED = "unsupported"

# The weight pushes, worded as the table shows them; weight_sync's adapter names may reuse them.
PUSH_RELOAD_WEIGHTS = "reload_weights(weights_iterator) via collective_rpc"
PUSH_RUNNER_LOAD_WEIGHTS = "model_runner.model.load_weights via collective_rpc"
PUSH_RELOAD_FROM_FOLDER = (
    "reload_weights(weights_path) from a safetensors folder via collective_rpc"
)
PUSH_RESET = "reset_prefix_cache"

# What worker_path reads; a caller must state each one (a missing key is a bug, not a "no").
PUSH_FEATURES: tuple[str, ...] = (
    COLLECTIVE_RPC,
    RELOAD_WEIGHTS_ITERATOR,
    RELOAD_WEIGHTS_PATH,
    RUNNER_LOAD_WEIGHTS,
    RESET_PREFIX_CACHE,
)


def worker_path(
    features: Mapping[str, bool], multiprocess: bool = False
) -> tuple[str, tuple[str, ...] | str]:
    """``(SUPPORTED, steps)`` of the weight push the worker takes, or ``(UNSUPPORTED, reason)``.

    The rule the worker follows (no user hook configured; ``gate.worker.weight_push.pick_adapter``
    applies it to a live engine, and tests/unit/test_compat.py holds the two to the same answers):

    1. every push runs on the workers through ``LLM.collective_rpc``;
    2. workers in this process (``multiprocess`` False) get a function:
       ``reload_weights(weights_iterator=...)`` where the worker accepts it (vLLM 0.16+), else
       ``model_runner.model.load_weights(...)``: before 0.16 ``reload_weights(self)`` takes no
       weights and would re-read the checkpoint, or raise TypeError when given some;
    3. workers in other processes (tensor/pipeline parallel, an mp or ray executor) get a method
       name and a path, nothing else: ``reload_weights(weights_path=...)`` from a safetensors
       folder the driver wrote (vLLM 0.16+); older releases have no such path;
    4. then ``LLM.reset_prefix_cache()``, so no cached block computed with the old weights is reused.

    The reason of an unsupported release starts with "unsupported release:" and names what is missing.
    """
    missing = [k for k in PUSH_FEATURES if k not in features]
    if missing:
        raise KeyError(
            f"worker_path needs every one of {list(PUSH_FEATURES)}; not given: {missing}"
        )
    if not features[COLLECTIVE_RPC]:
        return UNSUPPORTED, (
            "unsupported release: LLM.collective_rpc with a callable is missing, and every weight push "
            "runs on the workers through it; configure weight_update.hook"
        )
    if multiprocess:
        if not features[RELOAD_WEIGHTS_PATH]:
            return UNSUPPORTED, (
                "unsupported release: with workers in other processes no function or tensor can be "
                "sent to them, and Worker.reload_weights takes no weights_path; configure weight_update.hook"
            )
        push = PUSH_RELOAD_FROM_FOLDER
    elif features[RELOAD_WEIGHTS_ITERATOR]:
        push = PUSH_RELOAD_WEIGHTS
    elif features[RUNNER_LOAD_WEIGHTS]:
        push = PUSH_RUNNER_LOAD_WEIGHTS
    else:
        return UNSUPPORTED, (
            "unsupported release: Worker.reload_weights takes no weights_iterator and "
            "Worker.model_runner.model.load_weights is not reachable; configure weight_update.hook"
        )
    if not features[RESET_PREFIX_CACHE]:
        return UNSUPPORTED, (
            "unsupported release: LLM.reset_prefix_cache is missing, so prefix-cached blocks computed "
            "with the old weights would survive a push"
        )
    return SUPPORTED, (push, PUSH_RESET)
