"""train-inference-mismatch: how far the engine's logprobs are from the trainer's, per engine.

Each engine is judged on its own samples: d = lp_trainer - lp_engine per sampled token, with the
trainer's logprob under the same sampling transform (``trainer_logprob: processed``, the default) or
the raw one. Absolute thresholds apply to the new engine (published healthy ranges, sources below);
the regression test asks whether the new engine's per-prompt mean |d| is larger than the old one's
by more than noise: a paired bootstrap over prompts gives a confidence interval of the increase, and
only its lower bound is compared with the threshold, so sampling noise cannot trip it.

A WARN on an absolute threshold that the engine this PR replaces shares is pre-existing, not this
upgrade's: the old engine in the run, or else the comparable baseline's record of it
(summary.json), past the same warn level, with the new engine at most twice as far from ideal
(``PRE_EXISTING_FACTOR``). Such a measurement passes with a note that says so; a FAIL never does.
A bf16 engine against a bf16 trainer trunk reads k3 1.1e-3-1.5e-3 on SmolLM2 on every release and
seed (docs/validation.md), just past NeMo-RL's 1e-3: a WARN on every pull request would say
nothing about the upgrade. Whether the new engine moved further from the trainer is the
regression test's question, which it answers with the measured noise.

``details.worst_tokens`` lists the sampled tokens with the largest |d| (the ``worst_tokens`` option,
per engine, new first; 0 lists none), each with its prompt, position and a few tokens of context,
so a reader sees where the engines diverge. Token text comes from the worker (texts.json) and is
untrusted: it is carried verbatim and the renderer escapes it.

The support measurements (gate/analysis/support.py) add what d leaves out: under top-k / top-p a
trainer that normalises over the whole vocabulary (``reference.normalize: full``) sees a ratio of
the kept mass S on every token, however close the numbers are. ``support_k3_kl`` (the k3 KL of
that bias alone) and ``support_clip_frac`` (the share of sampled tokens with S < 1 - clip_eps) are
judged on the new engine; with ``normalize: kept`` they are reported only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gate.analysis.support import KeptMass, applies, kept_mass
from gate.checks.base import (
    CheckResult,
    CheckSettings,
    CheckSpec,
    Limit,
    Measurement,
    Threshold,
    measure,
)
from gate.checks.context import Context, per_prompt, sampled_pairs
from gate.checks.semantics import penalties_cause
from gate.contract import keys
from gate.contract.evidence import Evidence
from gate.metrics import bootstrap_mean_diff_ci, largest_abs_diff, mismatch
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
    "support_k3_kl": Threshold(
        Limit(1e-3), Limit(1e-2), source="as k3_kl (NeMo-RL), from the kept mass alone"
    ),
    "support_clip_frac": Threshold(
        Limit(0.02),
        Limit(0.1),
        source="as clip_frac_token: tokens whose ratio the kept mass alone takes out of the clip band",
    ),
    "regression_mean_abs_diff": Threshold(
        Limit(3, relative=True, floor=2e-3),
        Limit(6, relative=True, floor=1e-2),
        source="lower 95% bound of the per-prompt increase in mean |d|, new vs old; floors apply when uncalibrated",
    ),
}


# What RL stacks call these statistics on their dashboards (issue 27), shown beside gate's names
# so a reader recognises the number: the same estimator over the same d = lp_trainer - lp_engine.
STACK_NAMES = {
    "token_mult_prob_error": "NeMo-RL train/token_mult_prob_error",
    "k3_kl": "PipelineRL kl_new_old, prime-rl mismatch_kl, verl rollout_corr/k3_kl",
    "clip_frac_token": "PipelineRL clamp_log_ratio_new_old_indicator",
    "mean_abs_diff": "TRL sampling_logp_difference, slime train_rollout_logprob_abs_diff",
    "prob_abs_diff_mean": "verl training/rollout_probs_diff_mean",
    "prob_abs_diff_max": "verl training/rollout_probs_diff_max",
}

# The metrics a pre-existing WARN may pass on, and each one's distance from a perfect match.
DISTANCE_FROM_IDEAL = {
    "token_mult_prob_error": lambda v: v - 1.0,
    "k3_kl": lambda v: v,
    "clip_frac_token": lambda v: v,
    "ess": lambda v: 1.0 - v,
}
PRE_EXISTING_FACTOR = 2.0  # the new engine may be this much further from ideal than the old side

WORST_TOKENS = 10  # default of the ``worst_tokens`` option: tokens listed per engine
CONTEXT_BEFORE = 8  # tokens of context before a worst token (the prompt's tail near the start)
CONTEXT_AFTER = 4  # tokens of the completion after it


def _d_stats(pairs, clip_eps: float):
    return mismatch(pairs.trainer, pairs.engine, pairs.offsets, clip_eps=clip_eps)


def run(ctx: Context, settings: CheckSettings) -> CheckResult:
    opts, th = settings.options, settings.thresholds
    trainer_key = (
        keys.TRAINER_PROCESSED if opts["trainer_logprob"] == "processed" else keys.TRAINER_RAW
    )
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
            "prob_abs_diff_mean",
            "prob_abs_diff_max",
            "prob_pearson",
        ):
            measurements.append(Measurement(metric, getattr(s, metric), Status.PASS, engine=name))
    pre_existing = _mark_pre_existing(measurements, _old_side(ctx, stats), th)
    for m in measurements:
        if m.name in STACK_NAMES:
            m.note = "; ".join(n for n in (m.note, f"as {STACK_NAMES[m.name]}") if n)

    details = {
        name: s.to_dict() | {"tokens_outside_transform": pairs[name].masked}
        for name, s in stats.items()
    }
    support = {name: kept_mass(e, opts["clip_eps"]) for name, e in ctx.engines()}
    measurements += _support_measurements(ctx, support, th)
    for name, k in support.items():
        if k is not None:
            details[name]["support"] = asdict(k) | {"mean_ratio": k.mean}
    if ctx.old is not None:
        g = keys.SAMPLE
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

    n_worst = _worst_token_count(opts)
    if n_worst:
        # New engine first: a comment shows only the first rows, and the new engine is what changed.
        details["worst_tokens"] = [
            asdict(row)
            for name, e in reversed(ctx.engines())
            for row in worst_tokens(e, name, trainer_key, n_worst)
        ]

    status = worst(m.status for m in measurements)
    new = stats["new"]
    summary = f"new: token_mult_prob_error {new.token_mult_prob_error:.4f}, k3 KL {new.k3_kl:.2e}, clip {new.clip_frac_token:.2%}"
    kept_new = support.get("new")
    if kept_new is not None and ctx.trainer_normalize == "full" and kept_new.truncated > 0:
        summary += f"; kept mass {kept_new.mean:.3f} (full-vocabulary trainer)"
    if pre_existing:
        summary += (
            f"; {', '.join(pre_existing)} past the warn level on the old side too (pre-existing)"
        )
    diagnosis = ""
    if status in (Status.WARN, Status.FAIL):
        bad = [m for m in measurements if m.status == status]
        numeric = [
            f"{m.name}{'' if m.engine is None else f' ({m.engine})'} = {m.value:.4g}"
            for m in bad
            if not m.name.startswith("support_")
        ]
        parts = []
        if numeric:
            parts.append(
                f"The new engine's logprobs are further from the trainer's than allowed: {', '.join(numeric)}. "
                "Check the engine's logprob semantics and precision first (logprobs_mode, dtype, an fp32 lm_head on "
                "both sides); objective-side corrections such as truncated importance sampling would only hide an "
                "engine bug."
            )
        if numeric and ctx.penalties:
            parts.append(penalties_cause(ctx.penalties))
        if len(numeric) < len(bad):
            parts.append(_support_diagnosis(support["new"], ctx.sampling, opts["clip_eps"]))
        diagnosis = " ".join(parts)
    return CheckResult(ID, TITLE, status, summary, diagnosis, measurements, details)


def _old_side(ctx: Context, stats: dict[str, Any]) -> tuple[str, dict[str, float]] | None:
    """The absolute figures of the engine this PR replaces, and where they come from: the old
    engine in this run, else the comparable baseline's record of the engine it was made from."""
    if "old" in stats:
        return "the old engine", {k: float(getattr(stats["old"], k)) for k in DISTANCE_FROM_IDEAL}
    if ctx.baseline is not None and ctx.baseline_comparable and ctx.baseline.mismatch:
        return "the baseline", {
            k: v for k, v in ctx.baseline.mismatch.items() if k in DISTANCE_FROM_IDEAL
        }
    return None


def _mark_pre_existing(
    measurements: list[Measurement],
    old_side: tuple[str, dict[str, float]] | None,
    th: dict[str, Threshold],
) -> list[str]:
    """Pass the new engine's WARNs the old side shares (see the module doc); their names."""
    if old_side is None:
        return []
    where, old = old_side
    passed = []
    for m in measurements:
        if m.engine != "new" or m.status != Status.WARN or m.name not in old:
            continue
        old_status = th[m.name].evaluate(old[m.name], None)[0]
        distance = DISTANCE_FROM_IDEAL[m.name]
        if old_status == Status.PASS or distance(m.value) > PRE_EXISTING_FACTOR * distance(
            old[m.name]
        ):
            continue
        m.status = Status.PASS
        m.note = "; ".join(
            n
            for n in (
                m.note,
                f"pre-existing: {where} reads {old[m.name]:.4g}, past the warn level too",
            )
            if n
        )
        passed.append(m.name)
    return passed


def _support_measurements(
    ctx: Context, support: dict[str, KeptMass | None], thresholds: dict[str, Threshold]
) -> list[Measurement]:
    """support_k3_kl, support_clip_frac and support_mean_ratio per engine; judged on the new engine
    alone, and only where the trainer normalises over the whole vocabulary and the engine returns
    kept-set logprobs."""
    out = []
    for name, e in ctx.engines():
        k = support[name]
        if k is None:
            continue
        for metric, value in (("support_k3_kl", k.k3_kl), ("support_clip_frac", k.clip_frac)):
            m = measure(metric, value, thresholds[metric], engine=name)
            if name == "old":
                m.status, m.note = Status.PASS, "old engine: for comparison"
            elif ctx.trainer_normalize != "full":
                m.status, m.note = Status.PASS, f"reported only: {_KEPT}"
            elif not applies(e):
                m.status, m.note = Status.PASS, f"reported only: {_NOT_KEPT}"
            out.append(m)
        out.append(
            Measurement(
                "support_mean_ratio",
                k.mean,
                Status.PASS,
                engine=name,
                note=f"exp(mean log kept mass) over {k.truncated:.0%} truncated tokens",
            )
        )
    return out


_KEPT = "the trainer renormalises over the kept tokens (reference.normalize: kept)"
_NOT_KEPT = "the engine's logprobs are not normalised over the kept tokens (logprobs_mode)"


def _support_diagnosis(k: KeptMass | None, sampling: dict[str, Any], clip_eps: float) -> str:
    if k is None:
        return ""
    clipped = (
        f", and {k.clip_frac:.1%} of sampled tokens keep less than {1 - clip_eps:g}, so the clip band "
        "cuts them though they are on-policy"
        if k.clip_frac
        else ""
    )
    return (
        f"At top_k {sampling['top_k']}, top_p {sampling['top_p']} the sampler keeps a geometric mean of "
        f"{k.mean:.3f} of the probability: a trainer that takes log_softmax over the whole vocabulary "
        f"(reference.normalize: full) sees importance ratios that low on on-policy tokens, a mismatch "
        f"KL (k3) of {k.k3_kl:.2e} from normalisation alone{clipped}. Renormalise the trainer's logprobs "
        "over the kept tokens (vLLM's return_sampling_mask, Model Runner V2) and set reference.normalize: "
        "kept, or sample without top-k/top-p."
    )


@dataclass(frozen=True)
class WorstToken:
    """One row of ``details.worst_tokens`` (gate.report_model.WorstToken). Text is untrusted, verbatim."""

    engine: str  # "new" / "old"
    rank: int  # 1 = the largest |d| of this engine
    prompt_id: str | int  # the prompt set's id; its index where the evidence has none
    sample: int | None  # which of the prompt's n samples
    position: int  # the token's index in its completion
    token_id: int
    token: str  # its decoded text, or ``⟨id N⟩`` (evidence without token text)
    context: str  # up to CONTEXT_BEFORE tokens before it (the prompt's tail near the start)
    context_after: str  # up to CONTEXT_AFTER tokens after it in the completion
    engine_logprob: float
    trainer_logprob: float  # d = trainer_logprob - engine_logprob


def worst_tokens(e: Evidence, engine: str, trainer_key: str, n: int) -> list[WorstToken]:
    """The ``n`` sampled tokens of ``e`` with the largest |d|, largest first.

    d is ``trainer_key``'s logprob minus the engine's, as the check measures it; tokens the transform
    excludes have none and are never listed. The selection is vectorised; only the chosen rows are
    assembled one by one.
    """
    g = keys.SAMPLE
    trainer, engine_lp = e[f"{g}_{trainer_key}"], e[f"{g}_{keys.ENGINE_LOGPROB}"]
    chosen = largest_abs_diff(trainer, engine_lp, n)
    offsets, token_ids = e[f"{g}_{keys.OFFSETS}"], e[f"{g}_{keys.TOKEN_IDS}"]
    seqs = np.searchsorted(offsets, chosen, side="right") - 1  # the sequence holding each token
    prompt_index, sample_index = (
        e[f"{g}_{keys.PROMPT_INDEX}"],
        e.arrays.get(f"{g}_{keys.SAMPLE_INDEX}"),
    )
    prompt_names = _prompt_names(e)
    rows: list[WorstToken] = []
    for rank, (t, s) in enumerate(zip(chosen.tolist(), seqs.tolist(), strict=True), start=1):
        start, end, prompt = int(offsets[s]), int(offsets[s + 1]), int(prompt_index[s])
        before = token_ids[max(start, t - CONTEXT_BEFORE) : t].tolist()
        if len(before) < CONTEXT_BEFORE:  # near the start: the prompt's last tokens lead into it
            before = e.prompt_tokens(prompt)[len(before) - CONTEXT_BEFORE :].tolist() + before
        rows.append(
            WorstToken(
                engine=engine,
                rank=rank,
                prompt_id=prompt_names[prompt] if prompt < len(prompt_names) else prompt,
                sample=None if sample_index is None else int(sample_index[s]),
                position=t - start,
                token_id=int(token_ids[t]),
                token=e.token_label(int(token_ids[t])),
                context=e.decode(before),
                context_after=e.decode(token_ids[t + 1 : min(end, t + 1 + CONTEXT_AFTER)].tolist()),
                engine_logprob=float(engine_lp[t]),
                trainer_logprob=float(trainer[t]),
            )
        )
    return rows


def _prompt_names(e: Evidence) -> list[str]:
    """The prompt set's ids by prompt index (texts.json); empty where the evidence has none."""
    names = e.texts.get("prompt_ids") if isinstance(e.texts, dict) else None
    return [str(n) for n in names] if isinstance(names, list) else []


def _worst_token_count(options: Any) -> int:
    """The ``worst_tokens`` option, from a mapping or a typed settings object; the default if absent."""
    value = (
        options.get("worst_tokens", WORST_TOKENS)
        if hasattr(options, "get")
        else getattr(options, "worst_tokens", WORST_TOKENS)
    )
    if isinstance(value, bool) or not isinstance(value, int):
        return WORST_TOKENS
    return max(value, 0)


SPEC = CheckSpec(
    id=ID,
    title=TITLE,
    run=run,
    thresholds=THRESHOLDS,
    options={
        "trainer_logprob": "processed",
        "clip_eps": 0.2,
        "bootstrap_seed": 0,
        "worst_tokens": WORST_TOKENS,
    },
    compares_engine_logprobs=True,
)
