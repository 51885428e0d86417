"""The weight-sync probe in LoRA mode: the update is a new adapter version, not new weights.

The same probe prompts as the full-weight probe (gate/worker/weight_sync.py: control prompts that
cannot hit the prefix cache, prefix prompts behind whole cached blocks), in this order:

1. the base model, no adapter: how far the engine is from the trainer on the base weights (the
   engine's own precision; the limits of the weight-sync check are measured against it);
2. adapter version 1 (pushed when the engine started: the replay ran through it), probed: the
   engine applies the adapter as the trainer does (PEFT's
   ``W + scaling * B @ A``), or the tokens fit another way of applying it, which is scored too
   (the other scaling rule, each target module left out: :func:`gate.worker.lora.alternatives`);
3. version 2 pushed by the configured path, probed: scored under version 2 (new) and version 1 (old),
   so an id the engine already holds (the cached version 1 served again) reads as stale weights,
   and prefix blocks cached under version 1 as a stale cache;
4. version 2 pushed once more (a third version with the same tensors), probed: a second load that
   differs from the first.

The arrays are the full-weight probe's (``ws_*``, ``ws_before_*``, ``ws_again_*``) plus the base
pass (``ws_base_*``) and the alternatives' scores, so the weight-sync check reads both modes.
The engine's weight digests are not read: an adapter push leaves the base weights as they are.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from gate.contract import keys
from gate.contract.request import WeightSyncRequest
from gate.worker import lora as adapters
from gate.worker import replay
from gate.worker.policy_weights import host_state_dict
from gate.worker.weight_sync import (
    _continuations,
    _load_trainer,
    _score,
    engine_block_size,
    engine_dtype,
    probe_prompts,
)


def probe(
    llm,
    policy: adapters.PolicyAdapter,
    model_path: str,
    prompt_ids: list[list[int]],
    reference_ids: list[list[int] | None],
    request: WeightSyncRequest,
    progress,
    hf_kwargs: dict | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(evidence arrays, engine.json ``weight_sync``) of the LoRA-mode probe on a ``vllm.LLM``
    whose policy adapter (version 1) was pushed when the engine started."""
    lora = policy.lora
    block_size = engine_block_size(llm)
    bos_token_id = getattr(llm.get_tokenizer(), "bos_token_id", None)
    control, prefixed = probe_prompts(
        prompt_ids,
        reference_ids,
        block_size,
        replay.max_model_len(llm),
        request.probes,
        request.max_tokens,
        bos_token_id,
    )
    probes = control + prefixed
    progress(
        f"weight-sync probe (LoRA rank {lora.rank}, {', '.join(lora.target_modules)}): "
        f"{len(control)} control + {len(prefixed)} shared-prefix prompts (KV block {block_size}), "
        f"versions pushed via {policy.path_name}"
    )

    def greedy(lora_request):
        return replay.greedy(llm, probes, request.max_tokens, 1, lora_request=lora_request)

    base = greedy(None)
    before = greedy(policy.current)  # version 1, pushed when the engine started
    first, second = policy.versions
    after = greedy(policy.push(llm, second, model_path))
    again = greedy(policy.push(llm, second, model_path))  # version 2's tensors once more

    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    trainer = _load_trainer(AutoModelForCausalLM, model_path, device, hf_kwargs, engine_dtype(llm))
    base_sd = host_state_dict(trainer.state_dict(), False)
    v1_sd = adapters.merged(base_sd, first, lora.scaling)
    v2_sd = adapters.merged(base_sd, second, lora.scaling)
    passes = {"base": base, "before": before, "after": after, "again": again}
    seqs = {name: _continuations(probes, comp) for name, comp in passes.items()}

    def score(state_dict, name: str) -> np.ndarray:
        return _score(trainer, state_dict, *seqs[name], device)

    others = adapters.alternatives(lora, adapters.module_names(first))
    alt = [score(adapters.merged(base_sd, first, a.scaling, a.skip), "before") for a in others]
    is_prefix = np.arange(len(probes)) >= len(control)

    def prefix_mask(comp) -> np.ndarray:
        return np.repeat(is_prefix, np.diff(comp.offsets))

    arrays = {
        keys.WS_BASE_IS_PREFIX: prefix_mask(base),
        keys.WS_BASE_ENGINE_LOGPROB: base.logprob,
        keys.WS_BASE_TRAINER_LOGPROB: score(base_sd, "base"),
        keys.WS_BEFORE_IS_PREFIX: prefix_mask(before),
        keys.WS_BEFORE_ENGINE_LOGPROB: before.logprob,
        keys.WS_BEFORE_TRAINER_LOGPROB: score(v1_sd, "before"),
        keys.WS_BEFORE_TRAINER_ALT_LOGPROB: np.stack(alt, axis=1).astype(np.float32),
        keys.WS_IS_PREFIX: prefix_mask(after),
        keys.WS_OFFSETS: after.offsets,
        keys.WS_TOKEN_IDS: after.token_ids,
        keys.WS_ENGINE_LOGPROB: after.logprob,
        keys.WS_TRAINER_NEW_LOGPROB: score(v2_sd, "after"),
        keys.WS_TRAINER_OLD_LOGPROB: score(v1_sd, "after"),
        keys.WS_AGAIN_IS_PREFIX: prefix_mask(again),
        keys.WS_AGAIN_TOKEN_IDS: again.token_ids,
        keys.WS_AGAIN_ENGINE_LOGPROB: again.logprob,
        keys.WS_AGAIN_TRAINER_NEW_LOGPROB: score(v2_sd, "again"),
    }
    meta = {
        "adapter": policy.path_name,
        "push_s": policy.push_s[-2],
        "push_again_s": policy.push_s[-1],
        "perturbation": lora.size,
        "block_size": block_size,
        "bos_token_id": bos_token_id,
        "control_tokens": [len(q) for q in control],
        "prefix_tokens": len(prefixed[0]) - len(control[0]),
        "probes": len(control),
        "tensors_pushed": len(second),
        "digests": {},
        "sleep": _sleep_not_run(request),
        # The rest of the adapter's record is engine.json's top-level ``lora``.
        "lora": {"alternatives": [a.name for a in others]},
    }
    return arrays, meta


def _sleep_not_run(request: WeightSyncRequest) -> dict[str, Any] | None:
    if request.sleep_level <= 0:
        return None
    return {
        "level": request.sleep_level,
        "not_run": "LoRA mode: the sleep/wake cycle pushes full weights",
    }
