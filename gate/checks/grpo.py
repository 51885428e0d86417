"""grpo-trajectory: the new engine's mini GRPO run against the baseline's band and the old engine.

The baseline stores the reference engine's trajectories over several seeds; the band per metric
per step is their min..max widened by a per-metric margin (the run-to-run noise of a tiny model on
CPU is zero for the mismatch metrics, so the margin is what keeps the band from being a line).
Mismatch metrics (k3 KL, clip fraction, mean |d|, token_mult_prob_error) only have an upper edge
and FAIL when crossed: the engine's logprobs moved away from the trainer's during RL. Reward,
entropy and response length have both edges and WARN: they are noisier and move for benign reasons.
The first step where each metric leaves its band is reported.
"""

from __future__ import annotations

import numpy as np

from gate.checks.base import CheckResult, CheckSpec, Measurement
from gate.checks.weight_sync import push_failure
from gate.verdict import Status, worst

ID = "grpo-trajectory"
TITLE = "Mini GRPO trajectory"

# metric: (absolute margin, relative margin of the reference mean, edges, status when outside)
BANDS = {
    "k3_kl": (5e-4, 0.0, "upper", Status.FAIL),
    "clip_frac": (0.01, 0.0, "upper", Status.FAIL),
    "mean_abs_diff": (2e-3, 0.0, "upper", Status.FAIL),
    "token_mult_prob_error": (2e-3, 0.0, "upper", Status.FAIL),
    "reward": (0.15, 0.0, "both", Status.WARN),
    "entropy": (0.0, 0.15, "both", Status.WARN),
    "response_length": (0.0, 0.15, "both", Status.WARN),
}
INFO = ("step_s", "push_s")


def band(
    reference: np.ndarray, abs_margin: float, rel_margin: float, edges: str
) -> tuple[np.ndarray, np.ndarray]:
    """[steps] low/high from [seeds, steps] reference trajectories."""
    margin = np.maximum(abs_margin, rel_margin * np.abs(reference.mean(axis=0)))
    low = (
        reference.min(axis=0) - margin if edges == "both" else np.full(reference.shape[1], -np.inf)
    )
    return low, reference.max(axis=0) + margin


def first_exit(values: np.ndarray, low: np.ndarray, high: np.ndarray) -> int | None:
    outside = np.flatnonzero((values < low) | (values > high))
    return int(outside[0]) if len(outside) else None


def _trajectories(e) -> dict[str, np.ndarray] | None:
    if e is None or "grpo_reward" not in e.arrays:
        return None
    return {
        m: np.atleast_2d(e[f"grpo_{m}"]).astype(np.float64)
        for m in (*BANDS, *INFO)
        if f"grpo_{m}" in e.arrays
    }


def run(ctx, settings) -> CheckResult:
    failed = (
        push_failure(ctx.new.engine.get("grpo") or {}, ID, TITLE, "The GRPO run")
        if ctx.new is not None
        else None
    )
    if failed is not None:
        return failed
    new = _trajectories(ctx.new)
    unsupported = (
        (ctx.new.engine.get("grpo") or {}).get("unsupported") if ctx.new is not None else None
    )
    if new is None and unsupported:  # asked for, but the engine offers no weight push gate knows
        return CheckResult(ID, TITLE, Status.ERROR, "the GRPO run could not run: no weight push for this engine",
                           f"{unsupported[:1].upper()}{unsupported[1:]}.", details={"unsupported": unsupported})  # fmt: skip
    if new is None:
        return CheckResult(ID, TITLE, Status.SKIP, "the GRPO run did not run (grpo.enabled: false)")
    base = (
        _trajectories(ctx.baseline.evidence)
        if ctx.baseline is not None and ctx.baseline_comparable
        else None
    )
    old = _trajectories(ctx.old)
    steps = new["reward"].shape[1]
    # the band: the baseline's trajectories where comparable, else the old engine's
    found = next(
        (
            (candidate, name)
            for candidate, name in ((base, "baseline"), (old, "old"))
            if candidate is not None and candidate["reward"].shape[1] == steps
        ),
        None,
    )
    if found is None:
        return CheckResult(
            ID,
            TITLE,
            Status.SKIP,
            "no baseline band or old-engine run with the same number of steps",
        )
    reference, label = found

    measurements, metrics, exits = [], {}, {}
    for metric, (abs_m, rel_m, edges, outside_status) in BANDS.items():
        values = new[metric][0]
        low, high = band(reference[metric], abs_m, rel_m, edges)
        step = first_exit(values, low, high)
        exits[metric] = step
        status = Status.PASS if step is None else outside_status
        note = (
            "inside the band"
            if step is None
            else f"leaves the band at step {step} ({values[step]:.3g} vs [{low[step]:.3g}, {high[step]:.3g}])"
        )
        measurements.append(Measurement(metric, float(values[-1]), status, engine="new", note=note))
        metrics[metric] = {
            "new": values.tolist(),
            "old": None if old is None else old[metric][0].tolist(),
            "band_low": [None if not np.isfinite(x) else float(x) for x in low],
            "band_high": high.tolist(),
        }
    for metric in INFO:
        if metric in new:
            metrics[metric] = {
                "new": new[metric][0].tolist(),
                "old": None if old is None else old[metric][0].tolist(),
            }
    reward = new["reward"][0]
    k = max(1, steps // 4)
    rise = float(reward[-k:].mean() - reward[:k].mean())
    status = worst(m.status for m in measurements)
    summary = f"reward {reward[0]:.2f} -> {reward[-1]:.2f} over {steps} steps; " + (
        "every metric inside the " + label + " band" if status == Status.PASS
        else ", ".join(f"{m} leaves the band at step {s}" for m, s in exits.items() if s is not None)
    )  # fmt: skip
    diagnosis = ""
    if status in (Status.WARN, Status.FAIL):
        early = [m for m, s in exits.items() if s == 0 and BANDS[m][3] == Status.FAIL]
        diagnosis = (
            "The RL trajectory through the new engine leaves the reference band. "
            + ("Mismatch metrics are out from step 0: the engine's reported logprobs are not those of the distribution it "
               "sampled from (check logprobs_mode and precision). " if early else "")
            + "A KL or clip rate that grows step after step points at the weight-update path (stale weights or caches)."
        )  # fmt: skip
    details = {
        "steps": steps,
        "compared_with": label,
        "metrics": metrics,
        "first_exit": exits,
        "reward_rise": rise,
    }
    return CheckResult(ID, TITLE, status, summary, diagnosis, measurements, details)


SPEC = CheckSpec(id=ID, title=TITLE, run=run)
