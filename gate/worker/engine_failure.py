"""What killed an engine, in the engine's own words, and what avoids it where the cause is known.

A dead engine core reaches the worker through a wrapper: the API server answers "EngineCore
encountered an issue. See stack trace (above) for the root cause.", a tensor-parallel rank's
failure comes back from an RPC as a string. The root cause is the engine core's (or the rank's)
own exception, logged just before; :func:`describe` quotes it, and adds the cause and the setting
that avoids it for failures whose cause has been read in vLLM's source (:data:`KNOWN`).

Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# vLLM's prefixes: "(EngineCore pid=42) ERROR 12-01 17:08:10 [core.py:1512] RuntimeError: ...":
# the process (for every line a child process writes), then the logger's level, time and place.
_PREFIX = re.compile(
    r"^(?:\((?P<proc>[\w.-]+) pid=\d+\)\s*)?"
    r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]*\]\s?)?"
)
# Lines an engine core or worker process logs at ERROR: a log tail keeps the first of them (a
# crash's root cause) when later lines push them out (gate.worker.log_tail).
ENGINE_ERROR_LINE = re.compile(r"^\((?:EngineCore|Worker)[\w.-]* pid=\d+\)\s*(?:ERROR|CRITICAL)\b")
# The last line of a traceback: a dotted exception name, then its message.
_EXCEPTION = re.compile(
    r"^(?P<name>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)): (?P<msg>.+)$"
)
# Exceptions that only say that the engine died elsewhere (vllm/v1/engine/exceptions.py).
WRAPPERS = ("EngineDeadError", "EngineGenerateError")
_ENGINE_PROCESSES = ("EngineCore", "Worker")
WRAPPER_CHARS = 160  # of the wrapper's message, beside the engine's own


@dataclass(frozen=True)
class KnownFailure:
    """An engine failure whose cause was read in vLLM's source, found by its exception's text."""

    marker: str
    cause: str
    avoid: str


KNOWN = (
    KnownFailure(
        marker="CPU Generator does not use offset",
        cause=(
            "a seeded request's prompt was split across engine steps by chunked prefill; vLLM then "
            "discards the token sampled for the partial prompt and rewinds the request's generator "
            "(gen.set_offset(gen.get_offset() - 4) in gpu_model_runner._bookkeeping_sync), which "
            "torch's CPU generator cannot do"
        ),
        avoid=(
            "set engine_args enable_chunked_prefill: false (the gate does so on CPU unless "
            "engine_args sets enable_chunked_prefill, or a max_num_batched_tokens below "
            "max_model_len), or sample without a seed"
        ),
    ),
)


def engine_exception(lines: Sequence[str]) -> str | None:
    """The engine's own exception line in ``lines`` (a log tail): the last traceback line of an
    engine core or worker process that is not a wrapper, else the last such line of any process."""
    own: str | None = None
    engine: str | None = None
    for line in lines:
        match = _PREFIX.match(line)
        assert match is not None  # every part of the prefix is optional
        text = line[match.end() :].strip()
        exc = _EXCEPTION.match(text)
        if exc is None or exc["name"].rsplit(".", 1)[-1] in WRAPPERS:
            continue
        own = text
        if (match["proc"] or "").startswith(_ENGINE_PROCESSES):
            engine = own
    return engine or own


def known_failure(texts: Sequence[str]) -> KnownFailure | None:
    return next((k for k in KNOWN if any(k.marker in t for t in texts)), None)


def describe(message: str, lines: Sequence[str]) -> str:
    """The error for the report: the engine's own exception from ``lines`` first where
    ``message`` (the error as the worker caught it: a wrapper, an HTTP answer) does not carry it,
    then the cause and remedy of a known failure."""
    own = engine_exception(lines)
    if own and own not in message:
        text = f"the engine failed: {own} (reported as {_short(message)})"
    else:
        text = message
    known = known_failure([message, *(lines if own is None else [own])])
    if known is not None:
        text += f"; cause: {known.cause}; to avoid it: {known.avoid}"
    return text


def _short(text: str, limit: int = WRAPPER_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def error_line(exc: BaseException) -> str:
    """The one line the worker reports for ``exc`` (its ``error:`` progress line, which the
    orchestrator shows as the engine's error): the first line of its message, described."""
    if isinstance(exc, EngineFailed):
        message = str(exc)
    else:  # a ServerError's reason is its message without the log tail it appends
        message = f"{type(exc).__name__}: {getattr(exc, 'reason', None) or exc}"
    first = message.strip().splitlines()[0] if message.strip() else type(exc).__name__
    return describe(first, getattr(exc, "log_tail", None) or ())


class EngineFailed(RuntimeError):
    """The engine failed; the message says how, in the engine's own words where its log has them."""

    def __init__(self, message: str, log_tail: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.log_tail = list(log_tail)
