"""Trainer-side reference: transformers scores the engine's tokens teacher-forced.

For every target token it returns the raw logprob (log_softmax of the logits), the processed
logprob (the sampling transform the engine was asked to apply: temperature, then top-k, then
top-p; tokens outside the kept set get -inf) and the raw logprob with a bf16 final projection
(what an engine with a bf16 ``lm_head`` would report), so later checks can tell which one an
engine matches. Everything is batched: sequences are packed by a padded-token budget and the
scored positions are gathered with index tensors, never with per-token Python loops.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gate.contract.evidence import token_ranges
from gate.contract.request import Penalties
from gate.worker.matmul_precision import full_fp32_matmul

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Rows of the [rows, vocab] head block scored at a time: bounds its memory on 150k-token
# vocabularies. On a CPU smaller blocks are faster (SmolLM2's 49k vocabulary on 2 cores: 512 rows
# 4.8-5.2 s, 4096 rows 6.2-6.8 s for the same 2,032 targets; scripts/bench_reference.py): each
# of the block's passes stays nearer the caches, and a block is reused instead of mapped afresh.
HEAD_CHUNK_ROWS = {"cpu": 512, "cuda": 4096}


@dataclass(frozen=True)
class SamplingTransform:
    temperature: float  # <= 0 means greedy: the processed logprob is the raw one
    top_k: int  # 0 = off
    top_p: float  # 1.0 = off
    # The dtype the engine's logits are in (its lm_head's): top-k/top-p are decided on logits rounded
    # to it, as the engine decides them; None keeps the reference's own fp32 logits.
    mask_dtype: str | None = None
    # vLLM's penalties, on the fp32 logits before temperature (:func:`penalised`); neutral: off.
    # They need each row's prompt and earlier output tokens, so only ``ReferenceModel.score``
    # applies them, to completions scored from the prompt's end. The mask then reads the penalised
    # logits rounded to ``mask_dtype`` where the engine penalises rounded ones: at most an ULP
    # apart at the boundary, where ``at_boundary`` already calls a token undecidable.
    penalties: Penalties = field(default_factory=Penalties)

    @property
    def penalised(self) -> bool:
        return self.penalties.on


# Significant bits after the leading one, for the width of one ULP at the top-k/top-p boundary.
_MANTISSA_BITS = {"bfloat16": 7, "float16": 10, "float32": 23}


@dataclass
class ScoredTokens:
    """Flat per-target arrays, in the order of the sequences passed in."""

    raw: np.ndarray
    processed: np.ndarray
    raw_bf16_head: np.ndarray
    at_boundary: np.ndarray  # bool: the target sits within one ULP of the top-k/top-p boundary
    # The row's smallest kept logit minus the target's (logits as the mask sees them, before
    # temperature): > 0 outside the transform, <= 0 inside, NaN where no top-k/top-p applies.
    boundary_gap: np.ndarray | None = None
    # Probability (after temperature and top-k) of the tokens more likely than the target: top-p
    # keeps it while this is < top_p. NaN where top-p is off.
    mass_above: np.ndarray | None = None
    # [targets, k] logprobs before temperature (raw; after the penalties where they are on) of other
    # tokens at each target's position (``also_ids``; the engine's top-k), NaN where an id is -1:
    # logprob differences at one position fit the engine's temperature.
    also_raw: np.ndarray | None = None
    # log_softmax(logits / T) over the whole vocabulary: what a trainer that does not renormalise
    # over the sampler's kept tokens computes. Minus ``processed``, the log of the kept mass.
    tempered: np.ndarray | None = None


def penalised(
    logits: torch.Tensor,
    transform: SamplingTransform,
    in_prompt: torch.Tensor,
    output_counts: torch.Tensor,
) -> torch.Tensor:
    """vLLM's penalties on [rows, vocab] logits (``apply_penalties``, v1/sample/ops/penalties.py).

    ``in_prompt`` ([rows, vocab] bool): the token is in the row's prompt; ``output_counts``
    ([rows, vocab]): how often the completion produced it before this position. The repetition
    penalty divides a positive logit and multiplies a negative one of every token seen in either;
    frequency subtracts ``penalty x count`` and presence ``penalty`` once, for output tokens only.
    """
    p = transform.penalties
    out = logits.float()
    if p.repetition != 1.0:
        seen = in_prompt | (output_counts > 0)
        out = torch.where(seen, out * torch.where(out > 0, 1.0 / p.repetition, p.repetition), out)
    return out - p.frequency * output_counts - p.presence * (output_counts > 0).float()


def output_counts(
    ids: torch.Tensor,
    seq_of_row: torch.Tensor,
    target_pos: torch.Tensor,
    starts: torch.Tensor,
    vocab: int,
) -> torch.Tensor:
    """[rows, vocab]: per row, how often each token occurs in its sequence's completion before the
    row's target, ``ids[b, starts[b] : target_pos]``.

    Rows of one sequence are consecutive with rising positions (:func:`gate.contract.evidence.token_ranges`),
    so the counts are a running sum of each row's previous token, restarted per sequence; the
    first row of a sequence that starts mid-completion (a block split inside it) is seeded with the
    tokens before it.
    """
    rows = seq_of_row.shape[0]
    counts = torch.zeros(rows, vocab, dtype=torch.float32, device=ids.device)
    prev = target_pos - 1
    has_prev = prev >= starts[seq_of_row]
    r = torch.arange(rows, device=ids.device)
    counts.index_put_(
        (r[has_prev], ids[seq_of_row[has_prev], prev[has_prev]]),
        torch.ones(int(has_prev.sum()), device=ids.device),
        accumulate=True,
    )
    first = torch.ones(rows, dtype=torch.bool, device=ids.device)
    first[1:] = seq_of_row[1:] != seq_of_row[:-1]
    # Seed each segment's first row with its completion's tokens before the previous one.
    seg = torch.nonzero(first).squeeze(-1)
    lengths = (prev[seg] - starts[seq_of_row[seg]]).clamp(min=0)
    if int(lengths.sum()):
        seed_rows = torch.repeat_interleave(seg, lengths)
        within = torch.arange(int(lengths.sum()), device=ids.device) - torch.repeat_interleave(
            torch.cumsum(lengths, 0) - lengths, lengths
        )
        positions = starts[seq_of_row[seed_rows]] + within
        counts.index_put_(
            (seed_rows, ids[seq_of_row[seed_rows], positions]),
            torch.ones(len(seed_rows), device=ids.device),
            accumulate=True,
        )
    running = counts.cumsum(dim=0)
    segment_of_row = torch.cumsum(first.long(), 0) - 1
    before = torch.zeros(len(seg), vocab, device=ids.device)
    before[1:] = running[seg[1:] - 1]
    return running - before[segment_of_row]


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
    return torch.log_softmax(_masked(logits, transform, keep), dim=-1)


def _masked(
    logits: torch.Tensor, transform: SamplingTransform, keep: torch.Tensor | None
) -> torch.Tensor:
    values = _scaled(logits.float(), transform)
    return values if keep is None else values.masked_fill(~keep, -math.inf)


def _picked_log_softmax(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log_softmax(values)[row, ids[row]] for [rows, 1] ids."""
    return (values.gather(-1, ids) - torch.logsumexp(values, dim=-1, keepdim=True)).squeeze(-1)


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
    scaled = _scaled(keys, transform)
    keep = torch.ones_like(scaled, dtype=torch.bool)
    if use_k:  # every token tied with the k-th largest stays
        keep = scaled >= scaled.topk(transform.top_k, dim=-1).values[:, -1:]
    if use_p:
        keep &= top_p_keep(scaled.masked_fill(~keep, -math.inf), transform.top_p)
    return keep, keys.masked_fill(~keep, math.inf).min(dim=-1).values


# Candidates top_p_keep sorts per row: the nucleus of almost every position of an RL policy lies
# within them; a row whose nucleus does not falls back to sorting its whole vocabulary.
_TOP_P_CANDIDATES = 512


def top_p_keep(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """vLLM's top-p rule on [rows, vocab] scaled logits: sort ascending, drop the tokens whose
    cumulative probability stays <= 1 - p, always keep the most likely one.

    Sorting a 49k-150k vocabulary per position is most of a reference's scoring time; only the
    largest ``_TOP_P_CANDIDATES`` are sorted here. Every token below them has a cumulative
    probability of at most the mass they leave (the tail), so where the tail is <= 1 - p all of
    them are dropped and the rule only needs the candidates' order; the other rows sort whole.
    """
    vocab = scaled.shape[-1]
    probs = scaled.softmax(dim=-1)
    if vocab <= _TOP_P_CANDIDATES:
        return _top_p_keep_sorted(probs, top_p)
    top, order = probs.topk(_TOP_P_CANDIDATES, dim=-1)  # descending
    tail = (probs.sum(dim=-1, keepdim=True) - top.sum(dim=-1, keepdim=True)).clamp(min=0.0)
    ascending = tail + top.flip(-1).cumsum(dim=-1)
    cut = ascending <= 1.0 - top_p
    cut[:, -1] = False
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, order, ~cut.flip(-1))
    wide = (tail > 1.0 - top_p).squeeze(-1)
    if wide.any():
        keep[wide] = _top_p_keep_sorted(probs[wide], top_p)
    return keep


def _top_p_keep_sorted(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_probs, order = probs.sort(dim=-1, descending=False)
    cut = sorted_probs.cumsum(dim=-1) <= 1.0 - top_p
    cut[:, -1] = False
    return torch.empty_like(cut).scatter_(-1, order, ~cut)


def transform_scores(
    logits: torch.Tensor, transform: SamplingTransform, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row of [rows, vocab] logits and its [rows, 1] target: the processed logprob, whether the
    target is within one ULP of the boundary, the boundary gap and the mass above the target.

    Under top-p alone on a wide vocabulary the kept tokens lie among the ``_TOP_P_CANDIDATES``
    most likely (:func:`top_p_keep`), so the normaliser, the boundary and the mass above are
    taken over those candidates, not over [rows, vocab] blocks written out for each (a
    benchmark over SmolLM2's 49k vocabulary spent most of the reference's time there:
    docs/performance.md). Rows whose nucleus or target lies past the candidates, and every other
    transform, take the whole-vocabulary path; a test holds the two to each other.
    """
    vocab = logits.shape[-1]
    if not (
        transform.top_p < 1.0 and not 0 < transform.top_k < vocab and vocab > _TOP_P_CANDIDATES
    ):
        return _whole_vocabulary_scores(logits, transform, targets)
    keys = _rounded(logits, transform.mask_dtype)
    values = _scaled(logits.float(), transform)  # what the engine's log_softmax reads, as _masked
    probs = (values if keys is logits else _scaled(keys, transform)).softmax(dim=-1)
    top, order = probs.topk(_TOP_P_CANDIDATES, dim=-1)  # descending
    tail = (probs.sum(dim=-1, keepdim=True) - top.sum(dim=-1, keepdim=True)).clamp(min=0.0)
    cut = tail + top.flip(-1).cumsum(dim=-1) <= 1.0 - transform.top_p
    cut[:, -1] = False
    kept = ~cut.flip(-1)  # over the candidates, most likely first
    boundary = keys.gather(-1, order).masked_fill(~kept, math.inf).min(dim=-1).values
    normaliser = values.gather(-1, order).masked_fill(~kept, -math.inf).logsumexp(dim=-1)
    target_kept = ((order == targets) & kept).any(dim=-1)
    picked = values.gather(-1, targets).squeeze(-1) - normaliser
    processed = picked.masked_fill(~target_kept, -math.inf)
    target_prob = probs.gather(-1, targets)
    mass = (top * (top > target_prob)).sum(dim=-1)
    edge = _near_boundary(logits, transform, targets, boundary)
    gap = _boundary_gap(logits, transform, targets, boundary)
    # A target less likely than every candidate may have more likely tokens outside them; a wide
    # nucleus keeps tokens outside them.
    beyond = (tail > 1.0 - transform.top_p).squeeze(-1) | (target_prob < top[:, -1:]).squeeze(-1)
    if beyond.any():
        p, e, g, m = _whole_vocabulary_scores(logits[beyond], transform, targets[beyond])
        processed[beyond], edge[beyond], gap[beyond], mass[beyond] = p, e, g, m
    return processed, edge, gap, mass


def _whole_vocabulary_scores(
    logits: torch.Tensor, transform: SamplingTransform, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    keep, boundary = transform_keep(logits, transform)
    return (
        _picked_log_softmax(_masked(logits, transform, keep), targets),
        _near_boundary(logits, transform, targets, boundary),
        _boundary_gap(logits, transform, targets, boundary),
        _mass_above(logits, transform, targets),
    )


def at_boundary(
    logits: torch.Tensor, transform: SamplingTransform, targets: torch.Tensor
) -> torch.Tensor:
    """Whether each row's target lies within one ULP (of the mask dtype) of the top-k/top-p boundary.

    Such a token is undecidable rather than outside the transform: on CUDA the Triton top-k keeps
    exactly k tokens among ties and top-p finds its cut by a bounded bisection, so the engine may
    keep or drop it where the reference's rule says otherwise.
    """
    return _near_boundary(logits, transform, targets, transform_keep(logits, transform)[1])


def _near_boundary(
    logits: torch.Tensor,
    transform: SamplingTransform,
    targets: torch.Tensor,
    boundary: torch.Tensor | None,
) -> torch.Tensor:
    if boundary is None:
        return torch.zeros(targets.shape[0], dtype=torch.bool, device=logits.device)
    key = _rounded(logits, transform.mask_dtype).gather(-1, targets).squeeze(-1)
    _, exponent = torch.frexp(boundary)  # boundary = m * 2^e with m in [0.5, 1)
    ulp = torch.ldexp(
        torch.ones_like(boundary), exponent - 1 - _MANTISSA_BITS[transform.mask_dtype or "float32"]
    )
    return (key - boundary).abs() <= ulp


def _boundary_gap(
    logits: torch.Tensor,
    transform: SamplingTransform,
    targets: torch.Tensor,
    boundary: torch.Tensor | None,
) -> torch.Tensor:
    if boundary is None:
        return torch.full((targets.shape[0],), math.nan, device=logits.device)
    return boundary - _rounded(logits, transform.mask_dtype).gather(-1, targets).squeeze(-1)


def _mass_above(
    logits: torch.Tensor, transform: SamplingTransform, targets: torch.Tensor
) -> torch.Tensor:
    """Probability of the tokens strictly more likely than each target, as top-p sees it."""
    if transform.top_p >= 1.0:
        return torch.full((targets.shape[0],), math.nan, device=logits.device)
    scaled = _scaled(_rounded(logits, transform.mask_dtype), transform)
    if 0 < transform.top_k < scaled.shape[-1]:
        scaled = scaled.masked_fill(
            scaled < scaled.topk(transform.top_k, dim=-1).values[:, -1:], -math.inf
        )
    probs = scaled.softmax(dim=-1)
    return (probs * (probs > probs.gather(-1, targets))).sum(dim=-1)


def _rounded(logits: torch.Tensor, dtype: str | None) -> torch.Tensor:
    return logits.float() if dtype in (None, "float32") else logits.to(_DTYPES[dtype]).float()


def _scaled(logits: torch.Tensor, transform: SamplingTransform) -> torch.Tensor:
    if transform.temperature > 0 and transform.temperature != 1.0:
        return logits / transform.temperature
    return logits


@dataclass(frozen=True)
class Placement:
    """Where the reference goes: one device, or spread over several by accelerate."""

    device: str  # the device of a one-device reference ("cuda" or "cpu")
    device_map: str | dict[str, int | str] | None = (
        None  # accelerate's: a strategy or module -> device
    )
    max_memory: dict[str, str | int] | None = None  # "0" (GPU index) or "cpu" -> "20GiB" or bytes


@dataclass
class _Loaded:
    """A loaded reference: the trunk, the final projection in fp32, and where each lives."""

    trunk: torch.nn.Module
    head_weight_fp32: torch.Tensor
    head_bias_fp32: torch.Tensor | None
    input_device: torch.device  # where the token ids go: the embeddings' device
    head_device: torch.device  # where the projection runs
    head_source: str  # where the fp32 projection's values came from
    module_devices: dict[str, str] | None  # accelerate's module -> device map, when spread
    softcap: float | None  # Gemma-style models cap logits after the projection


class ReferenceModel:
    """A transformers causal LM split into trunk and final projection so the head precision is ours."""

    def __init__(
        self,
        model_path: str,
        dtype: str,
        lm_head_fp32: bool,
        device: str,
        hf_kwargs: dict[str, Any] | None = None,
        device_map: str | dict[str, int | str] | None = None,
        max_memory: dict[str, str | int] | None = None,
    ) -> None:
        self.placement = Placement(device, device_map, max_memory)
        trunk_dtype = _DTYPES[dtype]
        loaded = (
            _load_on_one_device(model_path, trunk_dtype, torch.device(device), hf_kwargs or {})
            if device_map is None
            else _load_spread(
                model_path, trunk_dtype, lm_head_fp32, self.placement, hf_kwargs or {}
            )
        )
        self.trunk = loaded.trunk
        self.head_weight_fp32, self.head_bias_fp32 = loaded.head_weight_fp32, loaded.head_bias_fp32
        self.input_device, self.head_device = loaded.input_device, loaded.head_device
        self.head_source, self.module_devices = loaded.head_source, loaded.module_devices
        self.head_dtype = (
            torch.float32 if (lm_head_fp32 or trunk_dtype == torch.float32) else trunk_dtype
        )
        self.softcap = loaded.softcap
        self.pad_id = 0

    def placement_record(self) -> dict[str, Any]:
        """engine.json's account of where the reference sits: requested placement, module -> device
        (accelerate's map, when spread), and the bytes of weights and buffers on each device."""
        return {
            "device_map": self.placement.device_map,
            "max_memory": self.placement.max_memory,
            "modules": self.module_devices,
            "input_device": str(self.input_device),
            "head_device": str(self.head_device),
            "head_dtype": str(self.head_dtype).removeprefix("torch."),
            "head_source": self.head_source,
            # The logits' width: the ids a top-logprobs list may hold (logprob-integrity).
            "vocab_size": int(self.head_weight_fp32.shape[0]),
            "bytes_per_device": self.bytes_per_device(),
        }

    def bytes_per_device(self) -> dict[str, int]:
        """Bytes of the trunk's parameters and buffers and of the fp32 projection, per device
        ("offloaded": weights accelerate keeps off the device they run on)."""
        tensors = [*self.trunk.parameters(), *self.trunk.buffers(), self.head_weight_fp32]
        if self.head_bias_fp32 is not None:
            tensors.append(self.head_bias_fp32)
        totals: dict[str, int] = {}
        for t in tensors:
            where = "offloaded" if t.device.type == "meta" else str(t.device)
            totals[where] = totals.get(where, 0) + t.numel() * t.element_size()
        return totals

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
        also_ids: np.ndarray | None = None,
    ) -> ScoredTokens:
        """Score tokens ``seq[t]`` for ``t in [score_from[i], len(seq))`` of every sequence.

        ``also_ids`` ([targets, k], -1 = none) names more tokens per target position whose
        logprobs before temperature (after the penalties, where on) come back as ``also_raw``.
        """
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
        gap = np.empty(total, dtype=np.float32)
        mass = np.empty(total, dtype=np.float32)
        tempered = np.empty(total, dtype=np.float32)
        also = None if also_ids is None else np.full(also_ids.shape, np.nan, dtype=np.float32)

        order = np.argsort(-lengths, kind="stable")  # longest first: batches pad little
        done = 0
        for batch in _pack(order, lengths, batch_tokens):
            dest = token_ranges(out_offsets[batch], counts[batch])
            r, p, b, e, a, g, m, t = self._score_batch(
                [sequences[i] for i in batch],
                starts[batch],
                counts[batch],
                transform,
                None if also_ids is None else also_ids[dest],
            )
            raw[dest], processed[dest], raw_bf16[dest], edge[dest], gap[dest] = r, p, b, e, g
            mass[dest], tempered[dest] = m, t
            if also is not None:
                also[dest] = a
            done += len(batch)
            if progress:
                progress(done, len(sequences))
        return ScoredTokens(
            raw=raw,
            processed=processed,
            raw_bf16_head=raw_bf16,
            at_boundary=edge,
            boundary_gap=gap,
            mass_above=mass,
            also_raw=also,
            tempered=tempered,
        )

    def _score_batch(
        self,
        seqs: list[list[int]],
        starts: np.ndarray,
        counts: np.ndarray,
        transform: SamplingTransform,
        also_ids: np.ndarray | None = None,
    ) -> tuple[
        np.ndarray,
        np.ndarray,
        np.ndarray,
        np.ndarray,
        np.ndarray | None,
        np.ndarray,
        np.ndarray,
        np.ndarray,
    ]:
        max_len = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), max_len), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), max_len), dtype=torch.long)
        for row, seq in enumerate(seqs):  # one Python step per sequence, not per token
            ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[row, : len(seq)] = 1
        hidden = self.trunk(
            input_ids=ids.to(self.input_device), attention_mask=mask.to(self.input_device)
        ).last_hidden_state

        # Target t is predicted by the hidden state at t - 1. A spread reference ends on the device
        # of its last layer: the picked states move to the projection's device, not the reverse.
        rows = torch.from_numpy(np.repeat(np.arange(len(seqs)), counts))
        cols = torch.from_numpy(token_ranges(starts - 1, counts))
        targets = ids[rows, cols + 1].unsqueeze(-1).to(self.head_device)
        picked = hidden[rows.to(hidden.device), cols.to(hidden.device)].to(self.head_device)

        outs: tuple[list[torch.Tensor], ...] = ([], [], [], [], [], [], [], [])
        also = None if also_ids is None else torch.from_numpy(also_ids.astype(np.int64))
        step = HEAD_CHUNK_ROWS.get(self.head_device.type, HEAD_CHUNK_ROWS["cuda"])
        penalties = (
            _Penalties.of(ids, starts, rows, cols, self.head_weight_fp32.shape[0], self.head_device)
            if transform.penalised
            else None
        )
        for chunk in range(0, picked.shape[0], step):
            h = picked[chunk : chunk + step]
            t = targets[chunk : chunk + step]
            logits = self.head(h, self.head_dtype)
            # log_softmax picked at a few ids: the entries minus the row's logsumexp, without
            # writing out a [rows, vocab] log_softmax per kind of logprob.
            raw_lse = torch.logsumexp(logits, dim=-1, keepdim=True)
            outs[0].append((logits.gather(-1, t) - raw_lse).squeeze(-1))
            # The sampler's logits: penalised where penalties are on; the raw logprob is before them.
            shaped = logits if penalties is None else penalties.apply(logits, transform, chunk)
            if also is not None:
                # What the engine's temperature divides: after the penalties, where they are on.
                lse = (
                    raw_lse if penalties is None else torch.logsumexp(shaped, dim=-1, keepdim=True)
                )
                others = also[chunk : chunk + step].to(logits.device)
                picked_also = shaped.gather(-1, others.clamp(min=0)) - lse
                outs[4].append(picked_also.masked_fill(others < 0, math.nan))
            processed, edge, gap, mass = transform_scores(shaped, transform, t)
            outs[1].append(processed)
            # A bf16 head is the one just applied: its logprob is the raw one, not a second matmul.
            same = self.head_dtype == torch.bfloat16
            outs[2].append(
                outs[0][-1] if same else _picked_log_softmax(self.head(h, torch.bfloat16), t)
            )
            outs[3].append(edge)
            outs[5].append(gap)
            outs[6].append(mass)
            outs[7].append(_tempered(shaped, transform, t, outs[0][-1], processed))
        raw, processed, raw_bf16 = (torch.cat(o).float().cpu().numpy() for o in outs[:3])
        also_raw = torch.cat(outs[4]).float().cpu().numpy() if outs[4] else None
        gaps, masses, tempered = (torch.cat(o).float().cpu().numpy() for o in outs[5:8])
        return (
            raw,
            processed,
            raw_bf16,
            torch.cat(outs[3]).cpu().numpy(),
            also_raw,
            gaps,
            masses,
            tempered,
        )


@dataclass(frozen=True)
class _Penalties:
    """What vLLM's penalties need for one batch's targets: each sequence's prompt tokens and each
    target's position, on the projection's device."""

    ids: torch.Tensor  # [sequences, max_len]
    in_prompt: torch.Tensor  # [sequences, vocab] bool
    starts: torch.Tensor  # [sequences]: where each completion starts
    seq_of_row: torch.Tensor  # [targets]
    target_pos: torch.Tensor  # [targets]

    @classmethod
    def of(
        cls,
        ids: torch.Tensor,
        starts: np.ndarray,
        rows: torch.Tensor,
        cols: torch.Tensor,
        vocab: int,
        device: torch.device,
    ) -> _Penalties:
        ids = ids.to(device)
        starts_t = torch.from_numpy(starts.astype(np.int64)).to(device)
        prompt = torch.arange(ids.shape[1], device=device) < starts_t[:, None]
        seq, pos = torch.nonzero(prompt, as_tuple=True)
        in_prompt = torch.zeros(ids.shape[0], vocab, dtype=torch.bool, device=device)
        in_prompt[seq, ids[seq, pos]] = True
        return cls(ids, in_prompt, starts_t, rows.to(device), cols.to(device) + 1)

    def apply(self, logits: torch.Tensor, transform: SamplingTransform, first: int) -> torch.Tensor:
        """The penalised logits of the block of targets ``first .. first + len(logits)``."""
        block = slice(first, first + logits.shape[0])
        seq = self.seq_of_row[block]
        counts = output_counts(self.ids, seq, self.target_pos[block], self.starts, logits.shape[-1])
        return penalised(logits, transform, self.in_prompt[seq], counts)


def _tempered(
    logits: torch.Tensor,
    transform: SamplingTransform,
    targets: torch.Tensor,
    raw: torch.Tensor,
    processed: torch.Tensor,
) -> torch.Tensor:
    """log_softmax(logits / T) at the targets, over the whole vocabulary; the logprobs already
    computed stand in where they are the same number (no top-k/top-p: the processed one; T 1 or
    greedy: the raw one)."""
    vocab = logits.shape[-1]
    if not (0 < transform.top_k < vocab or transform.top_p < 1.0):
        return processed
    if (transform.temperature <= 0 or transform.temperature == 1.0) and not transform.penalised:
        return raw
    return _picked_log_softmax(_scaled(logits.float(), transform), targets)


def _load_on_one_device(
    model_path: str, trunk_dtype: torch.dtype, device: torch.device, hf_kwargs: dict[str, Any]
) -> _Loaded:
    from transformers import AutoModelForCausalLM

    model = _load_causal_lm(AutoModelForCausalLM, model_path, **hf_kwargs).eval()
    head = model.get_output_embeddings()
    # Copy the projection in fp32 before the trunk is cast, so an fp32 head is really fp32.
    bias = getattr(head, "bias", None)
    return _Loaded(
        trunk=model.get_decoder().to(device=device, dtype=trunk_dtype),
        head_weight_fp32=head.weight.detach().float().to(device),
        head_bias_fp32=None if bias is None else bias.detach().float().to(device),
        input_device=device,
        head_device=device,
        head_source="float32 load",
        module_devices=None,
        softcap=getattr(model.config, "final_logit_softcapping", None),
    )


def _load_spread(
    model_path: str,
    trunk_dtype: torch.dtype,
    lm_head_fp32: bool,
    placement: Placement,
    hf_kwargs: dict[str, Any],
) -> _Loaded:
    """The reference spread over devices by accelerate, loaded straight in the trunk's dtype.

    Loaded in that dtype (not fp32, then cast) so that accelerate sizes the shards by the bytes
    they will hold: a 70B bf16 reference is 140 GB, not 280. The numbers stay those of the
    one-device path: the trunk's float buffers (rotary frequencies) are cast as that path casts
    them, and an fp32 projection on a lower-precision trunk is read at the checkpoint's own
    precision when the checkpoint is a local or cached safetensors one.
    """
    from transformers import AutoModelForCausalLM

    _require_accelerate()
    try:
        model = _load_causal_lm(
            AutoModelForCausalLM,
            model_path,
            dtype=trunk_dtype,
            device_map=placement.device_map,
            max_memory=_accelerate_max_memory(placement.max_memory),
            **hf_kwargs,
        ).eval()
    except ValueError as exc:
        if "offload" not in str(exc):
            raise
        raise RuntimeError(
            "reference.device_map / reference.max_memory: the reference does not fit the devices "
            f"and memory given (accelerate would offload layers to disk): {exc}"
        ) from None
    head = model.get_output_embeddings()
    head_device = _execution_device(head)
    weight = _module_tensor(head, "weight")
    source = f"{str(weight.dtype).removeprefix('torch.')} load"
    if lm_head_fp32 and weight.dtype != torch.float32:
        stored = _checkpoint_tensor(model_path, _parameter_names(model, head.weight), hf_kwargs)
        if stored is not None:
            weight, source = stored, f"checkpoint ({str(stored.dtype).removeprefix('torch.')})"
    bias = _module_tensor(head, "bias") if getattr(head, "bias", None) is not None else None
    # accelerate records its map only when it dispatched over several devices; one device is "".
    device_map = getattr(model, "hf_device_map", None) or {"": head_device}
    return _Loaded(
        # dtype only: the modules stay where accelerate put them; float buffers are cast as above.
        trunk=model.get_decoder().to(dtype=trunk_dtype),
        head_weight_fp32=weight.detach().float().to(head_device),
        head_bias_fp32=None if bias is None else bias.detach().float().to(head_device),
        input_device=_execution_device(model.get_input_embeddings()),
        head_device=head_device,
        head_source=source,
        module_devices={name: str(device) for name, device in device_map.items()},
        softcap=getattr(model.config, "final_logit_softcapping", None),
    )


def _require_accelerate() -> None:
    try:
        import accelerate  # noqa: F401 - transformers places models with it
    except ImportError:
        raise RuntimeError(
            "reference.device_map needs accelerate in the engine environment, which lacks it: add "
            "it to the engine's install (engines.<name>.pip_args: [accelerate]) or pip install accelerate"
        ) from None


def _accelerate_max_memory(
    max_memory: dict[str, str | int] | None,
) -> dict[int | str, str | int] | None:
    """gate.yaml's device keys ("0", "cpu") as accelerate takes them: GPU indices are integers."""
    if max_memory is None:
        return None
    return {int(k) if k.isdigit() else k: v for k, v in max_memory.items()}


def _execution_device(module: torch.nn.Module) -> torch.device:
    """The device ``module`` runs on: accelerate's hook says so for offloaded modules."""
    hook = getattr(module, "_hf_hook", None)
    device = getattr(hook, "execution_device", None)
    if device is not None:
        return torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    return next(module.parameters()).device


def _module_tensor(module: torch.nn.Module, name: str) -> torch.Tensor:
    """``module``'s parameter ``name`` with its values, also when accelerate offloaded it (on meta)."""
    tensor: torch.Tensor = getattr(module, name)
    if tensor.device.type == "meta":
        weights_map = getattr(getattr(module, "_hf_hook", None), "weights_map", None)
        if weights_map is None:
            raise RuntimeError(
                f"reference.device_map: the output projection's {name} has no values"
            )
        tensor = weights_map[name]
    return tensor


def _parameter_names(model: torch.nn.Module, tensor: torch.Tensor) -> list[str]:
    """Every name ``tensor`` goes by in ``model`` (a tied projection has two)."""
    return [n for n, p in model.named_parameters(remove_duplicate=False) if p is tensor]


def _checkpoint_tensor(
    model_path: str, names: list[str], hf_kwargs: dict[str, Any]
) -> torch.Tensor | None:
    """The first of ``names`` found in the checkpoint's safetensors files, at their stored dtype.

    None when the checkpoint is not local or cached safetensors, or names none of them.
    """
    from safetensors import safe_open

    folder = _checkpoint_folder(model_path, hf_kwargs)
    for file in sorted(folder.glob("*.safetensors")) if folder else []:
        with safe_open(str(file), framework="pt") as fh:
            found = next((n for n in names if n in fh.keys()), None)  # noqa: SIM118 - not a dict
            if found is not None:
                return fh.get_tensor(found)
    return None


def _checkpoint_folder(model_path: str, hf_kwargs: dict[str, Any]) -> Path | None:
    if Path(model_path).is_dir():
        return Path(model_path)
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(model_path, revision=hf_kwargs.get("revision"), local_files_only=True)
        )
    except Exception:  # not cached: the projection is upcast from the loaded one instead
        return None


def _load_causal_lm(
    auto_cls, model_path: str, dtype: torch.dtype = torch.float32, **hf_kwargs: Any
):
    # transformers 5 renamed torch_dtype to dtype; probe instead of parsing versions.
    try:
        return auto_cls.from_pretrained(model_path, dtype=dtype, **hf_kwargs)
    except TypeError:
        return auto_cls.from_pretrained(model_path, torch_dtype=dtype, **hf_kwargs)


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
