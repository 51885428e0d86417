"""GitHub's size limits for what the gate posts, the room the renderer leaves under them, and the
marker line that identifies the gate's sticky comment."""

from __future__ import annotations

from gate.render.escape import marker_id

COMMENT_BODY_LIMIT = 65_536  # characters; GitHub answers 422 above it
# What the renderer aims for: room for the marker line and a truncation note under the hard limit.
COMMENT_BUDGET = 65_000
SUMMARY_LIMIT = 1024 * 1024  # bytes per step; GitHub drops a larger job summary entirely
SUMMARY_BUDGET = 1_000_000

_MARKER = "<!-- gate-report:{} -->"


def marker(gate_id: str) -> str:
    """The hidden first line of the gate's comment; the id is reduced to characters that cannot end
    the HTML comment, so a gate id cannot break out of it."""
    return _MARKER.format(marker_id(gate_id))
