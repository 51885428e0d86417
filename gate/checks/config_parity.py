"""config-parity: the effective engine settings, old vs new, read from the live engines.

Upgrades change defaults silently (vLLM V1 turned on prefix caching and async scheduling, and
returns raw logprobs unless told otherwise; generation defaults may come from the model's
generation_config.json). Each changed setting gets the status its policy gives; a setting named in
the config's ``acknowledge:`` list is accepted as an intended change.
"""

from __future__ import annotations

from typing import Any

from gate.checks.base import CheckResult, CheckSpec, Measurement
from gate.verdict import Status, worst

ID = "config-parity"
TITLE = "Engine configuration parity"

# Settings known to change RL behaviour fail by default; the rest warn or are informational.
POLICY = {
    "logprobs_mode": "fail",
    "enable_prefix_caching": "fail",
    "async_scheduling": "fail",
    "dtype": "fail",
    "kv_cache_dtype": "fail",
    "quantization": "fail",
    "default_sampling_params": "fail",
    "generation_config": "warn",
    "override_generation_config": "warn",
    "generation_config_overrides": "warn",
    "engine_generation": "warn",
    "enable_chunked_prefill": "warn",
    "attention_backend": "warn",
    "dropped_engine_args": "warn",
    "logits_processors": "warn",
    "default": "info",
}

FIXES = {
    "logprobs_mode": "pass logprobs_mode='processed_logprobs' so logprobs match the sampling distribution",
    "enable_prefix_caching": "pass enable_prefix_caching=False (V1 enables it by default; stale cache entries survive weight updates)",
    "async_scheduling": "pass async_scheduling=False to keep the scheduling path of the baseline",
    "dtype": "pin dtype explicitly in engine_args",
    "kv_cache_dtype": "pin kv_cache_dtype explicitly",
    "default_sampling_params": "pass generation_config='vllm' (ignore the model's generation_config.json) or set the sampling "
    "parameters explicitly in every request",
    "generation_config": "pin generation_config explicitly ('vllm' ignores the model's generation_config.json)",
    "engine_generation": "the engine generation changed (V0 -> V1): re-check logprob semantics and weight-update paths",
    "logits_processors": "custom logits processors change the sampling distribution: the trainer must apply them too",
}

_STATUS = {"fail": Status.FAIL, "warn": Status.WARN, "info": Status.PASS}


def settings_of(engine_meta: dict[str, Any]) -> dict[str, Any]:
    """Flatten the behaviour-relevant settings an engine reported into one mapping."""
    flat = dict(engine_meta.get("effective", {}))
    for key, value in (engine_meta.get("default_sampling_params") or {}).items():
        flat[f"default_sampling_params.{key}"] = value
    flat["generation_config_overrides"] = engine_meta.get("generation_config_overrides")
    flat["engine_generation"] = engine_meta.get("identity", {}).get("engine_generation")
    flat["dropped_engine_args"] = engine_meta.get("dropped_engine_args")
    return flat


def policy_for(key: str, policy: dict[str, str]) -> str:
    return policy.get(key) or policy.get(key.split(".", 1)[0]) or policy["default"]


def run(ctx, settings) -> CheckResult:
    # Against the old engine when it ran; else against the settings the baseline's engine recorded.
    if ctx.old is not None:
        reference, label = ctx.old.engine, "old"
    elif ctx.baseline is not None:
        reference, label = ctx.baseline.manifest.get("engine", {}), "baseline"
    else:
        return CheckResult(ID, TITLE, Status.SKIP, "no old engine and no baseline to compare with")
    policy = settings.options["policy"]
    old, new = settings_of(reference), settings_of(ctx.new.engine)
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    measurements, problems = [], []
    for key in changed:
        level = policy_for(key, policy)
        acknowledged = key in ctx.acknowledge or key.split(".", 1)[0] in ctx.acknowledge
        status = Status.PASS if acknowledged else _STATUS[level]
        note = f"{old.get(key)!r} -> {new.get(key)!r}" + (
            " (acknowledged)" if acknowledged else f" (policy: {level})"
        )
        measurements.append(Measurement(key, None, status, note=note))
        if status in (Status.WARN, Status.FAIL):
            fix = FIXES.get(key) or FIXES.get(key.split(".", 1)[0]) or "pin it in engine_args"
            problems.append(f"{key} changed {old.get(key)!r} -> {new.get(key)!r}: {fix}")
    # What the user asked for but the engine overrode (e.g. async scheduling the platform refuses).
    requested = ctx.new.engine.get("requested_engine_args", {})
    effective = ctx.new.engine.get("effective", {})
    overridden = {
        k: (v, effective[k]) for k, v in requested.items() if k in effective and effective[k] != v
    }
    for key, (asked, actual) in sorted(overridden.items()):
        measurements.append(
            Measurement(
                f"requested.{key}",
                None,
                Status.PASS,
                note=f"requested {asked!r}, engine runs {actual!r}",
            )
        )
    status = worst([m.status for m in measurements] or [Status.PASS])
    unacked = sum(m.status in (Status.WARN, Status.FAIL) for m in measurements)
    summary = (
        f"{len(changed)} setting(s) differ from {label}, {unacked} not acknowledged"
        if changed
        else f"effective settings identical to {label}"
    )
    diagnosis = ""
    if problems:
        diagnosis = (
            "Settings that change RL behaviour differ between the engines: "
            + "; ".join(problems)
            + ". If a change is intended, list it under `acknowledge:` in the gate config."
        )
    details = {
        "compared_with": label,
        "overridden_by_engine": {
            k: {"requested": a, "effective": b} for k, (a, b) in overridden.items()
        },
        "diff": {k: {"old": old.get(k), "new": new.get(k)} for k in changed},
        "acknowledged": sorted(ctx.acknowledge),
    }
    return CheckResult(ID, TITLE, status, summary, diagnosis, measurements, details)


SPEC = CheckSpec(id=ID, title=TITLE, run=run, options={"policy": POLICY})
