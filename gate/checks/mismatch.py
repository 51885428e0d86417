"""train-inference-mismatch: how far the engine's logprobs are from the trainer's, per engine.

Each engine is judged on its own samples: d = lp_trainer - lp_engine per sampled token, with the
trainer's logprob under the same sampling transform (``trainer_logprob: processed``, the default) or
the raw one. Absolute thresholds apply to the new engine (published healthy ranges, sources below);
the regression test asks whether the new engine's per-prompt mean |d| is larger than the old one's
by more than noise: a paired bootstrap over prompts gives a confidence interval of the increase, and
only its lower bound is compared with the threshold, so sampling noise cannot trip it.
"""

from __future__ import annotations

from gate import evidence as ev
from gate.checks.base import CheckResult, CheckSpec, Limit, Measurement, Threshold, measure
from gate.checks.context import per_prompt, sampled_pairs
from gate.metrics import bootstrap_mean_diff_ci, mismatch
from gate.verdict import Status, worst

ID = "train-inference-mismatch"
TITLE = "Train-inference mismatch"

THRESHOLDS = {
    "token_mult_prob_error": Threshold(
        Limit(1.05), Limit(1.1), source="NeMo-RL: healthy < 1.05, CI asserts < 1.1"
    ),
    "k3_kl": Threshold(
        Limit(1e-3), Limit(1e-2), source="NeMo-RL: < 1e-3 acceptable; dense models 1e-5..1e-3"
    ),
    "clip_frac_token": Threshold(
        Limit(0.02), Limit(0.1), source="PPO/GRPO clip band 1 +/- clip_eps"
    ),
    "ess": Threshold(
        Limit(0.5), Limit(0.3), higher_is_worse=False, source="verl: ESS < 0.3 is bad"
    ),
    "regression_mean_abs_diff": Threshold(
        Limit(3, relative=True, floor=2e-3),
        Limit(6, relative=True, floor=1e-2),
        source="lower 95% bound of the per-prompt increase in mean |d|, new vs old; floors apply when uncalibrated",
    ),
}


def _d_stats(pairs, clip_eps: float):
    return mismatch(pairs.trainer, pairs.engine, pairs.offsets, clip_eps=clip_eps)


def run(ctx, settings) -> CheckResult:
    opts, th = settings.options, settings.thresholds
    trainer_key = ev.TRAINER_PROCESSED if opts["trainer_logprob"] == "processed" else ev.TRAINER_RAW
    # Tokens the requested top-k/top-p excludes have no finite d: logprob-semantics reports them.
    pairs = {name: sampled_pairs(e, trainer_key) for name, e in ctx.engines()}
    stats = {name: _d_stats(p, opts["clip_eps"]) for name, p in pairs.items()}
    measurements: list[Measurement] = []
    for name, s in stats.items():
        for metric in ("token_mult_prob_error", "k3_kl", "clip_frac_token", "ess"):
            m = measure(metric, getattr(s, metric), th[metric], engine=name)
            if name == "old":  # the old engine is context, not what this PR changes
                m.status, m.note = Status.PASS, "old engine: for comparison"
            measurements.append(m)
        for metric in (
            "mean_abs_diff",
            "p99_abs_diff",
            "max_abs_diff",
            "k1_kl",
            "clip_frac_seq",
            "prob_pearson",
        ):
            measurements.append(Measurement(metric, getattr(s, metric), Status.PASS, engine=name))

    details = {
        name: s.to_dict() | {"tokens_outside_transform": pairs[name].masked}
        for name, s in stats.items()
    }
    if ctx.old is not None:
        g = ev.SAMPLE
        per = {
            n: per_prompt(
                e, g, abs(pairs[n].trainer.astype(float) - pairs[n].engine), pairs[n].offsets
            )
            for n, e in ctx.engines()
        }
        low, high, point = bootstrap_mean_diff_ci(
            per["new"], per["old"], seed=opts["bootstrap_seed"]
        )
        m = measure(
            "regression_mean_abs_diff",
            low,
            th["regression_mean_abs_diff"],
            ctx.noise("regression_mean_abs_diff"),
        )
        m.note = f"increase {point:+.3g}, 95% CI [{low:+.3g}, {high:+.3g}]"
        measurements.append(m)
        details["regression"] = {"low": low, "high": high, "point": point}

    status = worst(m.status for m in measurements)
    new = stats["new"]
    summary = f"new: token_mult_prob_error {new.token_mult_prob_error:.4f}, k3 KL {new.k3_kl:.2e}, clip {new.clip_frac_token:.2%}"
    diagnosis = ""
    if status in (Status.WARN, Status.FAIL):
        bad = [
            f"{m.name}{'' if m.engine is None else f' ({m.engine})'} = {m.value:.4g}"
            for m in measurements
            if m.status == status
        ]
        diagnosis = (
            f"The new engine's logprobs are further from the trainer's than allowed: {', '.join(bad)}. "
            "Check the engine's logprob semantics and precision first (logprobs_mode, dtype, an fp32 lm_head on both "
            "sides); objective-side corrections such as truncated importance sampling would only hide an engine bug."
        )
    return CheckResult(ID, TITLE, status, summary, diagnosis, measurements, details)


SPEC = CheckSpec(
    id=ID,
    title=TITLE,
    run=run,
    thresholds=THRESHOLDS,
    options={"trainer_logprob": "processed", "clip_eps": 0.2, "bootstrap_seed": 0},
)
