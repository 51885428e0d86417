"""Rendering report.json (docs/report.md) as Markdown: the PR comment, the job summary, the artifact.

``gate.render.markdown`` holds the public functions. The schema (its versions and fields) lives in
:mod:`gate.report_schema`, which imports no Jinja2, so ``gate.merge`` and the CLI check reports cheaply.
"""

from __future__ import annotations

from typing import Any

from gate.report_schema import SCHEMA_PREFIX, SUPPORTED_MAJOR, check_version

__all__ = ["SCHEMA_PREFIX", "SUPPORTED_MAJOR", "check_schema"]


def check_schema(report: Any, where: str = "report") -> dict[str, Any]:
    """The report itself when its schema's major version is one this renderer knows, else a ReportError."""
    check_version(report, where)
    return report
