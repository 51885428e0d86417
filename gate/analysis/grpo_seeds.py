"""The per-seed numbers of a mini GRPO run that grpo-trajectory pairs across engines.

Each seed of a run is one independent unit: seed ``s`` of the baseline, the old and the new engine
draws the same prompt schedule and trains from the same checkpoint, so a difference between two
engines' seed ``s`` carries no prompt-draw noise. Everything here reduces a run's arrays
(gate.contract.keys, ``grpo_*``) to one number per seed:

- ``eval_reward``: the trained policy's success rate on the held-out eval set;
- ``k3_growth``: how far the engine falls behind the trainer as updates are pushed, the mean log k3
  over a seed's steps above its level at the run's first rollout (that level, before any update,
  is train-inference-mismatch's to judge);
- ``entropy_drift``: the late steps' entropy minus the first step's;
- ``identical_groups``: the share of groups whose samples were all one completion.
"""

from __future__ import annotations

import math

import numpy as np

from gate.analysis.paired import late_minus_early, log_growth
from gate.contract import keys
from gate.contract.evidence import Evidence

# k3 below this reads as this: a tenth of the level train-inference-mismatch WARNs at (1e-3). An
# fp32 engine and trainer agree bitwise on CPU, and the log of a zero, or of rounding at 1e-9,
# would make a slope of noise.
K3_FLOOR = 1e-4

STATISTICS = ("eval_reward", "k3_growth", "entropy_drift", "identical_groups")


def has_eval(e: Evidence | None) -> bool:
    return e is not None and e.has(keys.GRPO_EVAL_SUCCESS) and e.has(keys.GRPO_REWARD)


def seed_ids(e: Evidence) -> list[int]:
    """The run seeds of the rows of ``e``'s [seeds, ...] arrays (engine.json's ``grpo.seeds``)."""
    rows = np.atleast_2d(e[keys.GRPO_REWARD]).shape[0]
    seeds = e.engine.grpo.get("seeds")
    if not isinstance(seeds, list) or len(seeds) != rows:
        return list(range(rows))  # an older record: seeds 0..n-1, as the runs then used
    return [int(s) for s in seeds]


def per_seed(e: Evidence) -> dict[str, np.ndarray]:
    """Every statistic of :data:`STATISTICS`, [seeds] in the order of :func:`seed_ids`."""
    k3 = np.atleast_2d(e[keys.grpo_key("k3_kl")]).astype(np.float64)
    entropy = np.atleast_2d(e[keys.grpo_key("entropy")]).astype(np.float64)
    identical = np.atleast_2d(e[keys.grpo_key("identical_groups")]).astype(np.float64)
    return {
        "eval_reward": np.atleast_2d(e[keys.GRPO_EVAL_SUCCESS]).astype(np.float64).mean(axis=1),
        "k3_growth": log_growth(k3, K3_FLOOR),
        "entropy_drift": late_minus_early(entropy),
        "identical_groups": np.nanmean(identical, axis=1),
    }


def checkpoint_eval(e: Evidence, samples: int) -> tuple[float, float]:
    """The checkpoint's eval reward through this engine and its standard error: the prompts are
    fixed, so only the sampling varies, p(1 - p) / (m - 1) per prompt of m = ``samples``."""
    success = e[keys.GRPO_EVAL0_SUCCESS].astype(np.float64)
    if not len(success):
        return math.nan, math.nan
    if samples < 2:
        return float(success.mean()), math.nan
    variance = np.sum(success * (1 - success) / (samples - 1)) / len(success) ** 2
    return float(success.mean()), float(math.sqrt(variance))
