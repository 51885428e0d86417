"""The runner interface and the subprocess plumbing the local and venv runners share."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gate.config import EngineConfig
from gate.contract.request import PROGRESS_PREFIX
from gate.errors import EngineError
from gate.runners.venv_build import redact_credentials

LOG_TAIL_LINES = 25


@dataclass(frozen=True)
class WorkerOutcome:
    engine: str
    log_path: Path
    wall_s: float


class Runner(ABC):
    """Prepares an engine environment and runs ``python -m gate.worker`` inside it."""

    kind: str

    def __init__(self) -> None:
        # Set by whoever runs prepare() in a thread, to stop an install when the run is abandoned.
        self.cancelled = threading.Event()

    @abstractmethod
    def prepare(self, engine: EngineConfig, log) -> None:
        """Make the environment ready (install, cache look-up); raise EngineError on failure."""

    @abstractmethod
    def environment(self, engine: EngineConfig) -> dict:
        """What identifies the prepared environment's content (resolved packages, an image id)."""

    @abstractmethod
    def python(self, engine: EngineConfig) -> str:
        """The interpreter that runs the worker."""

    def worker_env(self, engine: EngineConfig) -> dict[str, str]:
        """Extra environment for the worker (after the engine's own ``env``)."""
        return {}

    def run_worker(
        self,
        engine: EngineConfig,
        request_paths: Sequence[Path],
        log_path: Path,
        timeout_s: float,
        log,
    ) -> WorkerOutcome:
        """Run one worker process over ``request_paths``: several requests share one engine start."""
        extra = self.worker_env(engine)
        if "PYTHONPATH" in extra and engine.env.get("PYTHONPATH"):
            # The engine's own PYTHONPATH (e.g. where a custom logits processor lives) stays reachable.
            extra["PYTHONPATH"] += os.pathsep + engine.env["PYTHONPATH"]
        env = {**os.environ, **engine.env, **extra, "PYTHONUNBUFFERED": "1"}
        cmd = [self.python(engine), "-m", "gate.worker", *map(str, request_paths)]
        start = time.perf_counter()
        run_logged(cmd, env, log_path, timeout_s, engine.name, "worker", log)
        return WorkerOutcome(engine.name, log_path, time.perf_counter() - start)


class OutputLog:
    """Where a worker's (or an install's) output lines go: the log file, a tail for error messages,
    and the ``[gate-worker]`` progress lines echoed to the user. Shared by every runner."""

    def __init__(
        self,
        log_file,
        engine: str,
        log: Callable[[str], None],
        line_hook: Callable[[str], None] | None = None,
    ) -> None:
        self.file = log_file
        self.engine = engine
        self.log = log
        self.line_hook = line_hook
        self.tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self.last_error: str | None = None

    def feed(self, line: str) -> None:
        self.file.write(line if line.endswith("\n") else line + "\n")
        line = line.rstrip("\n")
        self.tail.append(line)
        if line.startswith(PROGRESS_PREFIX):
            message = line[len(PROGRESS_PREFIX) :].rstrip()
            if message.startswith("error: "):
                self.last_error = message[len("error: ") :]
            self.log(f"[{self.engine}] {message}")
        elif self.line_hook is not None:
            self.line_hook(line)

    def tail_text(self) -> str:
        return "\n".join(self.tail)


def run_logged(
    cmd: list[str],
    env: dict,
    log_path: Path,
    timeout_s: float,
    engine: str,
    what: str,
    log: Callable[[str], None],
    line_hook: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
) -> None:
    """Run ``cmd``, teeing its output to ``log_path`` and echoing worker progress lines.

    ``line_hook`` sees every other output line (the venv runner relays pip's milestones with it).
    ``cancel``, when set from another thread, stops the command (an install abandoned by its run).

    Raises EngineError with the log's tail on a non-zero exit or a timeout. The child gets its own
    process group so a timeout or Ctrl-C also ends the processes vLLM spawned.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log_file:
        log_file.write(f"$ {redact_credentials(' '.join(cmd))}\n")
        log_file.flush()
        output = OutputLog(log_file, engine, log, line_hook)
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,
        )

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                output.feed(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            rc = _wait(proc, timeout_s, cancel, " ".join(cmd[:3]))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            reader.join(timeout=5)
            raise EngineError(  # noqa: B904 - the timeout is the error; its traceback says nothing
                engine,
                f"{what} timed out after {timeout_s:.0f}s (log: {log_path})",
                output.tail_text(),
            )
        except BaseException:
            _kill_group(proc)
            raise
        reader.join(timeout=30)
    if rc != 0:
        reason = output.last_error or f"{what} exited with code {rc}"
        raise EngineError(engine, f"{reason} (log: {log_path})", output.tail_text())


def _wait(
    proc: subprocess.Popen[str], timeout_s: float, cancel: threading.Event | None, command: str
) -> int:
    if cancel is None:
        return proc.wait(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return proc.wait(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise
            if cancel.is_set():
                raise KeyboardInterrupt(f"cancelled: {command}") from None


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def stderr_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
