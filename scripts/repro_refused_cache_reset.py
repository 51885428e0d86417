"""A prefix-cache reset asked for while requests are paused with their KV kept is refused, and the
blocks they computed on the old weights serve the next request that shares their prefix.

OpenRLHF's async training (``--train.async_enable`` with partial rollout) pauses generation with
the running requests kept, pushes through ``broadcast_to_vllm`` (which asks for
``reset_prefix_cache()`` first and never reads its result) and resumes. This script does the same
on the tiny model with gate's OpenRLHF recipe (gate/init/recipes/openrlhf_broadcast.py), in a vLLM
environment (an engine venv from ``gate prepare``):

    VLLM_CPU_KVCACHE_SPACE=1 ENGINE_PY scripts/repro_refused_cache_reset.py

and prints the reset's result during the pause, and how many prompt tokens a request sent after the
resume, with the same 140-token prompt, found cached. Measured on vllm-cpu 0.31.0 and 0.32.0
(2026-12-04): ``False`` ("Failed to reset prefix cache because some blocks (5) are not freed yet")
and 128, one block of KV from the old weights, on both.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "gate" / "assets" / "models" / "tiny-arith"
RECIPE = REPO / "gate" / "init" / "recipes" / "openrlhf_broadcast.py"
PROMPT = [3 + (i % 100) for i in range(140)]  # more than one 128-token block of the CPU's KV cache


def main() -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process, as gate's
    from safetensors.torch import load_file
    from vllm import LLM, SamplingParams

    spec = importlib.util.spec_from_file_location("openrlhf_broadcast", RECIPE)
    assert spec is not None and spec.loader is not None
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)

    llm = LLM(str(MODEL), dtype="float32", enable_prefix_caching=True, max_model_len=256,
              enforce_eager=True, seed=0, enable_chunked_prefill=False)  # fmt: skip
    engine, core = llm.llm_engine, llm.llm_engine.engine_core.engine_core
    weights = load_file(str(MODEL / "model.safetensors"))
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    resets: list[bool] = []
    asked = llm.reset_prefix_cache
    llm.reset_prefix_cache = lambda *a, **k: resets.append(asked(*a, **k)) or resets[-1]

    for i in range(4):
        engine.add_request(f"running-{i}", {"prompt_token_ids": PROMPT}, params)
    for _ in range(5):
        engine.step()
    core.pause_scheduler(mode="keep", clear_cache=False)  # OpenRLHF's pause_generation(mode="keep")
    recipe.update(llm, weights)  # its broadcast_to_vllm: the reset first, then every parameter
    core.resume_scheduler()
    while engine.has_unfinished_requests():
        engine.step()
    engine.add_request("after", {"prompt_token_ids": PROMPT}, params)
    cached = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                cached = out.num_cached_tokens
    print(f"reset_prefix_cache() during the pause: {resets}")
    print(f"prompt tokens the request after the resume found cached: {cached} of {len(PROMPT)}")


if __name__ == "__main__":
    main()
