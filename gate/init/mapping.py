"""A stack's flat config -> the gate.yaml fields it fills, each with where its value came from.

Nothing is guessed: a value comes from a key the config sets, from the stack's own default (named as
such), or from what the stack hard-codes; everything else is reported, with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gate.init.stacks import Stack, first_set

# Engine arguments gate.yaml takes from a stack's pass-through block, keyed as vLLM's EngineArgs.
_ENGINE_ARG_NAME = str.maketrans({"-": "_"})


@dataclass(frozen=True)
class Filled:
    value: Any
    source: str  # "from <key>", "<stack>'s default for <key> (not in your config)", "fixed by <stack>: why"


@dataclass
class Mapped:
    stack: Stack
    fields: dict[str, Filled] = field(default_factory=dict)  # gate.yaml dotted path -> value
    unmapped: list[str] = field(
        default_factory=list
    )  # sentences: what was not carried over and why
    transport: dict[str, Any] = field(default_factory=dict)


def map_config(stack: Stack, config: Mapping[str, Any]) -> Mapped:
    out = Mapped(stack)
    for path, where in stack.fields.items():
        value, found = first_set(config, *where.keys)
        if found is not None:
            source = f"from {found}"
        elif where.has_default:
            value, source = (
                where.default,
                f"{stack.title}'s default for {where.keys[0]} (not in your config)",
            )
        else:
            out.unmapped.append(
                f"{path}: {' / '.join(where.keys)} not in your config; gate's default stands"
            )
            continue
        if where.convert is not None:
            value = where.convert(value)
        if value is None:  # the stack leaves it to vLLM: so does gate
            continue
        out.fields[path] = Filled(value, source)
    for path, (value, why) in stack.fixed.items():
        out.fields[path] = Filled(value, f"fixed by {stack.title}: {why}")
    for prefix in stack.passthrough:
        for k, value in config.items():
            if k.startswith(prefix) and k != prefix.rstrip("."):
                name = k[len(prefix) :].translate(_ENGINE_ARG_NAME)
                if "." in name:
                    out.unmapped.append(
                        f"{k}: a nested engine argument; set engine_args.{name.split('.')[0]} by hand"
                    )
                    continue
                out.fields[f"engine_args.{name}"] = Filled(value, f"from {k}")
    if stack.loss is not None:
        choice = stack.loss(config)
        out.fields["grpo.loss"] = Filled(choice.loss, choice.why)
        band_why = choice.band_why or choice.why
        if choice.clip_eps is not None:
            out.fields["grpo.clip_eps"] = Filled(choice.clip_eps, band_why)
            if choice.clip_eps_high is not None and (
                choice.clip_eps_high != choice.clip_eps or choice.loss in ("dapo", "gspo")
            ):
                out.fields["grpo.clip_eps_high"] = Filled(choice.clip_eps_high, band_why)
        out.unmapped += list(choice.unmapped)
    rollout = out.fields.get("sampling.temperature")
    if rollout is not None and isinstance(rollout.value, (int, float)) and rollout.value > 0:
        # gate's own 0.7 would give a stack that samples at 1 with raw logprobs a mismatch it never has
        out.fields["grpo.temperature"] = Filled(
            rollout.value, "as sampling.temperature: the mini GRPO run samples as your rollouts do"
        )
    for k, why in stack.ignored.items():
        if k in config and not _is_noop(config[k]):
            out.unmapped.append(f"{k}: {config[k]!r} not carried over ({why})")
    out.transport = {k: config[k] for k in stack.transport if k in config}
    return out


def _is_noop(value: Any) -> bool:
    """Unset, off, empty, or a penalty/min_p at its neutral 0 or 1."""
    if value is None or value is False or value in ({}, [], ""):
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value in (0, 1)
