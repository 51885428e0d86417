"""What every check returns, and how thresholds are written and evaluated.

A threshold is absolute (``warn: 1e-3``) or relative to the metric's calibrated noise floor
(``fail: "6x noise"``). A relative threshold without a calibrated floor falls back to the
absolute ``floor`` given beside it, so a missing calibration never makes a check hypersensitive.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from gate.errors import ConfigError
from gate.verdict import Status

if TYPE_CHECKING:
    from gate.checks.context import Context

_NUMBER = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$")
_RELATIVE = re.compile(r"^\s*([0-9.eE+-]+)\s*x\s*noise\s*$")


@dataclass(frozen=True)
class Limit:
    """One bound: an absolute value, or a multiple of the noise floor but never below ``floor``."""

    value: float
    relative: bool = False
    floor: float = 0.0

    @classmethod
    def parse(cls, raw: Any, where: str) -> Limit | None:
        if raw is None:
            return None
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            return cls(float(raw))
        if isinstance(raw, str):
            m = _RELATIVE.match(raw)
            if m:
                return cls(float(m.group(1)), relative=True)
            # YAML 1.1 (PyYAML) reads `1e-3`, without a dot, as a string; the user meant a number.
            if _NUMBER.match(raw):
                return cls(float(raw))
        raise ConfigError(f"{where}: expected a number or 'N x noise', got {raw!r}")

    def resolve(self, noise: float | None) -> float:
        if not self.relative:
            return self.value
        if noise is None or not math.isfinite(noise):
            return self.floor
        return max(self.value * noise, self.floor)

    def describe(self) -> str:
        return f"max({self.value:g}x noise, {self.floor:g})" if self.relative else f"{self.value:g}"


@dataclass(frozen=True)
class Threshold:
    """warn/fail bounds on one metric; ``higher_is_worse`` False for e.g. ESS or match rates."""

    warn: Limit | None = None
    fail: Limit | None = None
    higher_is_worse: bool = True
    source: str = ""  # where the default comes from (NeMo-RL, verl, vLLM tests, ...)

    def evaluate(
        self, value: float, noise: float | None = None
    ) -> tuple[Status, float | None, float | None]:
        warn = self.warn.resolve(noise) if self.warn else None
        fail = self.fail.resolve(noise) if self.fail else None
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return Status.PASS, warn, fail
        if fail is not None and self._beyond(value, fail):
            return Status.FAIL, warn, fail
        if warn is not None and self._beyond(value, warn):
            return Status.WARN, warn, fail
        return Status.PASS, warn, fail

    def _beyond(self, value: float, bound: float) -> bool:
        return value > bound if self.higher_is_worse else value < bound

    def with_overrides(self, override: ThresholdOverride, where: str) -> Threshold:
        def limit(key: str, default: Limit | None) -> Limit | None:
            given = getattr(override, key)
            new = default if given is msgspec.UNSET else Limit.parse(given, f"{where}.{key}")
            if new is None:
                return None
            # A relative limit keeps the default's floor unless the config sets one.
            kept = default.floor if default is not None else 0.0
            floor = override.floor if override.floor is not None else kept
            return Limit(new.value, new.relative, floor)

        return Threshold(
            warn=limit("warn", self.warn),
            fail=limit("fail", self.fail),
            higher_is_worse=self.higher_is_worse,
            source="config",
        )


class ThresholdOverride(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A metric's bounds in gate.yaml: a number or "N x noise" each, and the floor of a relative one.

    A bound left out keeps the check's default; ``null`` removes it.
    """

    warn: float | str | msgspec.UnsetType | None = msgspec.UNSET
    fail: float | str | msgspec.UnsetType | None = msgspec.UNSET
    floor: float | None = None


@dataclass
class Measurement:
    name: str
    value: float | None
    status: Status
    warn: float | None = None
    fail: float | None = None
    higher_is_worse: bool = True
    engine: str | None = None  # "old" / "new" / None for comparisons
    note: str = ""
    noise: float | None = None  # the calibrated A/A floor of this statistic, where one applied

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "value": _num(self.value),
            "status": self.status.value,
            "warn": _num(self.warn),
            "fail": _num(self.fail),
            "higher_is_worse": self.higher_is_worse,
            "engine": self.engine,
            "note": self.note,
            "noise": _num(self.noise),
        }


@dataclass
class CheckResult:
    id: str
    title: str
    status: Status
    summary: str  # one line: the key metric, measured vs threshold
    diagnosis: str = ""  # what is wrong and the concrete fix; empty on PASS
    measurements: list[Measurement] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "title": self.title,
            "status": self.status.value,
            "summary": self.summary,
            "diagnosis": self.diagnosis,
            "measurements": [m.to_dict() for m in self.measurements],
            "details": self.details,
        }


def measure(
    name: str,
    value: float,
    threshold: Threshold,
    noise: float | None = None,
    engine: str | None = None,
) -> Measurement:
    status, warn, fail = threshold.evaluate(value, noise)
    return Measurement(
        name, value, status, warn, fail, threshold.higher_is_worse, engine, noise=noise
    )


def _num(x: float | None) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class CheckSettings:
    """One check's settings from gate.yaml's ``checks:`` section, its defaults filled in."""

    mode: str  # fail | warn | off
    thresholds: dict[str, Threshold]
    options: dict[str, Any]


@dataclass(frozen=True)
class CheckSpec:
    id: str
    title: str
    run: Callable[[Context, CheckSettings], CheckResult]
    thresholds: dict[str, Threshold] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    # It compares the engine's logprobs with a reference: an engine whose logprobs hold NaN/inf
    # (logprob-integrity FAILs it) is not judged by it, since its means would be NaN and read as PASS.
    compares_engine_logprobs: bool = False
    # (an array every engine's evidence must hold, the config switch of the pass that records it):
    # with that pass off the check is SKIP with the reason, not a crash on the missing array.
    requires: tuple[str, str] | None = None
