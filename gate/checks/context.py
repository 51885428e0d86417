"""Everything a check may look at: both engines' evidence, the baseline, noise floors, the run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gate.contract import keys
from gate.contract.evidence import Evidence, SampledPairs, sampled_pairs  # noqa: F401 (re-exported)

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
    # reference.normalize: the vocabulary the trainer normalises a sampled token's logprob over
    trainer_normalize: str = "full"

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
        """Raw and processed logprobs coincide: temperature 1, no top-k / top-p, no penalties."""
        s = self.sampling
        return (
            s["temperature"] == 1.0
            and s["top_k"] in (0, -1)
            and s["top_p"] >= 1.0
            and not self.penalties
        )

    @property
    def penalties(self) -> dict[str, float]:
        """The sampling penalties that are on (run.json records only those)."""
        return {k: v for k, v in self.sampling.items() if k.endswith("_penalty")}


def sequences(e: Evidence, group: str) -> list[np.ndarray]:
    off, ids = e[f"{group}_{keys.OFFSETS}"], e[f"{group}_{keys.TOKEN_IDS}"]
    return np.split(ids, off[1:-1])


def per_prompt(
    e: Evidence, group: str, per_token: np.ndarray, offsets: np.ndarray | None = None
) -> np.ndarray:
    """Per-prompt mean of a per-token array (sequences averaged within each prompt).

    ``offsets`` replaces the group's own when ``per_token`` holds a subset of its tokens
    (:func:`sampled_pairs` drops masked ones).
    """
    from gate.metrics import per_group_mean

    offsets = e[f"{group}_{keys.OFFSETS}"] if offsets is None else offsets
    return per_group_mean(per_token, offsets, e[f"{group}_{keys.PROMPT_INDEX}"], e.n_prompts)


# SampledPairs and sampled_pairs live in gate.contract.evidence (the baseline writer reads them too); the
# checks import them from here.
