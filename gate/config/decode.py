"""Decoding YAML data into msgspec Structs, failing at a dotted key rather than a JSON path.

msgspec reports ``Expected `int`, got `str` - at `$.sampling.n```. ``convert`` raises ``Invalid``
instead: the key as gate.yaml writes it (``sampling.n``, ``prompts[0]``), the value found there and
the type expected, so each caller words the one-line error its section has always had.
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")
Key = str | int
_UNIONS = (typing.Union, types.UnionType)
MISSING_VALUE = object()  # the value at a key that is not in the data (a required field)

# "<problem> - at `<path>`", "<problem> - at `key` in `<path>`", or just "<problem>" at the top.
_MESSAGE = re.compile(
    r"^(?P<problem>.*?)(?: - at (?P<in_key>`key` in )?`(?P<path>\$[^`]*)`)?$", re.S
)
_SEGMENT = re.compile(r"\.(?P<field>[^.\[]+)|\[(?P<index>\d+)\]|\[(?P<any_key>\.\.\.)\]")
_FIELD_PROBLEM = re.compile(
    r"^Object (?P<kind>contains unknown|missing required) field `(?P<name>[^`]+)`$"
)


@dataclass(frozen=True)
class Invalid(Exception):
    """Where and why YAML data does not fit its Struct."""

    path: tuple[Key, ...]  # ("engines", "new", "spec"); ("prompts", 0)
    kind: str  # "unknown" key, "missing" key, wrong "type", or another "problem" msgspec names
    value: Any  # what the data holds at path; MISSING_VALUE for a missing key
    expected: Any  # the type expected at path; None for an unknown key
    known: tuple[str, ...]  # the keys the enclosing mapping accepts, as written in gate.yaml
    problem: str  # msgspec's own words, for kinds without a wording of their own

    @property
    def expected_kinds(self) -> tuple[type, ...]:
        """The kinds the expected type accepts, null left out: ``int | None`` -> (int,); a Struct -> (dict,)."""
        hint = self.expected
        members = typing.get_args(hint) if typing.get_origin(hint) in _UNIONS else (hint,)
        kinds: list[type] = []
        for member in members:
            kind = dict if _is_struct(member) else typing.get_origin(member) or member
            if kind is not type(None) and isinstance(kind, type) and kind not in kinds:
                kinds.append(kind)
        return tuple(kinds)

    @property
    def key(self) -> str:
        """The path as gate.yaml readers write it: ``engines.new.pip_args[2]``."""
        out = ""
        for part in self.path:
            out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else part
        return out


def convert(data: Any, target: type[T]) -> T:
    """``msgspec.convert`` with a key left empty (``greedy:``) meaning the section's defaults."""
    try:
        return msgspec.convert(_without_empty_sections(data, target), target)
    except msgspec.ValidationError as exc:
        raise _invalid(str(exc), data, target) from None


def _without_empty_sections(data: Any, target: Any) -> Any:
    # YAML reads ``greedy:`` with nothing after it as null; like an omitted key, it means defaults.
    if not (_is_struct(target) and isinstance(data, dict)):
        return data
    fields = {f.encode_name: f.type for f in msgspec.structs.fields(target)}
    out = {}
    for key, value in data.items():
        section = fields.get(key)
        if value is None and (_is_struct(section) or typing.get_origin(section) is dict):
            continue
        out[key] = _without_empty_sections(value, section) if section is not None else value
    return out


def _invalid(message: str, data: Any, target: Any) -> Invalid:
    match = _MESSAGE.match(message)
    assert match is not None  # the pattern's groups are all optional
    problem, path = match["problem"], _parse_path(match["path"] or "$")
    field = _FIELD_PROBLEM.match(problem)
    if field:
        path = (*path, field["name"])
    path, value, expected, known = _locate(data, target, path)
    if field:
        kind = "unknown" if field["kind"] == "contains unknown" else "missing"
    else:
        kind = "problem" if match["in_key"] or not problem.startswith("Expected") else "type"
    return Invalid(path, kind, value, None if kind == "unknown" else expected, known, problem)


def _parse_path(text: str) -> tuple[Key, ...]:
    parts: list[Key] = []
    for m in _SEGMENT.finditer(text):
        parts.append(m["field"] if m["field"] else int(m["index"]) if m["index"] else "...")
    return tuple(parts)


def _locate(
    data: Any, target: Any, path: tuple[Key, ...]
) -> tuple[tuple[Key, ...], Any, Any, tuple[str, ...]]:
    """``path`` with its keys named, the value and expected type there, and the keys its Struct accepts.

    msgspec writes a mapping's key as ``[...]``; this names it by finding the entry that fails.
    """
    value, expected = data, target
    known: tuple[str, ...] = ()
    for i, part in enumerate(path):
        expected = _container(expected, value)
        if _is_struct(expected):
            fields = {f.encode_name: f.type for f in msgspec.structs.fields(expected)}
            known = tuple(fields)
            expected = fields.get(str(part))
        elif typing.get_origin(expected) is dict:
            expected = typing.get_args(expected)[1]
            if part == "...":
                part = _failing_key(value, expected)
                path = (*path[:i], part, *path[i + 1 :])
        elif typing.get_origin(expected) is tuple:
            expected = typing.get_args(expected)[0]
        else:
            expected = None
        value = _child(value, part)
    return path, value, expected, known


def _container(hint: Any, value: Any) -> Any:
    """The member of an Optional or Union hint that ``value``'s kind of container matches."""
    if typing.get_origin(hint) not in _UNIONS:
        return hint
    for member in typing.get_args(hint):
        origin = typing.get_origin(member)
        if (isinstance(value, dict) and (_is_struct(member) or origin is dict)) or (
            isinstance(value, (list, tuple)) and origin is tuple
        ):
            return member
    return hint


def _failing_key(mapping: Any, value_type: Any) -> Key:
    for key, value in (mapping or {}).items():
        try:
            msgspec.convert(value, value_type)
        except msgspec.ValidationError:
            return str(key)
    return "..."


def _child(value: Any, part: Key) -> Any:
    if isinstance(value, dict):
        return value.get(part, MISSING_VALUE)
    if isinstance(value, (list, tuple)) and isinstance(part, int) and part < len(value):
        return value[part]
    return MISSING_VALUE


def _is_struct(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, msgspec.Struct)
