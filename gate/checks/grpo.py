"""grpo-trajectory: the new engine's mini GRPO run, seed by seed against the baseline's seeds.

The design is paired (docs/checks.md#mini-grpo): seed ``s`` of every engine draws the same prompt
schedule, trains from the same checkpoint with the same trainer, and is evaluated on the same
held-out eval set. Each statistic (gate.analysis.grpo_seeds) is a per-seed difference
D_s = new_s - baseline_s, averaged over the new engine's seeds and judged by a t-test whose null
spread is the baseline's between-seed spread (``grpo.baseline_seeds``, 32 by default), never the new
run's own: a broken engine cannot widen the band it is judged by. Across releases the samples, and
so the trajectories after step 0, are independent, which is what that spread measures; same-seed
reruns of one release read 0 on a CPU and are no null. A baseline with fewer than
:data:`MIN_NULL_SEEDS` seeds has no power, and the check SKIPs saying so; it never passes.

The family of four statistics holds ``grpo.alpha`` (1%) by Bonferroni:
- ``eval_reward`` (FAIL): the trained policy's reward on the eval set is lower, by more than
  ``grpo.min_effect``. Reported split into what differed before any update (the checkpoint's eval
  through each engine: the per-token checks' part) and what was learned less.
- ``k3_growth`` (FAIL): the engine falls behind the trainer as updates are pushed (stale weights or
  caches, an update that rounds away): k3 over the run above its level at the first rollout, by
  more than a doubling on top of the baseline's.
- ``identical_groups`` (FAIL): more groups whose samples are all one completion, by more than a
  quarter of the groups (children of an n>1 request sharing one seed: zero advantage, no learning).
- ``entropy_drift`` (WARN): the policy's entropy moves differently over the run.
Each reports its effect, interval, p-value and δ90, the effect this run detects with 90% power.
The per-step trajectories stay, for the charts: the new engine's and the old engine's seed 0
against the min..max of the reference's seeds (display only, not a verdict).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gate import baseline as bl
from gate.analysis import grpo_seeds
from gate.analysis.paired import PairedTest, family_alpha, paired_test
from gate.checks.base import CheckResult, CheckSettings, CheckSpec, Measurement
from gate.checks.context import Context
from gate.checks.weight_sync import push_failure
from gate.contract import keys
from gate.contract.evidence import Evidence
from gate.verdict import Status, worst

ID = "grpo-trajectory"
TITLE = "Mini GRPO trajectory"

# Below this many null seeds the t-test's own quantile (t at 15 df: 3.29 for 0.25%, against 2.81 at
# the normal's) and the spread's estimate cost more power than the new engine's seeds can buy.
MIN_NULL_SEEDS = 16


@dataclass(frozen=True)
class Judgment:
    """How one statistic is judged: the direction of harm, the status beyond it, and the smallest
    effect worth that status however significant (:meth:`practical`)."""

    alternative: str
    outside: Status
    what: str

    def practical(self, name: str, grpo: dict[str, Any]) -> float:
        if name == "eval_reward":
            return float(grpo.get("min_effect", 0.05))
        if name == "k3_growth":  # k3 twice its start, on top of the baseline's growth
            return math.log(2.0)
        if name == "identical_groups":
            return 0.25
        return 0.0


JUDGED = {
    "eval_reward": Judgment("less", Status.FAIL, "eval reward of the trained policy"),
    "k3_growth": Judgment("greater", Status.FAIL, "log k3 over the run above its start"),
    "identical_groups": Judgment("greater", Status.FAIL, "share of groups all one completion"),
    "entropy_drift": Judgment("two-sided", Status.WARN, "entropy, late steps minus step 0"),
}
CHARTED = ("reward", "k3_kl", "clip_frac", "entropy", "mean_abs_diff", "token_mult_prob_error",
           "response_length", "identical_groups")  # fmt: skip
INFO = keys.GRPO_TIMINGS


def run(ctx: Context, settings: CheckSettings) -> CheckResult:
    not_judged = _not_judged(ctx)
    if not_judged is not None:
        return not_judged
    new = _trajectories(ctx.new)
    assert new is not None  # _not_judged says so
    steps = new["reward"].shape[1]
    null, label, why_not = _null(ctx)
    shown = {
        "steps": steps,
        "compared_with": label or "old",
        **_charts(new, _trajectories(null), _trajectories(ctx.old), steps),
    }
    if null is None or label is None:
        return _skip(why_not, shown)
    reason = _no_power(ctx.new, null, label, why_not)
    if reason is not None:
        return _skip(reason, shown | {"null_seeds": len(grpo_seeds.seed_ids(null))})
    return _judged(ctx, null, label, shown)


def _no_power(new: Evidence, null: Evidence, label: str, why_not: str) -> str | None:
    """Why the statistics cannot be judged with power against ``null``; None where they can."""
    if not grpo_seeds.has_eval(new):
        return "the new engine's GRPO run has no eval set (a run from before it)"
    null_ids = grpo_seeds.seed_ids(null)
    if len(null_ids) < MIN_NULL_SEEDS:
        return (
            (f"{why_not}; " if why_not else "")
            + f"no power: the {label} holds {len(null_ids)} GRPO seed(s), fewer than the "
            f"{MIN_NULL_SEEDS} the statistics' null needs (record a baseline: gate baseline record, "
            "grpo.baseline_seeds)"
        )
    missing = sorted(set(grpo_seeds.seed_ids(new)) - set(null_ids))
    if missing:
        return (
            f"the {label} lacks seed(s) {missing} the new engine trained: nothing to pair them with"
        )
    return None


def _judged(ctx: Context, null: Evidence, label: str, shown: dict[str, Any]) -> CheckResult:
    """Every statistic paired by seed against ``null``'s seeds, at the family's level."""
    grpo = ctx.run.get("grpo") or {}
    alpha = float(grpo.get("alpha", 0.01))
    new_ids, null_ids = grpo_seeds.seed_ids(ctx.new), grpo_seeds.seed_ids(null)
    tests = _tests(ctx.new, null, new_ids, null_ids, family_alpha(alpha, len(JUDGED)), grpo)
    statuses = {name: _status(name, test, grpo) for name, test in tests.items()}
    samples = int(grpo.get("eval_samples") or 0)
    details = shown | {
        "seeds": new_ids,
        "null_seeds": len(null_ids),
        "alpha": alpha,
        "statistics": {
            name: test.to_dict()
            | {
                "status": statuses[name].value,
                "practical": JUDGED[name].practical(name, grpo),
                "what": JUDGED[name].what,
            }
            for name, test in tests.items()
        },
        "eval": _eval_split(ctx.new, null, tests["eval_reward"], samples),
    }
    measurements = [
        Measurement(name, test.effect, statuses[name], engine="new", note=_note(test))
        for name, test in tests.items()
    ]
    return CheckResult(
        ID, TITLE, worst(statuses.values()), _summary(tests, statuses, len(new_ids), label),
        _diagnosis(statuses), measurements, details,
    )  # fmt: skip


def _tests(
    new: Evidence,
    null: Evidence,
    new_ids: list[int],
    null_ids: list[int],
    alpha_each: float,
    grpo: dict[str, Any],
) -> dict[str, PairedTest]:
    ours, theirs = grpo_seeds.per_seed(new), grpo_seeds.per_seed(null)
    rows = [null_ids.index(s) for s in new_ids]
    return {
        name: paired_test(
            ours[name],
            theirs[name][rows],
            theirs[name],
            judged.alternative,
            alpha_each,
            judged.practical(name, grpo),
        )
        for name, judged in JUDGED.items()
    }


def _status(name: str, test: PairedTest, grpo: dict[str, Any]) -> Status:
    """The statistic's status: significant, and beyond the practical size in the harmful direction."""
    judged = JUDGED[name]
    size = judged.practical(name, grpo)
    beyond = {
        "less": test.effect < -size,
        "greater": test.effect > size,
        "two-sided": abs(test.effect) > size,
    }[judged.alternative]
    return judged.outside if test.significant and beyond else Status.PASS


def _eval_split(new: Evidence, null: Evidence, test: PairedTest, samples: int) -> dict[str, Any]:
    """The eval reward's difference, split: before any update (the checkpoint through each engine)
    and what was learned less (the rest)."""
    ours, ours_se = grpo_seeds.checkpoint_eval(new, samples)
    theirs, theirs_se = grpo_seeds.checkpoint_eval(null, samples)
    immediate = ours - theirs
    return {
        "checkpoint_new": _finite(ours),
        "checkpoint_reference": _finite(theirs),
        "immediate": _finite(immediate),
        "immediate_se": _finite(math.sqrt(ours_se**2 + theirs_se**2)),
        "learned": _finite(test.effect - immediate),
        "trained_new": _finite(float(grpo_seeds.per_seed(new)["eval_reward"].mean())),
    }


def _note(t: PairedTest) -> str:
    p = "n/a" if not math.isfinite(t.p_value) else f"{t.p_value:.2g}"
    return (
        f"{t.effect:+.3g} [{t.low:+.3g}, {t.high:+.3g}] over {t.seeds} seed(s), p {p} "
        f"(level {t.alpha:.2g}), detects {t.delta90:.3g} with 90% power"
    )


def _summary(tests: dict[str, PairedTest], statuses: dict[str, Status], n: int, label: str) -> str:
    reward = tests["eval_reward"]
    head = (
        f"eval reward {reward.effect:+.3f} vs the {label} over {n} paired seed(s) "
        f"(detects {reward.delta90:.3f} at 90% power)"
    )
    out = [name for name, s in statuses.items() if s != Status.PASS]
    return head + (
        "; " + ", ".join(f"{name} {statuses[name].value}" for name in out) if out else ""
    )


def _diagnosis(statuses: dict[str, Status]) -> str:
    reasons = {
        "eval_reward": "the policy trained through the new engine reaches a lower reward: it "
        "learned less (see the split: before any update, or over the run)",
        "k3_growth": "the engine falls behind the trainer push after push: the weight-update path "
        "leaves stale weights or caches, or rounds small updates away",
        "identical_groups": "more groups whose samples are all one completion: the children of an "
        "n > 1 request may share one seed, which leaves GRPO no advantage to learn from",
        "entropy_drift": "the policy's entropy moves differently over the run",
    }
    found = [reasons[name] for name, s in statuses.items() if s != Status.PASS]
    return (
        (
            "The RL run through the new engine differs from the reference's seeds: "
            + "; ".join(found)
            + "."
        )
        if found
        else ""
    )


def _skip(summary: str, details: dict[str, Any]) -> CheckResult:
    return CheckResult(ID, TITLE, Status.SKIP, summary, details=details)


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _null(ctx: Context) -> tuple[Evidence | None, str | None, str]:
    """The runs whose seeds are the null: the baseline's where it is of this GRPO design, else the
    old engine's own seeds (a gate run without a baseline trains the new engine's seeds on both);
    and why the baseline's are not, where there is one."""
    why = ""
    if ctx.baseline is not None:
        redesigned = bl.grpo_design_differences(ctx.baseline, ctx.run)
        if bl.grpo_comparable(ctx.baseline, ctx.run) and grpo_seeds.has_eval(ctx.baseline.evidence):
            return ctx.baseline.evidence, "baseline", ""
        why = (
            f"the baseline's GRPO seeds were recorded under other settings ({'; '.join(redesigned)})"
            if redesigned
            else "the baseline's GRPO seeds are of another model or prompt sets"
        ) + ": re-record it (gate baseline update)"
    if grpo_seeds.has_eval(ctx.old):
        return ctx.old, "old", why
    return None, None, why or "no baseline of this GRPO design and no old-engine run to pair with"


def _trajectories(e: Evidence | None) -> dict[str, np.ndarray] | None:
    if e is None or keys.GRPO_REWARD not in e.arrays:
        return None
    return {
        m: np.atleast_2d(e[keys.grpo_key(m)]).astype(np.float64)
        for m in (*CHARTED, *INFO)
        if keys.grpo_key(m) in e.arrays
    }


def _charts(
    new: dict[str, np.ndarray],
    reference: dict[str, np.ndarray] | None,
    old: dict[str, np.ndarray] | None,
    steps: int,
) -> dict[str, Any]:
    """Per metric: the new and the old engine's seed 0 step by step, and the min..max of the
    reference's seeds; the first step the new line leaves that envelope (display, not a verdict)."""
    metrics: dict[str, Any] = {}
    exits: dict[str, int | None] = {}
    usable = reference is not None and reference["reward"].shape[1] == steps
    for metric in CHARTED:
        if metric not in new:
            continue
        values = new[metric][0]
        entry: dict[str, Any] = {
            "new": _listed(values),
            "old": None if old is None or metric not in old else _listed(old[metric][0]),
        }
        if usable and reference is not None and metric in reference:
            low, high = np.nanmin(reference[metric], axis=0), np.nanmax(reference[metric], axis=0)
            entry |= {"band_low": _listed(low), "band_high": _listed(high)}
            outside = np.flatnonzero((values < low) | (values > high))
            exits[metric] = int(outside[0]) if len(outside) else None
        metrics[metric] = entry
    for metric in INFO:
        if metric in new:
            metrics[metric] = {
                "new": _listed(new[metric][0]),
                "old": None if old is None or metric not in old else _listed(old[metric][0]),
            }
    return {"metrics": metrics, "first_exit": exits}


def _listed(values: np.ndarray) -> list[float | None]:
    return [float(x) if np.isfinite(x) else None for x in values]


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


SPEC = CheckSpec(id=ID, title=TITLE, run=run)
