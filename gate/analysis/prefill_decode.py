"""Prefill against decode, for logprob-integrity: does the engine agree with itself?

The worker scores each greedy sequence again as a prompt (gate/worker/prefill.py), so every greedy
token has two logprobs from one engine: the one decoding returned and the one prefill gives
(``greedy_prefill_logprob``). No reference plays a part. Per sequence, the two are compared as
NeMo-RL compares rollout and training logprobs, ``token_mult_prob_error = exp(mean |Δ|)``; a
sequence whose error passes 1.05 (NeMo-RL's own bar, #3365) disagrees. NeMo-RL #2100 / #4243
found vLLM's decode and prefill disagreeing on 15-20% of sequences; an engine's kernel noise
(batch shapes, bf16, run-to-run noise) moves a sequence's error by a few thousandths.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gate.contract import evidence as ev
from gate.contract import keys

PREFILL = f"{keys.GREEDY}_{keys.PREFILL_LOGPROB}"
DECODE = f"{keys.GREEDY}_{keys.ENGINE_LOGPROB}"
# Per sequence: exp(mean |decode - prefill|) above this disagrees (NeMo-RL's token_mult_prob_error bar).
SEQUENCE_ERROR_BAR = 1.05
# logprobs_mode values whose greedy logprobs are logprobs (the *_logits modes return logits).
LOGPROB_MODES = (None, "raw_logprobs", "processed_logprobs")


@dataclass(frozen=True)
class PrefillDecode:
    """One engine's decode-versus-prefill comparison over its greedy sequences."""

    sequences: int  # greedy sequences with at least one token compared
    disagreeing: np.ndarray  # indices (into the greedy sequences) whose error passes the bar
    sequence_error: np.ndarray  # exp(mean |Δ|) per compared sequence
    tokens: int  # tokens compared
    not_compared: int  # greedy tokens with no finite pair (not rescored: past max_model_len)
    mean_abs: float  # mean |Δ| over the compared tokens
    max_abs: float

    @property
    def disagreeing_fraction(self) -> float:
        return len(self.disagreeing) / self.sequences if self.sequences else float("nan")


def compare(e: ev.Evidence) -> PrefillDecode | None:
    """The comparison for ``e``; None where it has no rescored greedy pass or reports logits."""
    if PREFILL not in e.arrays or DECODE not in e.arrays:
        return None
    if e.engine.effective.get("logprobs_mode") not in LOGPROB_MODES:
        return None
    offsets = np.asarray(e[f"{keys.GREEDY}_{keys.OFFSETS}"], dtype=np.int64)
    decode = np.asarray(e[DECODE], dtype=np.float64)
    prefill = np.asarray(e[PREFILL], dtype=np.float64)
    both = np.isfinite(decode) & np.isfinite(prefill)
    diff = np.where(both, np.abs(decode - prefill), 0.0)
    seq = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    counts = np.bincount(seq, weights=both, minlength=len(offsets) - 1)
    sums = np.bincount(seq, weights=diff, minlength=len(offsets) - 1)
    compared = np.flatnonzero(counts > 0)
    error = np.exp(sums[compared] / counts[compared])
    n = int(both.sum())
    return PrefillDecode(
        sequences=len(compared),
        disagreeing=compared[error > SEQUENCE_ERROR_BAR],
        sequence_error=error,
        tokens=n,
        not_compared=int(both.size - n),
        mean_abs=float(diff.sum() / n) if n else float("nan"),
        max_abs=float(diff.max()) if n else float("nan"),
    )
