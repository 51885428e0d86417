"""Per-engine evidence: the array layout of ``evidence.npz`` and its validation.

Ragged data is stored flat with offsets (CSR style): sequence ``i`` owns ``x[offsets[i]:offsets[i+1]]``.
Groups share a prefix: ``sample_`` (the rollout pass), ``greedy_`` (temperature 0) and ``tf_``
(teacher-forced fixed sequences). docs/evidence.md describes every key. Imported by the worker and
the orchestrator alike, so numpy and the standard library only.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from gate.request import ENGINE_FILE, EVIDENCE_FILE, TEXTS_FILE

# Group prefixes
SAMPLE = "sample"
GREEDY = "greedy"
TF = "tf"

# Prompt-level arrays
PROMPT_OFFSETS = "prompt_offsets"
PROMPT_TOKEN_IDS = "prompt_token_ids"

# Per-group suffixes
PROMPT_INDEX = "prompt_index"
SAMPLE_INDEX = "sample_index"
OFFSETS = "offsets"
TOKEN_IDS = "token_ids"
ENGINE_LOGPROB = "engine_logprob"
ENGINE_RANK = "engine_rank"
TOPK_IDS = "topk_ids"
TOPK_LOGPROBS = "topk_logprobs"
FINISH = "finish"
TRAINER_RAW = "trainer_logprob_raw"
TRAINER_PROCESSED = "trainer_logprob_processed"
TRAINER_RAW_BF16_HEAD = "trainer_logprob_raw_bf16_head"
# The sampled token lies within one ULP of the top-k/top-p boundary (engine dtype): undecidable.
# Absent in evidence from gate versions before it (read as "none at the boundary").
TRAINER_AT_BOUNDARY = "trainer_at_boundary"
# The smallest logit top-k/top-p keeps minus the token's (> 0: outside the transform; NaN: none
# applies): how far outside the nucleus the reference puts a sampled token. Absent before it was.
TRAINER_BOUNDARY_GAP = "trainer_boundary_gap"
# The probability (after temperature and top-k) of the tokens more likely than the sampled one:
# top-p keeps a token while it is < top_p. NaN where top-p is off; absent before it was recorded.
TRAINER_MASS_ABOVE = "trainer_mass_above"
# The reference's log_softmax(logits / T) over the whole vocabulary: what a trainer that does not
# renormalise over the sampler's kept tokens computes; minus the processed logprob, the log of the
# kept mass (support-mismatch, in train-inference-mismatch). Absent before it was recorded.
TRAINER_TEMPERED = "trainer_logprob_tempered"
# The reference's raw logprobs of the engine's top-k tokens ([tokens, k], NaN where the engine
# reported fewer): the effective-temperature fit. Absent in evidence from gate versions before it.
TRAINER_TOPK_RAW = "trainer_topk_raw"
# With penalties on, the fit's inputs are after the penalties, before temperature: the reference's
# logprobs of the engine's top-k ([tokens, k]) and of the sampled token ([tokens]), in place of
# trainer_topk_raw and trainer_logprob_raw. Absent without penalties and before they were recorded.
TRAINER_TOPK_PENALISED = "trainer_topk_penalised"
TRAINER_PENALISED = "trainer_logprob_penalised"
# The engine's own prefill logprob of each greedy token: the greedy sequence scored again as a
# prompt in the same engine (NaN: not rescored). Absent before it was recorded.
PREFILL_LOGPROB = "prefill_logprob"

# Per sampled sequence (gate.worker.replay.text_round_trip): the engine's text is not the
# tokenizer's decoding of its ids; and where encoding that text again first departs from the ids
# (-1: it gives them back). Absent before they were recorded.
TEXT_MISMATCH = "text_mismatch"
RETOKENIZED_AT = "retokenized_at"

FINISH_NAMES = ("stop", "length", "abort", "other")

# texts.json key: the decoded text of every distinct prompt and sampled token id, ``{"123": " the"}``.
# Absent in evidence from gate versions before it: tokens then show by id (:meth:`Evidence.token_label`).
TOKEN_TEXT = "token_text"

# The reference's per-token logprobs must be finite: NaN there is the gate's own failure.
_REFERENCE_FINITE = (f"{SAMPLE}_{TRAINER_RAW}", f"{TF}_{TRAINER_RAW}")
# The engine's: NaN/inf there is a finding about the engine (logprob-integrity FAILs it, naming the
# positions), so only a caller that judges evidence accepts it (``allow_nonfinite_engine``); a
# baseline or a calibration is never made from it.
_ENGINE_FINITE = (
    f"{SAMPLE}_{ENGINE_LOGPROB}",
    f"{GREEDY}_{ENGINE_LOGPROB}",
    f"{TF}_{ENGINE_LOGPROB}",
)
# The reference's processed logprob is -inf for a sampled token that the requested top-k / top-p
# excludes: the engine sampled what the transform forbids. That is a finding (logprob-semantics
# judges it), not unusable evidence; NaN and +inf still are.
_FINITE_OR_MINUS_INF = (f"{SAMPLE}_{TRAINER_PROCESSED}",)


class EvidenceError(ValueError):
    """Evidence is missing, truncated or holds values no check can use."""


@dataclass
class Evidence:
    """One engine's evidence, loaded from its output folder."""

    path: Path
    arrays: dict[str, np.ndarray]
    engine: dict[str, Any]  # engine.json
    texts: dict[str, Any]  # texts.json

    def __getitem__(self, key: str) -> np.ndarray:
        return self.arrays[key]

    @property
    def n_prompts(self) -> int:
        return len(self.arrays[PROMPT_OFFSETS]) - 1

    def prompt_tokens(self, i: int) -> np.ndarray:
        off = self.arrays[PROMPT_OFFSETS]
        return self.arrays[PROMPT_TOKEN_IDS][off[i] : off[i + 1]]

    @cached_property
    def token_text(self) -> dict[int, str]:
        """Decoded text by token id (texts.json); empty for evidence written before it was recorded."""
        raw = self.texts.get(TOKEN_TEXT) if isinstance(self.texts, dict) else None
        return _token_text(raw, self.path / TEXTS_FILE)

    def token_label(self, token_id: int) -> str:
        """The token's text as the engine emitted it (untrusted), or ``⟨id N⟩`` where none is recorded."""
        text = self.token_text.get(int(token_id))
        return f"⟨id {int(token_id)}⟩" if text is None else text

    def sequence_labels(self, group: str, seqs: Iterable[int]) -> list[str]:
        """ "prompt P sample S" for sequences of a group (sample_, greedy_, ...): P the prompt set's
        id where texts.json has it, S only where the group has several samples per prompt."""
        names = self.texts.get("prompt_ids") if isinstance(self.texts, dict) else None
        prompts = self.arrays.get(f"{group}_{PROMPT_INDEX}")
        samples = self.arrays.get(f"{group}_{SAMPLE_INDEX}")
        out = []
        for s in seqs:
            p = int(prompts[s]) if prompts is not None else int(s)
            name = names[p] if isinstance(names, list) and p < len(names) else f"#{p}"
            out.append(
                f"prompt {name}" + (f" sample {int(samples[s])}" if samples is not None else "")
            )
        return out

    def decode(self, token_ids: Iterable[int]) -> str:
        """Token texts joined: readable context, though a character split across tokens shows as U+FFFD."""
        return "".join(self.token_label(t) for t in token_ids)


def load(folder: str | Path, allow_nonfinite_engine: bool = False) -> Evidence:
    """One engine's evidence, validated; ``allow_nonfinite_engine`` for callers that judge it."""
    folder = Path(folder)
    for name in (EVIDENCE_FILE, ENGINE_FILE, TEXTS_FILE):
        if not (folder / name).is_file():
            raise EvidenceError(f"{folder / name}: missing")
    try:
        with np.load(folder / EVIDENCE_FILE, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        engine = json.loads((folder / ENGINE_FILE).read_text(encoding="utf-8"))
        texts = json.loads((folder / TEXTS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise EvidenceError(f"{folder}: unreadable evidence: {exc}") from None
    evidence = Evidence(path=folder, arrays=arrays, engine=engine, texts=texts)
    validate(evidence, allow_nonfinite_engine=allow_nonfinite_engine)
    _ = evidence.token_text  # malformed token text fails here, naming the file, not in a check
    return evidence


def validate(
    evidence: Evidence, filename: str = EVIDENCE_FILE, allow_nonfinite_engine: bool = False
) -> None:
    """Shape and value checks; raises EvidenceError naming the array."""
    a = evidence.arrays
    where = evidence.path / filename
    for key in (PROMPT_OFFSETS, PROMPT_TOKEN_IDS, f"{SAMPLE}_{OFFSETS}", f"{SAMPLE}_{TOKEN_IDS}"):
        if key not in a:
            raise EvidenceError(f"{where}: {key}: missing")
    _check_offsets(a[PROMPT_OFFSETS], len(a[PROMPT_TOKEN_IDS]), where, PROMPT_OFFSETS)
    for group in (SAMPLE, GREEDY, TF):
        if f"{group}_{OFFSETS}" not in a:
            continue
        offsets = a[f"{group}_{OFFSETS}"]
        n_tokens = int(offsets[-1]) if len(offsets) else 0
        _check_offsets(offsets, n_tokens, where, f"{group}_{OFFSETS}")
        for key, arr in a.items():
            if (
                key.startswith(f"{group}_")
                and key != f"{group}_{OFFSETS}"
                and _is_per_token(key)
                and arr.shape[0] != n_tokens
            ):
                raise EvidenceError(f"{where}: {key}: {arr.shape[0]} rows, expected {n_tokens}")
    sequences = len(a[f"{SAMPLE}_{OFFSETS}"]) - 1
    for key in (f"{SAMPLE}_{TEXT_MISMATCH}", f"{SAMPLE}_{RETOKENIZED_AT}"):
        if key in a and a[key].shape != (sequences,):
            raise EvidenceError(f"{where}: {key}: shape {a[key].shape}, expected ({sequences},)")
    for key in _REFERENCE_FINITE:
        if key in a and not np.all(np.isfinite(a[key])):
            bad = int(np.count_nonzero(~np.isfinite(a[key])))
            raise EvidenceError(
                f"{where}: {key}: {bad} non-finite value(s) (NaN/inf) in reference output"
            )
    for key in () if allow_nonfinite_engine else _ENGINE_FINITE:
        if key in a and not np.all(np.isfinite(a[key])):
            bad = int(np.count_nonzero(~np.isfinite(a[key])))
            raise EvidenceError(
                f"{where}: {key}: {bad} non-finite value(s) (NaN/inf) in engine output"
            )
    for key in _FINITE_OR_MINUS_INF:
        if key in a and not np.all(np.isfinite(a[key]) | np.isneginf(a[key])):
            bad = int(np.count_nonzero(~(np.isfinite(a[key]) | np.isneginf(a[key]))))
            raise EvidenceError(f"{where}: {key}: {bad} NaN/+inf value(s) in reference output")


def _token_text(raw: Any, where: Path) -> dict[int, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise EvidenceError(f"{where}: {TOKEN_TEXT}: expected a mapping of token id to text")
    try:
        table = {int(k): v for k, v in raw.items()}
    except ValueError:
        raise EvidenceError(f"{where}: {TOKEN_TEXT}: a key is not a token id") from None
    if not all(isinstance(v, str) for v in table.values()):
        raise EvidenceError(f"{where}: {TOKEN_TEXT}: a value is not a string")
    return table


def _is_per_token(key: str) -> bool:
    per_sequence = (PROMPT_INDEX, SAMPLE_INDEX, FINISH, TEXT_MISMATCH, RETOKENIZED_AT,
                    "input_offsets", "input_ids")  # fmt: skip
    return not key.endswith(per_sequence)


def _check_offsets(offsets: np.ndarray, total: int, where: Path, key: str) -> None:
    if (
        offsets.ndim != 1
        or len(offsets) < 1
        or offsets[0] != 0
        or offsets[-1] != total
        or np.any(np.diff(offsets) < 0)
    ):
        raise EvidenceError(f"{where}: {key}: not monotone offsets ending at {total}")


def token_ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + c) for each (s, c), without a Python loop: the flat indices of
    token spans (sequences, prompts, kept prefixes) in the evidence's concatenated arrays."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    begins = np.repeat(
        np.asarray(starts, dtype=np.int64) - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts
    )
    return begins + np.arange(total, dtype=np.int64)


@dataclass(frozen=True)
class SampledPairs:
    """Trainer and engine logprobs of the sampled tokens the requested transform allows.

    A token the trainer's processed logprob puts at -inf was sampled although top-k / top-p
    excludes it; it has no finite d, so it is left out here and counted in ``masked``
    (logprob-semantics judges that count). ``offsets`` index the kept tokens per sequence.
    """

    trainer: np.ndarray
    engine: np.ndarray
    offsets: np.ndarray
    masked: int
    total: int

    @property
    def masked_fraction(self) -> float:
        return self.masked / self.total if self.total else 0.0


def sampled_pairs(e: Evidence, trainer_key: str = TRAINER_PROCESSED) -> SampledPairs:
    trainer, engine = e[f"{SAMPLE}_{trainer_key}"], e[f"{SAMPLE}_{ENGINE_LOGPROB}"]
    offsets = e[f"{SAMPLE}_{OFFSETS}"]
    keep = np.isfinite(trainer)
    if keep.all():
        return SampledPairs(trainer, engine, offsets, 0, len(trainer))
    # Kept tokens before each sequence start: the new offsets, without a per-sequence loop.
    kept_before = np.concatenate([[0], np.cumsum(keep, dtype=np.int64)])
    return SampledPairs(
        trainer[keep], engine[keep], kept_before[offsets], int((~keep).sum()), len(trainer)
    )
