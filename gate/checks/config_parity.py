"""config-parity: the effective engine settings, old vs new, read from the live engines.

Upgrades change defaults silently (vLLM V1 turned on prefix caching and async scheduling, and
returns raw logprobs unless told otherwise; generation defaults may come from the model's
generation_config.json). Settings are compared by meaning (gate/analysis/setting_meaning.py): top-k
-1 and 0 both mean "off", a V0 engine reports processed logprobs without a ``logprobs_mode``, a
release without a setting behaves as that release did. Each changed meaning gets the status its
policy gives; where a meaning cannot be known the setting is "not comparable" and at most WARNs. A
setting named in the config's ``acknowledge:`` list is accepted as an intended change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gate.analysis import server_defaults, stop_tokens
from gate.analysis.setting_meaning import EngineFacts, Meaning, meaning, restore_advice
from gate.checks.base import CheckResult, CheckSettings, CheckSpec, Measurement
from gate.checks.context import Context
from gate.contract.engine_record import EngineRecord
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
    # the text a reward reads, not the tokens trained on
    "default_sampling_params.skip_special_tokens": "warn",
    "generation_config": "warn",
    "override_generation_config": "warn",
    "generation_config_overrides": "warn",
    "engine_generation": "warn",
    # V1 and V2 sample, seed and compute logprobs with code of their own (gate/worker/model_runner.py)
    "model_runner": "warn",
    "enable_chunked_prefill": "warn",
    "attention_backend": "warn",
    "dropped_engine_args": "warn",
    "logits_processors": "warn",
    "default": "info",
}

_STATUS = {"fail": Status.FAIL, "warn": Status.WARN, "info": Status.PASS}
_DSP = "default_sampling_params"


def settings_of(record: EngineRecord) -> dict[str, Any]:
    """Flatten the behaviour-relevant settings an engine reported into one mapping."""
    flat = dict(record.effective)
    for key, value in (record.default_sampling_params or {}).items():
        flat[f"{_DSP}.{key}"] = value
    flat["generation_config_overrides"] = record.generation_config_overrides
    flat["engine_generation"] = record.identity.engine_generation
    flat["dropped_engine_args"] = record.dropped_engine_args
    return flat


def policy_for(key: str, policy: dict[str, str]) -> str:
    return policy.get(key) or policy.get(key.split(".", 1)[0]) or policy["default"]


@dataclass(frozen=True)
class SettingDiff:
    """One setting whose recorded value differs between the engines, with both meanings."""

    key: str
    old_value: Any
    new_value: Any
    old: Meaning
    new: Meaning

    @property
    def comparable(self) -> bool:
        return self.old.known and self.new.known

    @property
    def same_meaning(self) -> bool:
        return self.comparable and self.old.value == self.new.value


def _meaning_of(key: str, flat: dict[str, Any], record: EngineRecord) -> Meaning:
    if key.startswith(_DSP + ".") and record.default_sampling_params is None:
        # A release without LLM.get_default_sampling_params records none: its defaults are unknown.
        return Meaning(None, known=False, how="engine records no default sampling params")
    return meaning(key, flat.get(key), EngineFacts.of(record.identity, flat))


# Settings a gate records since a later version: a record from an earlier gate (a committed baseline)
# lacks the key, which says nothing about the engine, so they are compared only where both have it.
RECORDED_LATER = ("model_runner", f"{_DSP}.skip_special_tokens")


def compare(old_meta: EngineRecord, new_meta: EngineRecord) -> list[SettingDiff]:
    """Every setting whose recorded value differs, sorted by key, with what each value means."""
    old, new = settings_of(old_meta), settings_of(new_meta)
    keys = sorted(
        k
        for k in old.keys() | new.keys()
        if old.get(k) != new.get(k) and not (k in RECORDED_LATER and (k not in old or k not in new))
    )
    return [
        SettingDiff(
            k, old.get(k), new.get(k), _meaning_of(k, old, old_meta), _meaning_of(k, new, new_meta)
        )
        for k in keys
    ]


def _judge(d: SettingDiff, level: str, acknowledged: bool, label: str) -> tuple[Status, str, str]:
    """(status, note, problem) for one differing setting; problem is empty when nothing is wrong."""
    raw = f"{d.old_value!r} -> {d.new_value!r}"
    if d.same_meaning:
        return Status.PASS, f"{raw}: same meaning ({_how(d)})", ""
    if not d.comparable:
        side = label if not d.old.known else "new"
        note = f"{raw}: not comparable: {side} has no such setting ({(d.old if not d.old.known else d.new).how})"
        if acknowledged or level == "info":
            return Status.PASS, note + (" (acknowledged)" if acknowledged else ""), ""
        problem = (
            f"{d.key} not comparable ({raw}): {side} has no such setting, so whether its meaning changed "
            "cannot be known; check by hand that the new engine behaves as the trainer expects, then "
            "acknowledge it"
        )
        return Status.WARN, note, problem
    note = f"{d.old.describe()} -> {d.new.describe()}" + (
        f" (recorded {raw})" if _spelled_differently(d) else ""
    )
    if acknowledged:
        return Status.PASS, note + " (acknowledged)", ""
    status = _STATUS[level]
    problem = (
        f"{d.key} changed {d.old.describe()} -> {d.new.describe()}: {restore_advice(d.key, d.old)}"
    )
    return status, note + f" (policy: {level})", problem if status != Status.PASS else ""


def _how(d: SettingDiff) -> str:
    parts = [m.how for m in (d.old, d.new) if m.how != "reported"]
    return "; ".join(parts) or f"both mean {d.new.describe()}"


def _spelled_differently(d: SettingDiff) -> bool:
    return (d.old_value, d.new_value) != (d.old.value, d.new.value)


def run(ctx: Context, settings: CheckSettings) -> CheckResult:
    # Against the old engine when it ran; else against the settings the baseline's engine recorded.
    if ctx.old is not None:
        reference, label = ctx.old.engine, "old"
    elif ctx.baseline is not None:
        reference, label = ctx.baseline.engine, "baseline"
    else:
        return CheckResult(ID, TITLE, Status.SKIP, "no old engine and no baseline to compare with")
    policy = settings.options["policy"]
    diffs = compare(reference, ctx.new.engine)
    measurements, problems = [], []
    for d in diffs:
        acknowledged = d.key in ctx.acknowledge or d.key.split(".", 1)[0] in ctx.acknowledge
        status, note, problem = _judge(d, policy_for(d.key, policy), acknowledged, label)
        measurements.append(Measurement(d.key, None, status, note=note))
        if problem:
            problems.append(problem)
    # Server mode: the sampling defaults each server fills in (gate/analysis/server_defaults.py).
    old_meta = ctx.old.engine if ctx.old is not None else None
    for found in server_defaults.findings(old_meta, ctx.new.engine, ctx.sampling):
        measurements.append(found.measurement)
        if found.problem:
            problems.append(found.problem)
    # Stop tokens the old engine honoured and the new one samples and goes on past.
    stop_ref, stop_label, caps = stop_tokens.reference(ctx)
    stops, finish = stop_tokens.findings(stop_ref, ctx.new, stop_label, caps)
    for stop in stops:
        measurements.append(stop.measurement)
        problems.append(stop.problem)
    # What the user asked for but the engine overrode (e.g. async scheduling the platform refuses).
    requested = ctx.new.engine.requested_engine_args
    effective = ctx.new.engine.effective
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
    runners = _runners(reference, ctx.new.engine)
    if "model_runner" not in {d.key for d in diffs}:
        measurements.append(
            Measurement(
                "model_runner", None, Status.PASS, note=f"{label} {runners[0]}, new {runners[1]}"
            )
        )
    status = worst([m.status for m in measurements] or [Status.PASS])
    changed = [d for d in diffs if not d.same_meaning]
    unacked = sum(m.status in (Status.WARN, Status.FAIL) for m in measurements)
    equivalent = len(diffs) - len(changed)
    summary = (
        f"{len(changed)} setting(s) differ from {label}, {unacked} not acknowledged"
        if changed
        else f"effective settings identical to {label}"
    ) + (f" ({equivalent} spelled differently, same meaning)" if equivalent else "")
    if stops:
        summary += (
            f"; {len(stops)} stop token(s) the {stop_label} engine honoured passed over by new"
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
        "model_runner": {label: runners[0], "new": runners[1]},
        "overridden_by_engine": {
            k: {"requested": a, "effective": b} for k, (a, b) in overridden.items()
        },
        "diff": {d.key: {"old": d.old_value, "new": d.new_value} for d in changed},
        # What each changed value means where that differs from the value or cannot be known.
        "meaning": {
            d.key: {"old": _jsonable(d.old), "new": _jsonable(d.new)}
            for d in changed
            if _spelled_differently(d) or not d.comparable
        },
        "same_meaning": {
            d.key: {"old": d.old_value, "new": d.new_value, "meaning": _jsonable(d.new)}
            for d in diffs
            if d.same_meaning
        },
        "acknowledged": sorted(ctx.acknowledge),
        "finish": finish,
    }
    return CheckResult(ID, TITLE, status, summary, diagnosis, measurements, details)


def _runners(reference: EngineRecord, new: EngineRecord) -> tuple[str, str]:
    """Each engine's model runner as the report names it: V1, V2, or why it is not known."""

    def named(record: EngineRecord) -> str:
        if "model_runner" not in record.effective:
            return "not recorded (a gate before the runner was recorded)"
        return record.effective["model_runner"] or "decided by vLLM at start (not readable here)"

    return named(reference), named(new)


def _jsonable(m: Meaning) -> Any:
    return m.value if m.known else None


SPEC = CheckSpec(id=ID, title=TITLE, run=run, options={"policy": POLICY})
