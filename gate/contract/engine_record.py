"""engine.json: what one engine said about itself and what each of its passes recorded.

The worker builds an :class:`EngineRecord` and writes it with :meth:`EngineRecord.to_json`; the
orchestrator reads it with :meth:`EngineRecord.from_json`, which checks every field's type and
names the file and field it refuses. A section that was not recorded reads as its empty value
(``{}``, ``[]``) or None where absence itself means something (``batch_invariance``: the pass did
not run; ``prompt_ids``: evidence from before it was recorded), so no reader needs ``or {}``.

Sections whose keys differ by release or by pass (``effective``, ``numerics``, ``weight_sync``, ...)
stay mappings: their keys are listed in docs/evidence.md, and the check that owns a section reads
and validates it. The standard library and msgspec only: the worker imports this inside each
engine environment (every vLLM release depends on msgspec).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from gate.contract.keys import EVIDENCE_SCHEMA_VERSION


class EngineRecordError(ValueError):
    """engine.json is not a record this gate can read."""


@dataclass(frozen=True)
class EngineIdentity:
    """Versions and device of the engine environment (``identity``)."""

    vllm: str | None = None
    torch: str | None = None
    transformers: str | None = None
    python: str | None = None
    engine_class: str | None = None
    engine_generation: str | None = None  # V0 / V1, from the live engine's module
    device_kind: str | None = None  # cuda / cpu
    device_name: str | None = None
    platform: str | None = None
    executable: str | None = None
    worker_multiproc_method: str | None = None
    mode: str | None = None  # "server" in server mode

    def fingerprint(self) -> dict[str, str | None]:
        """The recorded fields but the interpreter's path (a machine path: baselines are committed)."""
        return {
            k: v for k, v in dataclasses.asdict(self).items() if k != "executable" and v is not None
        }


@dataclass(frozen=True)
class EngineRecord:
    """engine.json, typed at the top level."""

    schema_version: int = EVIDENCE_SCHEMA_VERSION
    engine_name: str | None = None
    order_seed: int | None = None
    identity: EngineIdentity = field(default_factory=EngineIdentity)
    # Settings read back from the live engine (a key is None where a release does not expose it),
    # plus ``env.<NAME>`` for environment the gate set.
    effective: dict[str, Any] = field(default_factory=dict)
    numerics: dict[str, Any] = field(default_factory=dict)
    # None: a release without LLM.get_default_sampling_params, whose defaults are unknown.
    default_sampling_params: dict[str, Any] | None = None
    generation_config_overrides: dict[str, Any] | None = None
    requested_engine_args: dict[str, Any] = field(default_factory=dict)
    dropped_engine_args: list[str] = field(default_factory=list)
    gate_settings: list[dict[str, Any]] = field(default_factory=list)
    passes_not_run: list[str] = field(default_factory=list)
    flat_logprobs: bool | None = None
    mode: str = "offline"
    server: dict[str, Any] | None = None  # server mode: how the server was started and answered
    batch_invariance: dict[str, Any] | None = None  # None: the pass did not run
    weight_sync: dict[str, Any] = field(default_factory=dict)  # {}: the probe is off
    weight_sync_inflight: dict[str, Any] = field(default_factory=dict)
    grpo: dict[str, Any] = field(default_factory=dict)
    # LoRA mode (gate/worker/lora.py PolicyAdapter.record): the adapter every pass generated
    # through, and how each version was served; None: full-weight mode.
    lora: dict[str, Any] | None = None
    prompt_ids: dict[str, Any] | None = None  # None: evidence from before it was recorded
    reference: dict[str, Any] = field(default_factory=dict)  # where the reference sat; vocab_size
    model_revision: str | None = None
    vllm_cache_root: dict[str, Any] | None = None
    memory: dict[str, Any] = field(default_factory=dict)
    memory_peaks: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any, where: Path | str = "engine.json") -> EngineRecord:
        """The record in ``data`` (engine.json decoded), every field's type checked (msgspec);
        EngineRecordError names the file and the field. Keys it does not declare are a newer
        gate's optional sections: ignored, as the schema version says the layout holds."""
        if not isinstance(data, dict):
            raise EngineRecordError(f"{where}: expected a JSON object")
        version = data.get("schema_version", 1)  # written before versions were recorded: 1
        if version != EVIDENCE_SCHEMA_VERSION:
            raise EngineRecordError(
                f"{where}: schema_version {version!r}: this gate reads evidence of schema "
                f"{EVIDENCE_SCHEMA_VERSION} only; run the engine again (clear the evidence cache "
                "if it came from there)"
            )
        # A section recorded as null (a pass that did not run) reads as its empty value.
        data = {k: (_EMPTY[k] if v is None and k in _EMPTY else v) for k, v in data.items()}
        if data.get("identity") is None:
            data.pop("identity", None)
        try:
            return msgspec.convert(data, cls)
        except msgspec.ValidationError as exc:
            raise EngineRecordError(f"{where}: {exc}") from None

    @classmethod
    def from_worker(cls, meta: dict[str, Any]) -> EngineRecord:
        """The worker's side: a key this record does not declare is a TypeError, not a silent
        extra in engine.json that no reader knows."""
        meta = dict(meta)
        identity = EngineIdentity(**meta.pop("identity", {}))
        # A pass that did not run records None: its section's empty value, as a reader sees it.
        empty = {k: _EMPTY[k] for k, v in meta.items() if v is None and k in _EMPTY}
        return cls(identity=identity, **(meta | empty))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def device_kind(self) -> str | None:
        return self.identity.device_kind


# The empty value a section recorded as null reads as.
_EMPTY: dict[str, Any] = {
    f.name: f.default_factory()
    for f in dataclasses.fields(EngineRecord)
    if f.default_factory is not dataclasses.MISSING and f.name != "identity"
}
