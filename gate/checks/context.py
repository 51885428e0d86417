"""Everything a check may look at: both engines' evidence, the baseline, noise floors, the run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gate import evidence as ev
from gate.evidence import Evidence

if TYPE_CHECKING:
    from gate.baseline import Baseline


@dataclass
class Context:
    new: Evidence
    old: Evidence | None
    run: dict[str, Any]  # run.json
    baseline: Baseline | None = None
    baseline_comparable: bool = (
        False  # same model, prompts and settings: token-level comparison allowed
    )
    # the baseline's calibrated noise describes this run (same engine inputs; any sampling seed)
    noise_applicable: bool = False
    acknowledge: frozenset[str] = frozenset()

    @property
    def sampling(self) -> dict[str, Any]:
        return self.run["sampling"]

    def noise(self, metric: str) -> float | None:
        """The calibrated noise floor of ``metric``, where the baseline's calibration applies."""
        if self.baseline is None or not self.noise_applicable:
            return None
        return self.baseline.noise.get(metric)

    def engines(self) -> list[tuple[str, Evidence]]:
        return [(n, e) for n, e in (("old", self.old), ("new", self.new)) if e is not None]

    def references(self) -> list[tuple[str, Evidence]]:
        """What the new engine is compared with: the comparable baseline first, then the old engine."""
        refs = []
        if self.baseline is not None and self.baseline_comparable:
            refs.append(("baseline", self.baseline.evidence))
        if self.old is not None:
            refs.append(("old", self.old))
        return refs

    @property
    def transform_is_identity(self) -> bool:
        """Raw and processed logprobs coincide: temperature 1 and no top-k / top-p."""
        s = self.sampling
        return s["temperature"] == 1.0 and s["top_k"] in (0, -1) and s["top_p"] >= 1.0


def sequences(e: Evidence, group: str) -> list[np.ndarray]:
    off, ids = e[f"{group}_{ev.OFFSETS}"], e[f"{group}_{ev.TOKEN_IDS}"]
    return np.split(ids, off[1:-1])


def per_prompt(
    e: Evidence, group: str, per_token: np.ndarray, offsets: np.ndarray | None = None
) -> np.ndarray:
    """Per-prompt mean of a per-token array (sequences averaged within each prompt).

    ``offsets`` replaces the group's own when ``per_token`` holds a subset of its tokens
    (:func:`sampled_pairs` drops masked ones).
    """
    from gate.metrics import per_group_mean

    offsets = e[f"{group}_{ev.OFFSETS}"] if offsets is None else offsets
    return per_group_mean(per_token, offsets, e[f"{group}_{ev.PROMPT_INDEX}"], e.n_prompts)


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


def sampled_pairs(e: Evidence, trainer_key: str = ev.TRAINER_PROCESSED) -> SampledPairs:
    trainer, engine = e[f"{ev.SAMPLE}_{trainer_key}"], e[f"{ev.SAMPLE}_{ev.ENGINE_LOGPROB}"]
    offsets = e[f"{ev.SAMPLE}_{ev.OFFSETS}"]
    keep = np.isfinite(trainer)
    if keep.all():
        return SampledPairs(trainer, engine, offsets, 0, len(trainer))
    # Kept tokens before each sequence start: the new offsets, without a per-sequence loop.
    kept_before = np.concatenate([[0], np.cumsum(keep, dtype=np.int64)])
    return SampledPairs(
        trainer[keep], engine[keep], kept_before[offsets], int((~keep).sum()), len(trainer)
    )
