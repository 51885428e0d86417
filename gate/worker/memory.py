"""The worker's measured peak memory, per phase: what the memory plan is checked against.

A background thread samples the resident memory (RSS) of this process and every process below it
(vLLM's engine core and tensor-parallel workers are children, started by spawn) every
``interval_s``, and, where the caller gives one, a device-memory reading (on CUDA the device's
memory in use as other processes see it). Each phase keeps the highest value seen while it was
open; phases may nest or overlap (a sample counts for every open phase).

Linux only (``/proc``), standard library only, so the orchestrator's benchmark can reuse it from
outside the worker. A reading that cannot be taken (no /proc, a process that ended between two
reads) counts as nothing rather than failing the worker.

Usage::

    tracker = PeakMemory()
    with tracker.phase("engine"):
        ...
    engine_json["memory_peaks"] = tracker.as_dict()
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROC = Path("/proc")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
DEFAULT_INTERVAL_S = 0.2

DeviceReading = Callable[[], int | None]


def parent_of(pid: int) -> int | None:
    """The parent pid from /proc/<pid>/stat (the command name may hold spaces and parentheses)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
    return int(fields[1]) if len(fields) > 1 else None


def process_tree(root: int) -> list[int]:
    """``root`` and every live process below it."""
    children: dict[int, list[int]] = {}
    for entry in PROC.glob("[0-9]*"):
        ppid = parent_of(int(entry.name))
        if ppid is not None:
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def rss_bytes(pid: int) -> int:
    """Resident memory of one process (0 when it is gone): /proc/<pid>/statm's second field."""
    try:
        return int((PROC / str(pid) / "statm").read_text().split()[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def tree_rss_bytes(root: int) -> int:
    """Resident memory of ``root`` and its descendants together (shared pages count once per process)."""
    return sum(rss_bytes(pid) for pid in process_tree(root))


def cuda_device_used() -> DeviceReading | None:
    """A reading of the current CUDA device's memory in use (all processes), or None without CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None

    def used() -> int:
        free, total = torch.cuda.mem_get_info()
        return int(total - free)

    return used


@dataclass
class PhasePeak:
    """One phase: the highest readings while it was open, and what it started and ended with."""

    rss_start_bytes: int
    rss_peak_bytes: int
    rss_end_bytes: int | None = None
    device_peak_bytes: int | None = None
    seconds: float = 0.0
    samples: int = 0
    started: float = field(default_factory=time.perf_counter, repr=False)

    def add(self, rss: int, device: int | None) -> None:
        self.rss_peak_bytes = max(self.rss_peak_bytes, rss)
        if device is not None:
            self.device_peak_bytes = max(self.device_peak_bytes or 0, device)
        self.samples += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "rss_start_bytes": self.rss_start_bytes,
            "rss_peak_bytes": self.rss_peak_bytes,
            "rss_end_bytes": self.rss_end_bytes,
            "device_peak_bytes": self.device_peak_bytes,
            "seconds": round(self.seconds, 3),
            "samples": self.samples,
        }


class PeakMemory:
    """Peak RSS (process tree) and device memory per named phase, sampled in a background thread."""

    def __init__(
        self,
        root: int | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        device: DeviceReading | None = None,
    ) -> None:
        self.root = os.getpid() if root is None else root
        self.interval_s = interval_s
        self.device = device
        self.phases: dict[str, PhasePeak] = {}
        self._open: list[PhasePeak] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def reading(self) -> tuple[int, int | None]:
        device = None
        if self.device is not None:
            try:
                device = self.device()
            except Exception:  # a device that stopped answering: the RSS still counts
                device = None
        return tree_rss_bytes(self.root), device

    @contextmanager
    def phase(self, name: str) -> Iterator[PhasePeak]:
        """Track ``name`` while the block runs; a name used again (one per request of a batch)
        goes on with the same record: the highest peak, the first start, the seconds added up."""
        rss, device = self.reading()
        with self._lock:
            peak = self.phases.get(name) or PhasePeak(rss_start_bytes=rss, rss_peak_bytes=rss)
            peak.started = time.perf_counter() - peak.seconds
            peak.add(rss, device)
            self.phases[name] = peak
            self._open.append(peak)
        self._ensure_sampling()
        try:
            yield peak
        finally:
            rss, device = self.reading()
            with self._lock:
                peak.add(rss, device)
                peak.rss_end_bytes = rss
                peak.seconds = time.perf_counter() - peak.started
                self._open.remove(peak)
                idle = not self._open
            if idle:
                self._stop_sampling()

    def _ensure_sampling(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, name="gate-peak-memory", daemon=True)
        self._thread.start()

    def _stop_sampling(self) -> None:
        thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5 * self.interval_s + 1)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            rss, device = self.reading()
            with self._lock:
                for peak in self._open:
                    peak.add(rss, device)

    def as_dict(self) -> dict[str, Any]:
        """engine.json's ``memory_peaks``: every phase, and the highest RSS over all of them."""
        with self._lock:
            phases = {name: p.as_dict() for name, p in self.phases.items()}
        return {
            "interval_s": self.interval_s,
            "what": "RSS of the worker and its child processes; device: memory in use on the device",
            "phases": phases,
            "rss_peak_bytes": max((p["rss_peak_bytes"] for p in phases.values()), default=None),
        }
