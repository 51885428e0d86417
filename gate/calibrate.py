"""A/A calibration: the old engine against itself, to measure each metric's noise floor.

Two replays of the same engine with the same per-prompt seeds, the second submitting prompts in a
permuted order so batch composition (and with it kernel numerics) changes. Whatever the checks
measure between them is noise; relative thresholds (``fail: "6x noise"``) scale from it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gate import evidence as ev
from gate.checks.context import per_prompt
from gate.checks.forward_drift import aligned_teacher_forced
from gate.config import GateConfig
from gate.metrics import bootstrap_mean_diff_ci, mismatch
from gate.replay import EngineJob, RunResult, run_gate

NOISE_FILE = "noise.json"
REPLICA = "old-permuted"


def calibration_jobs(cfg: GateConfig) -> list[EngineJob]:
    old = cfg.engines["old"]
    # The first replay also runs GRPO over band_seeds: the baseline's band per metric per step.
    return [
        EngineJob("old", old, grpo_seeds=tuple(cfg.grpo.band_seeds)),
        EngineJob(REPLICA, old, order_seed=cfg.sampling.seed + 1),
    ]


def noise_floors(a: ev.Evidence, b: ev.Evidence) -> dict[str, float]:
    """What the checks' noise-relative metrics read between two replays of the same engine."""
    lp_a, lp_b, _, _ = aligned_teacher_forced(a, b)
    drift = np.abs(lp_a - lp_b)
    g = ev.SAMPLE
    abs_d = {
        k: np.abs(
            e[f"{g}_{ev.TRAINER_PROCESSED}"].astype(np.float64) - e[f"{g}_{ev.ENGINE_LOGPROB}"]
        )
        for k, e in (("a", a), ("b", b))
    }
    low, high, point = bootstrap_mean_diff_ci(
        per_prompt(a, g, abs_d["a"]), per_prompt(b, g, abs_d["b"])
    )
    stats = [
        mismatch(
            e[f"{g}_{ev.TRAINER_PROCESSED}"], e[f"{g}_{ev.ENGINE_LOGPROB}"], e[f"{g}_{ev.OFFSETS}"]
        )
        for e in (a, b)
    ]
    return {
        "mean_abs_drift": float(drift.mean()) if len(drift) else 0.0,
        "max_abs_drift": float(drift.max()) if len(drift) else 0.0,
        # The regression test compares a CI bound with this: noise is the larger of the A/A shift and half-width.
        "regression_mean_abs_diff": float(max(abs(point), (high - low) / 2))
        if np.isfinite(point)
        else 0.0,
        "k3_kl": abs(stats[0].k3_kl - stats[1].k3_kl),
        "token_mult_prob_error": abs(
            stats[0].token_mult_prob_error - stats[1].token_mult_prob_error
        ),
    }


def calibrate(
    cfg: GateConfig, out: Path | None, log: Callable[[str], None]
) -> tuple[RunResult, dict[str, float] | None]:
    result = run_gate(cfg, out, log, calibration_jobs(cfg))
    if result.status != "ok":
        return result, None
    noise = noise_floors(
        ev.load(result.run_dir / "engines" / "old"), ev.load(result.run_dir / "engines" / REPLICA)
    )
    (result.run_dir / NOISE_FILE).write_text(
        json.dumps(noise, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    return result, noise
