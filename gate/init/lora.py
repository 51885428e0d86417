"""A stack's LoRA settings -> gate.yaml's ``lora`` section (docs/lora.md), read from its own keys.

Where a stack serves the adapter through vLLM's LoRA path, its rank, alpha, target modules and the
way it pushes each version become LoRA mode; the passes gate refuses in that mode (the mini GRPO
run, the in-flight phase: they push full weights) are turned off with the reason. Where a stack
merges the adapter and pushes full weights, or has no working adapter path, nothing is carried and
the report says why: gate's full-weight probe is then the stack's own path. Keys and behaviour
were read in the stacks' code (verl 0.9.1, TRL 1.16.0, AReaL 1.0.4, OpenRLHF 0.11.2, SkyRL 0.3.0,
and NeMo-RL, prime-rl, PipelineRL at their December 2026 heads).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# Megatron-Core's names for a decoder's linear modules, as the HF names vLLM's adapters use
# (AReaL's megatron_lora.py mapping; verl's and NeMo-RL's Megatron backends use these names).
MEGATRON_MODULES = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),
    "linear_fc2": ("down_proj",),
}
ALL_LINEAR = "all-linear"  # PEFT's shorthand: every linear module but the output head


@dataclass(frozen=True)
class LoraKeys:
    """Where one stack's config sets its adapter, and how the stack gets each version into vLLM."""

    rank: str  # LoRA is on where this is > 0, or where ``switch`` is true
    alpha: str
    target_modules: str
    defaults: tuple[int, float, Any]  # the stack's own rank, alpha and target modules
    # (config) -> (gate's lora.naming, why): the stack's push, read from its code
    naming: Callable[[Mapping[str, Any]], tuple[str, str]]
    switch: str | None = None  # a boolean key that turns LoRA on (AReaL's actor.use_lora)
    on_when_present: str | None = None  # a section whose presence turns it on (prime-rl)
    use_rslora: str | None = None
    # (key, value, its default): the stack merges and pushes full weights when key is value
    merges_when: tuple[str, Any, Any] | None = None
    merges_why: str = ""

    def config_keys(self) -> tuple[str, ...]:
        """The config keys this block reads (accounted for: not reported as unmapped)."""
        optional = (self.switch, self.use_rslora)
        return (self.rank, self.alpha, self.target_modules, *(k for k in optional if k))


@dataclass(frozen=True)
class NoAdapterPath:
    """A stack whose LoRA never reaches vLLM as an adapter: the keys that turn it on, and why."""

    switches: tuple[str, ...]  # any of these set (true, or > 0) means the user trains LoRA
    why: str

    def config_keys(self) -> tuple[str, ...]:
        return self.switches


@dataclass
class LoraMapping:
    """What ``lora`` gate.yaml gets, with sources, and what the report says."""

    fields: dict[str, tuple[Any, str]]  # gate.yaml dotted path -> (value, source)
    said: list[str]  # sentences for the report (what was not carried, or turned off, and why)


def same(naming: str, why: str) -> Callable[[Mapping[str, Any]], tuple[str, str]]:
    return lambda config: (naming, why)


def map_lora(spec: LoraKeys | NoAdapterPath | None, config: Mapping[str, Any]) -> LoraMapping:
    if spec is None:
        return LoraMapping({}, [])
    if isinstance(spec, NoAdapterPath):
        on = [k for k in spec.switches if _on(config.get(k))]
        return LoraMapping(
            {}, [f"lora: {on[0]} is set, not carried over ({spec.why})"] if on else []
        )
    if not _lora_on(spec, config):
        return LoraMapping({}, [])
    if spec.merges_when is not None:
        key, value, default = spec.merges_when
        if config.get(key, default) == value:
            return LoraMapping(
                {},
                [
                    f"lora: not carried over ({key}: {value}: {spec.merges_why}; gate's full-weight probe is that path)"
                ],
            )
    rank_default, alpha_default, targets_default = spec.defaults
    fields: dict[str, tuple[Any, str]] = {"lora.enabled": (True, _why_on(spec, config))}
    for name, k, default in (
        ("rank", spec.rank, rank_default),
        ("alpha", spec.alpha, alpha_default),
        ("target_modules", spec.target_modules, targets_default),
    ):
        value = config.get(k)
        source = (
            f"from {k}"
            if value is not None
            else f"the stack's default for {k} (not in your config)"
        )
        value = default if value is None else value
        if name == "target_modules":
            value, note = target_modules(value)
            source += note
        elif name == "rank":
            value = int(value)
        else:
            value = float(value)
        fields[f"lora.{name}"] = (value, source)
    if spec.use_rslora and config.get(spec.use_rslora) is not None:
        fields["lora.use_rslora"] = (bool(config[spec.use_rslora]), f"from {spec.use_rslora}")
    naming, why = spec.naming(config)
    fields["lora.naming"] = (naming, why)
    off = (
        "LoRA mode: this pass pushes full weights, its adapter path is not built yet (docs/lora.md)"
    )
    fields["grpo.enabled"] = (False, off)
    fields["weight_sync.inflight.enabled"] = (False, off)
    return LoraMapping(fields, [])


def target_modules(value: Any) -> tuple[list[str], str]:
    """The stack's target modules as gate.yaml's list: PEFT's "all-linear" (a string, a list of it,
    or AReaL's and NeMo-RL's empty list) stays the shorthand; Megatron names become HF names."""
    if value in (ALL_LINEAR, [ALL_LINEAR], [], None):
        return [ALL_LINEAR], ""
    names = [value] if isinstance(value, str) else [str(v) for v in value]
    if any(n in MEGATRON_MODULES for n in names):
        hf = [h for n in names for h in MEGATRON_MODULES.get(n, (n,))]
        return hf, f" (Megatron names {names} as the HF modules vLLM adapts)"
    return names, ""


def _on(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    try:
        return float(value) > 0
    except (TypeError, ValueError):
        return value not in (None, "", "false", "False")


def _lora_on(spec: LoraKeys, config: Mapping[str, Any]) -> bool:
    if spec.switch is not None:
        return _on(config.get(spec.switch))
    if spec.on_when_present is not None:
        return any(k.startswith(spec.on_when_present) for k in config)
    return _on(config.get(spec.rank))


def _why_on(spec: LoraKeys, config: Mapping[str, Any]) -> str:
    if spec.switch is not None:
        return f"from {spec.switch}"
    if spec.on_when_present is not None:
        return f"your config has a {spec.on_when_present.rstrip('.')} section"
    return f"from {spec.rank}: {config.get(spec.rank)} > 0"
