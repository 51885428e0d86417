"""How much the gate may post, and how a rendering is fitted into it.

GitHub's size limits, the room the renderer leaves under them, the marker line that identifies the
gate's sticky comment, the per-output caps on cells, rows and tokens, and :func:`fit`, which joins a
rendering's sections and drops the least important until the text fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gate.render import escape as esc

COMMENT_BODY_LIMIT = 65_536  # characters; GitHub answers 422 above it
# What the renderer aims for: room for the marker line and a truncation note under the hard limit.
COMMENT_BUDGET = 65_000
SUMMARY_LIMIT = 1024 * 1024  # bytes per step; GitHub drops a larger job summary entirely
SUMMARY_BUDGET = 1_000_000

_MARKER = "<!-- gate-report:{} -->"


def marker(gate_id: str) -> str:
    """The hidden first line of the gate's comment; the id is reduced to characters that cannot end
    the HTML comment, so a gate id cannot break out of it."""
    return _MARKER.format(esc.marker_id(gate_id))


# -- caps per output -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    """Per-output caps (characters or rows); None is unlimited."""

    cell: int | None  # a table cell
    text: int | None  # a diagnosis or message paragraph
    rows: int | None  # rows of one metrics table
    tokens: int | None  # worst-token rows
    context: int | None  # characters of context on each side of a worst token
    log: int | None  # characters of an engine's log tail
    points: int  # points of a Mermaid chart
    spark: int  # characters of a sparkline


COMMENT = Limits(
    cell=160, text=4_000, rows=60, tokens=10, context=60, log=2_000, points=60, spark=24
)
SUMMARY = Limits(
    cell=400, text=20_000, rows=500, tokens=50, context=120, log=10_000, points=100, spark=40
)
FULL = Limits(
    cell=None, text=None, rows=None, tokens=None, context=None, log=None, points=200, spark=60
)


# -- units a limit counts in ---------------------------------------------------------------------
def utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def utf16_len(text: str) -> int:
    """Characters as JavaScript counts them (an emoji is two): never fewer than code points."""
    return len(text.encode("utf-16-le")) // 2


@dataclass(frozen=True)
class Units:
    """How a limit counts text, and the longest prefix within a count (never half a character)."""

    size: Callable[[str], int]
    cut: Callable[[str, int], str]


UTF16 = Units(utf16_len, lambda t, n: t.encode("utf-16-le")[: 2 * n].decode("utf-16-le", "ignore"))
UTF8 = Units(utf8_len, lambda t, n: t.encode("utf-8")[:n].decode("utf-8", "ignore"))
CHARACTERS = Units(len, lambda t, n: t[:n])


# -- fitting sections ----------------------------------------------------------------------------
REQUIRED = 1_000  # a section priority that is never dropped
OMITTED = "omitted"  # the key of the placeholder where the note on dropped sections goes
_SEP = "\n\n"


@dataclass(frozen=True)
class Section:
    key: str
    priority: int  # higher survives longer
    text: str


OmittedNote = Callable[[int, Sequence[str]], str]  # (number dropped, their keys) -> the note


def fit(
    sections: Sequence[Section], budget: int | None, units: Units, omitted_note: OmittedNote
) -> tuple[str, tuple[str, ...]]:
    """Join the sections, dropping the least important (latest first among equals) until the text fits.

    The note on what was dropped goes where the :data:`OMITTED` section stands; when the required
    sections alone are over the budget, the text is cut and the note says so.
    """
    size = units.size
    dropped: set[int] = set()
    if budget is not None:
        sizes = [size(s.text) + size(_SEP) for s in sections]
        total = sum(sizes) + 1
        longest = sorted((s.key for s in sections), key=len, reverse=True)[:12]
        reserve = size(omitted_note(len(sections), longest)) + 64  # room for the note itself
        candidates = sorted(
            (i for i, s in enumerate(sections) if s.priority < REQUIRED),
            key=lambda i: (sections[i].priority, -i),
        )
        for i in candidates:
            if total + (reserve if dropped or total > budget else 0) <= budget:
                break
            dropped.add(i)
            total -= sizes[i]
    keys = [sections[i].key for i in sorted(dropped, key=lambda i: (sections[i].priority, -i))]
    note = omitted_note(len(keys), keys) if keys else ""
    texts = [
        note if s.key == OMITTED else s.text for i, s in enumerate(sections) if i not in dropped
    ]
    text = esc.neutralise_comments(_SEP.join(t for t in texts if t)) + "\n"
    if budget is not None and size(text) > budget:  # the required sections alone are too big
        note = omitted_note(len(keys) + 1, [*keys, "the rest of this text"])
        room = max(0, budget - size(note) - size(_SEP) - 2)
        text = units.cut(text, room).rstrip() + _SEP + note + "\n"
    return text, tuple(keys)
