"""Trainer-side reference: transformers scores the engine's tokens teacher-forced.

For every target token it returns the raw logprob (log_softmax of the logits), the processed
logprob (the sampling transform the engine was asked to apply: temperature, then top-k, then
top-p; tokens outside the kept set get -inf) and the raw logprob with a bf16 final projection
(what an engine with a bf16 ``lm_head`` would report), so later checks can tell which one an
engine matches. Everything is batched: sequences are packed by a padded-token budget and the
scored positions are gathered with index tensors, never with per-token Python loops.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gate.evidence import token_ranges

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_HEAD_CHUNK_ROWS = 4096  # bounds the [rows, vocab] logits block for 150k-token vocabularies


@dataclass(frozen=True)
class SamplingTransform:
    temperature: float  # <= 0 means greedy: the processed logprob is the raw one
    top_k: int  # 0 = off
    top_p: float  # 1.0 = off
    # The dtype the engine's logits are in (its lm_head's): top-k/top-p are decided on logits rounded
    # to it, as the engine decides them; None keeps the reference's own fp32 logits.
    mask_dtype: str | None = None


# Significant bits after the leading one, for the width of one ULP at the top-k/top-p boundary.
_MANTISSA_BITS = {"bfloat16": 7, "float16": 10, "float32": 23}


@dataclass
class ScoredTokens:
    """Flat per-target arrays, in the order of the sequences passed in."""

    raw: np.ndarray
    processed: np.ndarray
    raw_bf16_head: np.ndarray
    at_boundary: np.ndarray  # bool: the target sits within one ULP of the top-k/top-p boundary


def processed_logprobs(logits: torch.Tensor, transform: SamplingTransform) -> torch.Tensor:
    """log_softmax after temperature, top-k and top-p, with vLLM's tie and boundary rules.

    Like vLLM's sampler: top-k keeps every token tied with the k-th largest logit; top-p sorts
    ascending, drops tokens whose cumulative probability stays <= 1 - p, and always keeps the
    most likely token.
    """
    return _masked_log_softmax(logits, transform, transform_keep(logits, transform)[0])


def _masked_log_softmax(
    logits: torch.Tensor, transform: SamplingTransform, keep: torch.Tensor | None
) -> torch.Tensor:
    values = _scaled(logits.float(), transform)
    if keep is not None:
        values = values.masked_fill(~keep, -math.inf)
    return torch.log_softmax(values, dim=-1)


def transform_keep(
    logits: torch.Tensor, transform: SamplingTransform
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The tokens top-k/top-p keep ([rows, vocab]) and each row's boundary: its smallest kept logit.

    Decided on the logits rounded to ``transform.mask_dtype``: a bf16 engine sees ties that the
    fp32 reference does not, and keeps or cuts them as a block. (None, None) when neither applies.
    """
    vocab = logits.shape[-1]
    use_k = 0 < transform.top_k < vocab
    use_p = transform.top_p < 1.0
    if not (use_k or use_p):
        return None, None
    keys = _rounded(logits, transform.mask_dtype)
    sorted_keys, order = _scaled(keys, transform).sort(dim=-1, descending=False)
    drop = torch.zeros_like(sorted_keys, dtype=torch.bool)
    if use_k:
        drop |= sorted_keys < sorted_keys[:, vocab - transform.top_k].unsqueeze(-1)
    if use_p:
        cum = sorted_keys.masked_fill(drop, -math.inf).softmax(dim=-1).cumsum(dim=-1)
        cut = cum <= 1.0 - transform.top_p
        cut[:, -1] = False
        drop |= cut
    keep = torch.empty_like(drop).scatter_(-1, order, ~drop)
    return keep, keys.masked_fill(~keep, math.inf).min(dim=-1).values


def at_boundary(
    logits: torch.Tensor, transform: SamplingTransform, targets: torch.Tensor
) -> torch.Tensor:
    """Whether each row's target lies within one ULP (of the mask dtype) of the top-k/top-p boundary.

    Such a token is undecidable rather than outside the transform: on CUDA the Triton top-k keeps
    exactly k tokens among ties and top-p finds its cut by a bounded bisection, so the engine may
    keep or drop it where the reference's rule says otherwise.
    """
    return _near_boundary(logits, transform, targets, transform_keep(logits, transform)[1])


def _near_boundary(logits: torch.Tensor, transform: SamplingTransform, targets: torch.Tensor,
                   boundary: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    if boundary is None:
        return torch.zeros(targets.shape[0], dtype=torch.bool, device=logits.device)
    key = _rounded(logits, transform.mask_dtype).gather(-1, targets).squeeze(-1)
    _, exponent = torch.frexp(boundary)  # boundary = m * 2^e with m in [0.5, 1)
    ulp = torch.ldexp(
        torch.ones_like(boundary), exponent - 1 - _MANTISSA_BITS[transform.mask_dtype or "float32"]
    )
    return (key - boundary).abs() <= ulp


def _rounded(logits: torch.Tensor, dtype: str | None) -> torch.Tensor:
    return logits.float() if dtype in (None, "float32") else logits.to(_DTYPES[dtype]).float()


def _scaled(logits: torch.Tensor, transform: SamplingTransform) -> torch.Tensor:
    if transform.temperature > 0 and transform.temperature != 1.0:
        return logits / transform.temperature
    return logits


@contextlib.contextmanager
def full_fp32_matmul() -> Iterator[None]:
    """fp32 matmuls at full precision while the reference scores.

    The precision is process-wide, and vLLM sets it from VLLM_FLOAT32_MATMUL_PRECISION when it
    starts in this process: "high" would make the fp32 reference a TF32 one on Ampere and later.
    """
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


class ReferenceModel:
    """A transformers causal LM split into trunk and final projection so the head precision is ours."""

    def __init__(self, model_path: str, dtype: str, lm_head_fp32: bool, device: str,
                 hf_kwargs: dict[str, Any] | None = None) -> None:  # fmt: skip
        from transformers import AutoModelForCausalLM

        self.device = torch.device(device)
        model = _load_causal_lm(AutoModelForCausalLM, model_path, **(hf_kwargs or {}))
        model.eval()
        head = model.get_output_embeddings()
        # Copy the projection in fp32 before the trunk is cast, so an fp32 head is really fp32.
        self.head_weight_fp32 = head.weight.detach().float().to(self.device)
        self.head_bias_fp32 = (
            None
            if getattr(head, "bias", None) is None
            else head.bias.detach().float().to(self.device)
        )
        trunk_dtype = _DTYPES[dtype]
        self.head_dtype = (
            torch.float32 if (lm_head_fp32 or trunk_dtype == torch.float32) else trunk_dtype
        )
        self.trunk = model.get_decoder().to(device=self.device, dtype=trunk_dtype)
        # Gemma-style models cap logits after the projection; keep the reference faithful.
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.pad_id = 0

    def head(self, hidden: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        weight = self.head_weight_fp32.to(dtype)
        logits = hidden.to(dtype) @ weight.T
        if self.head_bias_fp32 is not None:
            logits = logits + self.head_bias_fp32.to(dtype)
        logits = logits.float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    @torch.inference_mode()
    @full_fp32_matmul()
    def score(
        self,
        sequences: list[list[int]],
        score_from: list[int],
        transform: SamplingTransform,
        batch_tokens: int,
        progress: Callable[[int, int], None] | None = None,
    ) -> ScoredTokens:
        """Score tokens ``seq[t]`` for ``t in [score_from[i], len(seq))`` of every sequence."""
        lengths = np.array([len(s) for s in sequences], dtype=np.int64)
        starts = np.asarray(score_from, dtype=np.int64)
        if np.any(starts < 1) or np.any(starts > lengths):
            raise ValueError("score_from must lie in [1, len(sequence)]")
        counts = lengths - starts
        out_offsets = np.concatenate([[0], np.cumsum(counts)])
        total = int(out_offsets[-1])
        raw = np.empty(total, dtype=np.float32)
        processed = np.empty(total, dtype=np.float32)
        raw_bf16 = np.empty(total, dtype=np.float32)
        edge = np.empty(total, dtype=bool)

        order = np.argsort(-lengths, kind="stable")  # longest first: batches pad little
        done = 0
        for batch in _pack(order, lengths, batch_tokens):
            dest = token_ranges(out_offsets[batch], counts[batch])
            r, p, b, e = self._score_batch(
                [sequences[i] for i in batch], starts[batch], counts[batch], transform
            )
            raw[dest], processed[dest], raw_bf16[dest], edge[dest] = r, p, b, e
            done += len(batch)
            if progress:
                progress(done, len(sequences))
        return ScoredTokens(raw=raw, processed=processed, raw_bf16_head=raw_bf16, at_boundary=edge)

    def _score_batch(
        self,
        seqs: list[list[int]],
        starts: np.ndarray,
        counts: np.ndarray,
        transform: SamplingTransform,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        max_len = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), max_len), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), max_len), dtype=torch.long)
        for row, seq in enumerate(seqs):  # one Python step per sequence, not per token
            ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[row, : len(seq)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        hidden = self.trunk(input_ids=ids, attention_mask=mask).last_hidden_state

        # Target t is predicted by the hidden state at t - 1.
        rows = torch.from_numpy(np.repeat(np.arange(len(seqs)), counts)).to(self.device)
        cols = torch.from_numpy(token_ranges(starts - 1, counts)).to(self.device)
        targets = ids[rows, cols + 1].unsqueeze(-1)
        picked = hidden[rows, cols]

        outs: tuple[list[torch.Tensor], ...] = ([], [], [], [])
        for chunk in range(0, picked.shape[0], _HEAD_CHUNK_ROWS):
            h = picked[chunk : chunk + _HEAD_CHUNK_ROWS]
            t = targets[chunk : chunk + _HEAD_CHUNK_ROWS]
            logits = self.head(h, self.head_dtype)
            keep, boundary = transform_keep(
                logits, transform
            )  # one sort of the [rows, vocab] block
            outs[0].append(torch.log_softmax(logits, dim=-1).gather(-1, t).squeeze(-1))
            outs[1].append(_masked_log_softmax(logits, transform, keep).gather(-1, t).squeeze(-1))
            logits_bf16 = self.head(h, torch.bfloat16)
            outs[2].append(torch.log_softmax(logits_bf16, dim=-1).gather(-1, t).squeeze(-1))
            outs[3].append(_near_boundary(logits, transform, t, boundary))
        raw, processed, raw_bf16 = (torch.cat(o).float().cpu().numpy() for o in outs[:3])
        return raw, processed, raw_bf16, torch.cat(outs[3]).cpu().numpy()


def _load_causal_lm(auto_cls, model_path: str, **hf_kwargs: Any):
    # transformers 5 renamed torch_dtype to dtype; probe instead of parsing versions.
    try:
        return auto_cls.from_pretrained(model_path, dtype=torch.float32, **hf_kwargs)
    except TypeError:
        return auto_cls.from_pretrained(model_path, torch_dtype=torch.float32, **hf_kwargs)


def _pack(order: np.ndarray, lengths: np.ndarray, batch_tokens: int) -> list[np.ndarray]:
    """Group indices (already sorted longest first) so that rows * longest <= batch_tokens."""
    batches: list[np.ndarray] = []
    current: list[int] = []
    longest = 0
    for idx in order:
        longest_if_added = max(longest, int(lengths[idx]))
        if current and longest_if_added * (len(current) + 1) > batch_tokens:
            batches.append(np.array(current))
            current, longest_if_added = [], int(lengths[idx])
        current.append(idx)
        longest = longest_if_added
    if current:
        batches.append(np.array(current))
    return batches
