"""greedy-and-length: greedy completions and output lengths against the baseline and the old engine.

Cheap drift guards peers use: greedy completions should be identical on the same model and
settings (first divergence reported), and the mean sampled output length should stay within
+/-10% of the reference (MLPerf's accuracy-run guard).

Beside them, informational and never flagged: the share of sampled completions identical to the
reference's for the same seed. A release that changes the sampler's random stream (vLLM 0.32's
CPU Gumbel-max sampling with per-token SplitMix64 noise, #59786; Model Runner V2's generator,
#53183) draws other samples from the same distribution: every check judges samples by their
distribution, so this alone is no failure, but users who rely on seeded reproducibility (and
``gate bisect --metric``) see exactly where it changed.

Where runs are not bit-identical (GPU kernels that are not batch-invariant), near-tie tokens flip
between two runs of one engine and a greedy completion diverges from there: measured with the CPU
noise emulation at sigma 0.03, an A/A matched 92.5-94% of greedy completions (scripts/noise_study.py).
Both bounds therefore scale with the calibrated A/A readings (``gate calibrate``): the match rate
must stay above ``min(bound, 1 - k x A/A mismatch)`` (k = 2 for warn, 4 for fail: about the 99th
and far beyond percentile of a binomial count over the prompt set), the length deviation below
``max(bound, 4x / 10x its A/A reading)``. On an exact A/A (CPU) both readings are 0 and the
absolute bounds apply.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from gate.checks.base import CheckResult, CheckSettings, CheckSpec, Limit, Threshold, measure
from gate.checks.context import Context, sequences
from gate.contract import evidence as ev
from gate.contract import keys
from gate.metrics import greedy_agreement, length_ratio, length_ratio_se
from gate.verdict import Status, worst

ID = "greedy-and-length"
EXAMPLES = 3  # changed completions kept for the report, side by side (reference, new)
TITLE = "Greedy agreement and output length"

THRESHOLDS = {
    "greedy_exact_match_rate": Threshold(
        Limit(0.95),
        Limit(0.8),
        higher_is_worse=False,
        source="identical greedy completions expected on the same model and dtype",
    ),
    "length_ratio_deviation": Threshold(
        Limit(4, relative=True, floor=0.05),
        Limit(10, relative=True, floor=0.10),
        source="MLPerf: output length within +/-10%; wider where the calibrated A/A reads more",
    ),
}
# The match rate's bounds move down by these multiples of the calibrated A/A mismatch rate.
MISMATCH_MULTIPLES = {"warn": 2.0, "fail": 4.0}


def match_threshold(th: Threshold, noise_mismatch: float | None) -> Threshold:
    """The match-rate threshold where the calibrated A/A greedy mismatch rate is not 0."""
    if not noise_mismatch:
        return th

    def lowered(limit: Limit | None, k: float) -> Limit | None:
        if limit is None or limit.relative:
            return limit
        return Limit(min(limit.value, 1.0 - k * noise_mismatch))

    return dataclasses.replace(
        th,
        warn=lowered(th.warn, MISMATCH_MULTIPLES["warn"]),
        fail=lowered(th.fail, MISMATCH_MULTIPLES["fail"]),
    )


def run(ctx: Context, settings: CheckSettings) -> CheckResult:
    th = settings.thresholds
    refs = ctx.references()
    if not refs:
        return CheckResult(ID, TITLE, Status.SKIP, "no baseline and no old engine to compare with")
    g, s = keys.GREEDY, keys.SAMPLE
    measurements, details = [], {}
    for label, ref in refs:
        entry: dict[str, Any] = {}  # JSON details: the agreement's figures and the length ratio
        if f"{g}_{keys.OFFSETS}" in ctx.new.arrays and f"{g}_{keys.OFFSETS}" in ref.arrays:
            agree = greedy_agreement(
                ctx.new[f"{g}_{keys.TOKEN_IDS}"],
                ctx.new[f"{g}_{keys.OFFSETS}"],
                ref[f"{g}_{keys.TOKEN_IDS}"],
                ref[f"{g}_{keys.OFFSETS}"],
            )
            noise = ctx.noise("greedy_mismatch_rate")
            m = measure(
                "greedy_exact_match_rate",
                agree.exact_match_rate,
                match_threshold(th["greedy_exact_match_rate"], noise),
                engine=f"vs {label}",
            )
            if noise:
                m.note = f"A/A greedy mismatch {noise:.2g} (calibrated)"
            measurements.append(m)
            diverged = np.flatnonzero(agree.first_divergence >= 0)
            entry["greedy"] = {
                **{k: v for k, v in agree.to_dict().items() if k != "first_divergence"},
                "diverging_prompts": diverged[:20].tolist(),
            }
            if len(diverged):
                entry["examples"] = _examples(
                    ctx.new, ref, diverged[:EXAMPLES], agree.first_divergence
                )
        same_seed = _same_seed_samples(ctx.new, ref)
        if same_seed is not None:
            measurements.append(
                measure(
                    SAME_SEED, same_seed, Threshold(source="informational"), engine=f"vs {label}"
                )
            )
            entry["same_seed_sample_match_rate"] = same_seed
        ratio = length_ratio(ctx.new[f"{s}_{keys.OFFSETS}"], ref[f"{s}_{keys.OFFSETS}"])
        # Two engines whose samplers draw other samples from one seed compare two draws: their
        # mean lengths differ by chance (SmolLM2 at n 2: x0.934 from 112 samples a side, clean).
        # The standard error stands in for the A/A reading, whichever is larger.
        se = length_ratio_se(ctx.new[f"{s}_{keys.OFFSETS}"], ref[f"{s}_{keys.OFFSETS}"])
        calibrated = ctx.noise("length_ratio_deviation")
        noise = max(calibrated, se) if calibrated is not None else (se or None)
        length = measure(
            "length_ratio_deviation",
            abs(ratio - 1.0),
            th["length_ratio_deviation"],
            noise,
            engine=f"vs {label}",
        )
        if se > (calibrated or 0.0):
            length.note = f"sampling standard error {se:.2g} (the bounds scale with it)"
        measurements.append(length)
        entry["length_ratio"] = ratio
        entry["length_ratio_se"] = se
        details[label] = entry
    status = worst(m.status for m in measurements)
    first = measurements[0]
    summary = f"greedy match {first.value:.0%} {first.engine}, length x{details[refs[0][0]]['length_ratio']:.3f}"
    same_seed = details[refs[0][0]].get("same_seed_sample_match_rate")
    if same_seed is not None and same_seed < 1.0:
        summary += (
            f"; same-seed samples {same_seed:.0%} identical (the sampler's random stream changed: judged by "
            "distribution, not token by token)"
        )
    diagnosis = ""
    if status in (Status.WARN, Status.FAIL):
        diagnosis = (
            "Greedy completions or output lengths moved. If forward drift is clean, look at sampling-side changes "
            "(generation defaults from generation_config.json, stop tokens, detokenization); otherwise fix the forward drift first."
        )
    return CheckResult(ID, TITLE, status, summary, diagnosis, measurements, details)


SAME_SEED = "same_seed_sample_match_rate"


def _same_seed_samples(new: ev.Evidence, ref: ev.Evidence) -> float | None:
    """The share of sampled completions identical to ``ref``'s, sequence by sequence; None where
    the two did not sample the same prompts x n (nothing to pair)."""
    s = keys.SAMPLE
    needed = (f"{s}_{keys.TOKEN_IDS}", f"{s}_{keys.OFFSETS}", f"{s}_{keys.PROMPT_INDEX}")
    if not all(k in new.arrays and k in ref.arrays for k in needed):
        return None
    if not np.array_equal(new[needed[2]], ref[needed[2]]):
        return None
    return greedy_agreement(
        new[needed[0]], new[needed[1]], ref[needed[0]], ref[needed[1]]
    ).exact_match_rate


def _examples(
    new: ev.Evidence, ref: ev.Evidence, which: np.ndarray, first: np.ndarray
) -> list[dict[str, Any]]:
    """The reference's and the new engine's greedy completions of the sequences ``which``, decoded
    (untrusted text, escaped where it is rendered), with the prompt id and the first differing token."""
    g = keys.GREEDY
    new_seqs, ref_seqs = sequences(new, g), sequences(ref, g)
    prompt_of = new[f"{g}_{keys.PROMPT_INDEX}"]
    names = new.texts.get("prompt_ids") if isinstance(new.texts, dict) else None
    out = []
    for i in which.tolist():
        p = int(prompt_of[i])
        out.append(
            {
                "prompt_id": names[p] if isinstance(names, list) and p < len(names) else p,
                "first_divergence": int(first[i]),
                "reference": ref.decode(ref_seqs[i].tolist()),
                "new": new.decode(new_seqs[i].tolist()),
            }
        )
    return out


SPEC = CheckSpec(id=ID, title=TITLE, run=run, thresholds=THRESHOLDS)
