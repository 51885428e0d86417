"""gate.yaml's ``checks:`` section: one typed Struct per check, decoded with the config's wording.

``checks:`` configures each check by id::

    checks:
      train-inference-mismatch:
        mode: warn                 # fail (default) | warn (cap at WARN) | off
        thresholds:
          k3_kl: {warn: 1e-3, fail: 1e-2}
      config-parity:
        policy: {compilation_mode: warn}

The Structs are generated from each check's SPEC (its thresholds and options, typed by their
defaults), so a check's settings are declared once, beside the check.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from gate.checks import registry
from gate.checks.base import CheckSettings, CheckSpec, ThresholdOverride
from gate.config.decode import Invalid, convert
from gate.errors import ConfigError

MODES = ("fail", "warn", "off")


@functools.cache
def settings_schema() -> type[msgspec.Struct]:
    """The Struct that decodes gate.yaml's ``checks:`` section: one field per check id.

    Each check's Struct holds ``mode``, a ``thresholds`` Struct with one optional override per
    metric, and its options typed by their defaults; unknown keys are refused at every level.
    Cached: the registry is fixed, and the config schema embeds these same Structs.
    """
    checks = [(spec.id, _check_struct(spec)) for spec in registry()]
    return _struct(
        "Checks",
        [(_attr(cid), struct, msgspec.field(default_factory=struct)) for cid, struct in checks],
        renamed=[cid for cid, _ in checks],
        doc="Per-check settings, by check id; a check left out runs with its defaults.",
    )


def parse_settings(raw: Any, where: str) -> dict[str, CheckSettings]:
    """Every check's settings from the ``checks:`` section (``None`` for none), defaults filled in."""
    try:
        section = convert(raw or {}, settings_schema())
    except Invalid as invalid:
        raise _settings_error(invalid, where) from None
    return {
        spec.id: _settings(spec, getattr(section, _attr(spec.id)), f"{where}: checks.{spec.id}")
        for spec in registry()
    }


def default_settings(spec: CheckSpec) -> CheckSettings:
    return CheckSettings(mode="fail", thresholds=dict(spec.thresholds), options=dict(spec.options))


def _check_struct(spec: CheckSpec) -> type[msgspec.Struct]:
    name = "".join(part.title() for part in spec.id.split("-"))
    thresholds = _struct(
        f"{name}Thresholds",
        [(_attr(metric), ThresholdOverride | None, None) for metric in spec.thresholds],
        renamed=list(spec.thresholds),
        doc=f"Overrides of {spec.id}'s thresholds, by metric.",
    )
    options = [(_attr(key), *_option_field(default)) for key, default in spec.options.items()]
    return _struct(
        name,
        [
            ("mode", str, "fail"),
            ("thresholds", thresholds, msgspec.field(default_factory=thresholds)),
            *options,
        ],
        renamed=list(spec.options),
        doc=f"{spec.title}. mode: one of {', '.join(MODES)}.",
    )


def _option_field(default: Any) -> tuple[Any, Any]:
    """An option's type and default, from its default: a mapping is merged under the default."""
    if isinstance(default, dict):
        return dict[str, Any], msgspec.field(default_factory=lambda: dict(default))
    return (Any if default is None else type(default)), default


def _struct(name: str, fields: list[Any], renamed: list[str], doc: str) -> type[msgspec.Struct]:
    return msgspec.defstruct(
        name,
        fields,
        namespace={"__doc__": doc},
        module=__name__,
        rename={_attr(key): key for key in renamed if _attr(key) != key},
        kw_only=True,
        frozen=True,
        forbid_unknown_fields=True,
    )


def _attr(key: str) -> str:
    # Check ids hold hyphens; Struct fields are attributes, and keep their id as the YAML key.
    return key.replace("-", "_")


def _settings(spec: CheckSpec, decoded: Any, where: str) -> CheckSettings:
    if decoded.mode not in MODES:
        raise ConfigError(f"{where}.mode: '{decoded.mode}' is not one of {MODES}")
    thresholds = dict(spec.thresholds)
    for metric, default in spec.thresholds.items():
        override = getattr(decoded.thresholds, _attr(metric))
        if override is not None:
            thresholds[metric] = default.with_overrides(override, f"{where}.thresholds.{metric}")
    options = {}
    for key, default in spec.options.items():
        value = getattr(decoded, _attr(key))
        options[key] = {**default, **value} if isinstance(default, dict) else value
    return CheckSettings(mode=decoded.mode, thresholds=thresholds, options=options)


def _settings_error(invalid: Invalid, where: str) -> ConfigError:
    """The error for a bad ``checks:`` section, worded by where in it the problem is."""
    path, key = invalid.path, f"{where}: checks.{invalid.key}".rstrip(".")
    known = ", ".join(invalid.known)
    match invalid.kind, len(path), path[1:2], path[3:]:
        case "type", 0, _, _:
            message = "expected a mapping of check id to settings"
        case "unknown", 1, _, _:
            message = f"unknown check (expected one of: {known})"
        case "unknown", 3, ("thresholds",), _:
            message = f"unknown metric (expected one of: {known})"
        case "unknown", 4, ("thresholds",), _:
            message = "unknown key (expected warn, fail, floor)"
        case "unknown", 2, _, _:
            message = f"unknown key (expected one of: {known})"
        case "type", 3, ("thresholds",), _:
            message = "expected a mapping with warn/fail"
        case "type", 4, ("thresholds",), ("floor",):
            message = f"expected a number, got {invalid.value!r}"
        case "type", 4, ("thresholds",), _:
            message = f"expected a number or 'N x noise', got {invalid.value!r}"
        case "type", 2, ("mode",), _:
            message = f"'{invalid.value}' is not one of {MODES}"
        case "type", _, _, _ if dict in invalid.expected_kinds:
            message = "expected a mapping"
        case "type", _, _, _:
            expected = " or ".join(k.__name__ for k in invalid.expected_kinds)
            message = f"expected {expected}, got {invalid.value!r}"
        case _:
            message = invalid.problem
    return ConfigError(f"{key}: {message}")
