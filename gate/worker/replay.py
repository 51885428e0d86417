"""The three engine passes: sampled (the rollout path), greedy, and teacher-forced.

Prompts are tokenized here, inside the engine environment, with that environment's transformers
and chat template, and the engine is fed the resulting token ids, so the ids recorded are exactly
the ids the engine and the trainer-side reference saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gate.contract.request import PromptItem, SamplingRequest

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

FINISH_CODES = {"stop": 0, "length": 1, "abort": 2}
FINISH_OTHER = 3


@dataclass
class Completions:
    """Ragged completions of one pass, flattened: sequence ``i`` owns ``offsets[i]:offsets[i+1]``."""

    prompt_index: np.ndarray  # [S] which prompt each sequence continues
    sample_index: np.ndarray  # [S] which of the n samples of that prompt
    offsets: np.ndarray  # [S+1]
    token_ids: np.ndarray  # [T]
    logprob: np.ndarray  # [T] the engine's reported logprob of each generated token
    rank: np.ndarray  # [T] the engine's rank of each generated token (1 = most likely)
    topk_ids: np.ndarray  # [T, k]
    topk_logprobs: np.ndarray  # [T, k]
    finish: np.ndarray  # [S] FINISH_CODES
    texts: list[str]
    texts_whole: bool = True  # False: a server split some texts (reasoning, tool calls)
    # Per prompt, the ids the engine reports it ran (RequestOutput.prompt_token_ids; None: unsaid)
    engine_prompt_ids: list[list[int] | None] | None = None


@dataclass
class PromptScores:
    """Engine logprobs of fixed token sequences (prompt_logprobs), positions 1..L-1 of each."""

    offsets: np.ndarray  # [Q+1] over target positions
    logprob: np.ndarray  # [sum(L-1)]


def tokenize_prompts(tokenizer, prompts: list[PromptItem]) -> list[list[int]]:
    """The ids the trainer holds for each prompt: pre-tokenized ids as given, chat messages through
    the tokenizer's chat template, plain text through the tokenizer."""
    ids = []
    for item in prompts:
        if item.prompt_token_ids is not None:
            ids.append(_checked_token_ids(item, len(tokenizer)))
        elif item.messages is not None:
            out = tokenizer.apply_chat_template(
                item.messages, add_generation_prompt=True, tokenize=True
            )
            # transformers 5 returns a BatchEncoding here, 4.x a plain list.
            ids.append(list(out["input_ids"] if hasattr(out, "keys") else out))
        else:
            ids.append(list(tokenizer(item.prompt).input_ids))
    return ids


def _checked_token_ids(item: PromptItem, vocabulary: int) -> list[int]:
    ids = list(item.prompt_token_ids or [])
    outside = [t for t in ids if t >= vocabulary]
    if outside:
        raise ValueError(
            f"prompt {item.id}: prompt_token_ids: {len(outside)} id(s) outside the tokenizer's "
            f"{vocabulary} (first: {outside[0]}): ids from another tokenizer?"
        )
    return ids


def tokenize_references(tokenizer, prompts: list[PromptItem]) -> list[list[int] | None]:
    return [
        None
        if item.reference is None
        else list(tokenizer(item.reference, add_special_tokens=False).input_ids)
        for item in prompts
    ]


def token_texts(tokenizer: PreTrainedTokenizerBase, ids: np.ndarray) -> dict[str, str]:
    """Each distinct token id's own decoded text, keyed by the id as a string (texts.json).

    Decoded one token at a time and verbatim (special tokens kept, no space clean-up), so a token
    shows as the engine emitted it; a token holding part of a multi-byte character decodes to U+FFFD.
    """
    distinct = np.unique(np.asarray(ids, dtype=np.int64)).tolist()
    texts = tokenizer.batch_decode(
        [[i] for i in distinct], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    return dict(zip(map(str, distinct), texts, strict=True))


@dataclass(frozen=True)
class TextRoundTrip:
    """Per sampled sequence, the engine's text against its token ids (class 8 of issue 26).

    ``text_mismatch``: the engine's text is not the tokenizer's decoding of the ids it sampled
    (special tokens left out, as the engine's text leaves them; a multi-byte character cut off at
    the length cap is not a mismatch: :func:`_held_back`).
    ``retokenized_at``: where encoding that text again first departs from the sampled ids, -1 where
    it gives them back: a stack that passes rollouts on as text trains on other tokens there.
    """

    text_mismatch: np.ndarray  # [S] bool
    retokenized_at: np.ndarray  # [S] int32


def text_round_trip(
    tokenizer: PreTrainedTokenizerBase, sampled: Completions
) -> TextRoundTrip | None:
    """None where the texts are not whole (a server's reasoning parser or tool calls took part of
    them): nothing to compare."""
    if not sampled.texts_whole:
        return None
    if len(sampled.offsets) <= 1:
        return TextRoundTrip(np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int32))
    ids = np.asarray(sampled.token_ids, dtype=np.int64)
    keep = ~np.isin(ids, np.asarray(sorted(tokenizer.all_special_ids), dtype=np.int64))
    # Each sequence's ids without the special ones: where the sequences start among the kept ids.
    starts = np.concatenate([[0], np.cumsum(keep)])[np.asarray(sampled.offsets, dtype=np.int64)]
    sequences = [part.tolist() for part in np.split(ids[keep], starts[1:-1])]
    decoded = tokenizer.batch_decode(
        sequences, skip_special_tokens=True, clean_up_tokenization_spaces=False
    )
    texts = list(sampled.texts)
    mismatch = np.array(
        [
            d != t and not _held_back(tokenizer, seq, d, t)
            for seq, d, t in zip(sequences, decoded, texts, strict=True)
        ],
        dtype=bool,
    )
    encoded = tokenizer(texts, add_special_tokens=False).input_ids if texts else []
    return TextRoundTrip(
        mismatch,
        np.array(
            [_first_difference(e, s) for e, s in zip(encoded, sequences, strict=True)],
            dtype=np.int32,
        ),
    )


# A UTF-8 character is at most 4 bytes, so at most 3 of its tokens can end a sequence unfinished.
_MAX_UNFINISHED_TOKENS = 3


def _held_back(tokenizer: PreTrainedTokenizerBase, ids: list[int], decoded: str, text: str) -> bool:
    """The engine's text is the decoding of ``ids`` less the last tokens, which hold a character
    the length cap cut off: vLLM's incremental detokenizer emits no text for a token until its
    bytes complete a character, so it holds back the whole token, a leading space included (on
    SmolLM2, token 40303: a space and three of an emoji's four bytes). A decode shows the tail as
    U+FFFD. Every token held back ends the text unfinished: each longer prefix decodes to a
    trailing U+FFFD. Only sequences that differ get here: rare, so a few decodes each are cheap."""
    for k in range(1, min(_MAX_UNFINISHED_TOKENS, len(ids)) + 1):
        if not decoded.endswith("\ufffd"):
            return False
        decoded = tokenizer.decode(
            ids[:-k], skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        if decoded == text:
            return True
    return False


def _first_difference(a: list[int], b: list[int]) -> int:
    """The first index where ``a`` and ``b`` differ (or the shorter's length), -1 when equal."""
    if a == b:
        return -1
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def flat_logprobs_supported() -> bool:
    from vllm import SamplingParams

    return hasattr(SamplingParams(), "flat_logprobs")


def _params(**kwargs):
    from vllm import SamplingParams

    if flat_logprobs_supported():
        # Flat logprobs arrive as a few primitive lists we can view as arrays, not a dict per token.
        kwargs["flat_logprobs"] = True
    return SamplingParams(**kwargs)


def _generate(
    llm, prompt_ids: list[list[int]], params, order: np.ndarray | None, lora_request=None
):
    """llm.generate in ``order`` (a permutation), outputs returned in prompt order; with
    ``lora_request``, every prompt through that adapter (LoRA mode)."""
    if not isinstance(params, list):
        params = [params] * len(prompt_ids)
    idx = np.arange(len(prompt_ids)) if order is None else order
    adapter = {} if lora_request is None else {"lora_request": lora_request}
    outputs = llm.generate(
        [{"prompt_token_ids": prompt_ids[i]} for i in idx],
        [params[i] for i in idx],
        use_tqdm=False,
        **adapter,
    )
    restored = [None] * len(outputs)
    for position, i in enumerate(idx.tolist()):
        restored[i] = outputs[position]
    return restored


def submission_order(n: int, order_seed: int | None) -> np.ndarray | None:
    return None if order_seed is None else np.random.default_rng(order_seed).permutation(n)


def sample(
    llm,
    prompt_ids: list[list[int]],
    sampling: SamplingRequest,
    order: np.ndarray | None = None,
    lora_request=None,
) -> Completions:
    """The rollout path: n samples per prompt with a per-prompt seed, so batching cannot change them."""
    params = [
        _params(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else _top_k_off(),
            max_tokens=sampling.max_tokens,
            seed=sampling.seed + i * sampling.n,
            logprobs=sampling.logprobs,
            repetition_penalty=sampling.repetition_penalty,
            presence_penalty=sampling.presence_penalty,
            frequency_penalty=sampling.frequency_penalty,
        )
        for i in range(len(prompt_ids))
    ]
    return _collect(_generate(llm, prompt_ids, params, order, lora_request), sampling.logprobs)


def greedy(
    llm,
    prompt_ids: list[list[int]],
    max_tokens: int,
    k: int,
    order: np.ndarray | None = None,
    lora_request=None,
) -> Completions:
    params = _params(n=1, temperature=0.0, max_tokens=max_tokens, logprobs=k)
    return _collect(_generate(llm, prompt_ids, params, order, lora_request), k)


def score_sequences(
    llm,
    sequences: list[list[int]],
    order: np.ndarray | None = None,
    one_per_call: bool = False,
    lora_request=None,
) -> PromptScores:
    """Engine logprobs of every position after the first, teacher-forced via prompt_logprobs; with
    ``one_per_call``, each sequence alone in its own call (in ``order``)."""
    params = _params(n=1, temperature=0.0, max_tokens=1, prompt_logprobs=0)
    if one_per_call:
        idx = range(len(sequences)) if order is None else order.tolist()
        alone = {i: _generate(llm, [sequences[i]], params, None, lora_request)[0] for i in idx}
        outputs = [alone[i] for i in range(len(sequences))]
    else:
        outputs = _generate(llm, sequences, params, order, lora_request)
    parts = []
    for out, seq in zip(outputs, sequences, strict=True):
        values = _prompt_logprobs_of(out.prompt_logprobs, seq)
        if len(values) != len(seq) - 1:
            raise RuntimeError(
                f"engine returned {len(values)} prompt logprobs for {len(seq) - 1} positions"
            )
        parts.append(values)
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    return PromptScores(offsets=offsets, logprob=np.concatenate(parts).astype(np.float32))


def max_model_len(llm) -> int:
    """The running offline engine's context length (2048 where it does not say)."""
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    return int(getattr(getattr(config, "model_config", None), "max_model_len", 2048))


def _top_k_off() -> int:
    # vLLM >= 0.9 accepts 0 for "off"; older releases want -1. Probe the default.
    from vllm import SamplingParams

    return SamplingParams().top_k


def _collect(outputs, k: int) -> Completions:
    prompt_index, sample_index, lengths, finish, texts = [], [], [], [], []
    ids, lps, ranks, topk_ids, topk_lps = [], [], [], [], []
    engine_prompt_ids = []
    for p, out in enumerate(outputs):
        ran = getattr(out, "prompt_token_ids", None)
        engine_prompt_ids.append(None if ran is None else list(ran))
        for s, comp in enumerate(out.outputs):
            tokens = np.asarray(comp.token_ids, dtype=np.int32)
            lp, rk, tid, tlp = _sample_logprobs_of(comp.logprobs, tokens, k)
            prompt_index.append(p)
            sample_index.append(s)
            lengths.append(len(tokens))
            finish.append(FINISH_CODES.get(comp.finish_reason, FINISH_OTHER))
            texts.append(comp.text)
            ids.append(tokens)
            lps.append(lp)
            ranks.append(rk)
            topk_ids.append(tid)
            topk_lps.append(tlp)
    return Completions(
        prompt_index=np.asarray(prompt_index, dtype=np.int32),
        sample_index=np.asarray(sample_index, dtype=np.int32),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        token_ids=_cat(ids, np.int32, (0,)),
        logprob=_cat(lps, np.float32, (0,)),
        rank=_cat(ranks, np.int32, (0,)),
        topk_ids=_cat(topk_ids, np.int32, (0, k)),
        topk_logprobs=_cat(topk_lps, np.float32, (0, k)),
        finish=np.asarray(finish, dtype=np.int8),
        texts=texts,
        engine_prompt_ids=engine_prompt_ids,
    )


SHOWN_PROMPTS = 20


def prompt_ids_record(
    trainer: list[list[int]], engine: list[list[int] | None], names: list[str], source: str
) -> dict[str, Any]:
    """engine.json ``prompt_ids``: the prompts the engine ran on other ids than the trainer holds
    (its tokenizer's chat template, its tokenizer, or the pre-tokenized ids as given), with where
    the first of them departs. ``checked``: prompts whose engine ids are known."""
    unlike: list[str] = []
    first: dict[str, Any] | None = None
    checked = 0
    for name, mine, ran in zip(names, trainer, engine, strict=True):
        if ran is None:
            continue
        checked += 1
        if ran == mine:
            continue
        unlike.append(name)
        if first is None:
            at = next(
                (i for i, (a, b) in enumerate(zip(mine, ran, strict=False)) if a != b),
                min(len(mine), len(ran)),
            )
            first = {"id": name, "at": at, "trainer_tokens": len(mine), "engine_tokens": len(ran)}
    return {
        "source": source,
        "checked": checked,
        "unlike_trainer": {"count": len(unlike), "ids": unlike[:SHOWN_PROMPTS], "first": first},
    }


def _cat(parts: list[np.ndarray], dtype, empty_shape: tuple[int, ...]) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(empty_shape, dtype=dtype)


def _sample_logprobs_of(logprobs, tokens: np.ndarray, k: int):
    """(sampled logprob, sampled rank, top-k ids, top-k logprobs) for one completion."""
    n = len(tokens)
    if n == 0:
        return np.zeros(0), np.zeros(0), np.zeros((0, k)), np.zeros((0, k))
    if hasattr(logprobs, "start_indices"):
        # FlatLogprobs: every position holds [sampled, top-1 .. top-k] (vLLM appends k + 1 entries).
        width = k + 1
        flat = np.asarray(logprobs.logprobs, dtype=np.float64)
        if flat.size != n * width:
            raise RuntimeError(f"flat logprobs hold {flat.size} entries for {n} tokens x {width}")
        lps = flat.reshape(n, width)
        ids = np.asarray(logprobs.token_ids, dtype=np.int64).reshape(n, width)
        ranks = np.asarray(logprobs.ranks, dtype=np.int64).reshape(n, width)
        if not np.array_equal(ids[:, 0], tokens):
            raise RuntimeError("flat logprobs: first entry of a position is not the sampled token")
        return lps[:, 0], ranks[:, 0], ids[:, 1:], lps[:, 1:]
    # Older releases: a dict per position. The sampled token is always a key.
    lp, rk = np.empty(n), np.empty(n)
    tid, tlp = np.full((n, k), -1), np.full((n, k), -np.inf)
    for t, (token, entry) in enumerate(zip(tokens.tolist(), logprobs, strict=True)):
        lp[t], rk[t] = entry[token].logprob, entry[token].rank
        top = sorted(
            (v.rank, tok, v.logprob)
            for tok, v in entry.items()
            if v.rank is not None and v.rank <= k
        )
        for j, (_, tok, value) in enumerate(top[:k]):
            tid[t, j], tlp[t, j] = tok, value
    return lp, rk, tid, tlp


def _prompt_logprobs_of(prompt_logprobs, seq: list[int]) -> np.ndarray:
    if hasattr(prompt_logprobs, "start_indices"):
        # prompt_logprobs=0: position 0 is empty, every later one holds just the actual token.
        if list(prompt_logprobs.token_ids) != list(seq[1:]):
            raise RuntimeError("flat prompt logprobs do not follow the scored sequence")
        return np.asarray(prompt_logprobs.logprobs, dtype=np.float64)
    return np.asarray(
        [entry[tok].logprob for tok, entry in zip(seq[1:], prompt_logprobs[1:], strict=True)],
        dtype=np.float64,
    )
