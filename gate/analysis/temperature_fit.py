"""The temperature an engine's reported logprobs behave like, fitted against the trainer's logits.

At one position, processed logprobs are ``log_softmax(logits / T)`` after top-k/top-p masking; the
difference of two kept tokens' logprobs is ``(raw_i - raw_j) / T`` whatever the normaliser, so
top-k and top-p (which only renormalise) drop out. The engine reports the logprobs of its top-k
tokens at every sampled position, and the reference scores those same tokens raw
(``sample_trainer_topk_raw``), or after the penalties where they are on
(``sample_trainer_topk_penalised``: vLLM applies them before temperature). Regressing the
engine's differences on the trainer's through the origin gives ``1 / T_eff``; its standard error
is cluster-robust over positions (the differences at one position share a token), so the fit's
resolution is stated with it.

A raw-logprobs engine behaves like T=1; a temperature applied twice like T²; a sampler off by 3%
like 1.03·T. numpy only, vectorised over all positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gate.contract import evidence as ev
from gate.contract import keys


@dataclass(frozen=True)
class TemperatureFit:
    temperature: float  # T_eff: the engine's logprob differences are the trainer's divided by it
    stderr: float  # standard error of T_eff (cluster-robust over positions)
    pairs: int  # logprob differences used
    positions: int  # sampled positions that contributed at least one difference

    @property
    def rel_stderr(self) -> float:
        return self.stderr / self.temperature if self.temperature > 0 else float("nan")


def fit_temperature(engine_topk: np.ndarray, trainer_topk: np.ndarray) -> TemperatureFit | None:
    """Fit T_eff from [positions, k] engine and trainer logprobs of the same tokens; None if < 2 pairs.

    Entries that are not finite on either side (fewer than k reported, tokens top-k/top-p
    excluded: -inf) are left out; each position's differences are taken to its first usable token.
    """
    found = _pairs(engine_topk, trainer_topk)
    if found is None:
        return None
    x, y, row_of, rows_total = found
    sxx = float(np.dot(x, x))
    beta = float(np.dot(x, y)) / sxx  # 1 / T_eff
    # Cluster-robust variance of beta: residual scores summed per position first.
    score = np.bincount(row_of, weights=x * (y - beta * x), minlength=rows_total)
    var_beta = float(np.dot(score, score)) / sxx**2
    positions = int(np.count_nonzero(np.bincount(row_of, minlength=rows_total)))
    if beta <= 0:
        return TemperatureFit(float("inf"), float("inf"), len(x), positions)
    temperature = 1.0 / beta
    return TemperatureFit(temperature, np.sqrt(var_beta) / beta**2, len(x), positions)


def _pairs(
    engine_topk: np.ndarray, trainer_topk: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """(trainer differences, engine differences, their position, positions): each position's
    usable entries against its first usable one. None if fewer than 2 pairs or no trainer spread."""
    e = np.asarray(engine_topk, dtype=np.float64)
    r = np.asarray(trainer_topk, dtype=np.float64)
    if e.ndim != 2 or e.shape != r.shape or e.shape[1] < 2:
        return None
    ok = np.isfinite(e) & np.isfinite(r)
    has = np.any(ok, axis=1, keepdims=True)  # [rows, 1]
    first = np.argmax(ok, axis=1)  # index of each row's first usable entry
    rows = np.arange(len(e))
    with np.errstate(invalid="ignore"):  # -inf - -inf in unusable entries, masked out below
        d_e = e - e[rows, first][:, None]
        d_r = r - r[rows, first][:, None]
    use = ok & has & (np.arange(e.shape[1])[None, :] != first[:, None])
    x, y = d_r[use], d_e[use]
    if len(x) < 2 or not np.any(x != 0):
        return None
    return x, y, np.broadcast_to(rows[:, None], use.shape)[use], len(e)


def logit_noise(
    engine_topk: np.ndarray, trainer_topk: np.ndarray, quantile: float = 0.99
) -> float | None:
    """How far the engine's logit differences at one position stray from the trainer's, in logits.

    The ``quantile`` of |T_eff * (engine difference) - (trainer difference)| over the fit's pairs:
    the difference of two logits as each side computes them, with the fitted temperature taken
    out (so a wrong temperature is the fit's finding, not noise). A bf16 engine and trainer differ
    here by their kernels' rounding; an fp32 pair by almost nothing. None where the fit is.
    """
    fit = fit_temperature(engine_topk, trainer_topk)
    found = _pairs(engine_topk, trainer_topk)
    if fit is None or found is None or not np.isfinite(fit.temperature):
        return None
    x, y, _, _ = found
    return float(np.quantile(np.abs(fit.temperature * y - x), quantile))


def _fit_inputs(e: ev.Evidence) -> tuple[np.ndarray, np.ndarray] | None:
    g = keys.SAMPLE
    # Penalties act before temperature: with them on, the trainer's side is the penalised logprobs.
    penalised = f"{g}_{keys.TRAINER_TOPK_PENALISED}" in e.arrays
    topk, sampled = (
        (keys.TRAINER_TOPK_PENALISED, keys.TRAINER_PENALISED)
        if penalised
        else (keys.TRAINER_TOPK_RAW, keys.TRAINER_RAW)
    )
    trainer = e.arrays.get(f"{g}_{topk}")
    engine = e.arrays.get(f"{g}_{keys.TOPK_LOGPROBS}")
    if trainer is None or engine is None or trainer.shape != engine.shape:
        return None
    if f"{g}_{sampled}" not in e.arrays:
        return None
    # The sampled token adds one more pair at positions where it lies outside the engine's top-k.
    sampled_e = e[f"{g}_{keys.ENGINE_LOGPROB}"][:, None]
    sampled_r = e[f"{g}_{sampled}"][:, None]
    in_topk = (e[f"{g}_{keys.TOPK_IDS}"] == e[f"{g}_{keys.TOKEN_IDS}"][:, None]).any(axis=1)
    sampled_r = np.where(in_topk[:, None], np.nan, sampled_r)
    return np.hstack([engine, sampled_e]), np.hstack([trainer, sampled_r])


def evidence_logit_noise(e: ev.Evidence) -> float | None:
    """``logit_noise`` over one engine's sampled positions (as ``fit_evidence`` pairs them)."""
    inputs = _fit_inputs(e)
    return None if inputs is None else logit_noise(*inputs)


def fit_evidence(e: ev.Evidence) -> TemperatureFit | None:
    """The fit over one engine's sampled positions: its top-k plus the sampled token itself.

    None when the evidence has no trainer scores of the top-k tokens (evidence from gate versions
    before them, or ``sampling.logprobs: 0``).
    """
    inputs = _fit_inputs(e)
    return None if inputs is None else fit_temperature(*inputs)
