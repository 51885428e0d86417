"""Errors the CLI turns into one-line messages and distinct exit codes."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAIL = 1  # the gate judged and the verdict is FAIL
EXIT_USAGE = 2  # the user's config, arguments or input files are wrong
EXIT_ERROR = 3  # the gate could not judge: an engine failed to install, crashed or timed out


class GateError(Exception):
    """Base class: carries the exit code the CLI should return."""

    exit_code = EXIT_ERROR


class ConfigError(GateError):
    """A config, prompt set or model path is missing or malformed; names the file and field."""

    exit_code = EXIT_USAGE


class EngineError(GateError):
    """An engine environment could not produce evidence; carries the tail of its log."""

    exit_code = EXIT_ERROR

    def __init__(self, engine: str, message: str, log_tail: str = "") -> None:
        self.engine = engine
        self.log_tail = log_tail
        super().__init__(f"engine '{engine}': {message}")


class DockerError(GateError):
    """The Docker side failed: no daemon, an image build, a container that died; carries a log tail."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str, log_tail: str = "") -> None:
        self.log_tail = log_tail
        super().__init__(message)
