"""run.json and a baseline's manifest.json, declared as typed records and checked where read.

Both may come from elsewhere (a pull request's artifact, a baseline edited by hand), so every field
the gate reads is checked for its type once, on load, with msgspec as for the config, the worker
request and engine.json: a wrong type is one :class:`~gate.errors.ConfigError` line naming the
file and the field (exit code 2), never a ``KeyError`` inside a check. Fields the gate does not
read (timestamps, provenance, a newer gate's additions) pass unchecked. Readers still take the
decoded JSON object: the records say what it holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from gate.contract.engine_record import EngineIdentity
from gate.errors import ConfigError
from gate.files import RUN_FILE


@dataclass(frozen=True)
class ModelRecord:
    """The model's fingerprint: what a baseline and a run are compared on."""

    sha256: str | None = None
    path: str | None = None  # run.json only: baselines are committed without machine paths
    bytes: int | None = None
    method: str | None = None


@dataclass(frozen=True)
class PromptSetRecord:
    name: str
    sha256: str
    records: int
    file: str | None = None  # run.json only


@dataclass(frozen=True)
class EngineRunRecord:
    """One engine's outcome in run.json (gate.engine_jobs.EngineRun)."""

    spec: str
    status: str  # "ok" | "error"
    name: str | None = None
    runner: str | None = None
    output_dir: str | None = None
    error: str | None = None
    log_tail: str | None = None
    prepare_s: float = 0.0
    worker_s: float = 0.0
    reused: dict[str, Any] | None = None


@dataclass(frozen=True)
class RunRecord:
    """run.json (gate.replay.run_manifest; docs/evidence.md)."""

    model: ModelRecord
    prompt_sets: list[PromptSetRecord]
    sampling: dict[str, int | float] = field(default_factory=dict)
    greedy: dict[str, Any] = field(default_factory=dict)
    reference: dict[str, Any] = field(default_factory=dict)
    engines: dict[str, EngineRunRecord] = field(default_factory=dict)
    gate_version: str | None = None
    status: str | None = None
    gate_id: str | None = None
    config: str | None = None
    teacher_forced: dict[str, Any] = field(default_factory=dict)
    weight_sync: dict[str, Any] = field(default_factory=dict)
    grpo: dict[str, Any] = field(default_factory=dict)
    device: dict[str, Any] | None = None
    memory_plan: dict[str, Any] | None = None
    lora: dict[str, Any] | None = None  # LoRA mode's adapter (LoraConfig.record); None: off


@dataclass(frozen=True)
class RecordedFrom:
    run: str
    engine: str
    spec: str


@dataclass(frozen=True)
class BaselineEngine:
    """The recorded engine's settings and identity (the engine record's reviewable part)."""

    effective: dict[str, Any] = field(default_factory=dict)
    default_sampling_params: dict[str, Any] | None = None
    generation_config_overrides: dict[str, Any] | None = None
    dropped_engine_args: list[str] = field(default_factory=list)
    identity: EngineIdentity = field(default_factory=EngineIdentity)


@dataclass(frozen=True)
class BaselineManifest:
    """A baseline's manifest.json (gate.baseline)."""

    schema: int
    model: ModelRecord
    prompt_sets: list[PromptSetRecord]
    sampling: dict[str, int | float] = field(default_factory=dict)
    greedy: dict[str, Any] = field(default_factory=dict)
    reference: dict[str, Any] = field(default_factory=dict)
    engine: BaselineEngine = field(default_factory=BaselineEngine)
    gate_version: str | None = None
    created: str | None = None
    recorded_from: RecordedFrom | None = None
    device: dict[str, Any] | None = None
    grpo: dict[str, Any] | None = None
    lora: dict[str, Any] | None = None  # the adapter the recorded engine ran through; None: off


def checked(doc: Any, record: type, where: Path | str) -> None:
    """Refuse ``doc`` where it does not hold ``record``'s fields with their types, naming the
    file and the field."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: expected a JSON object")
    try:
        msgspec.convert(doc, record)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def read_run_manifest(run_dir: Path) -> dict[str, Any]:
    """``run.json`` of a run directory, checked against :class:`RunRecord`; a missing, broken or
    mistyped one is a usage error naming the file (and the field)."""
    file = Path(run_dir) / RUN_FILE
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{file}: no such file (not a gate run directory)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{file}: not a readable run manifest: {exc}") from None
    checked(doc, RunRecord, file)
    return doc
