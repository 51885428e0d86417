"""The verdict vocabulary: statuses, their order and icons, and what a verdict means as an exit code.

Every module that ranks, prints or converts a status imports it from here; a report read from disk
carries statuses as strings, so the helpers below take either form.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from gate.errors import EXIT_ERROR, EXIT_FAIL, EXIT_OK


class Status(str, Enum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    ERROR = "ERROR"  # the gate could not judge
    SKIP = "SKIP"  # turned off, or the evidence it needs was not recorded

    @property
    def rank(self) -> int:
        return RANK[self.value]

    @property
    def icon(self) -> str:
        return ICON[self.value]


# Worst last: a run's verdict is the highest-ranked status among its checks.
RANK = {"SKIP": 0, "PASS": 1, "WARN": 2, "FAIL": 3, "ERROR": 4}
ICON = {"PASS": "✅", "WARN": "⚠️", "FAIL": "❌", "ERROR": "🛑", "SKIP": "➖"}
UNKNOWN_ICON = "❔"
# A verdict is never SKIP: a run with every check off still PASSes.
VERDICTS = ("PASS", "WARN", "FAIL", "ERROR")
STATUSES = tuple(s.value for s in Status)
FAIL_ON = ("fail", "warn")


def icon(status: str | Status | None) -> str:
    """The status's icon; an unknown status (an untrusted report) gets a neutral mark."""
    value = status.value if isinstance(status, Status) else status
    return ICON.get(str(value), UNKNOWN_ICON)


def rank(status: str | Status | None) -> int:
    """The status's rank; an unknown one ranks as ERROR, so nothing unreadable passes for better."""
    value = status.value if isinstance(status, Status) else status
    return RANK.get(str(value), RANK["ERROR"])


def worst(statuses: Iterable[Status]) -> Status:
    return max(statuses, key=lambda s: s.rank, default=Status.PASS)


def worst_verdict(verdicts: Iterable[str]) -> str:
    """The worst of several verdicts read from reports; anything unknown is ERROR."""
    verdict = max(verdicts, key=rank, default="PASS")
    return verdict if verdict in VERDICTS else "ERROR"


def exit_code(verdict: str | Status, fail_on: str | None = "fail") -> int:
    """0 PASS/WARN (1 for WARN with ``fail_on: warn``), 1 FAIL, 3 ERROR (or anything unknown)."""
    value = verdict.value if isinstance(verdict, Status) else verdict
    if value == "FAIL" or (value == "WARN" and fail_on == "warn"):
        return EXIT_FAIL
    if value in ("PASS", "WARN"):
        return EXIT_OK
    return EXIT_ERROR
