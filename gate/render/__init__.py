"""Rendering report.json (docs/report.md) as Markdown: the PR comment, the job summary, the artifact.

``gate.render.markdown`` holds the public functions; this module only knows the schema versions a
renderer accepts, so ``gate.merge`` and the CLI can check them without importing Jinja2.
"""

from __future__ import annotations

from typing import Any

from gate.errors import ConfigError

SCHEMA_PREFIX = "gate-report/"
SUPPORTED_MAJOR = 1


def check_schema(report: Any, where: str = "report") -> dict[str, Any]:
    """The report itself when its schema's major version is one this renderer knows, else ConfigError."""
    if not isinstance(report, dict):
        raise ConfigError(f"{where}: expected a JSON object (a gate report.json), got {type(report).__name__}")
    schema = report.get("schema")
    if not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
        raise ConfigError(f"{where}: not a gate report (schema {schema!r}, expected '{SCHEMA_PREFIX}{SUPPORTED_MAJOR}')")
    version = schema[len(SCHEMA_PREFIX):]
    major = version.split(".", 1)[0]
    if not major.isdigit() or int(major) != SUPPORTED_MAJOR:
        raise ConfigError(f"{where}: unsupported report schema {schema!r}; this gate reads '{SCHEMA_PREFIX}{SUPPORTED_MAJOR}'")
    return report
