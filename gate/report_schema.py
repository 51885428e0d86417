"""The shape of report.json (docs/report.md), checked once where a report is loaded.

A report may come from a pull request's own run (the fork split's artifact), so every field the gate
reads is checked for its type before any code touches it: a wrong type is one :class:`ReportError`
line naming the file and the field (``checks[2].measurements[0].value``), exit code 2, never a
traceback deep inside the renderer.

The schema is declared as data (:data:`REPORT`: objects of typed fields) rather than as code that
walks the report, so the typed structs a later reader builds can be derived from the same table.
Unknown keys are allowed (minor schema versions add fields); a known key must have its type. ``None``
is accepted wherever the report writer emits null for "not known".
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gate.errors import ConfigError
from gate.verdict import STATUSES, VERDICTS

SCHEMA_PREFIX = "gate-report/"
SUPPORTED_MAJOR = 1


class ReportError(ConfigError):
    """A report.json that does not match the documented schema; names the file and the field."""


# A check raises _Mismatch(expected) for its own value; the walker adds the field's path.
class _Mismatch(Exception):
    def __init__(self, expected: str, path: str, value: Any) -> None:
        super().__init__(expected)
        self.expected = expected
        self.path = path
        self.value = value


Check = Callable[[Any, str], None]  # (value, path below the report) -> None, raises _Mismatch


@dataclass(frozen=True)
class Field:
    name: str
    check: Check
    required: bool = False


@dataclass(frozen=True)
class Obj:
    """A JSON object with these typed fields (others are allowed); ``nullable``: null stands for it."""

    fields: tuple[Field, ...]
    nullable: bool = True
    by_name: dict[str, Field] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {f.name: f for f in self.fields})

    def __call__(self, value: Any, path: str) -> None:
        if value is None and self.nullable:
            return
        if not isinstance(value, dict):
            raise _Mismatch("an object", path, value)
        for f in self.fields:
            if f.name not in value:
                if f.required:
                    raise _Mismatch("a value (the field is required)", _join(path, f.name), None)
                continue
            f.check(value[f.name], _join(path, f.name))


# -- leaf checks ---------------------------------------------------------------------------------
def _leaf(expected: str, ok: Callable[[Any], bool], nullable: bool = True) -> Check:
    def check(value: Any, path: str) -> None:
        if (value is None and nullable) or (value is not None and ok(value)):
            return
        raise _Mismatch(expected, path, value)

    return check


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return _is_int(v) or isinstance(v, float)


STR = _leaf("a string", lambda v: isinstance(v, str))
INT = _leaf("an integer", _is_int)
COUNT = _leaf("a non-negative integer", lambda v: _is_int(v) and v >= 0, nullable=False)
NUMBER = _leaf("a number", _is_number)
FINITE = _leaf("a finite number", lambda v: _is_number(v) and math.isfinite(v))
BOOL = _leaf("true or false", lambda v: isinstance(v, bool))
# A measured value: a number, or text such as a version or a setting.
SCALAR = _leaf("a number, a string or true/false", lambda v: isinstance(v, (str, int, float)))
ANY_OBJECT = _leaf("an object", lambda v: isinstance(v, dict))
ANY_LIST = _leaf("a list", lambda v: isinstance(v, list))


def one_of(*choices: str, nullable: bool = True) -> Check:
    return _leaf(" or ".join(f'"{c}"' for c in choices), lambda v: v in choices, nullable)


def list_of(item: Check) -> Check:
    def check(value: Any, path: str) -> None:
        if value is None:
            return
        if not isinstance(value, list):
            raise _Mismatch("a list", path, value)
        for i, v in enumerate(value):
            item(v, f"{path}[{i}]")

    return check


def map_of(item: Check, key: Check | None = None) -> Check:
    def check(value: Any, path: str) -> None:
        if value is None:
            return
        if not isinstance(value, dict):
            raise _Mismatch("an object", path, value)
        for k, v in value.items():
            if key is not None:
                key(k, _join(path, k))
            item(v, _join(path, k))

    return check


_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _join(path: str, name: Any) -> str:
    """``path.name``; a key that is not a plain name (it may come from the PR) is shown JSON-quoted."""
    if not (isinstance(name, str) and _NAME.fullmatch(name)):
        return f"{path}[{json.dumps(str(name), ensure_ascii=True)[:60]}]"
    return f"{path}.{name}" if path else name


# -- the schema (docs/report.md) -----------------------------------------------------------------
MEASUREMENT = Obj((
    Field("name", STR), Field("value", SCALAR), Field("status", one_of(*STATUSES)), Field("warn", NUMBER),
    Field("fail", NUMBER), Field("higher_is_worse", BOOL), Field("engine", STR), Field("note", STR),
), nullable=False)  # fmt: skip

WORST_TOKEN = Obj((
    Field("engine", STR), Field("prompt_id", SCALAR), Field("context", STR), Field("token", STR),
    Field("engine_logprob", NUMBER), Field("trainer_logprob", NUMBER), Field("position", INT),
), nullable=False)  # fmt: skip

CHECK = Obj((
    Field("id", STR, required=True), Field("title", STR), Field("status", one_of(*STATUSES, nullable=False), required=True),
    Field("summary", STR), Field("diagnosis", STR), Field("measurements", list_of(MEASUREMENT)),
    Field("details", Obj((Field("worst_tokens", list_of(WORST_TOKEN)),))),
), nullable=False)  # fmt: skip

ENGINE = Obj((
    Field("spec", STR), Field("runner", STR), Field("status", STR), Field("error", STR), Field("log_tail", STR),
    Field("reused", Obj((Field("key", STR), Field("created", STR), Field("source_run", STR), Field("worker_s", NUMBER)))),
    Field("identity", ANY_OBJECT), Field("effective", ANY_OBJECT), Field("dropped_engine_args", ANY_LIST),
    Field("timings", map_of(NUMBER)), Field("counts", map_of(INT)),
), nullable=False)  # fmt: skip

RUN = Obj((
    Field("dir", STR), Field("config", STR), Field("started", STR), Field("finished", STR),
    Field("model", Obj((Field("path", STR), Field("sha256", STR)))),
    Field("prompt_sets", list_of(Obj((Field("name", STR), Field("sha256", STR), Field("records", INT)), nullable=False))),
))  # fmt: skip

BASELINE = Obj((
    Field("path", STR), Field("status", one_of(*STATUSES)), Field("message", STR),
    Field("differences", list_of(STR)), Field("manifest", ANY_OBJECT),
))  # fmt: skip

GRPO_METRIC = Obj(tuple(Field(k, list_of(NUMBER)) for k in ("old", "new", "band_low", "band_high")))
GRPO = Obj((
    Field("steps", INT), Field("compared_with", STR), Field("metrics", map_of(GRPO_METRIC)),
    Field("first_exit", map_of(INT)),
))  # fmt: skip

_REPORT_FIELDS = (
    Field("gate_version", STR), Field("gate_id", STR), Field("verdict", one_of(*VERDICTS)),
    Field("exit_code", INT), Field("fail_on", one_of("fail", "warn")),
    Field("counts", map_of(COUNT, key=one_of(*STATUSES, nullable=False))),
    Field("errors", list_of(STR)), Field("run", RUN), Field("engines", map_of(ENGINE)), Field("baseline", BASELINE),
    Field("checks", list_of(CHECK)), Field("commands", Obj((Field("reproduce", STR), Field("regenerate_baseline", STR)))),
    Field("grpo", GRPO), Field("worst_tokens", list_of(WORST_TOKEN)),
)  # fmt: skip
PART = Obj(
    _REPORT_FIELDS, nullable=False
)  # a merged report's part: a report without its own schema line
REPORT = Obj(
    (Field("schema", STR, required=True), *_REPORT_FIELDS, Field("parts", list_of(PART))),
    nullable=False,
)


# -- entry point ---------------------------------------------------------------------------------
def check_version(report: Any, where: str = "report") -> None:
    """A JSON object whose ``schema`` names a major version this gate reads."""
    if not isinstance(report, dict):
        raise ReportError(
            f"{where}: expected a JSON object (a gate report.json), got {describe(report)}"
        )
    schema = report.get("schema")
    if not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
        raise ReportError(
            f"{where}: not a gate report (schema {describe(schema)}, expected '{SCHEMA_PREFIX}{SUPPORTED_MAJOR}')"
        )
    major = schema[len(SCHEMA_PREFIX) :].split(".", 1)[0]
    if not (major.isascii() and major.isdigit()) or int(major) != SUPPORTED_MAJOR:
        raise ReportError(
            f"{where}: unsupported report schema {schema[:60]!r}; this gate reads '{SCHEMA_PREFIX}{SUPPORTED_MAJOR}'"
        )


def validate_report(report: Any, where: str = "report") -> dict[str, Any]:
    """The report itself when it matches the schema; else one :class:`ReportError` line naming ``where`` and the field."""
    check_version(report, where)
    try:
        REPORT(report, "")
    except _Mismatch as exc:
        raise ReportError(
            f"{where}: field {exc.path}: expected {exc.expected}, got {describe(exc.value)}"
        ) from None
    return report


def describe(value: Any, limit: int = 40) -> str:
    """A value as one short line for an error message: its JSON type and a JSON-quoted excerpt."""
    kind = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if _is_number(value) else type(value).__name__)  # fmt: skip
    if isinstance(value, (dict, list)):
        return kind
    text = json.dumps(
        value, ensure_ascii=True, default=str
    )  # one line: newlines and controls escaped
    return f"{kind} {text[:limit]}{'…' if len(text) > limit else ''}" if value is not None else kind
