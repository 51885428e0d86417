"""An RL stack's own configuration, read into one flat ``{"dotted.key": value}`` dict.

Stacks keep their settings in YAML (verl, NeMo-RL, AReaL, PipelineRL, TRL's ``--config``), TOML
(prime-rl), Hydra ``key=value`` overrides on a launch line (verl, SkyRL, PipelineRL) or argparse
flags (OpenRLHF's ``--rollout.temperature 0.7``, vime's ``--rollout-temperature``). A launch script
holds the overrides or the flags: its lines are joined at their continuations and split as the
shell would, and every ``key=value`` and ``--flag [value]`` token is read, in order, so a later one
wins as it does at launch. Values written as text (flags, overrides) are read as YAML scalars, the
way Hydra and argparse's typed options see them.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from gate.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

FORMATS = ("yaml", "toml", "flags")
_OVERRIDE = re.compile(r"^\+{0,2}([A-Za-z_][\w.\-]*)=(.*)$", re.S)
_FLAG = re.compile(r"^--([A-Za-z_][\w.\-]*)(?:=(.*))?$", re.S)
_INTERPOLATION = re.compile(r"^\$\{([A-Za-z_][\w.]*)\}$")


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and scalars are leaves, empty mappings too."""
    if not isinstance(tree, dict) or (prefix and not tree):
        return {prefix: tree} if prefix else {}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def read_config(path: Path, fmt: str) -> dict[str, Any]:
    """The file at ``path`` in format ``fmt`` (FORMATS), flattened; a YAML file's ``${a.b}``
    references to its own keys are resolved, others (``${oc.env:...}``) kept as written."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the stack's config: {exc}") from None
    if fmt == "yaml" and path.suffix in (".sh", ".bash", ".txt"):
        fmt = "flags"  # a Hydra stack launched from a script: its overrides
    if fmt == "yaml":
        try:
            tree = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f" (line {mark.line + 1})" if mark else ""
            raise ConfigError(f"{path}: not valid YAML{line}") from None
        if tree is None:
            tree = {}
        if not isinstance(tree, dict):
            raise ConfigError(f"{path}: the stack's config must be a mapping at the top level")
        return resolve_references(flatten(tree))
    if fmt == "toml":
        try:
            return flatten(tomllib.loads(text))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    if fmt == "flags":
        return read_launch_tokens(launch_tokens(text, path))
    raise ConfigError(f"{path}: unknown config format {fmt!r} (one of {FORMATS})")


def launch_tokens(text: str, where: Path | str) -> list[str]:
    """A launch script's or flag file's tokens, as the shell splits them (comments dropped)."""
    joined = re.sub(r"\\\r?\n", " ", text)
    tokens: list[str] = []
    for number, line in enumerate(joined.splitlines(), 1):
        try:
            tokens += shlex.split(line, comments=True)
        except ValueError as exc:
            raise ConfigError(
                f"{where}: line {number}: cannot split it as the shell would: {exc}"
            ) from None
    return tokens


def read_launch_tokens(tokens: Iterable[str]) -> dict[str, Any]:
    """``key=value`` overrides and ``--flag [value]`` / ``--flag=value`` flags; a flag followed by
    another flag (or nothing) is a switch, True. Other tokens (the command itself) are skipped."""
    flat: dict[str, Any] = {}
    items = list(tokens)
    i = 0
    while i < len(items):
        token = items[i]
        i += 1
        if flag := _FLAG.match(token):
            key, value = flag.group(1), flag.group(2)
            if value is None:
                if (
                    i < len(items)
                    and not items[i].startswith("--")
                    and not _OVERRIDE.match(items[i])
                ):
                    value = items[i]
                    i += 1
                    # nargs=2 flags (OpenRLHF's --actor.eps_clip_low_high 0.2 0.28): the values up to the next flag
                    while i < len(items) and _is_number(items[i]) and _is_number(value.split()[0]):
                        value += " " + items[i]
                        i += 1
                else:
                    flat[key] = True
                    continue
            flat[key] = _scalar(value)
        elif override := _OVERRIDE.match(token):
            flat[override.group(1)] = _scalar(override.group(2))
    return flat


def resolve_references(flat: dict[str, Any]) -> dict[str, Any]:
    """Replace ``${a.b}`` values by the value of ``a.b`` in the same file (a chain, at most 8 deep)."""
    out = dict(flat)
    for key, value in flat.items():
        for _ in range(8):
            ref = _INTERPOLATION.match(value) if isinstance(value, str) else None
            if ref is None or ref.group(1) not in flat:
                break
            value = flat[ref.group(1)]
        out[key] = value
    return out


def _scalar(text: str) -> Any:
    if " " in text.strip() and all(_is_number(p) for p in text.split()):
        return [yaml.safe_load(p) for p in text.split()]
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
