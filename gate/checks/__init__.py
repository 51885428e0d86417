"""The checks that turn evidence into PASS / WARN / FAIL / ERROR, and their configuration.

Each check is one module exposing ``SPEC`` (id, title, default thresholds and options) and
``run(ctx, settings) -> CheckResult``. ``checks:`` in gate.yaml configures them by id::

    checks:
      train-inference-mismatch:
        mode: warn                 # fail (default) | warn (cap at WARN) | off
        thresholds:
          k3_kl: {warn: 1e-3, fail: 1e-2}
      config-parity:
        policy: {compilation_mode: warn}
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gate.checks.base import CheckResult, CheckSettings, CheckSpec
from gate.checks.context import Context
from gate.errors import ConfigError
from gate.verdict import Status

MODES = ("fail", "warn", "off")


def registry() -> list[CheckSpec]:
    from gate.checks import (
        config_parity,
        forward_drift,
        greedy,
        grpo,
        mismatch,
        precision,
        semantics,
        tokenization,
        weight_sync,
    )  # fmt: skip

    modules = (
        semantics,
        mismatch,
        forward_drift,
        greedy,
        config_parity,
        precision,
        tokenization,
        weight_sync,
        grpo,
    )
    return [m.SPEC for m in modules]


def parse_settings(raw: Any, where: str) -> dict[str, CheckSettings]:
    """Validate the ``checks:`` section against every check's spec; unknown keys fail by path."""
    raw = raw or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: checks: expected a mapping of check id to settings")
    specs = {spec.id: spec for spec in registry()}
    for check_id in raw:
        if check_id not in specs:
            raise ConfigError(
                f"{where}: checks.{check_id}: unknown check (expected one of: {', '.join(specs)})"
            )
    return {
        cid: _settings(spec, raw.get(cid) or {}, f"{where}: checks.{cid}")
        for cid, spec in specs.items()
    }


def _settings(spec: CheckSpec, raw: Any, where: str) -> CheckSettings:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping")
    raw = dict(raw)
    mode = raw.pop("mode", "fail")
    if mode not in MODES:
        raise ConfigError(f"{where}.mode: '{mode}' is not one of {MODES}")
    thresholds = dict(spec.thresholds)
    for name, value in (raw.pop("thresholds", None) or {}).items():
        if name not in thresholds:
            raise ConfigError(
                f"{where}.thresholds.{name}: unknown metric (expected one of: {', '.join(thresholds)})"
            )
        thresholds[name] = thresholds[name].with_overrides(value, f"{where}.thresholds.{name}")
    options = dict(spec.options)
    for name, value in raw.items():
        if name not in options:
            known = ", ".join(["mode", "thresholds", *options])
            raise ConfigError(f"{where}.{name}: unknown key (expected one of: {known})")
        default = options[name]
        if isinstance(default, dict):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}.{name}: expected a mapping")
            value = {**default, **value}
        elif (
            default is not None
            and not isinstance(value, type(default))
            and not (isinstance(default, float) and isinstance(value, int))
        ):
            raise ConfigError(f"{where}.{name}: expected {type(default).__name__}, got {value!r}")
        options[name] = value
    return CheckSettings(mode=mode, thresholds=thresholds, options=options)


def run_checks(ctx: Context, settings: dict[str, CheckSettings]) -> list[CheckResult]:
    results = []
    for spec in registry():
        s = settings[spec.id]
        if s.mode == "off":
            results.append(
                CheckResult(spec.id, spec.title, Status.SKIP, "turned off in the config")
            )
            continue
        try:
            result = spec.run(ctx, s)
        except Exception as exc:
            result = CheckResult(
                spec.id, spec.title, Status.ERROR, f"check crashed: {type(exc).__name__}: {exc}"
            )
        if s.mode == "warn" and result.status == Status.FAIL:
            result = dataclasses.replace(
                result, status=Status.WARN, summary=result.summary + " (capped at WARN by config)"
            )
        results.append(result)
    return results
