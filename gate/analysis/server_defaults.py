"""Server mode's sampling defaults, for config-parity: what the server filled in, and its changes.

A server fills every field a request omits from the model's ``generation_config.json``
(``--generation-config auto``, vLLM's default): a top_k 20 or a repetition penalty the trainer
never applies. The worker records, per engine, the fields its requests sent, the defaults the
server reported, those it therefore applied, and whether a request with every field set to those
values sampled the same (engine.json ``server``; gate/worker/server_engine.py).

:func:`findings` turns that into config-parity measurements: each applied default that differs
from the config's sampling section (the transform the trainer-side reference applies) FAILs with
the fix; an applied default that changed between the engines WARNs; effective parameters the gate
could not confirm WARN. Offline engines have no ``server`` record and give no findings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gate.checks.base import Measurement
from gate.contract.engine_record import EngineRecord
from gate.verdict import Status

KEY = "server_defaults"  # measurement names: server_defaults.<field>
# The sampling section's fields the trainer-side reference applies; a server default for any other
# field (a repetition penalty, min_p) is a transform the reference does not know at all.
_TRAINER_FIELDS = ("temperature", "top_p", "top_k")
_NEUTRAL = {
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


@dataclass(frozen=True)
class Finding:
    measurement: Measurement
    problem: str  # empty when nothing is wrong


def server_record(engine: EngineRecord | None) -> dict[str, Any] | None:
    return engine.server if engine is not None else None


def _source(source: str | None) -> str:
    """Where the server read its defaults: its own words, a folder by name (no machine paths)."""
    if not source:
        return "the model's generation_config.json"
    return (
        f"{source.rstrip('/').rsplit('/', 1)[-1]}/generation_config.json"
        if source.startswith("/")
        else source
    )


def _fix(field: str, source: str | None) -> str:
    where = _source(source)
    return (
        f"the server fills {field} from {where} (generation_config) because the requests omit it; start the "
        f"server with `--generation-config vllm` (server.args) or send {field} explicitly "
        "(server.request_fields, and in your stack's requests)"
    )


def _against_trainer(field: str, value: Any, sampling: dict[str, Any]) -> bool:
    """Whether the server's ``value`` for ``field`` is the transform the trainer applies."""
    if field == "top_k":  # 0 and -1 both mean "off"
        return max(int(value or 0), 0) == max(int(sampling.get("top_k") or 0), 0)
    if field in _TRAINER_FIELDS:
        return value == sampling.get(field)
    if field in _NEUTRAL:
        return value == _NEUTRAL[field]
    return True  # max_tokens and the like change lengths, not logprobs


def findings(
    old_meta: EngineRecord | None, new_meta: EngineRecord, sampling: dict[str, Any]
) -> list[Finding]:
    """Config-parity rows for the server defaults of both engines (none for offline engines)."""
    out: list[Finding] = []
    records = {"old": server_record(old_meta), "new": server_record(new_meta)}
    for label, record in records.items():
        if record is None:
            continue
        applied = record.get("applied_defaults") or {}
        source = record.get("reported_defaults_source")
        for field, value in sorted(applied.items()):
            name = f"{KEY}.{field}"
            if _against_trainer(field, value, sampling):
                note = f"{label}: the server applies {field}={value!r} from {_source(source)}, as the trainer does"
                out.append(
                    Finding(Measurement(name, None, Status.PASS, engine=label, note=note), "")
                )
                continue
            note = (
                f"{label}: the server applies {field}={value!r} from {_source(source)}; "
                f"the trainer applies {field}={sampling.get(field, _NEUTRAL.get(field))!r}"
            )
            problem = f"{label} engine: {field}={value!r} differs from the trainer's sampling: {_fix(field, source)}"
            out.append(
                Finding(Measurement(name, None, Status.FAIL, engine=label, note=note), problem)
            )
        if record.get("effective_confirmed") is False:
            note = f"{label}: a request with every field set sampled differently from one as the stack sends it"
            problem = (
                f"{label} engine: the server applies a default the gate could not read; set every sampling "
                "field explicitly (server.request_fields) or start the server with `--generation-config vllm`"
            )
            out.append(
                Finding(
                    Measurement(f"{KEY}.unconfirmed", None, Status.WARN, engine=label, note=note),
                    problem,
                )
            )
    old, new = records["old"], records["new"]
    if old is not None and new is not None:
        a, b = old.get("applied_defaults") or {}, new.get("applied_defaults") or {}
        for field in sorted(a.keys() | b.keys()):
            if a.get(field) != b.get(field):
                note = f"applied default {field}: {a.get(field)!r} -> {b.get(field)!r}"
                problem = f"the server's default {field} changed {a.get(field)!r} -> {b.get(field)!r}: {_fix(field, new.get('reported_defaults_source'))}"
                out.append(
                    Finding(
                        Measurement(f"{KEY}.changed.{field}", None, Status.WARN, note=note), problem
                    )
                )
    return out
