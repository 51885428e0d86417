"""A stack's flat config -> the gate.yaml fields it fills, each with where its value came from.

Nothing is guessed: a value comes from a key the config sets, from the stack's own default (named as
such), or from what the stack hard-codes; everything else is reported, with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gate.init.lora import map_lora
from gate.init.stacks import Stack, first_set, spellings

# Engine arguments gate.yaml takes from a stack's pass-through block, keyed as vLLM's EngineArgs.
_ENGINE_ARG_NAME = str.maketrans({"-": "_"})

# Arguments gate decides itself, whichever block of a stack's config sets them: why each stays out.
NOT_CARRIED = {
    "model": "gate.yaml's model.path names the checkpoint",
    "tokenizer": "gate.yaml's model.tokenizer names it",
    "load_format": "gate loads the checkpoint and pushes weights itself in its probes",
    "distributed_executor_backend": "gate picks the executor its weight push reaches",
    "worker_extension_cls": "the stack's worker extension is its update path: gate's recipe "
    "(weight_update.hook) carries it",
    "served_model_name": "gate names the model it serves",
    "data_parallel_size": "gate runs one engine per release",
    **dict.fromkeys(
        ("host", "port", "uvicorn_log_level", "disable_uvicorn_access_log", "api_key",
         "lora_modules", "headless", "nnodes", "node_rank", "master_addr", "master_port"),
        "a flag of the stack's server launch, not an engine argument: gate starts its own engine",
    ),
}  # fmt: skip


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
    read: set[str] = set()  # the config's keys something below accounts for
    for path, where in stack.fields.items():
        value, found = first_set(config, *where.keys)
        if found is not None:
            read.add(found)
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
        for k in config:
            if k.startswith(prefix) and k != prefix.rstrip(".") and k not in read:
                read.add(k)
                _carry(out, stack, k, k[len(prefix) :], config[k])
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
        for spelled in spellings(k):
            if spelled in config:
                read.add(spelled)
                if not _is_noop(config[spelled]):
                    out.unmapped.append(f"{spelled}: {config[spelled]!r} not carried over ({why})")
    if stack.only_when is not None:
        (key, value, default), paths, why = stack.only_when
        setting = config.get(key, default)
        if setting != value:
            for path in paths:
                if (dropped := out.fields.pop(path, None)) is not None:
                    out.unmapped.append(
                        f"{path}: {dropped.value!r} not carried over ({key}: {setting}: {why})"
                    )
    for spec in stack.lora:  # the first of the stack's LoRA blocks that is on
        lora = map_lora(spec, config)
        if lora.fields and stack.mode[0] == "server":
            adapter = {k: v for k, (v, _) in lora.fields.items() if k.startswith("lora.")}
            out.unmapped.append(
                f"lora: {adapter} not carried over ({stack.title} serves vLLM over HTTP, and "
                "gate's LoRA mode runs offline only for now: docs/lora.md)"
            )
            break
        for path, (value, source) in lora.fields.items():
            out.fields[path] = Filled(value, source)
        out.unmapped += lora.said
        if lora.fields or lora.said:
            break
    read |= {k for spec in stack.lora for k in spec.config_keys()}
    out.transport = {k: config[k] for k in stack.transport if k in config}
    read |= set(out.transport) | {k for k, _, _ in stack.recipe_when}
    for k in config:
        if (
            k not in read
            and any(k.startswith(scope) for scope in stack.scopes)
            and not any(k.startswith(own) for own in stack.own)
        ):
            out.unmapped.append(
                f"{k}: {config[k]!r} not carried over (a {stack.title} setting gate has no "
                "mapping for; if it is a vLLM engine argument, set it under engine_args by hand)"
            )
    return out


def _carry(out: Mapped, stack: Stack, key: str, arg: str, value: Any) -> None:
    """One key of a pass-through block: into engine_args under vLLM's name, or named with why not."""
    name, _, inner = arg.translate(_ENGINE_ARG_NAME).partition(".")
    if inner:  # a config argument written as a mapping (compilation_config: {mode: 0})
        block = out.fields.get(f"engine_args.{name}")
        nested = dict(block.value) if block is not None and isinstance(block.value, dict) else {}
        _nest(nested, inner.split("."), value)
        where = key[: len(key) - len(arg)] + arg.partition(".")[0]
        out.fields[f"engine_args.{name}"] = Filled(nested, f"from {where}")
        return
    if any(value is s or (type(value) is type(s) and value == s) for s in stack.passthrough_skips):
        out.unmapped.append(
            f"{key}: {value!r} not carried over ({stack.title} passes no such flag: vLLM's default stands)"
        )
        return
    if name.startswith("no_") and isinstance(value, bool):
        # argparse's negative switch (--no-enable-prefix-caching): the setting, off
        if not value:
            out.unmapped.append(f"{key}: false not carried over (the switch is not passed)")
            return
        name, value = name[3:], False
    if name in NOT_CARRIED:
        out.unmapped.append(f"{key}: {value!r} not carried over ({NOT_CARRIED[name]})")
        return
    target = f"engine_args.{name}"
    earlier = out.fields.get(target)
    if (
        earlier is not None
        and earlier.source.startswith("from ")
        and earlier.source != f"from {key}"
    ):
        out.unmapped.append(
            f"{key}: {value!r} and {earlier.source.removeprefix('from ')} both set "
            f"{name}; the later one, {key}, is carried"
        )
    out.fields[target] = Filled(value, f"from {key}")


def _nest(tree: dict[str, Any], path: list[str], value: Any) -> None:
    for part in path[:-1]:
        tree = tree.setdefault(part, {})
    tree[path[-1]] = value


def _is_noop(value: Any) -> bool:
    """Unset, off, empty, or a penalty/min_p at its neutral 0 or 1."""
    if value is None or value is False or value in ({}, [], ""):
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value in (0, 1)
