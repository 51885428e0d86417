"""What an engine setting means, so config-parity compares meanings rather than spellings.

An engine records each setting as its live config reads it (gate/worker/engine.py). The same
behaviour is spelled differently across releases (top-k "off" is -1 in old releases and 0 in new
ones), a setting a release does not have reads ``None``, and a V0 engine carries fields it ignores.
:func:`meaning` turns one recorded value into its meaning, using the engine's generation and
version where the value alone is not enough; where the meaning cannot be known it says so
(``known=False``) and config-parity reports "not comparable" instead of a change.

Each rule cites the vLLM source it was read from (wheel sources under $GATE_CACHE_DIR/vllm-source,
``gate.vllm_source``); tests/unit/test_setting_meaning.py holds the table to hand-made cases.
Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gate.contract.engine_record import EngineIdentity

OFF = "off"


@dataclass(frozen=True)
class Meaning:
    """A setting's meaning: ``value`` compares with ``==``; ``how`` says how it was read."""

    value: Any
    known: bool = True
    how: str = "reported"

    def describe(self) -> str:
        return repr(self.value) if self.known else "unknown"


@dataclass(frozen=True)
class EngineFacts:
    """What the rules need to know about the engine beyond the value."""

    generation: str | None  # "V0" / "V1" / None when not recorded
    version: tuple[int, ...] | None  # vLLM's version, (0, 31, 0); None when not recorded
    settings: Mapping[str, Any]  # the engine's other flattened settings (kv "auto" needs dtype)

    @classmethod
    def of(cls, identity: EngineIdentity, settings: Mapping[str, Any]) -> EngineFacts:
        return cls(identity.engine_generation, parse_version(identity.vllm), settings)


def parse_version(raw: Any) -> tuple[int, ...] | None:
    """``"0.10.2+cpu"`` -> (0, 10, 2); None for anything without a leading dotted number."""
    m = re.match(r"^\s*v?(\d+(?:\.\d+)*)", str(raw)) if raw is not None else None
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def _unknown(how: str) -> Meaning:
    return Meaning(None, known=False, how=how)


def _name(value: Any) -> str:
    """An enum member, its repr or its name, lower-cased without the class: ``LogprobsMode.RAW_LOGPROBS``."""
    text = str(getattr(value, "value", value)).strip()
    return (
        text.rsplit(".", 1)[-1].lower()
        if re.match(r"^[A-Za-z_]+\.[A-Za-z_]+$", text)
        else text.lower()
    )


def _logprobs_mode(value: Any, e: EngineFacts) -> Meaning:
    if e.generation == "V0":
        # V0 never read logprobs_mode (vLLM 0.10.2 still defines ModelConfig.logprobs_mode, which only
        # the V1 sampler reads): its sampler reports logprobs after temperature and penalties.
        return Meaning(
            "processed_logprobs", how="V0 has no logprobs_mode: it reports processed logprobs"
        )
    if value is None:
        if e.generation == "V1" and e.version is not None and e.version < (0, 10):
            # V1 before logprobs_mode (added in 0.10.0) returned raw logprobs; 0.10.2 keeps that as
            # the default (vllm/config/__init__.py: logprobs_mode = LogprobsMode.RAW_LOGPROBS).
            return Meaning("raw_logprobs", how="V1 before 0.10 has no logprobs_mode: raw logprobs")
        return _unknown("not recorded")
    return Meaning(_name(value))


def _async_scheduling(value: Any, e: EngineFacts) -> Meaning:
    if e.generation == "V0":
        return Meaning(False, how="V0 has no async scheduling")
    if value is None:
        # 0.10.2 scheduler.py: `async_scheduling: bool = False`; 0.32.0 declares `bool | None = None`
        # but VllmConfig.__post_init__ resolves None to a bool before the engine runs, so a recorded
        # None is a release without the field: the synchronous scheduler is its only one.
        return Meaning(False, how="no async_scheduling setting: synchronous scheduling")
    return Meaning(bool(value))


def _prefix_caching(value: Any, e: EngineFacts) -> Meaning:
    if value is None:
        # 0.10.2 arg_utils.py resolves None to True for V1 generation models before the engine runs.
        return _unknown("not recorded")
    return Meaning(bool(value))


def _off_at(*off_values: float) -> Callable[[Any, EngineFacts], Meaning]:
    """A sampling parameter whose listed values (and None, SamplingParams' default) mean "off"."""

    def rule(value: Any, e: EngineFacts) -> Meaning:
        if value is None or float(value) in off_values:
            return Meaning(OFF)
        return Meaning(float(value))

    return rule


def _top_k(value: Any, e: EngineFacts) -> Meaning:
    # 0.10.2 sampling_params.py: "top_k ... Set to 0 (or -1) to consider all tokens"; releases
    # before 0.9 defaulted to -1 and required it for "off"; every release from 0.10.2 to 0.34.0
    # defaults to 0 and accepts -1 (`if self.top_k < -1: raise`).
    if value is None or int(value) <= 0:
        return Meaning(OFF, how=f"{value!r} = top-k off")
    return Meaning(int(value))


def _temperature(value: Any, e: EngineFacts) -> Meaning:
    # SamplingParams.temperature defaults to 1.0 in every release read (0.10.2 .. 0.34.0).
    return Meaning(1.0 if value is None else float(value))


def _skip_special_tokens(value: Any, e: EngineFacts) -> Meaning:
    # SamplingParams.skip_special_tokens defaults to True (0.10.2 .. 0.34.0); a record from a gate
    # before it was read holds None: the default then too, as generation_config.json could set it
    # only from 0.33.
    return Meaning(True if value is None else bool(value))


def _max_tokens(value: Any, e: EngineFacts) -> Meaning:
    return Meaning(16 if value is None else int(value))  # SamplingParams default (0.10.2: 16)


_DTYPES = {"float": "float32", "fp32": "float32", "half": "float16", "fp16": "float16",
           "bf16": "bfloat16"}  # fmt: skip


def _dtype_name(value: Any) -> str:
    text = str(value).strip().lower().removeprefix("torch.")
    return _DTYPES.get(text, text)


def _dtype(value: Any, e: EngineFacts) -> Meaning:
    return _unknown("not recorded") if value is None else Meaning(_dtype_name(value))


def _kv_cache_dtype(value: Any, e: EngineFacts) -> Meaning:
    if value is None:
        return _unknown("not recorded")
    text = _dtype_name(value)
    if text == "auto":
        # cache.py (0.10.2 .. 0.34.0): "auto" stores the KV cache in the model's dtype.
        model = e.settings.get("dtype")
        if model is None:
            return _unknown("'auto' and the model dtype is not recorded")
        return Meaning(_dtype_name(model), how=f"'auto' = the model dtype ({_dtype_name(model)})")
    if text == "fp8":
        return Meaning("fp8_e4m3", how="'fp8' = fp8_e4m3")  # 0.10.2 cache.py: "fp8 (=fp8_e4m3)"
    return Meaning(text)


# 0.10.2 compilation.py CompilationLevel (NO_COMPILATION=0, DYNAMO_AS_IS=1, DYNAMO_ONCE=2,
# PIECEWISE=3) became CompilationMode (NONE=0, STOCK_TORCH_COMPILE=1, DYNAMO_TRACE_ONCE=2,
# VLLM_COMPILE=3) with the same numbers (0.32.0 compilation.py).
_COMPILATION = {
    "0": "none", "no_compilation": "none", "none": "none",
    "1": "stock_torch_compile", "dynamo_as_is": "stock_torch_compile",
    "stock_torch_compile": "stock_torch_compile",
    "2": "dynamo_trace_once", "dynamo_once": "dynamo_trace_once",
    "dynamo_trace_once": "dynamo_trace_once",
    "3": "vllm_compile", "piecewise": "vllm_compile", "vllm_compile": "vllm_compile",
}  # fmt: skip


def _compilation_mode(value: Any, e: EngineFacts) -> Meaning:
    if value is None:
        return _unknown("not recorded")
    return Meaning(_COMPILATION.get(_name(value), _name(value)))


def _empty_is_none(value: Any, e: EngineFacts) -> Meaning:
    """Lists and mappings where None and empty both mean "none" (logits processors, overrides)."""
    return Meaning(
        None if value in (None, [], {}, ()) else value, how="none" if not value else "reported"
    )


def _overrides(value: Any, e: EngineFacts) -> Meaning:
    """Sampling overrides (generation_config.json, override_generation_config): an entry that sets
    a parameter to what SamplingParams does without it (top_k -1, top_p 1.0) overrides nothing."""
    if value is None:  # the engine's get_diff_sampling_param was missing or failed
        return _unknown("not recorded")
    if not isinstance(value, dict):
        return Meaning(value)
    kept = {
        k: v
        for k, v in value.items()
        if meaning(_DSP + k, v, e).value != meaning(_DSP + k, None, e).value
        or _DSP + k not in RULES
    }
    dropped = sorted(set(value) - set(kept))
    return Meaning(
        kept or None, how=f"{', '.join(dropped)}: the default" if dropped else "reported"
    )


def _attention_backend(value: Any, e: EngineFacts) -> Meaning:
    # AttentionConfig.backend (0.13.0+) defaults to None: the platform picks the backend; before
    # 0.13.0 no config field exists and the platform picks it too (tests/compat SETTING_SINCE).
    return Meaning(
        "auto" if value is None else _name(value),
        how="platform's choice" if value is None else "reported",
    )


_DSP = "default_sampling_params."


def _reported(value: Any, e: EngineFacts) -> Meaning:
    return _unknown("not recorded") if value is None else Meaning(value)


def _as_is(value: Any, e: EngineFacts) -> Meaning:
    """Settings whose None is itself a value (seed None = no seed)."""
    return Meaning(value)


RULES: dict[str, Callable[[Any, EngineFacts], Meaning]] = {
    "logprobs_mode": _logprobs_mode,
    "async_scheduling": _async_scheduling,
    "enable_prefix_caching": _prefix_caching,
    "dtype": _dtype,
    "kv_cache_dtype": _kv_cache_dtype,
    "compilation_mode": _compilation_mode,
    "attention_backend": _attention_backend,
    "logits_processors": _empty_is_none,
    # ModelConfig.override_generation_config: None and {} both mean none given (0.10.2: a dict field).
    "override_generation_config": lambda v, e: _overrides({} if v is None else v, e),
    "generation_config_overrides": _overrides,
    "dropped_engine_args": _empty_is_none,
    "quantization": _as_is,
    "seed": _as_is,
    _DSP + "top_k": _top_k,
    _DSP + "top_p": _off_at(1.0),
    _DSP + "min_p": _off_at(0.0),
    _DSP + "repetition_penalty": _off_at(1.0),
    _DSP + "presence_penalty": _off_at(0.0),
    _DSP + "frequency_penalty": _off_at(0.0),
    _DSP + "temperature": _temperature,
    _DSP + "max_tokens": _max_tokens,
    _DSP + "skip_special_tokens": _skip_special_tokens,
    _DSP + "seed": _as_is,
}


def meaning(key: str, value: Any, engine: EngineFacts) -> Meaning:
    """The meaning of ``value`` recorded for ``key`` on ``engine``; unknown keys: None is unknown."""
    rule = RULES.get(key, _reported)
    try:
        return rule(value, engine)
    except (TypeError, ValueError):  # a value of a type the rule does not expect: compare as given
        return Meaning(value)


# What to pass so the new engine behaves like the old one, by setting; {value} is the old meaning.
# Only used when the meanings differ and the old one is known, so advice never asks for what the
# new engine already does.
_RESTORE = {
    "logprobs_mode": "pass logprobs_mode={value!r} so logprobs keep the semantics the trainer was written for",
    "enable_prefix_caching": "pass enable_prefix_caching={value!r} (V1 enables it by default; stale cache "
    "entries survive weight updates)",
    "async_scheduling": "pass async_scheduling={value!r} to keep the scheduling path of the baseline",
    "dtype": "pin dtype={value!r} in engine_args",
    "kv_cache_dtype": "pin kv_cache_dtype={value!r} in engine_args",
    "default_sampling_params": "pass generation_config='vllm' (ignore the model's generation_config.json) or "
    "set the sampling parameters explicitly in every request",
    "generation_config": "pin generation_config={value!r} ('vllm' ignores the model's generation_config.json)",
    "engine_generation": "the engine generation changed ({value} -> new): re-check logprob semantics and "
    "weight-update paths",
    "generation_config_overrides": "the model's generation_config.json (with override_generation_config) "
    "now changes the sampling defaults: pass generation_config='vllm' to ignore it, or set the sampling "
    "parameters explicitly in every request",
    "override_generation_config": "override_generation_config changes the sampling defaults: drop it, or set "
    "the sampling parameters explicitly in every request",
    "logits_processors": "custom logits processors change the sampling distribution: the trainer must apply "
    "them too",
    "model_runner": "the rollouts moved off Model Runner {value}, whose sampler, random generator and "
    "logprob code the baseline measured (vLLM 0.34 removed V1; 0.22-0.33 chose per engine): re-record the "
    "baseline on the new runner, or set VLLM_USE_V2_MODEL_RUNNER in the engine's env where the release "
    "still has both, then acknowledge model_runner",
}


def restore_advice(key: str, old: Meaning) -> str:
    """The fix for a changed setting, phrased from the old engine's meaning."""
    template = _RESTORE.get(key) or _RESTORE.get(key.split(".", 1)[0])
    if template is None:
        return f"pin it in engine_args ({key}={old.value!r} on the old engine)"
    return template.format(value=old.value)
