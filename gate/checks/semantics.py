"""logprob-semantics: does each engine report processed logprobs, raw ones, or neither?

The engine's logprob of each sampled token is compared with the trainer-side reference's
processed logprob (after temperature / top-k / top-p) and raw logprob (log_softmax of the logits)
of the same token. The closer one wins if it is clearly closer (``decisive_ratio``) and close
in absolute terms (``max_mean_abs_diff``); otherwise the semantics are "neither". vLLM V1 returns raw
logprobs unless ``logprobs_mode="processed_logprobs"`` (added in 0.10.0); V0 returned logprobs
after temperature. An RL trainer that uses raw logprobs as the rollout policy's logprobs computes
wrong importance ratios at any temperature other than 1.

Before that, the check counts sampled tokens the requested transform excludes (the reference's
processed logprob is -inf: outside the top-k, or outside the top-p nucleus). An engine that applies
top-k / top-p never samples one; one that ignores them does at the rate of the mass it should have
cut. Their fraction (``tokens_outside_transform``) FAILs above 1e-3 and WARNs above 0. A token
within one ULP (of the engine's logit dtype) of the top-k/top-p boundary is undecidable instead:
the reference decides on logits rounded to that dtype, but a GPU kernel keeps exactly k of tied
tokens and bisects for the top-p cut, so it may keep or drop such a token either way
(``tokens_at_transform_boundary``, informational). Semantics are then classified on the remaining
tokens.
"""

from __future__ import annotations

import math

import numpy as np

from gate import evidence as ev
from gate.checks.base import CheckResult, CheckSpec, Limit, Measurement, Threshold, measure
from gate.checks.context import sampled_pairs
from gate.metrics import logprob_semantics_distances
from gate.verdict import Status, worst

ID = "logprob-semantics"
TITLE = "Logprob semantics"

FIX = {
    "processed": "set the engine argument logprobs_mode='processed_logprobs' (vLLM >= 0.10) so reported "
    "logprobs are those of the distribution the token was sampled from",
    "raw": "set the engine argument logprobs_mode='raw_logprobs', or change `expect` if the trainer "
    "applies the sampling transform itself",
}


def classify(
    d_processed: float, d_raw: float, decisive_ratio: float, max_mean_abs_diff: float
) -> str:
    if math.isnan(d_processed) or math.isnan(d_raw):
        return "unknown"
    best, other, name = (
        (d_processed, d_raw, "processed") if d_processed <= d_raw else (d_raw, d_processed, "raw")
    )
    if best > max_mean_abs_diff or best * decisive_ratio > other:
        return "neither"
    return name


THRESHOLDS = {
    "tokens_outside_transform": Threshold(
        Limit(0.0),
        Limit(1e-3),
        source="fraction of sampled tokens the requested top-k/top-p excludes: 0 for an engine that applies them",
    ),
}


def _distances(e) -> tuple[dict[str, float], int, int]:
    """Semantics distances on the tokens the transform allows; (distances, masked, total)."""
    pairs = sampled_pairs(e)
    raw = e[f"{ev.SAMPLE}_{ev.TRAINER_RAW}"]
    if pairs.masked:
        raw = raw[np.isfinite(e[f"{ev.SAMPLE}_{ev.TRAINER_PROCESSED}"])]
    return logprob_semantics_distances(pairs.engine, pairs.trainer, raw), pairs.masked, pairs.total


def _undecidable(e) -> int:
    """Sampled tokens outside the reference's transform that sit on its boundary (within one ULP)."""
    edge = e.arrays.get(f"{ev.SAMPLE}_{ev.TRAINER_AT_BOUNDARY}")
    if edge is None:  # evidence from before the boundary was recorded
        return 0
    return int(np.count_nonzero(edge & ~np.isfinite(e[f"{ev.SAMPLE}_{ev.TRAINER_PROCESSED}"])))


def run(ctx, settings) -> CheckResult:
    opts = settings.options
    expect = opts["expect"]
    if ctx.transform_is_identity:
        return CheckResult(
            ID, TITLE, Status.SKIP, "temperature 1 without top-k/top-p: raw and processed coincide"
        )
    found, outside, measurements = {}, {}, []
    for name, e in ctx.engines():
        dist, excluded, total = _distances(e)
        undecidable = _undecidable(e)
        masked = excluded - undecidable
        found[name] = classify(
            dist["mean_abs_diff_processed"],
            dist["mean_abs_diff_raw"],
            opts["decisive_ratio"],
            opts["max_mean_abs_diff"],
        )
        for key, value in dist.items():
            measurements.append(Measurement(key, value, Status.PASS, engine=name))
        if undecidable:
            note = f"{undecidable} of {total} sampled tokens: within one ULP of the top-k/top-p boundary, undecidable"
            measurements.append(
                Measurement(
                    "tokens_at_transform_boundary",
                    undecidable / total,
                    Status.PASS,
                    engine=name,
                    note=note,
                )
            )
        m = measure(
            "tokens_outside_transform",
            masked / total if total else 0.0,
            settings.thresholds["tokens_outside_transform"],
            engine=name,
        )
        m.note = f"{masked} of {total} sampled tokens"
        if name == "old":  # the old engine is context, not what this PR changes
            m.status, m.note = Status.PASS, m.note + "; old engine: for comparison"
        measurements.append(m)
        outside[name] = (masked, total, m.status)
    details = {
        "semantics": found,
        "expect": expect,
        "engine_mode": {n: e.engine["effective"].get("logprobs_mode") for n, e in ctx.engines()},
        "tokens_outside_transform": {n: masked for n, (masked, _, _) in outside.items()},
    }
    new, old = found["new"], found.get("old")
    label = f"new reports {new}" + (f", old reports {old}" if old else "") + f" (expected {expect})"
    status, diagnosis = _semantics_verdict(new, old, expect, details["engine_mode"]["new"])
    masked, total, outside_status = outside["new"]
    if outside_status in (Status.WARN, Status.FAIL):
        # Listed first: an engine that ignores top-k/top-p also reports logprobs of the wrong
        # distribution, so the semantics finding below is usually a consequence of this one.
        label = f"new sampled {masked} token(s) outside top-k/top-p; " + label
        diagnosis = " ".join(
            d for d in (_outside_diagnosis(masked, total, ctx.sampling), diagnosis) if d
        )
        status = worst([status, outside_status])
    return CheckResult(ID, TITLE, status, label, diagnosis, measurements, details)


def _semantics_verdict(new: str, old: str | None, expect: str, mode) -> tuple[Status, str]:
    if new != expect:
        if new == "neither":
            fix = (
                "the engine transforms logits beyond the configured temperature/top-k/top-p: check custom "
                "logits_processors, penalties or other defaults taken from generation_config.json, and a "
                "temperature applied twice; the trainer must apply exactly the transform the engine samples with"
            )
        else:
            fix = FIX.get(expect, FIX["processed"])
        diagnosis = (
            f"The new engine reports {new} logprobs (engine logprobs_mode={mode!r}) but the trainer expects {expect}: "
            f"importance ratios and KL are computed against the wrong distribution. Fix: {fix}."
        )
        return Status.FAIL, diagnosis
    if old is not None and old not in (new, "unknown"):
        diagnosis = (
            f"Logprob semantics changed with the upgrade: old reported {old}, new reports {new}. The new one is what the "
            "config expects; remove any trainer-side compensation that was written for the old semantics."
        )
        return Status.WARN, diagnosis
    return Status.PASS, ""


def _outside_diagnosis(masked: int, total: int, s: dict) -> str:
    return (
        f"The new engine sampled {masked} of {total} tokens ({masked / total:.2%}) that the requested sampling "
        f"transform excludes (temperature={s['temperature']}, top_k={s['top_k']}, top_p={s['top_p']}): it does not "
        "apply top-k/top-p although the request asked for them, so rollouts come from a wider distribution than the "
        "one the trainer's processed logprobs describe (those tokens have probability 0 under it). Fix: use an engine "
        "build whose sampler applies top-k/top-p on this platform, or stop requesting them and drop them on the "
        "trainer side too."
    )


SPEC = CheckSpec(
    id=ID,
    title=TITLE,
    run=run,
    thresholds=THRESHOLDS,
    options={"expect": "processed", "decisive_ratio": 5.0, "max_mean_abs_diff": 0.05},
)
