"""gate.worker.memory: the process tree's RSS and the peak per phase, against a child of known size."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from gate.worker import memory

MiB = 2**20
# A child that touches ALLOC bytes (so they are resident), says so, and waits to be told to exit.
CHILD = """
import sys
block = bytearray({size})
for i in range(0, len(block), 4096):
    block[i] = 1
print("ready", flush=True)
sys.stdin.readline()
"""


def start_child(size: int) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(size=size)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def stop(child: subprocess.Popen[str]) -> None:
    assert child.stdin is not None
    child.stdin.write("\n")
    child.stdin.flush()
    child.wait(timeout=10)


def test_parent_of_reads_a_command_name_with_spaces_and_parentheses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_text("42 (a) b (c) S 7 42 42 0 -1\n")
    monkeypatch.setattr(memory, "PROC", tmp_path)
    assert memory.parent_of(42) == 7
    assert memory.parent_of(43) is None


def test_tree_includes_a_child_and_its_memory() -> None:
    child = start_child(160 * MiB)
    try:
        assert child.pid in memory.process_tree(memory.os.getpid())
        own = memory.rss_bytes(memory.os.getpid())
        assert memory.rss_bytes(child.pid) >= 150 * MiB
        assert memory.tree_rss_bytes(memory.os.getpid()) >= own + 150 * MiB
    finally:
        stop(child)
    assert memory.rss_bytes(child.pid) == 0  # gone: counts as nothing


def test_peak_per_phase_sees_a_child_allocation_that_ended_before_the_phase() -> None:
    tracker = memory.PeakMemory(interval_s=0.05, device=lambda: 123)
    with tracker.phase("idle"):
        time.sleep(0.15)
    with tracker.phase("engine") as engine:
        child = start_child(200 * MiB)
        time.sleep(0.3)  # a few samples while the child holds its memory
        stop(child)
    idle = tracker.phases["idle"]
    assert engine.rss_peak_bytes >= idle.rss_peak_bytes + 190 * MiB
    assert (
        engine.rss_end_bytes is not None
        and engine.rss_end_bytes < engine.rss_peak_bytes - 150 * MiB
    )
    data = tracker.as_dict()
    assert set(data["phases"]) == {"idle", "engine"}
    assert data["phases"]["engine"]["device_peak_bytes"] == 123
    assert data["phases"]["engine"]["samples"] >= 4 and data["phases"]["engine"]["seconds"] >= 0.3
    assert data["rss_peak_bytes"] == engine.rss_peak_bytes
    assert tracker._thread is None  # no sampling thread left once every phase closed


def test_nested_phases_share_samples_and_a_failing_device_reading_is_ignored() -> None:
    def broken() -> int:
        raise RuntimeError("device gone")

    tracker = memory.PeakMemory(interval_s=0.05, device=broken)
    with tracker.phase("outer"), tracker.phase("inner"):
        child = start_child(120 * MiB)
        time.sleep(0.2)
        stop(child)
    outer, inner = tracker.phases["outer"], tracker.phases["inner"]
    assert outer.rss_peak_bytes >= inner.rss_peak_bytes >= outer.rss_start_bytes + 110 * MiB
    assert outer.device_peak_bytes is None


def test_a_phase_used_again_keeps_its_highest_peak() -> None:
    tracker = memory.PeakMemory(interval_s=0.05)
    with tracker.phase("reference"):
        child = start_child(150 * MiB)
        time.sleep(0.15)
        stop(child)
    first = tracker.phases["reference"].rss_peak_bytes
    with tracker.phase("reference"):
        time.sleep(0.1)
    again = tracker.phases["reference"]
    assert again.rss_peak_bytes == first and again.seconds >= 0.25
