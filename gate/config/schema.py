"""gate.yaml's schema: msgspec Structs derived from the section dataclasses, and its JSON Schema.

The Structs are generated from gate.config.sections rather than written out, so a field added to a
section is accepted in gate.yaml, type-checked, defaulted and documented in the JSON Schema at once.
They refuse unknown keys (``forbid_unknown_fields``), which is what turns a typo into an error.

The committed JSON Schema, docs/gate.schema.json, is regenerated with
``python -c "from gate.config.schema import write_json_schema; write_json_schema()"``; a unit test
fails when it is stale.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from pathlib import Path
from typing import Any

import msgspec

from gate.config.checks_section import settings_schema
from gate.config.sections import INTERNAL, YAML_TYPE, EngineConfig, GateConfig, ServerConfig

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "docs" / "gate.schema.json"
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

# Top-level keys that set every engine's default: engine_args and env merge under each engine's
# own, runner, installer and mode apply where an engine does not set its own, and the server
# section's keys merge under each engine's own.
SHARED_ENGINE_FIELDS: list[tuple[str, Any, Any]] = [
    ("engine_args", dict[str, Any], msgspec.field(default_factory=dict)),
    ("env", dict[str, str | int | float | bool], msgspec.field(default_factory=dict)),
    ("runner", str, "venv"),
    ("installer", str, "auto"),
    ("mode", str, "offline"),
]


@functools.cache
def gate_file() -> type[msgspec.Struct]:
    """The Struct that decodes a whole gate.yaml (built once: loading and the JSON Schema share it)."""
    engine = section_struct(EngineConfig)
    engines = _struct("Engines", [("old", engine), ("new", engine)], doc="The two engines.")
    checks = settings_schema()
    server = section_struct(ServerConfig)
    return section_struct(
        GateConfig,
        types={"engines": engines},
        extra=[
            *SHARED_ENGINE_FIELDS,
            ("server", server, msgspec.field(default_factory=server)),
            ("checks", checks, msgspec.field(default_factory=checks)),
        ],
    )


def section_struct(
    cls: type,
    types: dict[str, Any] | None = None,
    extra: list[tuple[str, Any, Any]] | None = None,
) -> type[msgspec.Struct]:
    """A Struct with the fields, types and defaults of dataclass ``cls``, less its internal fields.

    A field's type is its ``YAML_TYPE`` where it has one, else ``types[name]`` where given, else
    its own; a dataclass type becomes its own section Struct.
    """
    hints = typing.get_type_hints(cls)
    fields: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(cls):
        if f.metadata.get(INTERNAL):
            continue
        hint = f.metadata.get(YAML_TYPE) or (types or {}).get(f.name) or hints[f.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            hint = section_struct(hint)
        fields.append((f.name, hint, *_default(f, hint)))
    return _struct(cls.__name__, [*fields, *(extra or [])], doc=_docstring(cls))


def _default(f: dataclasses.Field[Any], hint: Any) -> tuple[Any, ...]:
    """``()`` for a required field, else ``(default,)`` as msgspec takes it."""
    if f.default_factory is not dataclasses.MISSING:
        return (msgspec.field(default_factory=f.default_factory),)
    if f.default is dataclasses.MISSING:
        return ()
    if dataclasses.is_dataclass(f.default):
        # Every section's default is the section with its own defaults: so is the Struct's.
        return (msgspec.field(default_factory=hint),)
    return (f.default,)


def _struct(name: str, fields: list[Any], doc: str | None) -> type[msgspec.Struct]:
    return msgspec.defstruct(
        name,
        fields,
        namespace={"__doc__": doc},
        module=__name__,
        kw_only=True,
        frozen=True,
        forbid_unknown_fields=True,
    )


def _docstring(cls: type) -> str | None:
    # A dataclass without a docstring gets its signature as one: no use to an editor.
    doc = cls.__doc__
    return None if doc is None or doc.startswith(f"{cls.__name__}(") else doc.strip()


def json_schema() -> dict[str, Any]:
    """gate.yaml's JSON Schema, for editors (``# yaml-language-server: $schema=...``)."""
    schema: dict[str, Any] = msgspec.json.schema(gate_file())
    return {"$schema": JSON_SCHEMA_DIALECT, "title": "gate.yaml", **schema}


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def write_json_schema(path: Path = SCHEMA_FILE) -> Path:
    path.write_text(json_schema_text(), encoding="utf-8")
    return path
