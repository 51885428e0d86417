"""grpo-trajectory: the new engine's mini GRPO run against the baseline's band and the old engine.

The baseline stores the reference engine's trajectories over several seeds; the band per metric
per step is their min..max widened by a margin the runs themselves measure: ``Z`` standard errors
of the difference between the new run's step mean and the reference's (the worker records each
step's standard error, ``grpo_<metric>_se``: sequences as the units for token means, prompts for
reward and length). A reference without recorded errors (evidence from before they were) borrows
the new run's: same task, same batch, the same estimator. Mismatch metrics also have a resolution
floor, a tenth of the level train-inference-mismatch starts to WARN at: an engine and trainer that
agree bitwise (an fp32 model on CPU) have a standard error of zero, and a band that is a line
would turn any rounding into a FAIL.

Mismatch metrics (k3 KL, clip fraction, mean |d|, token_mult_prob_error) only have an upper edge
and FAIL when crossed: the engine's logprobs moved away from the trainer's during RL. Reward,
entropy and response length have both edges and WARN: they move for benign reasons too.
The first step where each metric leaves its band is reported.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gate import baseline as bl
from gate.checks.base import CheckResult, CheckSettings, CheckSpec, Measurement
from gate.checks.context import Context
from gate.checks.weight_sync import push_failure
from gate.contract import keys
from gate.verdict import Status, worst

ID = "grpo-trajectory"
TITLE = "Mini GRPO trajectory"

# Standard errors of the difference a band allows. Per step the check makes 10 one-sided
# comparisons (4 upper edges, 3 metrics with two), 100 over 10 steps; at 3.5 sigma each is a false
# alarm 2.3e-4 of the time, about 2% for the whole band if the step means were normal and independent.
Z = 3.5

# metric: (resolution floor of the margin, edges, status when outside). The floors are a tenth of
# train-inference-mismatch's WARN limits (k3 1e-3, clip 0.02, token_mult_prob_error 1.05; mean |d|
# is token_mult_prob_error - 1 to first order).
BANDS = {
    "k3_kl": (1e-4, "upper", Status.FAIL),
    "clip_frac": (2e-3, "upper", Status.FAIL),
    "mean_abs_diff": (5e-3, "upper", Status.FAIL),
    "token_mult_prob_error": (5e-3, "upper", Status.FAIL),
    "reward": (0.0, "both", Status.WARN),
    "entropy": (0.0, "both", Status.WARN),
    "response_length": (0.0, "both", Status.WARN),
}
INFO = ("step_s", "push_s")


def margin(reference_se: np.ndarray | None, new_se: np.ndarray, floor: float) -> np.ndarray:
    """[steps] allowed excess: Z standard errors of (new - reference), never under ``floor``.

    The errors are those under "nothing changed": the reference's, for the reference and for a new
    run like it (``reference_se`` [seeds, steps], its largest per step), so a broken engine's own
    wider spread does not widen the band it is judged by. A reference that recorded none borrows
    the new run's. A NaN error (a step with one unit) gives no margin beyond the floor.
    """
    ref = (
        new_se if reference_se is None else np.fmax.reduce(reference_se, axis=0)
    )  # NaN-skipping, no warning
    return np.maximum(floor, np.nan_to_num(Z * np.sqrt(2.0) * ref, nan=0.0))


def band(reference: np.ndarray, allowed: np.ndarray, edges: str) -> tuple[np.ndarray, np.ndarray]:
    """[steps] low/high from [seeds, steps] reference trajectories and a [steps] margin."""
    low = (
        reference.min(axis=0) - allowed if edges == "both" else np.full(reference.shape[1], -np.inf)
    )
    return low, reference.max(axis=0) + allowed


def first_exit(values: np.ndarray, low: np.ndarray, high: np.ndarray) -> int | None:
    outside = np.flatnonzero((values < low) | (values > high))
    return int(outside[0]) if len(outside) else None


def _trajectories(e) -> dict[str, np.ndarray] | None:
    if e is None or keys.GRPO_REWARD not in e.arrays:
        return None
    return {
        m: np.atleast_2d(e[keys.grpo_key(m)]).astype(np.float64)
        for m in (*BANDS, *(f"{b}_se" for b in BANDS), *INFO)
        if keys.grpo_key(m) in e.arrays
    }


def run(ctx: Context, settings: CheckSettings) -> CheckResult:
    not_judged = _not_judged(ctx)
    if not_judged is not None:
        return not_judged
    new = _trajectories(ctx.new)
    assert new is not None  # _not_judged says so
    steps = new["reward"].shape[1]
    # a band recorded under other GRPO settings (another loss, lr, ...) is not this run's band
    redesigned = (
        bl.grpo_design_differences(ctx.baseline, ctx.run) if ctx.baseline is not None else []
    )
    old = _trajectories(ctx.old)
    found = _reference(ctx, old, steps, redesigned)
    if found is None:
        return CheckResult(
            ID,
            TITLE,
            Status.SKIP,
            "no baseline band or old-engine run with the same number of steps"
            + (
                f" (the baseline's band has other GRPO settings: {'; '.join(redesigned)})"
                if redesigned
                else ""
            ),
            details={"baseline_grpo_differs": redesigned},
        )
    reference, label = found
    measurements, metrics, exits, borrowed = _band_rows(new, reference, old, steps)
    for metric in INFO:
        if metric in new:
            metrics[metric] = {
                "new": new[metric][0].tolist(),
                "old": None if old is None else old[metric][0].tolist(),
            }
    reward = new["reward"][0]
    k = max(1, steps // 4)
    status = worst(m.status for m in measurements)
    summary = f"reward {reward[0]:.2f} -> {reward[-1]:.2f} over {steps} steps; " + (
        "every metric inside the " + label + " band"
        if status == Status.PASS
        else ", ".join(
            f"{m} leaves the band at step {s}" for m, s in exits.items() if s is not None
        )
    )
    details = {
        "steps": steps,
        "compared_with": label,
        "metrics": metrics,
        "first_exit": exits,
        "reward_rise": float(reward[-k:].mean() - reward[:k].mean()),
        "margin_z": Z,
        # metrics whose reference recorded no standard errors: the new run's stood in for them
        "reference_se_borrowed": borrowed,
        # GRPO settings this run changed since the baseline's band was recorded (the band unused)
        "baseline_grpo_differs": redesigned,
    }
    return CheckResult(ID, TITLE, status, summary, _diagnosis(status, exits), measurements, details)


def _not_judged(ctx: Context) -> CheckResult | None:
    """ERROR for a run whose push raised or that had no push; SKIP for a run turned off."""
    failed = push_failure(ctx.new.engine.grpo, ID, TITLE, "The GRPO run")
    if failed is not None:
        return failed
    if _trajectories(ctx.new) is not None:
        return None
    unsupported = ctx.new.engine.grpo.get("unsupported")
    if unsupported:  # asked for, but the engine offers no weight push gate knows
        return CheckResult(
            ID,
            TITLE,
            Status.ERROR,
            "the GRPO run could not run: no weight push for this engine",
            f"{unsupported[:1].upper()}{unsupported[1:]}.",
            details={"unsupported": unsupported},
        )
    return CheckResult(ID, TITLE, Status.SKIP, "the GRPO run did not run (grpo.enabled: false)")


def _reference(
    ctx: Context,
    old: dict[str, np.ndarray] | None,
    steps: int,
    redesigned: list[str],
) -> tuple[dict[str, np.ndarray], str] | None:
    """The band's trajectories: the baseline's where comparable and of this design, else the old
    engine's; None where neither has this run's number of steps."""
    base = (
        _trajectories(ctx.baseline.evidence)
        if ctx.baseline is not None and ctx.baseline_comparable and not redesigned
        else None
    )
    return next(
        (
            (candidate, name)
            for candidate, name in ((base, "baseline"), (old, "old"))
            if candidate is not None and candidate["reward"].shape[1] == steps
        ),
        None,
    )


def _band_rows(
    new: dict[str, np.ndarray],
    reference: dict[str, np.ndarray],
    old: dict[str, np.ndarray] | None,
    steps: int,
) -> tuple[list[Measurement], dict[str, Any], dict[str, int | None], list[str]]:
    """Per banded metric: its measurement, its chart data, the first step outside the band, and
    whether the reference lacked standard errors (the new run's stood in)."""
    measurements, metrics, exits, borrowed = [], {}, {}, []
    for metric, (floor, edges, outside_status) in BANDS.items():
        values = new[metric][0]
        new_se = new.get(f"{metric}_se", np.full((1, steps), np.nan))[0]
        ref_se = reference.get(f"{metric}_se")
        if ref_se is None:
            borrowed.append(metric)
        allowed = margin(ref_se, new_se, floor)
        low, high = band(reference[metric], allowed, edges)
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
            "margin": allowed.tolist(),
            "new_se": [None if not np.isfinite(x) else float(x) for x in new_se],
        }
    return measurements, metrics, exits, borrowed


def _diagnosis(status: Status, exits: dict[str, int | None]) -> str:
    if status not in (Status.WARN, Status.FAIL):
        return ""
    early = [m for m, s in exits.items() if s == 0 and BANDS[m][2] == Status.FAIL]
    return (
        "The RL trajectory through the new engine leaves the reference band. "
        + (
            "Mismatch metrics are out from step 0: the engine's reported logprobs are not those of "
            "the distribution it sampled from (check logprobs_mode and precision). "
            if early
            else ""
        )
        + "A KL or clip rate that grows step after step points at the weight-update path (stale "
        "weights or caches)."
    )


SPEC = CheckSpec(id=ID, title=TITLE, run=run)
