"""File names of a run and a report, and how they are written and read.

Everything the gate writes for another process to read is written atomically (a reader never sees
half a file), and every report is read through :func:`read_report_json`, so NaN handling and the
``.incomplete`` fallback are the same for every command.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from gate.errors import ConfigError

RUN_FILE = "run.json"
REPORT_FILE = "report.json"
REPEAT_FILE = "repeat.json"
ENGINES_DIR = "engines"
INCOMPLETE_SUFFIX = ".incomplete"


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """An exclusive flock on ``path`` while the ``with`` lasts: one process builds a cached thing
    (a venv, a converted model) while the others wait for it. A lock file that exists but is not
    ours to write (an image built by root, run as the user) is only read, since what it guards is
    never rebuilt there."""
    try:
        fh = open(path, "a")  # noqa: SIM115 - closed below, after the lock
    except PermissionError:
        fh = open(path)  # noqa: SIM115
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def atomic_write_bytes(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Call ``write`` on a temporary file beside ``path``, then rename it into place."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, lambda fh: fh.write(text.encode("utf-8")))


def write_json(path: Path, doc: Any) -> None:
    """Indented JSON, atomically; NaN is refused (a report says ``null`` for undefined)."""
    atomic_write_text(path, json.dumps(doc, indent=2, allow_nan=False, default=str) + "\n")


def find_report(path: Path) -> Path:
    """``path`` itself (a report.json), or the report.json of a run directory or its ``.incomplete``.

    A run whose engines failed stays in ``<run>.incomplete/`` and still has a report (verdict ERROR),
    so naming the run directory finds it.
    """
    path = Path(path)
    if path.is_dir():
        candidates = [path / REPORT_FILE]
        if not path.name.endswith(INCOMPLETE_SUFFIX):
            candidates.append(path.with_name(path.name + INCOMPLETE_SUFFIX) / REPORT_FILE)
    else:
        candidates = [path]
        if not path.exists() and not path.name.endswith(".json"):
            candidates.append(path.with_name(path.name + INCOMPLETE_SUFFIX) / REPORT_FILE)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ConfigError(
        f"{path}: no {REPORT_FILE} here (pass a report.json or a gate run directory holding one)"
    )


def read_report_json(path: Path) -> tuple[Any, Path]:
    """The parsed JSON of a report (not yet validated) and the file it came from.

    NaN and Infinity read as ``None``: the schema's "undefined", whoever wrote the file.
    """
    file = find_report(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: cannot read: {exc.__class__.__name__}: {exc}") from None
    try:
        return json.loads(text, parse_constant=lambda _: None), file
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{file}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None


def read_run_manifest(run_dir: Path) -> dict[str, Any]:
    """``run.json`` of a run directory; a missing or broken one is a usage error naming the file."""
    file = Path(run_dir) / RUN_FILE
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{file}: no such file (not a gate run directory)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{file}: not a readable run manifest: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{file}: not a run manifest (expected a JSON object)")
    return doc
