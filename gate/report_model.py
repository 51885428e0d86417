"""report.json as typed, validated structs: the one declaration of the schema (docs/report.md).

A report may come from a pull request's own run (the fork split's artifact), so every field the gate
reads is checked for its type once, where the report is loaded: a wrong type is one
:class:`ReportError` line naming the file and the dotted field
(``report.json: field counts.PASS: expected a non-negative integer, got a string "7"``), exit code 2,
never a traceback deep inside the renderer. What comes out is a tree of frozen dataclasses, so the
renderer, ``gate publish`` and ``gate merge`` read attributes, not ``.get()`` chains.

Rules the structs keep:

- Unknown keys are allowed (minor schema versions add them) and ignored by the structs; the JSON
  object each :class:`ReportBody` and :class:`Check` was read from stays in ``document``, so what no
  reader interprets (``run.sampling``, a check's own details) passes through unchanged, e.g. into a
  merged report's parts.
- ``null`` stands for "not known": an optional field reads as ``None``; a list or map field reads
  as empty. NaN never gets here (:func:`gate.files.read_report_json` reads it as ``null``).
- A merged report (``gate merge``) is a :class:`Report` whose ``parts`` are :class:`ReportBody`:
  each a report minus its ``schema`` line.

Why dataclasses and a small converter, not ``msgspec.convert``: msgspec names a map's value
``$.engines[...]`` without its key, so ``engines.old.timings.total_s`` could not be named in the
error; its messages spell types in Python (``Expected `int | null`, got `str```) rather than the
documented wording, and parsing them would tie the error format to msgspec's message text; and it
turns an integer read into a ``float`` field into a float, which changes how a figure is printed
(``12,345`` vs ``1.23e+04``). The converter below walks the dataclasses' type hints, so the types
are declared once, here, and nothing else describes the schema.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

from gate.errors import ConfigError
from gate.files import read_report_json
from gate.verdict import FAIL_ON, STATUSES, VERDICTS

SCHEMA_PREFIX = "gate-report/"
SUPPORTED_MAJOR = 1
SCHEMA = f"{SCHEMA_PREFIX}{SUPPORTED_MAJOR}"


class ReportError(ConfigError):
    """A report.json that does not match the documented schema; names the file and the field."""


# -- value rules beyond a Python type (used as Annotated[...] metadata) ------------------------------
@dataclass(frozen=True)
class Rule:
    """A value must satisfy ``accepts``; ``expected`` completes "expected ..." in the error."""

    expected: str
    accepts: Callable[[Any], bool]


def one_of(choices: tuple[str, ...]) -> Rule:
    return Rule(" or ".join(f'"{c}"' for c in choices), lambda v: v in choices)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return _is_int(v) or isinstance(v, float)


StatusName = Annotated[str, one_of(STATUSES)]
VerdictName = Annotated[str, one_of(VERDICTS)]
FailOn = Annotated[str, one_of(FAIL_ON)]
Count = Annotated[int, Rule("a non-negative integer", lambda v: _is_int(v) and v >= 0)]
# A measured value or an id: a number, or text such as a version or a setting.
Scalar = Annotated[
    str | float | bool,
    Rule("a number, a string or true/false", lambda v: isinstance(v, (str, int, float))),
]
JsonObject = Mapping[str, Any]  # open data an engine or a check reported: any keys, any JSON values

# Marks the field that keeps the JSON object a struct was read from (filled by the converter).
_DOCUMENT = {"document": True}


# -- the schema (docs/report.md), fields in the order they are checked --------------------------------
@dataclass(frozen=True, kw_only=True)
class Measurement:
    name: str | None = None
    value: Scalar | None = None
    status: StatusName | None = None
    warn: float | None = None  # the resolved bounds; None: no such bound
    fail: float | None = None
    higher_is_worse: bool | None = None
    engine: str | None = None  # old, new, vs baseline, vs old
    note: str | None = None
    noise: float | None = None  # the calibrated A/A floor of the statistic, where one applied


@dataclass(frozen=True, kw_only=True)
class WorstToken:
    """One of the tokens whose logprobs diverge most between the engine and the trainer."""

    engine: str | None = None
    prompt_id: Scalar | None = None
    context: str | None = None  # the text just before the token
    token: str | None = None
    engine_logprob: float | None = None
    trainer_logprob: float | None = None
    position: int | None = None
    context_after: str | None = None  # the text just after the token
    rank: int | None = None


@dataclass(frozen=True, kw_only=True)
class SettingChange:
    old: Any = None  # JSON values as the engines reported them
    new: Any = None


@dataclass(frozen=True, kw_only=True)
class SettingOverride:
    requested: Any = None
    effective: Any = None


@dataclass(frozen=True, kw_only=True)
class CheckDetails:
    """The check-specific data a reader interprets; everything else stays in the check's ``document``."""

    worst_tokens: tuple[WorstToken, ...] = ()
    # config-parity (compared_with also in grpo-trajectory)
    compared_with: str | None = None
    diff: Mapping[str, SettingChange] = field(default_factory=dict)
    overridden_by_engine: Mapping[str, SettingOverride] = field(default_factory=dict)
    acknowledged: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Check:
    id: str | None  # required (may be null)
    title: str | None = None
    status: StatusName  # required
    summary: str | None = None
    diagnosis: str | None = None
    measurements: tuple[Measurement, ...] = ()
    details: CheckDetails = field(default_factory=CheckDetails)
    part: str | None = None  # in a merged report: the gate id of the part this check came from
    document: JsonObject = field(
        default_factory=dict, repr=False, compare=False, metadata=_DOCUMENT
    )


@dataclass(frozen=True, kw_only=True)
class ReusedEvidence:
    """The evidence cache entry an engine's evidence came from instead of a replay."""

    key: str | None = None
    created: str | None = None
    source_run: str | None = None
    worker_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class Engine:
    """An engine as the run saw it; a baseline's manifest records one too (without spec and runner)."""

    spec: str | None = None
    runner: str | None = None
    status: str | None = None
    error: str | None = None
    log_tail: str | None = None
    reused: ReusedEvidence | None = None
    identity: JsonObject | None = (
        None  # versions, device, engine class: as the engine reported them
    )
    effective: JsonObject | None = None  # effective settings
    dropped_engine_args: tuple[Any, ...] = ()
    timings: Mapping[str, float | None] = field(default_factory=dict)
    counts: Mapping[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ModelRef:
    path: str | None = None
    sha256: str | None = None


@dataclass(frozen=True, kw_only=True)
class PromptSetRef:
    name: str | None = None
    sha256: str | None = None
    records: int | None = None


@dataclass(frozen=True, kw_only=True)
class Run:
    dir: str | None = None
    config: str | None = None
    started: str | None = None
    finished: str | None = None
    model: ModelRef | None = None
    prompt_sets: tuple[PromptSetRef, ...] = ()


@dataclass(frozen=True, kw_only=True)
class RecordedFrom:
    spec: str | None = None
    run: str | None = None


@dataclass(frozen=True, kw_only=True)
class BaselineManifest:
    """What the baseline folder says about where it was recorded (gate/baseline.py writes it)."""

    created: str | None = None
    recorded_from: RecordedFrom | None = None
    engine: Engine | None = None
    model: ModelRef | None = None
    prompt_sets: tuple[PromptSetRef, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Baseline:
    path: str | None = None
    status: StatusName | None = None
    message: str | None = None
    differences: tuple[str | None, ...] = ()
    manifest: BaselineManifest | None = None
    noise_floors: str | None = None


@dataclass(frozen=True, kw_only=True)
class Commands:
    reproduce: str | None = None
    regenerate_baseline: str | None = None


@dataclass(frozen=True, kw_only=True)
class GrpoMetric:
    """Per-step values; None where a step has none (band_low None: the band has no lower edge)."""

    old: tuple[float | None, ...] = ()
    new: tuple[float | None, ...] = ()
    band_low: tuple[float | None, ...] = ()
    band_high: tuple[float | None, ...] = ()


@dataclass(frozen=True, kw_only=True)
class GrpoStatistic:
    """One paired statistic of the GRPO run (gate/checks/grpo.py): the mean per-seed difference
    new - reference, its interval at the statistic's level, p-value and the effect detected with
    90% power (δ90)."""

    effect: float | None = None
    low: float | None = None
    high: float | None = None
    p_value: float | None = None
    delta90: float | None = None
    alpha: float | None = None
    alternative: str | None = None
    seeds: int | None = None
    null_seeds: int | None = None
    practical: float | None = None  # the smallest effect worth the status, however significant
    status: str | None = None
    what: str | None = None


@dataclass(frozen=True, kw_only=True)
class GrpoEval:
    """The eval reward's difference split: the checkpoint through each engine (before any update),
    and the rest (what was learned less)."""

    checkpoint_new: float | None = None
    checkpoint_reference: float | None = None
    immediate: float | None = None
    immediate_se: float | None = None
    learned: float | None = None
    trained_new: float | None = None


@dataclass(frozen=True, kw_only=True)
class Grpo:
    steps: int | None = None
    compared_with: str | None = None
    metrics: Mapping[str, GrpoMetric | None] = field(default_factory=dict)
    first_exit: Mapping[str, int | None] = field(default_factory=dict)  # first step out of band
    seeds: tuple[int, ...] = ()  # the new engine's seeds, paired with the reference's
    null_seeds: int | None = None
    statistics: Mapping[str, GrpoStatistic | None] = field(default_factory=dict)
    eval: GrpoEval | None = None
    summary: str | None = None  # the check's one line, where the statistics did not run (SKIP)


@dataclass(frozen=True, kw_only=True)
class PlanComponent:
    name: str | None = None
    bytes: int | None = None
    how: str | None = None  # the formula or constant it came from


@dataclass(frozen=True, kw_only=True)
class PlanDeviceUse:
    total_bytes: int | None = None
    components: tuple[PlanComponent, ...] = ()


@dataclass(frozen=True, kw_only=True)
class PlanDevice:
    name: str | None = None  # "cuda:0", or "cpu" for the host
    total_bytes: int | None = None
    available_bytes: int | None = None  # free when the plan was made


@dataclass(frozen=True, kw_only=True)
class EngineMemoryPlan:
    """The plan of the engines that share these settings (old and new, when alike)."""

    engines: tuple[str | None, ...] = ()
    devices: tuple[PlanDevice, ...] = ()
    peak_bytes: Mapping[str, int | None] = field(default_factory=dict)  # device -> largest phase
    peak_phase: Mapping[str, str | None] = field(default_factory=dict)
    phases: Mapping[str, Mapping[str, PlanDeviceUse]] = field(
        default_factory=dict
    )  # phase -> device
    problems: tuple[str | None, ...] = ()


@dataclass(frozen=True, kw_only=True)
class MemoryPlan:
    """gate.memory_plan's plan, made before the run (absent in reports of older gates)."""

    model: str | None = None
    parameters: int | None = None
    parameters_from: str | None = None  # "safetensors header" (exact) or "config.json"
    fits: bool | None = None
    knobs: tuple[str | None, ...] = ()
    engines: tuple[EngineMemoryPlan, ...] = ()
    skipped: str | None = None  # why there is no plan (e.g. a hub model not in the local cache)
    measured_peak_bytes: Mapping[str, int | None] = field(
        default_factory=dict
    )  # engine -> RSS peak


@dataclass(frozen=True, kw_only=True)
class BisectReading:
    status: StatusName | None = None
    value: float | None = None


@dataclass(frozen=True, kw_only=True)
class BisectStep:
    version: str | None = None
    outcome: Annotated[str, one_of(("held", "changed", "skipped", "ambiguous"))] | None = None
    reading: BisectReading | None = None
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class BisectCheck:
    status: StatusName | None = None
    summary: str | None = None


@dataclass(frozen=True, kw_only=True)
class BisectBoundary:
    """The last release that held and the first that changed, judged against each other."""

    settings: Mapping[str, JsonObject] = field(default_factory=dict)  # setting -> {old, new}
    features: JsonObject = field(default_factory=dict)  # {"changed": [...]} or {"error": ...}
    checks: Mapping[str, BisectCheck] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Bisection:
    """``gate bisect --attach``: which release between the two pins changed the judgment."""

    status: Annotated[str, one_of(("found", "no-change", "inconclusive", "adjacent"))] | None = None
    good: str | None = None
    bad: str | None = None
    target: str | None = None
    candidates: tuple[str | None, ...] = ()
    steps: tuple[BisectStep, ...] = ()
    first_changed: str | None = None
    last_held: str | None = None
    untested_between: tuple[str | None, ...] = ()
    boundary: BisectBoundary | None = None
    replays: Count | None = None
    wall_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class ReportBody:
    """Everything a report says about one gate run; a merged report's part is exactly this."""

    gate_version: str | None = None
    gate_id: str | None = None
    verdict: VerdictName | None = None
    exit_code: int | None = None
    fail_on: FailOn | None = None
    counts: Mapping[StatusName, Count] = field(default_factory=dict)
    errors: tuple[str | None, ...] = ()
    run: Run | None = None
    engines: Mapping[str, Engine] = field(default_factory=dict)
    baseline: Baseline | None = None
    checks: tuple[Check, ...] = ()
    commands: Commands | None = None
    grpo: Grpo | None = None
    worst_tokens: tuple[WorstToken, ...] = ()
    memory_plan: MemoryPlan | None = None
    bisect: Bisection | None = None
    document: JsonObject = field(
        default_factory=dict, repr=False, compare=False, metadata=_DOCUMENT
    )


@dataclass(frozen=True, kw_only=True)
class Report(ReportBody):
    schema: str  # gate-report/<major>[.<minor>]
    parts: tuple[ReportBody, ...] | None = None  # a merged report's inputs (None: not merged)

    @classmethod
    def from_dict(
        cls, data: Any, where: str = "report", *, require_verdict: bool = False
    ) -> Report:
        """The report in ``data`` (parsed JSON), checked; else one :class:`ReportError` naming ``where``.

        ``require_verdict``: ``gate publish`` and ``gate comment`` act on the verdict, so it must be
        there; rendering a report without one shows it as ERROR.
        """
        check_version(data, where)
        try:
            report: Report = _build(data, cls, "")
        except _Mismatch as exc:
            raise ReportError(
                f"{where}: field {exc.path}: expected {exc.expected}, got {describe(exc.value)}"
            ) from None
        if require_verdict and report.verdict is None:
            raise ReportError(f"{where}: field verdict: required, one of {', '.join(VERDICTS)}")
        return report


def load_report(path: Path, *, require_verdict: bool = False) -> tuple[Report, Path]:
    """The report at ``path`` (a report.json, or a run directory or its ``.incomplete`` holding one),
    checked, and the file it came from."""
    data, file = read_report_json(path)
    return Report.from_dict(data, str(file), require_verdict=require_verdict), file


def check_version(data: Any, where: str = "report") -> None:
    """A JSON object whose ``schema`` names a major version this gate reads."""
    if not isinstance(data, dict):
        raise ReportError(
            f"{where}: expected a JSON object (a gate report.json), got {describe(data)}"
        )
    schema = data.get("schema")
    if not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
        raise ReportError(
            f"{where}: not a gate report (schema {describe(schema)}, expected '{SCHEMA}')"
        )
    major = schema[len(SCHEMA_PREFIX) :].split(".", 1)[0]
    if not (major.isascii() and major.isdigit()) or int(major) != SUPPORTED_MAJOR:
        raise ReportError(
            f"{where}: unsupported report schema {schema[:60]!r}; this gate reads '{SCHEMA}'"
        )


def describe(value: Any, limit: int = 40) -> str:
    """A value as one short line for an error message: its JSON type and a JSON-quoted excerpt."""
    kind = {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
    }.get(type(value), "a number" if _is_number(value) else type(value).__name__)
    if isinstance(value, (dict, list)):
        return kind
    text = json.dumps(
        value, ensure_ascii=True, default=str
    )  # one line: newlines and controls escaped
    return f"{kind} {text[:limit]}{'…' if len(text) > limit else ''}" if value is not None else kind


# -- the converter: JSON values into the types above, or _Mismatch at the first wrong one -----------
class _Mismatch(Exception):
    def __init__(self, expected: str, path: str, value: Any) -> None:
        super().__init__(expected)
        self.expected = expected
        self.path = path
        self.value = value


_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_PLAIN = {str: ("a string", lambda v: isinstance(v, str)), int: ("an integer", _is_int),
          float: ("a number", _is_number), bool: ("true or false", lambda v: isinstance(v, bool))}  # fmt: skip


def _join(path: str, name: Any) -> str:
    """``path.name``; a key that is not a plain name (it may come from the PR) is shown JSON-quoted."""
    if not (isinstance(name, str) and _NAME.fullmatch(name)):
        return f"{path}[{json.dumps(str(name), ensure_ascii=True)[:60]}]"
    return f"{path}.{name}" if path else name


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls, include_extras=True)


def _nullable(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)


def _build(value: Any, cls: type, path: str) -> Any:
    """A dataclass from a JSON object: known keys converted, unknown ones kept only in ``document``."""
    if not isinstance(value, dict):
        raise _Mismatch("an object", path, value)
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("document"):
            kwargs[f.name] = value
            continue
        where = _join(path, f.name)
        has_default = not (f.default is MISSING and f.default_factory is MISSING)
        if f.name not in value:
            if not has_default:
                raise _Mismatch("a value (the field is required)", where, None)
            continue
        item = value[f.name]
        if item is None and has_default and not _nullable(hints[f.name]):
            continue  # null is "not known": an empty list, map or details
        kwargs[f.name] = _convert(item, hints[f.name], where)
    return cls(**kwargs)


def _convert(value: Any, tp: Any, path: str) -> Any:
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        # only Optional[...] unions are declared above
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(value, inner, path)
    if origin is Annotated:
        rule = args[1]
        if not rule.accepts(value):
            raise _Mismatch(rule.expected, path, value)
        return value
    if tp in _PLAIN:
        expected, accepts = _PLAIN[tp]
        if not accepts(value):
            raise _Mismatch(expected, path, value)
        return value
    if origin is tuple:  # tuple[X, ...]: a JSON list
        if not isinstance(value, list):
            raise _Mismatch("a list", path, value)
        return tuple(_convert(v, args[0], f"{path}[{i}]") for i, v in enumerate(value))
    if origin is Mapping:  # a JSON object with free keys
        if not isinstance(value, dict):
            raise _Mismatch("an object", path, value)
        key_type, value_type = args
        out = {}
        for k, v in value.items():
            out[_convert(k, key_type, _join(path, k))] = _convert(v, value_type, _join(path, k))
        return out
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build(value, tp, path)
    raise TypeError(
        f"report_model: no conversion for {tp!r}"
    )  # a declaration error, not the report's
