"""GitHub Actions plumbing: the job summary, step outputs and workflow annotations.

- ``$GITHUB_STEP_SUMMARY``: the rendered summary is appended; GitHub drops a step's summary entirely
  above 1 MiB, so it is re-rendered with a smaller budget until it fits (and a short note is written
  if it never does).
- ``$GITHUB_OUTPUT``: ``name=value`` lines; a multi-line value uses the heredoc form with a random
  delimiter (``name<<ghadelimiter_<uuid>``), so a value can never end the block early or set another
  output.
- Annotations: at most 10 ``::error``/``::warning`` workflow commands (FAIL and ERROR first), with the
  escaping the runner expects (``%``, ``\\r``, ``\\n`` in the message; also ``:`` and ``,`` in properties),
  so untrusted text can neither forge a workflow command nor break the annotation.
"""

import os
import re
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate.errors import ConfigError
from gate.files import find_report
from gate.render.budget import SUMMARY_LIMIT
from gate.report_model import Report
from gate.verdict import exit_code

MAX_ANNOTATIONS = 10


# -- the report and its verdict ------------------------------------------------------------------
def has_report(path: Path) -> bool:
    """Whether ``path`` holds a report.json (readable or not): a bad one is an error, never a missing one."""
    try:
        find_report(path)
    except ConfigError:
        return False
    return True


def exit_code_for(report: Report, fail_on: str | None = None) -> int:
    """The CLI's exit code for this verdict: 0 PASS/WARN (1 with fail_on warn), 1 FAIL, 3 ERROR."""
    return exit_code(report.verdict or "ERROR", fail_on or report.fail_on or "fail")


# -- outputs -------------------------------------------------------------------------------------
def outputs_for(
    report: Report, report_path: Path, exit_code: int, comment_url: str = ""
) -> dict[str, str]:
    counts = report.counts
    return {
        "verdict": str(report.verdict),
        "report-path": str(report_path),
        "comment-url": comment_url,
        "exit-code": str(exit_code),
        "pass-count": str(counts.get("PASS", 0)),
        "warn-count": str(counts.get("WARN", 0)),
        "fail-count": str(counts.get("FAIL", 0)),
        "error-count": str(counts.get("ERROR", 0)),
        "skip-count": str(counts.get("SKIP", 0)),
    }


def format_output(name: str, value: str) -> str:
    if not re.match(r"^[A-Za-z_][A-Za-z0-9_-]*$", name):
        raise ValueError(f"output name '{name}' is not a valid identifier")
    value = str(value)
    if "\n" not in value and "\r" not in value:
        return f"{name}={value}\n"
    delimiter = f"ghadelimiter_{uuid.uuid4()}"
    while delimiter in value:  # astronomically unlikely; never let the value close the block
        delimiter = f"ghadelimiter_{uuid.uuid4()}"
    return f"{name}<<{delimiter}\n{value}\n{delimiter}\n"


def write_outputs(values: dict[str, str], path: str | os.PathLike | None = None) -> bool:
    """Append to ``$GITHUB_OUTPUT``; False (nothing written) outside Actions."""
    path = path or os.environ.get("GITHUB_OUTPUT")
    if not path:
        return False
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(format_output(k, v) for k, v in values.items()))
    return True


# -- job summary ---------------------------------------------------------------------------------
def write_step_summary(
    report: Report,
    render: Callable[[Report, int], str],
    path: str | os.PathLike[str] | None = None,
    limit: int = SUMMARY_LIMIT,
) -> int | None:
    """Append the rendered summary to ``$GITHUB_STEP_SUMMARY``; the bytes written, or None outside Actions.

    ``render(report, budget)`` is called with a character budget; what it returns is measured in UTF-8
    bytes (GitHub's limit) together with what the step already wrote, and re-rendered smaller if needed.
    """
    path = path or os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return None
    existing = os.path.getsize(path) if os.path.exists(path) else 0
    room = limit - existing - 1  # keep a byte for a separating newline
    data = b""
    budget = min(room, 1_000_000)
    for _ in range(4):
        if budget <= 0:
            break
        data = render(report, budget).encode("utf-8")
        if len(data) <= room:
            break
        budget = int(budget * room / len(data) * 0.9)
    if not data or len(data) > room:
        note = (
            f"**gate {report.gate_id or ''}: {report.verdict}** — the summary does not fit "
            "GitHub's 1 MiB limit; see the report artifact.\n"
        ).encode()
        data = note if len(note) <= room else b""
    with open(path, "ab") as f:
        if existing:
            f.write(b"\n")
        f.write(data)
    return len(data)


# -- annotations ---------------------------------------------------------------------------------
def escape_data(text: str) -> str:
    return str(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


@dataclass(frozen=True)
class Annotation:
    level: str  # error | warning | notice
    title: str
    message: str

    def __post_init__(self) -> None:
        if self.level not in ("error", "warning", "notice"):
            raise ValueError(f"annotation level '{self.level}' is not error, warning or notice")

    def command(self) -> str:
        """The workflow command: one line, whatever the title and message hold."""
        return f"::{self.level} title={escape_property(self.title)}::{escape_data(self.message)}"


def annotation(level: str, title: str, message: str) -> str:
    return Annotation(level, title, message).command()


def annotations(report: Report, limit: int = MAX_ANNOTATIONS) -> list[Annotation]:
    """At most ``limit`` annotations: errors, FAIL/ERROR checks, then WARN checks and the baseline."""
    gate_id = report.gate_id or "gate"
    items: list[tuple[int, str, str, str]] = []  # (rank, level, title, message)
    for error in report.errors:
        items.append((0, "error", f"gate {gate_id}: ERROR", str(error)))
    for check in report.checks:
        if check.status not in ("FAIL", "ERROR", "WARN"):
            continue
        message = " ".join(part for part in (check.summary, check.diagnosis) if part)
        title = f"gate {gate_id}: {check.title or check.id} {check.status}"
        level = "error" if check.status != "WARN" else "warning"
        items.append((1 if level == "error" else 2, level, title, message or check.status))
    baseline = report.baseline
    if baseline is not None and baseline.status in ("WARN", "FAIL", "ERROR"):
        differences = "; ".join(str(d) for d in baseline.differences)
        message = " ".join(p for p in (baseline.message or "", differences) if p)
        level = "warning" if baseline.status == "WARN" else "error"
        title = f"gate {gate_id}: baseline {baseline.status}"
        items.append((1 if level == "error" else 2, level, title, message))
    items.sort(key=lambda item: item[0])
    if len(items) > limit:
        rest = len(items) - (limit - 1)
        items = [
            *items[: limit - 1],
            (3, "warning", f"gate {gate_id}", f"{rest} more finding(s) in the report"),
        ]
    return [Annotation(level, title, message) for _, level, title, message in items]


def emit(items: Iterable[Annotation], write: Callable[[str], Any] | None = None) -> None:
    """Print annotations as workflow commands; only escaped :class:`Annotation` objects get through."""
    write = write or (lambda line: print(line, flush=True))
    for item in items:
        if not isinstance(item, Annotation):
            raise TypeError(f"emit() prints Annotation objects, not {type(item).__name__}")
        write(item.command())
