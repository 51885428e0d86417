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

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate.errors import ConfigError
from gate.files import find_report, read_report_json
from gate.render.budget import SUMMARY_LIMIT
from gate.report_schema import validate_report
from gate.verdict import VERDICTS, exit_code

MAX_ANNOTATIONS = 10


# -- report loading ------------------------------------------------------------------------------
def has_report(path: Path) -> bool:
    """Whether ``path`` holds a report.json (readable or not): a bad one is an error, never a missing one."""
    try:
        find_report(path)
    except ConfigError:
        return False
    return True


def load_report(path: Path) -> tuple[dict[str, Any], Path]:
    report, report_path = read_report_json(path)
    validate_report(
        report, str(report_path)
    )  # types checked here, so nothing below meets a surprise
    if report.get("verdict") not in VERDICTS:
        raise ConfigError(f"{report_path}: field verdict: required, one of {', '.join(VERDICTS)}")
    return report, report_path


def exit_code_for(report: dict[str, Any], fail_on: str | None = None) -> int:
    """The CLI's exit code for this verdict: 0 PASS/WARN (1 with fail_on warn), 1 FAIL, 3 ERROR."""
    return exit_code(report["verdict"], fail_on or report.get("fail_on") or "fail")


# -- outputs -------------------------------------------------------------------------------------
def outputs_for(
    report: dict[str, Any], report_path: Path, exit_code: int, comment_url: str = ""
) -> dict[str, str]:
    counts = report.get("counts") or {}
    return {
        "verdict": report["verdict"],
        "report-path": str(report_path),
        "comment-url": comment_url,
        "exit-code": str(exit_code),
        "pass-count": str(int(counts.get("PASS", 0))),
        "warn-count": str(int(counts.get("WARN", 0))),
        "fail-count": str(int(counts.get("FAIL", 0))),
        "error-count": str(int(counts.get("ERROR", 0))),
        "skip-count": str(int(counts.get("SKIP", 0))),
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
    report: dict[str, Any],
    render: Callable[[dict[str, Any], int], str],
    path: str | os.PathLike | None = None,
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
        note = (f"**gate {report.get('gate_id', '')}: {report.get('verdict')}** — the summary does not fit "
                "GitHub's 1 MiB limit; see the report artifact.\n").encode()  # fmt: skip
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


def annotations(report: dict[str, Any], limit: int = MAX_ANNOTATIONS) -> list[Annotation]:
    """At most ``limit`` annotations: errors, FAIL/ERROR checks, then WARN checks and the baseline."""
    gate_id = report.get("gate_id") or "gate"
    items: list[tuple[int, str, str, str]] = []  # (rank, level, title, message)
    for error in report.get("errors") or []:
        items.append((0, "error", f"gate {gate_id}: ERROR", str(error)))
    for check in report.get("checks") or []:
        status = check.get("status")
        if status not in ("FAIL", "ERROR", "WARN"):
            continue
        message = " ".join(
            str(part) for part in (check.get("summary"), check.get("diagnosis")) if part
        )
        title = f"gate {gate_id}: {check.get('title') or check.get('id')} {status}"
        items.append(
            (
                1 if status != "WARN" else 2,
                "error" if status != "WARN" else "warning",
                title,
                message or status,
            )
        )
    baseline = report.get("baseline") or {}
    if baseline.get("status") in ("WARN", "FAIL", "ERROR"):
        differences = "; ".join(str(d) for d in baseline.get("differences") or [])
        message = " ".join(p for p in (str(baseline.get("message") or ""), differences) if p)
        level = "warning" if baseline["status"] == "WARN" else "error"
        items.append(
            (
                1 if level == "error" else 2,
                level,
                f"gate {gate_id}: baseline {baseline['status']}",
                message,
            )
        )
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
