"""Weight-sync probe: push new weights into the RUNNING engine and check it samples from them.

The trainer pushes weights into the engine every RL step. A wrong path leaves stale weights, loads
only part of the model, or keeps KV / prefix-cache entries computed with the old weights: the
engine then silently samples from an older policy. The probe:

1. generates greedily, before the update, for *control* prompts (too short to fill a KV block,
   so no cache hit is possible) and *prefix* prompts (a long shared prefix that fills whole blocks,
   so prefix caching, when on, caches them with the old weights);
2. builds new weights (every floating-point tensor perturbed by ``perturbation x its std``, fixed
   seed) and pushes them with the user's hook or the adapter the engine offers;
3. generates the same prompts again and scores the generated tokens with the trainer-side model
   under the new and under the old weights.

The orchestrator's ``weight-sync`` check reads the result. The push goes through, in order:
the configured hook ``fn(llm, state_dict)``; ``collective_rpc`` to the worker's ``reload_weights``
(vLLM V1, 0.10+) followed by ``reset_prefix_cache``; or the V0 driver worker's ``load_weights``.
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from gate.request import WeightSyncRequest

UpdateFn = Callable[[Any, dict[str, torch.Tensor]], None]


@dataclass
class Adapter:
    name: str
    push: UpdateFn


def load_hook(spec: str) -> UpdateFn:
    """``package.module:function`` or ``/path/to/file.py:function``."""
    module_part, _, func = spec.rpartition(":")
    if not module_part or not func:
        raise ValueError(f"weight_update.hook {spec!r}: expected 'package.module:function' or 'file.py:function'")
    if module_part.endswith(".py"):
        path = Path(module_part)
        loader_spec = importlib.util.spec_from_file_location(f"gate_hook_{path.stem}", path)
        if loader_spec is None or loader_spec.loader is None:
            raise ValueError(f"weight_update.hook: cannot load {path}")
        module = importlib.util.module_from_spec(loader_spec)
        loader_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_part)
    fn = getattr(module, func, None)
    if not callable(fn):
        raise ValueError(f"weight_update.hook {spec!r}: {func} is not a function of {module.__name__}")
    return fn


def _reload_on_worker(worker, state_dict) -> None:
    worker.reload_weights(weights_iterator=iter(state_dict.items()))


def reload_weights_push(llm, state_dict: dict[str, torch.Tensor]) -> None:
    """vLLM V1: load in place on every worker, then drop cache entries computed with old weights."""
    llm.collective_rpc(_reload_on_worker, args=(state_dict,))
    reset = getattr(llm, "reset_prefix_cache", None)
    if reset is not None:
        reset()


def v0_load_weights_push(llm, state_dict: dict[str, torch.Tensor]) -> None:
    model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    model.load_weights(state_dict.items())
    reset = getattr(llm, "reset_prefix_cache", None)
    if reset is not None:
        reset()


def choose_adapter(llm, hook: str | None) -> Adapter:
    """The user's hook when configured, else the first update path this engine offers."""
    if hook:
        return Adapter(f"hook {hook}", load_hook(hook))
    if hasattr(llm, "collective_rpc"):
        has_reload = llm.collective_rpc(_has_reload_weights)
        if has_reload and all(has_reload):
            return Adapter("collective_rpc reload_weights + reset_prefix_cache", reload_weights_push)
    executor = getattr(llm.llm_engine, "model_executor", None)
    runner = getattr(getattr(executor, "driver_worker", None), "model_runner", None)
    if hasattr(getattr(runner, "model", None), "load_weights"):
        return Adapter("V0 driver_worker.model_runner.model.load_weights", v0_load_weights_push)
    raise RuntimeError("this engine offers no in-place weight update path gate knows; configure weight_update.hook")


def _has_reload_weights(worker) -> bool:
    return callable(getattr(worker, "reload_weights", None))


def perturbed(state_dict: dict[str, torch.Tensor], scale: float, seed: int) -> dict[str, torch.Tensor]:
    """A new policy: every float tensor moved by ``scale`` times its own std, reproducibly."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, tensor in state_dict.items():
        if tensor.is_floating_point() and tensor.numel() > 1:
            noise = torch.randn(tensor.shape, generator=gen, dtype=torch.float32).to(tensor.device, tensor.dtype)
            out[name] = tensor + scale * tensor.float().std().to(tensor.dtype) * noise
        else:
            out[name] = tensor.clone()
    return out


def probe_prompts(prompt_ids: list[list[int]], reference_ids: list[list[int] | None], block_size: int,
                  max_model_len: int, n: int, max_tokens: int) -> tuple[list[list[int]], list[list[int]]]:  # fmt: skip
    """(control, prefix) prompts: the same questions alone and behind a shared multi-block prefix."""
    questions = [p for p in prompt_ids if len(p) + max_tokens < block_size][:n] or [p[:8] for p in prompt_ids[:n]]
    # The prefix: whole prompt+reference examples (the model's own format), without BOS repeats.
    pieces = [(p + (r or []))[1:] for p, r in zip(prompt_ids, reference_ids)]
    budget = max_model_len - max(len(q) for q in questions) - max_tokens - 1
    target = min(budget, 2 * block_size)
    prefix: list[int] = []
    for piece in pieces * 100:
        if len(prefix) >= target:
            break
        prefix += piece
    prefix = prefix[:budget]
    if len(prefix) < block_size:
        raise RuntimeError(
            f"max_model_len {max_model_len} leaves room for a {len(prefix)}-token prefix, less than one KV block "
            f"({block_size}); the prefix-cache probe needs max_model_len >= {block_size + max_tokens + 32}"
        )
    bos = questions[0][:1]
    return questions, [bos + prefix + q[1:] for q in questions]


def run_probe(llm, model_path: str, prompt_ids, reference_ids, request: WeightSyncRequest, progress) -> tuple[dict, dict]:
    """Returns (arrays, meta) for weight_sync.npz / engine.json."""
    from transformers import AutoModelForCausalLM

    from gate.worker import replay

    config = llm.llm_engine.vllm_config if hasattr(llm.llm_engine, "vllm_config") else None
    block_size = int(getattr(getattr(config, "cache_config", None), "block_size", 16) or 16)
    max_model_len = int(getattr(getattr(config, "model_config", None), "max_model_len", 2048))
    control, prefixed = probe_prompts(prompt_ids, reference_ids, block_size, max_model_len, request.probes, request.max_tokens)
    probes = control + prefixed
    adapter = choose_adapter(llm, request.hook)
    progress(f"weight-sync probe: {len(control)} control + {len(prefixed)} shared-prefix prompts, push via {adapter.name}")

    before = replay.greedy(llm, probes, request.max_tokens, 1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    trainer = _load_trainer(AutoModelForCausalLM, model_path, device)
    old_sd = {k: v.detach().clone() for k, v in trainer.state_dict().items()}
    new_sd = perturbed(old_sd, request.perturbation, request.seed)

    start = time.perf_counter()
    adapter.push(llm, new_sd)
    push_s = time.perf_counter() - start
    after = replay.greedy(llm, probes, request.max_tokens, 1)

    seq_before, starts_before = _continuations(probes, before)
    seq_after, starts_after = _continuations(probes, after)
    pre_old = _score(trainer, old_sd, seq_before, starts_before, device)
    post_new = _score(trainer, new_sd, seq_after, starts_after, device)
    post_old = _score(trainer, old_sd, seq_after, starts_after, device)
    arrays = {
        "ws_is_prefix": np.repeat(np.arange(len(probes)) >= len(control), np.diff(after.offsets)),
        "ws_offsets": after.offsets,
        "ws_token_ids": after.token_ids,
        "ws_engine_logprob": after.logprob,
        "ws_trainer_new_logprob": post_new,
        "ws_trainer_old_logprob": post_old,
        "ws_before_is_prefix": np.repeat(np.arange(len(probes)) >= len(control), np.diff(before.offsets)),
        "ws_before_engine_logprob": before.logprob,
        "ws_before_trainer_logprob": pre_old,
    }
    meta = {
        "adapter": adapter.name,
        "push_s": push_s,
        "perturbation": request.perturbation,
        "block_size": block_size,
        "prefix_tokens": len(prefixed[0]) - len(control[0]),
        "probes": len(control),
        "tensors_pushed": len(new_sd),
    }
    return arrays, meta


def _load_trainer(auto_cls, model_path: str, device: str):
    try:
        model = auto_cls.from_pretrained(model_path, dtype=torch.float32)
    except TypeError:
        model = auto_cls.from_pretrained(model_path, torch_dtype=torch.float32)
    return model.to(device).eval()


def _continuations(prompts: list[list[int]], comp) -> tuple[list[list[int]], list[int]]:
    seqs = [p + comp.token_ids[comp.offsets[i] : comp.offsets[i + 1]].tolist() for i, p in enumerate(prompts)]
    return seqs, [len(p) for p in prompts]


@torch.inference_mode()
def _score(model, state_dict, seqs: list[list[int]], starts: list[int], device: str) -> np.ndarray:
    """Raw logprobs of the generated tokens (greedy: the processed transform is the identity)."""
    model.load_state_dict(state_dict)
    out = []
    for seq, start in zip(seqs, starts):  # a handful of probe sequences: one forward each
        if start >= len(seq):
            continue
        ids = torch.tensor([seq], device=device)
        logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
        targets = ids[0, start:]
        out.append(logp[start - 1 : len(seq) - 1].gather(-1, targets.unsqueeze(-1)).squeeze(-1).cpu().numpy())
    return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)
