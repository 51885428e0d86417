#!/usr/bin/env python3
"""The memory plans of docs/scale.md's GPU examples, computed by gate's own planner.

Llama-3.1-8B on one 80 GB GPU and Llama-3.1-70B on eight (TP=8, reference sharded): their shapes
are the published config.json values, the devices are H100 80 GB with nothing else on them. These
cannot run on the project's CPU machines; the plan is what `gate run` would print before starting.

    python scripts/plan_gpu_examples.py
"""

from __future__ import annotations

import dataclasses

from gate.memory_plan import (
    Device,
    PlanSettings,
    RunMemoryPlan,
    _shape_from_config,
    find_knobs,
    fitting_combination,
    plan_engine,
)

H100 = 80 * 10**9  # bytes, as nvidia-smi reports 81,559 MiB; the CUDA driver keeps ~0.5 GiB
LLAMA_31_8B = {"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
               "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "tie_word_embeddings": False, "torch_dtype": "bfloat16", "model_type": "llama"}  # fmt: skip
LLAMA_31_70B = {**LLAMA_31_8B, "hidden_size": 8192, "intermediate_size": 28672,
                "num_hidden_layers": 80, "num_attention_heads": 64}  # fmt: skip

# examples/gpu-qwen.yaml's sampling (8 samples of 256 tokens, prompts up to ~200 tokens) with the
# RL passes on: the realistic trainer setting (bf16 trunk, fp32 head) and a memory-bounded GRPO.
COMMON = dict(engine_dtype="bfloat16", sequence_tokens=512, replay_sequences=160 * 8,
              reference_dtype="bfloat16", grpo_trainable={"last_layers": 2}, grpo_optimizer="adamw")  # fmt: skip
EXAMPLES = {
    "Llama-3.1-8B, 1 x H100 80 GB": (
        LLAMA_31_8B, 1, PlanSettings(**COMMON, gpu_memory_utilization=0.35)),
    # The RL passes' trainer is one model on one device (131 GiB in bf16 at 70B): they run on a
    # same-family proxy (docs/scale.md), and the 70B run keeps the replay, reference and parity checks.
    "Llama-3.1-70B, 8 x H100 80 GB, TP=8, reference sharded, RL passes on a proxy": (
        LLAMA_31_70B, 8, PlanSettings(**COMMON, tensor_parallel_size=8, gpu_memory_utilization=0.5,
                                      reference_device_map="auto", weight_sync=False, grpo=False,
                                      reference_max_memory={str(i): "40GiB" for i in range(8)})),
}  # fmt: skip


def main() -> None:
    for title, (config, gpus, settings) in EXAMPLES.items():
        shape = _shape_from_config(config)
        devices = [Device(f"cuda:{i}", H100, H100 - 2**29) for i in range(gpus)]
        plan = plan_engine(shape, settings, devices, ("old", "new"))
        run = RunMemoryPlan(title, shape, (plan,), knobs=tuple(find_knobs(shape, plan)),
                            together=fitting_combination(shape, plan))  # fmt: skip
        print(f"## {title}\n")
        print(f"settings: {dataclasses.asdict(settings)}\n")
        print(run.table())
        print(
            f"\nfits: {run.fits()}; knobs: {[k.setting for k in run.knobs]}; "
            f"together: {list(run.together)}\n"
        )


if __name__ == "__main__":
    main()
