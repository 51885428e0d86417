"""A frozen gate prompt set from an RL stack's JSONL dataset file.

Stacks' datasets name the prompt differently: a ``prompt`` string or a list of chat messages (verl,
OpenRLHF's ``--data.input_key``), ``messages``, ``question``, ``problem``, ``query``; the answer the
reward checks as ``answer``, ``ground_truth``, ``solution`` or verl's ``reward_model.ground_truth``.
The first ``limit`` records are kept, in file order, so the set is the same on every machine; ids
are the record's own where they are unique strings, else ``<file stem>-<index>``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gate.errors import ConfigError
from gate.promptset import freeze_prompt_set, json_record

PROMPT_KEYS = ("prompt", "messages", "question", "problem", "query", "input")
ANSWER_KEYS = ("answer", "ground_truth", "solution", "reward_model.ground_truth")


def convert(source: Path, out: Path, limit: int, prompt_key: str | None = None) -> tuple[Path, str]:
    """Write gate's JSONL for ``source`` to ``out`` and freeze it; returns (manifest, what was kept)."""
    if source.suffix not in (".jsonl", ".json"):
        raise ConfigError(f"{source}: gate init reads JSONL datasets (got {source.suffix or 'no suffix'}); "
                          "export the prompts to JSONL and pass it with --dataset")  # fmt: skip
    try:
        lines = source.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot read the dataset: {exc}") from None
    records: list[dict[str, Any]] = []
    total, ids = 0, set[str]()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        total += 1
        if len(records) >= limit:
            continue
        raw = json_record(line, f"{source}:{number}")
        records.append(_record(raw, source, number, len(records), prompt_key, ids))
    if not records:
        raise ConfigError(f"{source}: the dataset holds no record")
    out.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8"
    )
    manifest = freeze_prompt_set(
        out, out.stem, f"the first {len(records)} of {total} records of {source.name}"
    )
    kept = f"the first {len(records)} of {total} records of {source.name}"
    return manifest, kept


def _record(
    raw: dict, source: Path, number: int, index: int, prompt_key: str | None, ids: set
) -> dict:
    where = f"{source}:{number}"
    keys = (prompt_key,) if prompt_key else PROMPT_KEYS
    found = next((k for k in keys if raw.get(k) not in (None, "", [])), None)
    if found is None:
        raise ConfigError(
            f"{where}: no prompt: none of {', '.join(keys)} is set (--prompt-key names another)"
        )
    value = raw[found]
    rid = raw.get("id")
    rid = rid if isinstance(rid, str) and rid and rid not in ids else f"{source.stem}-{index:05d}"
    ids.add(rid)
    record: dict[str, Any] = {"id": rid}
    if isinstance(value, str):
        record["prompt"] = value
    elif isinstance(value, list) and all(
        isinstance(m, dict) and {"role", "content"} <= set(m) for m in value
    ):
        record["messages"] = [{"role": m["role"], "content": m["content"]} for m in value]
    else:
        raise ConfigError(
            f"{where}: {found}: a string or a list of {{role, content}} messages is needed"
        )
    answer = next((a for a in (_get(raw, k) for k in ANSWER_KEYS) if a not in (None, "")), None)
    if answer is not None:
        record["answer"] = str(answer)
    return record


def _get(raw: dict, dotted: str) -> Any:
    value: Any = raw
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value
