"""bisect.json -> Markdown: the summary `gate bisect` writes, also a PR comment section.

Release versions come from a package index and summaries from engine runs: every value passes
through the shared template environment's escaping (gate.render.templates), never raw.
"""

from __future__ import annotations

import re
from typing import Any

from gate.render import escape as esc
from gate.render.templates import render
from gate.verdict import ICON

OUTCOME_ICON = {"held": "✅", "changed": "❌", "skipped": "⏭️", "ambiguous": "❔"}
# The one link the section carries; a report is untrusted (a fork's artifact), so anything else is dropped.
_NOTES = re.compile(r"^https://github\.com/vllm-project/vllm/releases/tag/v[0-9][0-9A-Za-z.+!-]*$")


def render_bisect(result: dict[str, Any]) -> str:
    """The Markdown summary of one bisection (``bisect.json``)."""
    boundary = result.get("boundary") or {}
    features = boundary.get("features") or {}
    last, first = result.get("last_held"), result.get("first_changed")
    return (
        render(
            "bisect",
            headline=_headline(result),
            target=result["target"],
            good=result["good"],
            bad=result["bad"],
            candidates=len(result.get("candidates") or []),
            candidates_list=result.get("candidates") or [],
            replays=result.get("replays", 0),
            wall=f"{result.get('wall_s', 0):.0f} s",
            steps=[_step_row(s) for s in result.get("steps", [])],
            boundary=bool(boundary),
            last_held=last or "",
            first_changed=first or "",
            notes=_notes(boundary.get("notes")),
            settings=[
                {"key": k, "old": v.get("old"), "new": v.get("new")}
                for k, v in (boundary.get("settings") or {}).items()
            ],
            features=[
                {"feature": f["feature"], "old": f.get(last), "new": f.get(first)}
                for f in features.get("changed", [])
            ],
            features_error=features.get("error"),
            flagged=[
                {"id": cid, **c}
                for cid, c in (boundary.get("checks") or {}).items()
                if c.get("status") in ("WARN", "FAIL", "ERROR")
            ],
            untested=result.get("untested_between") or [],
        )
        + "\n"
    )


def _notes(url: object) -> str:
    return url if isinstance(url, str) and _NOTES.match(url) else ""


def _headline(result: dict[str, Any]) -> str:
    status = result.get("status")
    if status == "no-change":
        return f"nothing to bisect: {result.get('target')} reads the same at {result.get('bad')} as where nothing changed"
    if status == "adjacent":
        return f"no release lies between {result.get('good')} and {result.get('bad')}: {result.get('bad')} is the one"
    first, last = result.get("first_changed"), result.get("last_held")
    if status == "found":
        return f"{first} (the last that held: {last})"
    if first and last:
        return f"inconclusive: between {last} and {first}"
    return "inconclusive"


def _step_row(step: dict[str, Any]) -> dict[str, Any]:
    reading = step.get("reading") or {}
    status = reading.get("status")
    value = reading.get("value")
    shown = "" if status is None else f"{ICON.get(status, '')} {status}".strip()
    if value is not None:
        shown += f" ({esc.num(value)})"
    return {
        "version": step.get("version") or "?",
        "outcome": f"{OUTCOME_ICON.get(step.get('outcome') or '', '')} {step.get('outcome') or '?'}".strip(),
        "reading": shown,
        "reason": step.get("reason") or "",
    }
