"""TRL's colocated weight push (GRPOTrainer with vllm_mode="colocate"), as a gate hook.

TRL runs vLLM in the trainer's own process (``distributed_executor_backend="external_launcher"``, so
no engine-core process) and, after each optimizer step, loads the gathered parameters one at a time
into the driver worker's model, then resets the prefix cache (trl/generation/vllm_generation.py).
The same calls here; gate.yaml sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` so that the model lives in
this process, as it does under TRL. Written by ``gate init --stack trl``.
"""

from __future__ import annotations


def update(llm, state_dict) -> None:
    model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    for name, tensor in state_dict.items():
        # FSDP's activation-checkpointing wrapper leaves this in gathered names; TRL strips it too
        model.load_weights([(name.replace("_checkpoint_wrapped_module.", ""), tensor)])
    llm.reset_prefix_cache()
