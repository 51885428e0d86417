"""A frozen gate prompt set from an RL stack's dataset file: JSONL, or Parquet (verl's format;
read with pyarrow, the ``parquet`` extra).

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
    if source.suffix == ".parquet":
        raws, total = _parquet_records(source, limit)
    elif source.suffix in (".jsonl", ".json"):
        raws, total = _jsonl_records(source, limit)
    else:
        raise ConfigError(
            f"{source}: gate init reads JSONL or Parquet datasets (got "
            f"{source.suffix or 'no suffix'}); export the prompts to either and pass it with --dataset"
        )
    ids = set[str]()
    records = [
        _record(raw, where, i, prompt_key, ids, source.stem) for i, (where, raw) in enumerate(raws)
    ]
    if not records:
        raise ConfigError(f"{source}: the dataset holds no record")
    out.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8"
    )
    kept = f"the first {len(records)} of {total} records of {source.name}"
    return freeze_prompt_set(out, out.stem, kept), kept


def _jsonl_records(source: Path, limit: int) -> tuple[list[tuple[str, dict]], int]:
    """The first ``limit`` records of a JSONL file, each with where it is ("file:line"), and how many it holds."""
    try:
        lines = source.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot read the dataset: {exc}") from None
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    return [
        (f"{source}:{n}", json_record(line, f"{source}:{n}")) for n, line in numbered[:limit]
    ], len(numbered)


def _parquet_records(source: Path, limit: int) -> tuple[list[tuple[str, dict]], int]:
    """The first ``limit`` rows of a Parquet file (verl's datasets), each with where it is
    ("file row N", 1-based), and how many it holds. Only those rows are read."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            f"{source}: reading a Parquet dataset needs pyarrow: "
            "python -m pip install 'vllm-upgrade-gate[parquet]'"
        ) from None
    try:
        handle = pq.ParquetFile(source)
        total = handle.metadata.num_rows
        rows: list[dict] = []
        for batch in handle.iter_batches(batch_size=max(1, min(limit, 1024))):
            rows += batch.to_pylist()
            if len(rows) >= limit:
                break
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise ConfigError(f"{source}: cannot read the Parquet dataset: {exc}") from None
    return [(f"{source} row {i}", row) for i, row in enumerate(rows[:limit], 1)], total


def _record(raw: dict, where: str, index: int, prompt_key: str | None, ids: set, stem: str) -> dict:
    keys = (prompt_key,) if prompt_key else PROMPT_KEYS
    found = next((k for k in keys if raw.get(k) not in (None, "", [])), None)
    if found is None:
        raise ConfigError(
            f"{where}: no prompt: none of {', '.join(keys)} is set (--prompt-key names another)"
        )
    value = raw[found]
    rid = raw.get("id")
    rid = rid if isinstance(rid, str) and rid and rid not in ids else f"{stem}-{index:05d}"
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
