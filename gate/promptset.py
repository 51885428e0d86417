"""Frozen prompt sets: a JSONL file pinned by a manifest that holds its sha256.

A record is ``{"id": ..., "prompt": "..."}``, ``{"id": ..., "messages": [{"role", "content"}]}`` or
``{"id": ..., "prompt_token_ids": [...]}`` (pre-tokenized: the token-in path), with an optional
``reference`` (the expected continuation, scored teacher-forced) and ``answer`` (the verifiable
final answer). Messages may carry a ``reasoning`` or ``reasoning_content`` string (earlier
assistant turns' thinking, as multi-turn rollouts store it). A file whose bytes no longer match its
manifest is refused: a gate that silently compared against a different prompt set would be worse
than none.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from gate.contract.request import PromptItem
from gate.errors import ConfigError

_RECORD_KEYS = {"id", "prompt", "messages", "prompt_token_ids", "reference", "answer"}
_PROMPT_KEYS = ("prompt", "messages", "prompt_token_ids")
# Optional string fields of a message besides role and content: what multi-turn stacks store of
# an assistant turn's reasoning, under vLLM's old and new names (vLLM #33402 renamed the field).
_MESSAGE_STRINGS = ("reasoning", "reasoning_content", "name")


@dataclass(frozen=True)
class PromptSet:
    name: str
    path: Path  # the JSONL file
    sha256: str
    items: tuple[PromptItem, ...]
    answers: tuple[str | None, ...]  # aligned with items


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_prompt_set(manifest_path: str | Path) -> PromptSet:
    manifest_path = Path(manifest_path)
    manifest = _read_manifest(manifest_path)
    data_path = (manifest_path.parent / manifest["file"]).resolve()
    if not data_path.is_file():
        raise ConfigError(f"{manifest_path}: file: prompt file '{data_path}' not found")
    actual = sha256_file(data_path)
    if actual != manifest["sha256"]:
        raise ConfigError(
            f"{data_path}: sha256 {actual[:12]}… does not match the frozen hash {manifest['sha256'][:12]}… "
            f"in {manifest_path.name}; restore the file or re-freeze it with `gate prompts freeze {data_path}`"
        )
    items, answers = _read_records(data_path)
    if "records" in manifest and manifest["records"] != len(items):
        raise ConfigError(
            f"{manifest_path}: records: says {manifest['records']}, file holds {len(items)}"
        )
    return PromptSet(
        name=manifest["name"],
        path=data_path,
        sha256=actual,
        items=tuple(items),
        answers=tuple(answers),
    )


def freeze_prompt_set(
    data_path: str | Path, name: str | None = None, description: str = ""
) -> Path:
    """Validate a JSONL prompt file and write its manifest beside it; returns the manifest path."""
    data_path = Path(data_path)
    if not data_path.is_file():
        raise ConfigError(f"{data_path}: prompt file not found")
    items, _ = _read_records(data_path)
    name = name or data_path.stem
    manifest = {
        "name": name,
        "file": data_path.name,
        "sha256": sha256_file(data_path),
        "records": len(items),
        "description": description,
    }
    out = data_path.with_name(f"{data_path.stem}.manifest.json")
    out.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return out


def _read_manifest(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"{path}: prompt-set manifest not found")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc.msg} (line {exc.lineno})") from None
    if not isinstance(manifest, dict):
        raise ConfigError(f"{path}: manifest must be a JSON object")
    for key in ("name", "file", "sha256"):
        if not isinstance(manifest.get(key), str) or not manifest[key]:
            raise ConfigError(f"{path}: {key}: required string")
    return manifest


def json_record(line: str, where: str) -> dict:
    """One JSONL line as a JSON object; a ConfigError naming ``where`` otherwise."""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON: {exc.msg}") from None
    if not isinstance(rec, dict):
        raise ConfigError(f"{where}: record must be a JSON object")
    return rec


def _read_records(path: Path) -> tuple[list[PromptItem], list[str | None]]:
    items: list[PromptItem] = []
    answers: list[str | None] = []
    seen: set[str] = set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        rec = json_record(line, where)
        unknown = set(rec) - _RECORD_KEYS
        if unknown:
            raise ConfigError(
                f"{where}: {sorted(unknown)[0]}: unknown key (expected {sorted(_RECORD_KEYS)})"
            )
        item = _record_to_item(rec, where)
        if item.id in seen:
            raise ConfigError(f"{where}: id: duplicate id '{item.id}'")
        seen.add(item.id)
        items.append(item)
        answers.append(rec.get("answer"))
    if not items:
        raise ConfigError(f"{path}: prompt set is empty")
    return items, answers


def _record_to_item(rec: dict, where: str) -> PromptItem:
    if not isinstance(rec.get("id"), str) or not rec["id"]:
        raise ConfigError(f"{where}: id: required string")
    given = [key for key in _PROMPT_KEYS if key in rec]
    if len(given) != 1:
        raise ConfigError(f"{where}: {'/'.join(_PROMPT_KEYS)}: exactly one of them is required")
    if "prompt" in rec and (not isinstance(rec["prompt"], str) or not rec["prompt"]):
        raise ConfigError(f"{where}: prompt: must be a non-empty string")
    if "messages" in rec:
        _check_messages(rec["messages"], where)
    if "prompt_token_ids" in rec:
        ids = rec["prompt_token_ids"]
        if not isinstance(ids, list) or not ids or not all(_is_token_id(t) for t in ids):
            raise ConfigError(
                f"{where}: prompt_token_ids: must be a non-empty list of token ids (integers >= 0)"
            )
    for key in ("reference", "answer"):
        if key in rec and not isinstance(rec[key], str):
            raise ConfigError(f"{where}: {key}: must be a string")
    return PromptItem(
        id=rec["id"],
        prompt=rec.get("prompt"),
        messages=rec.get("messages"),
        reference=rec.get("reference"),
        answer=rec.get("answer"),
        prompt_token_ids=rec.get("prompt_token_ids"),
    )


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_messages(msgs: object, where: str) -> None:
    ok = (
        isinstance(msgs, list)
        and msgs
        and all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in msgs
        )
    )
    if not ok:
        raise ConfigError(
            f"{where}: messages: must be a non-empty list of {{role, content}} strings"
        )
    for i, message in enumerate(cast("list[dict[str, object]]", msgs)):
        for key in _MESSAGE_STRINGS:
            if key in message and not isinstance(message[key], str):
                raise ConfigError(f"{where}: messages[{i}].{key}: must be a string")
