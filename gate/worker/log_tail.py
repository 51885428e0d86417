"""The last lines of the engine's processes' output, read up to a known point.

vLLM's engine processes (tensor-parallel ranks, a server's API process and engine core) log their
own failures to stdout, and the worker learns of the failure through another channel: an RPC's
reply through shared memory, an HTTP answer. A thread pumping their output pipe may not have read
the failing rank's lines yet when that reply arrives, so a tail read at that moment can miss them
(the flaky "failed_ranks == []" of issue 29).

:meth:`LineTail.lines` therefore puts a marker into the same pipe first and waits until the pump
has read up to it: a pipe keeps the order of writes, and the rank wrote its lines before it sent
the reply this process has already received, so every such line is in the tail once the marker is.
The marker is stripped from what passes through.

Standard library only.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence

# NUL never appears in a text log; the number tells one barrier from another.
_MARK = b"\x00gate-tail-sync:"
SYNC_TIMEOUT_S = 5.0
WATCHED_LINES = 200


def _split_marks(data: bytes) -> tuple[bytes, list[int], bytes]:
    """``data`` less every complete marker, the markers' numbers, and a trailing piece to hold back
    until the next read (a marker, or what may be the start of one, cut by the read's size)."""
    out = bytearray()
    seen: list[int] = []
    pos = 0
    while (start := data.find(_MARK, pos)) != -1:
        end = data.find(b"\n", start)
        if end == -1:
            return bytes(out + data[pos:start]), seen, data[start:]
        out += data[pos:start]
        with contextlib.suppress(ValueError):
            seen.append(int(data[start + len(_MARK) : end]))
        pos = end + 1
    rest = data[pos:]
    for keep in range(min(len(_MARK) - 1, len(rest)), 0, -1):
        if rest.endswith(_MARK[:keep]):
            return bytes(out + rest[:-keep]), seen, rest[-keep:]
    return bytes(out + rest), seen, b""


class _Store:
    """Lines kept by one or more pumps, in the order they were read: the last ``max_lines``, and
    the first ``WATCHED_LINES`` that match ``watch`` (an engine process's error lines: the root
    cause of a crash is logged once, then buried under every request's wrapper traceback)."""

    def __init__(self, max_lines: int, watch: re.Pattern[str] | None = None) -> None:
        self.lines: deque[str] = deque(maxlen=max_lines)
        self.watch = watch
        self.watched: list[tuple[int, str]] = []  # (line number, line)
        self.count = 0  # lines read so far
        self.cond = threading.Condition()

    def add(self, lines: Iterable[str]) -> None:
        """Under ``cond``."""
        for line in lines:
            if (
                self.watch is not None
                and len(self.watched) < WATCHED_LINES
                and self.watch.search(line)
            ):
                self.watched.append((self.count, line))
            self.lines.append(line)
            self.count += 1

    def snapshot(self) -> list[str]:
        """Watched lines that left the tail, then the tail."""
        with self.cond:
            first_in_tail = self.count - len(self.lines)
            return [line for n, line in self.watched if n < first_in_tail] + list(self.lines)


class LineTail:
    """Pumps one pipe's read end on a daemon thread: every byte goes to ``sink`` as it arrives (no
    line buffering: progress bars keep working), the last ``max_lines`` lines are kept.

    ``write_fd`` is an fd of this process that writes into the same pipe; without one (or once it
    is closed) :meth:`lines` cannot place a barrier and returns what was read so far. Lines that
    match ``watch`` are kept beyond the tail (:class:`_Store`).
    """

    def __init__(
        self,
        read_fd: int,
        sink: Callable[[bytes], None],
        *,
        write_fd: int | None = None,
        store: _Store | None = None,
        max_lines: int = 400,
        watch: re.Pattern[str] | None = None,
        name: str = "gate-log-tail",
    ) -> None:
        self._read_fd = read_fd
        self._sink = sink
        self.write_fd = write_fd
        self._store = store if store is not None else _Store(max_lines, watch)
        self._seen = 0  # the highest barrier number this pump has read
        self._done = False  # the pipe reached its end: nothing more will be read
        self._numbers = itertools.count(1)
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._thread.start()

    def _run(self) -> None:
        held = b""
        partial = b""
        store = self._store
        try:
            while chunk := os.read(self._read_fd, 65536):
                through, seen, held = _split_marks(held + chunk)
                if through:
                    self._pass_on(through)
                *complete, partial = (partial + through).split(b"\n")
                with store.cond:
                    store.add(line.decode("utf-8", "replace") for line in complete)
                    self._seen = max(self._seen, *seen) if seen else self._seen
                    store.cond.notify_all()
        finally:
            if held:  # the stream ended inside what looked like a marker: it was the stream's own
                self._pass_on(held)
            with store.cond:
                if rest := (partial + held).decode("utf-8", "replace"):
                    store.add([rest])
                self._done = True
                store.cond.notify_all()
            os.close(self._read_fd)

    def _pass_on(self, data: bytes) -> None:
        """To the sink; a sink that fails (its reader gone) is dropped, and the pipe is still read
        to its end, or the engine's processes would block on a full pipe."""
        try:
            self._sink(data)
        except (OSError, ValueError):
            self._sink = _discard

    @property
    def done(self) -> bool:
        """The pipe reached its end (every process holding a write end closed it)."""
        with self._store.cond:
            return self._done

    def sync(self, timeout_s: float = SYNC_TIMEOUT_S) -> bool:
        """Wait until the pump has read everything written into the pipe before this call; False
        when that could not be made sure (no write end, the pump gone, or ``timeout_s`` passed)."""
        if self.write_fd is None or self._done:
            return False
        number = next(self._numbers)
        try:
            os.write(self.write_fd, _MARK + str(number).encode() + b"\n")
        except OSError:
            return False
        with self._store.cond:
            self._store.cond.wait_for(lambda: self._seen >= number or self._done, timeout_s)
            return self._seen >= number

    def lines(self) -> list[str]:
        """The last lines, including every line written into the pipe before this call."""
        self.sync()
        return self._store.snapshot()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout=timeout_s)


class OutputTail:
    """The last lines written to this process's stdout and stderr, by it and by the processes it
    starts: engine worker processes inherit fds 1 and 2, and vLLM logs to stdout, so a rank's own
    error ("(Worker_TP1 pid=...) ERROR ...") passes through here on its way to the log. Everything
    is written through unchanged, each stream to where it went before.
    """

    def __init__(
        self,
        max_lines: int = 400,
        fds: Sequence[int] = (1, 2),
        watch: re.Pattern[str] | None = None,
    ) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self._restore: list[tuple[int, int]] = []  # (fd, its original, duplicated)
        self._store = _Store(max_lines, watch)  # both streams' lines, interleaved as they were read
        self._tails: list[LineTail] = []
        for fd in fds:
            through = os.dup(fd)
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            self._restore.append((fd, through))
            self._tails.append(
                LineTail(
                    read_end,
                    _writer(through),
                    write_fd=fd,
                    store=self._store,
                    name=f"gate-output-tail-{fd}",
                )
            )

    def lines(self) -> list[str]:
        """The last lines of both streams, each read up to this call."""
        for tail in self._tails:
            tail.sync()
        return self._store.snapshot()

    def close(self, wait_s: float = 1.0) -> None:
        """Put the original streams back and let the pumps drain what is left (bounded wait: a
        helper process such as multiprocessing's resource tracker may hold a pipe open until exit,
        and the daemon pumps keep passing its lines through meanwhile)."""
        sys.stdout.flush()
        sys.stderr.flush()
        for tail in self._tails:
            tail.write_fd = None  # the fd is the original stream again from here on
        for fd, through in self._restore:
            os.dup2(through, fd)  # drops this process's write end; workers' ends close as they exit
        for tail in self._tails:
            tail.join(wait_s)


def _discard(data: bytes) -> None:
    pass


def _writer(fd: int) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    return write
