"""Prefill against decode inside one engine: the greedy sequences, scored again by prefill.

An engine gives each token of a sequence one logprob whichever way it computes it: while decoding
(one position per step, from the KV cache) or while prefilling (every position of a prompt in one
forward, ``prompt_logprobs``). NeMo-RL #2100 / #4243 saw vLLM's decode disagree with its own
prefill on 15-20% of sequences; a trainer that scores rollouts by prefill then trains on numbers
the sampler never used. Here the greedy pass's sequences (prompt + greedy tokens) go back into the
same engine as prompts, and each greedy token's decode logprob meets its prefill logprob
(``greedy_prefill_logprob``, judged by logprob-integrity). Greedy, because its processed logprobs
are the raw ones: no temperature, top-k or top-p stands between the two numbers.
"""

from __future__ import annotations

import numpy as np

from gate.contract.evidence import token_ranges
from gate.worker.replay import Completions, PromptScores


def rescoring_input(
    prompt_ids: list[list[int]], greedy: Completions, max_model_len: int
) -> tuple[list[list[int]], list[int]]:
    """(prompt + greedy tokens, completion start) per greedy sequence, as prompts to score.

    Scoring asks for one new token, so a sequence is cut to ``max_model_len - 1`` tokens: the
    greedy tokens past the cut are not rescored (NaN in :func:`decode_positions`).
    """
    seqs, starts = [], []
    for i, p in enumerate(greedy.prompt_index.tolist()):
        prompt = prompt_ids[p]
        tokens = greedy.token_ids[greedy.offsets[i] : greedy.offsets[i + 1]].tolist()
        seqs.append((prompt + tokens)[: max(max_model_len - 1, len(prompt))])
        starts.append(len(prompt))
    return seqs, starts


def decode_positions(scores: PromptScores, starts: list[int], greedy: Completions) -> np.ndarray:
    """The prefill logprob of every greedy token, aligned with the greedy arrays (NaN: not rescored).

    ``scores`` holds positions 1..L-1 of each rescored sequence, so the token at position ``t``
    is entry ``t - 1`` of its sequence's block; completion tokens start at ``starts[i]``.
    """
    starts_arr = np.asarray(starts, dtype=np.int64)
    rescored = (
        np.diff(scores.offsets) + 1 - starts_arr
    )  # completion tokens each rescored sequence holds
    counts = np.clip(np.minimum(rescored, np.diff(greedy.offsets)), 0, None)
    out = np.full(int(greedy.offsets[-1]), np.nan, dtype=np.float32)
    source = token_ranges(scores.offsets[:-1] + starts_arr - 1, counts)
    dest = token_ranges(greedy.offsets[:-1], counts)
    out[dest] = scores.logprob[source]
    return out
