"""Per-engine evidence: one engine's output folder loaded and validated.

``evidence.npz`` holds the arrays :mod:`gate.contract.keys` declares (ragged data flat with
offsets: sequence ``i`` owns ``x[offsets[i]:offsets[i+1]]``), ``engine.json`` the
:class:`~gate.contract.engine_record.EngineRecord`, ``texts.json`` decoded text for humans.
docs/evidence.md describes every key. Imported by the worker and the orchestrator alike, so numpy,
msgspec and the standard library only.
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

from gate.contract import keys
from gate.contract.engine_record import EngineRecord, EngineRecordError
from gate.contract.keys import (
    ENGINE_LOGPROB,
    GREEDY,
    OFFSETS,
    PROMPT_INDEX,
    PROMPT_OFFSETS,
    PROMPT_TOKEN_IDS,
    SAMPLE,
    SAMPLE_INDEX,
    TF,
    TOKEN_IDS,
    TRAINER_PROCESSED,
    TRAINER_RAW,
    Axis,
)
from gate.contract.request import ENGINE_FILE, EVIDENCE_FILE, TEXTS_FILE

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
    engine: EngineRecord  # engine.json
    texts: dict[str, Any]  # texts.json

    def has(self, key: str) -> bool:
        """Whether the optional array ``key`` (a name from gate.contract.keys) was recorded."""
        return key in self.arrays

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
        engine_json = json.loads((folder / ENGINE_FILE).read_text(encoding="utf-8"))
        texts = json.loads((folder / TEXTS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise EvidenceError(f"{folder}: unreadable evidence: {exc}") from None
    try:
        engine = EngineRecord.from_json(engine_json, folder / ENGINE_FILE)
    except EngineRecordError as exc:
        raise EvidenceError(str(exc)) from None
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
    check_layout(a, where)
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


def check_layout(arrays: dict[str, np.ndarray], where: Path) -> None:
    """Every array is declared (gate.contract.keys) and runs along its pass's axis; the worker
    calls this before it writes, :func:`validate` after reading."""
    for key in arrays:
        if keys.declared(key) is None:
            raise EvidenceError(
                f"{where}: {key}: not an evidence key of schema {keys.EVIDENCE_SCHEMA_VERSION}"
            )
    for passname in keys.PASSES:
        _check_pass(arrays, passname, where)


def _check_pass(a: dict[str, np.ndarray], passname: str, where: Path) -> None:
    """Every array of one pass runs along its declared axis: TOKEN arrays have the pass's token
    count (``offsets[-1]``, or one count they agree on where the pass has no offsets), SEQUENCE
    arrays its sequence count, input ids their input offsets' end, GRPO arrays one [seeds, steps]."""
    present = [k for k in keys.keys_of(passname) if k.name in a]
    if not present:
        return
    by_axis: dict[Axis, list[str]] = {}
    for k in present:
        by_axis.setdefault(k.axis, []).append(k.name)
    expected: dict[Axis, int] = {}
    for name in by_axis.get(Axis.OFFSETS, []):
        offsets = a[name]
        if passname == keys.PROMPTS:
            _check_offsets(offsets, len(a[PROMPT_TOKEN_IDS]), where, name)
            continue
        _check_offsets(offsets, int(offsets[-1]) if len(offsets) else 0, where, name)
        expected = {Axis.TOKEN: int(offsets[-1]), Axis.SEQUENCE: len(offsets) - 1}
    for name in by_axis.get(Axis.INPUT_OFFSETS, []):
        n_inputs = len(a[n]) if (n := keys.pass_key(passname, keys.INPUT_IDS)) in a else 0
        _check_offsets(a[name], n_inputs, where, name)
    for axis in (Axis.TOKEN, Axis.SEQUENCE):
        names = by_axis.get(axis, [])
        if not names:
            continue
        want = expected.get(axis, a[names[0]].shape[0] if a[names[0]].ndim else -1)
        for name in names:
            rows = a[name].shape[0] if a[name].ndim else -1
            if rows != want:
                raise EvidenceError(
                    f"{where}: {name}: {rows} rows, expected {want} ({axis.value}s)"
                )
    grids = {
        a[n].shape if a[n].ndim == 2 else a[n][None, :].shape
        for n in by_axis.get(Axis.SEED_STEP, [])
    }
    if len(grids) > 1:
        raise EvidenceError(f"{where}: grpo_*: [seeds, steps] shapes differ: {sorted(grids)}")
    _check_eval(a, by_axis, grids, where)


def _check_eval(
    a: dict[str, np.ndarray],
    by_axis: dict[Axis, list[str]],
    grids: set[tuple[int, ...]],
    where: Path,
) -> None:
    """The GRPO eval arrays: one eval set ([E]), and one row per trained seed ([seeds, E])."""
    sizes = {a[n].shape for n in by_axis.get(Axis.EVAL_PROMPT, [])}
    sizes |= {a[n].shape[1:] for n in by_axis.get(Axis.SEED_EVAL, []) if a[n].ndim == 2}
    if len(sizes) > 1 or any(a[n].ndim != 2 for n in by_axis.get(Axis.SEED_EVAL, [])):
        raise EvidenceError(f"{where}: grpo eval arrays: eval-set shapes differ: {sorted(sizes)}")
    seeds = {g[0] for g in grids}
    for n in by_axis.get(Axis.SEED_EVAL, []):
        if seeds and a[n].shape[0] not in seeds:
            raise EvidenceError(
                f"{where}: {n}: {a[n].shape[0]} seeds, the per-step arrays have {sorted(seeds)}"
            )


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
