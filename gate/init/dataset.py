"""A frozen gate prompt set from an RL stack's dataset: JSONL or Parquet files (Parquet is verl's
format; read with pyarrow, the ``parquet`` extra), or a folder of them, named by ``--dataset`` or by
the stack's own config (:func:`from_stack_config`).

Stacks' datasets name the prompt differently: a ``prompt`` string or a list of chat messages (verl,
OpenRLHF's ``--data.input_key``), ``messages``, ``question``, ``problem``, ``query``; the answer the
reward checks as ``answer``, ``ground_truth``, ``solution`` or verl's ``reward_model.ground_truth``.
The first ``limit`` records are kept, in file order, so the set is the same on every machine; ids
are the record's own where they are unique strings, else ``<file stem>-<index>``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate.errors import ConfigError
from gate.init.stacks import DatasetKeys, first_set
from gate.promptset import freeze_prompt_set, json_record

PROMPT_KEYS = ("prompt", "messages", "question", "problem", "query", "input")
ANSWER_KEYS = ("answer", "ground_truth", "solution", "reward_model.ground_truth",
               "reward_spec.ground_truth")  # fmt: skip
SUFFIXES = (".jsonl", ".json", ".parquet")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(?::[\w.-]+)?$")
_ROW_SLICE = re.compile(r"@\[-?\d*:-?\d*\]$")  # slime's path@[start:end]


@dataclass(frozen=True)
class StackDataset:
    """The files a stack's config names as its training prompts, and the record fields it reads."""

    files: tuple[Path, ...]
    key: str  # the config key that named them
    prompt_key: str | None
    answer_key: str | None
    notes: tuple[str, ...] = ()


def from_stack_config(
    keys: DatasetKeys, config: Mapping[str, Any], config_file: Path, scratch: Path
) -> StackDataset:
    """The local files behind the dataset ``config`` names (a Hub dataset's first records are
    exported into ``scratch``); a ConfigError in one line where it names none, names a file that is
    not there, or names a Hub dataset this machine cannot read."""
    if not keys.keys:
        raise ConfigError(f"{config_file}: {keys.none_why}")
    value, key = first_set(config, *keys.keys)
    if key is None:
        raise ConfigError(
            f"{config_file}: gate init needs the prompts to replay and the config names none "
            f"({' / '.join(keys.keys)}): pass --dataset FILE (JSONL or Parquet)"
        )
    files: list[Path] = []
    hub: list[str] = []
    notes: list[str] = []
    for entry in _entries(value, keys.comma_separated):
        if _ROW_SLICE.search(entry):
            notes.append(f"{key}: the row slice of {entry!r} is not applied; the first records are")
            entry = _ROW_SLICE.sub("", entry)
        found = _local(entry, config_file.parent, keys.search)
        if found is not None:
            files += dataset_files(found, keys.split)
        elif _HUB_ID.match(entry) and Path(entry.partition(":")[0]).suffix not in SUFFIXES:
            hub.append(entry)
        else:
            raise ConfigError(
                f"{key}: {entry!r} not found (looked in {Path.cwd()} and {config_file.parent}); "
                "run gate init where the stack runs, or pass --dataset FILE"
            )
    if not files:
        files.append(_from_hub(hub[0], key, keys.split, scratch))
    notes += [f"{key}: {h!r} (a Hub dataset) left out: the local files are read" for h in hub]
    prompt_field, _ = first_set(config, keys.prompt[0]) if keys.prompt[0] else (None, None)
    answer_field, _ = first_set(config, keys.answer[0]) if keys.answer[0] else (None, None)
    return StackDataset(
        tuple(files),
        key,
        prompt_field or keys.prompt[1],
        answer_field or keys.answer[1],
        tuple(notes),
    )


def _entries(value: Any, comma_separated: bool) -> list[str]:
    """The dataset entries a key holds: one path, a list of them, a comma-separated string, or
    TRL's mixture (a list of {path, data_files} load_dataset arguments)."""
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        if isinstance(item, dict):
            files = item.get("data_files") or item.get("path")
            out += _entries(files, False) if files is not None else []
        elif item is not None and str(item).strip():
            text = str(item).strip()
            out += [p.strip() for p in text.split(",") if p.strip()] if comma_separated else [text]
    return out


def _local(entry: str, config_dir: Path, search: tuple[str, ...]) -> Path | None:
    """``entry`` as a path (``~`` and ``$VARS`` expanded), tried from here, from the config's
    folder, then under the stack's own dataset folders (with ``.jsonl`` added)."""
    path = Path(os.path.expandvars(os.path.expanduser(entry)))
    bases = [Path.cwd(), config_dir] if not path.is_absolute() else [Path("/")]
    candidates = [base / path for base in bases]
    candidates += [base / folder / name for folder in search for base in bases
                   for name in (path, path.with_name(path.name + ".jsonl"))]  # fmt: skip
    return next((c for c in candidates if c.exists()), None)


def dataset_files(found: Path, split: str) -> list[Path]:
    """A file as it is; a folder's JSONL and Parquet files (recursively, sorted), those of ``split``
    (train.jsonl, main/train-00000-of-00001.parquet) where the folder holds several splits."""
    if found.is_file():
        return [found]
    files = sorted(p for p in found.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
    if not files:
        raise ConfigError(f"{found}: no JSONL or Parquet file in this dataset folder")
    of_split = [p for p in files if split in re.split(r"[^A-Za-z0-9]+", str(p.relative_to(found)))]
    return of_split or files


def _from_hub(dataset_id: str, key: str, split: str, out_dir: Path) -> Path:
    """A Hub dataset's first records of ``split`` through the ``datasets`` package, as a JSONL in
    ``out_dir``; a ConfigError naming what is missing where it cannot be read."""
    name, _, id_split = dataset_id.partition(":")
    export = (
        f"python -c \"import datasets; datasets.load_dataset('{name}', split='{id_split or split}')"
        ".to_json('prompts.jsonl')\" on a machine with network, then pass --dataset prompts.jsonl"
    )
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError:
        raise ConfigError(
            f"{key}: {dataset_id!r} is a Hugging Face Hub dataset: reading it needs the datasets "
            f"package and network (pip install datasets), or run {export}"
        ) from None
    target = out_dir / f"{name.replace('/', '--')}.{id_split or split}.jsonl"
    try:
        rows = datasets.load_dataset(name, split=id_split or split, streaming=True)
        with target.open("w", encoding="utf-8") as fh:
            for i, row in enumerate(rows):
                if i >= HUB_RECORDS:
                    break
                fh.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    except Exception as exc:  # network, authentication, a missing split: one line, not a trace
        target.unlink(missing_ok=True)
        raise ConfigError(
            f"{key}: {dataset_id!r} could not be read from the Hub ({type(exc).__name__}: "
            f"{str(exc)[:160]}); run {export}"
        ) from None
    return target


HUB_RECORDS = 4096  # a Hub dataset's first records, more than any prompt set gate keeps


def convert(
    sources: Path | Sequence[Path],
    out: Path,
    limit: int,
    prompt_key: str | None = None,
    answer_key: str | None = None,
) -> tuple[Path, str]:
    """Write gate's JSONL for the first ``limit`` records of ``sources`` (in order) to ``out`` and
    freeze it; returns (manifest, what was kept)."""
    files = [sources] if isinstance(sources, Path) else list(sources)
    raws: list[tuple[str, dict, str]] = []
    total = 0
    for source in files:
        found, count = _records(source, limit - len(raws))
        raws += [(where, raw, source.stem) for where, raw in found]
        total += count
    ids = set[str]()
    records = [
        _record(raw, where, i, prompt_key, ids, stem, answer_key)
        for i, (where, raw, stem) in enumerate(raws)
    ]
    if not records:
        raise ConfigError(f"{files[0]}: the dataset holds no record")
    out.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8"
    )
    names = files[0].name if len(files) == 1 else f"{len(files)} files ({files[0].name}, ...)"
    kept = f"the first {len(records)} of {total} records of {names}"
    return freeze_prompt_set(out, out.stem, kept), kept


def _records(source: Path, limit: int) -> tuple[list[tuple[str, dict]], int]:
    if source.suffix == ".parquet":
        return _parquet_records(source, max(limit, 0))
    if source.suffix in (".jsonl", ".json"):
        return _jsonl_records(source, max(limit, 0))
    raise ConfigError(
        f"{source}: gate init reads JSONL or Parquet datasets (got "
        f"{source.suffix or 'no suffix'}); export the prompts to either and pass it with --dataset"
    )


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


def _record(
    raw: dict,
    where: str,
    index: int,
    prompt_key: str | None,
    ids: set,
    stem: str,
    answer_key: str | None = None,
) -> dict:
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
    answer_keys = ((answer_key,) if answer_key else ()) + ANSWER_KEYS
    answer = next((a for a in (_get(raw, k) for k in answer_keys) if a not in (None, "")), None)
    if answer is not None:
        record["answer"] = str(answer)
    return record


def _get(raw: dict, dotted: str) -> Any:
    value: Any = raw
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value
