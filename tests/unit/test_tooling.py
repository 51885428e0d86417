"""The code checks hold at zero findings: ruff's lint and format on gate/, tests/ and scripts/, and
mypy on gate/.

Each runs as reviewers and editors run it, from the repository root with the configuration in
pyproject.toml, so a finding here is one `ruff check` or `mypy` shows on a developer's machine.
The versions are those of the `test-unit` extra: another release may add rules or change the format.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _assert_clean(*args: str, hint: str = "") -> None:
    """Run ``python -m <args>`` (the tool of the interpreter under test, whatever is first on PATH)
    and fail with its findings, and nothing else, where it exits non-zero."""
    proc = subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(args)}{hint}:\n{proc.stdout}{proc.stderr}", pytrace=False)


LINTED = ("gate", "tests", "scripts")


def test_ruff_lint_finds_nothing():
    _assert_clean("ruff", "check", "--output-format", "concise", "--no-fix", *LINTED)


def test_ruff_format_changes_nothing():
    _assert_clean(
        "ruff",
        "format",
        "--check",
        "--diff",
        *LINTED,
        hint=" (run `ruff format gate tests scripts`)",
    )


def test_mypy_finds_nothing():
    _assert_clean("mypy")  # [tool.mypy] files: gate/
