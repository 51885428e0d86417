"""logprob-semantics: does each engine report processed logprobs, raw ones, or neither?

The engine's logprob of each sampled token is compared with the trainer-side reference's
processed logprob (after temperature / top-k / top-p) and raw logprob (log_softmax of the logits)
of the same token. The closer one wins if it is clearly closer (``decisive_ratio``) and close
in absolute terms (``max_mean_abs_diff``); otherwise the semantics are "neither". vLLM V1 returns raw
logprobs unless ``logprobs_mode="processed_logprobs"`` (added in 0.10.0); V0 returned logprobs
after temperature. An RL trainer that uses raw logprobs as the rollout policy's logprobs computes
wrong importance ratios at any temperature other than 1.
"""

from __future__ import annotations

import math

from gate import evidence as ev
from gate.checks.base import CheckResult, CheckSpec, Measurement, Status
from gate.metrics import logprob_semantics_distances

ID = "logprob-semantics"
TITLE = "Logprob semantics"

FIX = {
    "processed": "set the engine argument logprobs_mode='processed_logprobs' (vLLM >= 0.10) so reported "
    "logprobs are those of the distribution the token was sampled from",
    "raw": "set the engine argument logprobs_mode='raw_logprobs', or change `expect` if the trainer "
    "applies the sampling transform itself",
}


def classify(d_processed: float, d_raw: float, decisive_ratio: float, max_mean_abs_diff: float) -> str:
    if math.isnan(d_processed) or math.isnan(d_raw):
        return "unknown"
    best, other, name = (d_processed, d_raw, "processed") if d_processed <= d_raw else (d_raw, d_processed, "raw")
    if best > max_mean_abs_diff or best * decisive_ratio > other:
        return "neither"
    return name


def run(ctx, settings) -> CheckResult:
    opts = settings.options
    expect = opts["expect"]
    if ctx.transform_is_identity:
        return CheckResult(ID, TITLE, Status.SKIP, "temperature 1 without top-k/top-p: raw and processed coincide")
    found, measurements = {}, []
    for name, e in ctx.engines():
        dist = logprob_semantics_distances(
            e[f"{ev.SAMPLE}_{ev.ENGINE_LOGPROB}"], e[f"{ev.SAMPLE}_{ev.TRAINER_PROCESSED}"], e[f"{ev.SAMPLE}_{ev.TRAINER_RAW}"]
        )
        found[name] = classify(dist["mean_abs_diff_processed"], dist["mean_abs_diff_raw"], opts["decisive_ratio"], opts["max_mean_abs_diff"])
        for key, value in dist.items():
            measurements.append(Measurement(key, value, Status.PASS, engine=name))
    details = {"semantics": found, "expect": expect, "engine_mode": {n: e.engine["effective"].get("logprobs_mode") for n, e in ctx.engines()}}
    new, old = found["new"], found.get("old")
    label = f"new reports {new}" + (f", old reports {old}" if old else "") + f" (expected {expect})"
    if new != expect:
        mode = details["engine_mode"]["new"]
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
        return CheckResult(ID, TITLE, Status.FAIL, label, diagnosis, measurements, details)
    if old is not None and old not in (new, "unknown"):
        diagnosis = (
            f"Logprob semantics changed with the upgrade: old reported {old}, new reports {new}. The new one is what the "
            "config expects; remove any trainer-side compensation that was written for the old semantics."
        )
        return CheckResult(ID, TITLE, Status.WARN, label, diagnosis, measurements, details)
    return CheckResult(ID, TITLE, Status.PASS, label, "", measurements, details)


SPEC = CheckSpec(
    id=ID,
    title=TITLE,
    run=run,
    options={"expect": "processed", "decisive_ratio": 5.0, "max_mean_abs_diff": 0.05},
)
