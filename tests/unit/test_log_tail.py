"""gate/worker/log_tail.py: the tail of the engine processes' output, read up to a barrier.

The race these guard against (issue 29): a rank logs its error, then replies through another
channel; the worker reads the tail as soon as the reply is in, before its pump has read the rank's
lines. A slow sink holds the pump back here, so a tail without the barrier misses the line every
time, not once in a while.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from gate.worker import log_tail as lt

MARK = lt._MARK


@pytest.mark.parametrize(
    ("data", "through", "seen", "held"),
    [
        (b"plain\n", b"plain\n", [], b""),
        (b"a\n" + MARK + b"3\nb\n", b"a\nb\n", [3], b""),
        (MARK + b"1\n" + MARK + b"2\n", b"", [1, 2], b""),
        (b"a\n" + MARK + b"1", b"a\n", [], MARK + b"1"),  # the read ended inside a marker
        (b"a\n" + MARK[:5], b"a\n", [], MARK[:5]),  # ... or inside what may start one
        (b"progress 10%\r", b"progress 10%\r", [], b""),  # no newline: passed on at once
        (b"a\x00b\n", b"a\x00b\n", [], b""),  # a NUL that starts no marker is the stream's own
    ],
)  # fmt: skip
def test_markers_are_cut_out_of_the_stream_and_counted(data, through, seen, held):
    assert lt._split_marks(data) == (through, seen, held)


def test_a_marker_split_across_reads_is_still_cut_out():
    first, second = b"x\n" + MARK[:7], MARK[7:] + b"12\ny\n"
    through1, seen1, held = lt._split_marks(first)
    through2, seen2, rest = lt._split_marks(held + second)
    assert (through1 + through2, seen1 + seen2, rest) == (b"x\ny\n", [12], b"")


def _slow_sink(seconds: float, into: list[bytes]):
    def sink(data: bytes) -> None:
        time.sleep(seconds)
        into.append(data)

    return sink


def test_lines_include_what_a_process_wrote_before_it_replied_elsewhere():
    """The child writes its error into the tailed pipe, then replies on a second pipe; read as
    soon as the reply arrives, the tail has the error (the pump is 0.2 s behind on every chunk)."""
    read_end, write_end = os.pipe()
    passed: list[bytes] = []
    tail = lt.LineTail(read_end, _slow_sink(0.2, passed), write_fd=write_end)
    reply_r, reply_w = os.pipe()
    try:
        for attempt in range(3):
            child = subprocess.Popen(
                [sys.executable, "-c",
                 f"import os; os.write({write_end}, b'(Worker_TP1 pid=7) ERROR boom {attempt}\\n'); "
                 f"os.write({reply_w}, b'failed')"],
                pass_fds=(write_end, reply_w),
            )  # fmt: skip
            assert os.read(reply_r, 6) == b"failed"
            assert f"(Worker_TP1 pid=7) ERROR boom {attempt}" in tail.lines()
            child.wait()
    finally:
        os.close(write_end)
        os.close(reply_r)
        os.close(reply_w)
        tail.join(5)
    assert b"".join(passed) == b"".join(b"(Worker_TP1 pid=7) ERROR boom %d\n" % i for i in range(3))
    assert tail.done


def test_a_tail_whose_pipe_ended_answers_at_once_with_what_it_read():
    read_end, write_end = os.pipe()
    tail = lt.LineTail(read_end, lambda data: None)
    os.write(write_end, b"first\nlast line without newline")
    os.close(write_end)
    tail.join(5)
    start = time.perf_counter()
    assert tail.lines() == ["first", "last line without newline"]
    assert not tail.sync() and time.perf_counter() - start < 1


def test_output_tail_keeps_what_child_processes_write_and_passes_it_through(capfd):
    tail = lt.OutputTail(max_lines=10)
    try:
        subprocess.run([sys.executable, "-c", "import sys; [print(f'(Worker_TP1 pid=9) line {i}', file=(sys.stderr, sys.stdout)[i % 2], flush=True) for i in range(5)]"],
                       check=True)  # fmt: skip
        lines = tail.lines()  # no polling: the barrier makes the children's lines present
    finally:
        tail.close()
    assert sorted(lines) == [f"(Worker_TP1 pid=9) line {i}" for i in range(5)]
    out = capfd.readouterr()  # each line went through to its own stream, and no marker did
    assert "(Worker_TP1 pid=9) line 0" in out.err and "(Worker_TP1 pid=9) line 1" in out.out
    assert "gate-tail-sync" not in out.out + out.err


def test_watched_lines_outlive_the_tail_that_buries_them():
    """A crash's root cause is logged once, then every failing request logs its own traceback."""
    read_end, write_end = os.pipe()
    tail = lt.LineTail(read_end, lambda data: None, write_fd=write_end, max_lines=3,
                       watch=re.compile(r"^\(EngineCore pid=\d+\) ERROR"))  # fmt: skip
    try:
        os.write(write_end, b"(EngineCore pid=5) ERROR RuntimeError: root cause\n")
        os.write(write_end, b"".join(b"(APIServer pid=4) ERROR wrapper %d\n" % i for i in range(5)))
        assert tail.lines() == ["(EngineCore pid=5) ERROR RuntimeError: root cause",
                                "(APIServer pid=4) ERROR wrapper 2", "(APIServer pid=4) ERROR wrapper 3",
                                "(APIServer pid=4) ERROR wrapper 4"]  # fmt: skip
        os.write(write_end, b"(EngineCore pid=5) ERROR again\n")
        assert tail.lines()[0] == "(EngineCore pid=5) ERROR RuntimeError: root cause"
        assert tail.lines()[-1] == "(EngineCore pid=5) ERROR again"  # in the tail: not twice
        assert len(tail.lines()) == 4
    finally:
        os.close(write_end)
        tail.join(5)


def test_a_failing_sink_does_not_stop_the_pipe_being_read():
    """The worker's own output gone (its reader died): the engine's processes must not block."""
    read_end, write_end = os.pipe()

    def broken(data: bytes) -> None:
        raise BrokenPipeError("reader gone")

    tail = lt.LineTail(read_end, broken, write_fd=write_end)
    try:
        os.write(write_end, b"first\n")
        os.write(write_end, b"x" * 200_000 + b"\n")  # more than a pipe holds: read, or this blocks
        os.write(write_end, b"last\n")
        assert tail.lines()[-1] == "last"
    finally:
        os.close(write_end)
        tail.join(5)
