"""Escaping of untrusted text for GitHub-flavoured Markdown, and number formatting.

Everything in a report that did not come from the renderer's own templates is untrusted: model
completions and prompts, engine errors and log tails, file paths, even the setting values an engine
reported. Every such value goes through one of these functions before it reaches the Markdown:

- :func:`inline`: one physical line of text (a paragraph or a table cell). HTML is entity-escaped
  (so ``<!--``, ``-->``, ``</details>`` and tags are inert), inline Markdown punctuation is
  backslash-escaped, newlines become ``<br>`` (a cell or paragraph can never end early, so no block
  construct can start inside it), pipes are escaped for tables, ``@mentions`` and ``#123`` issue
  references get a zero-width joiner so GitHub neither notifies nor cross-links.
- :func:`prose`: like :func:`inline`, but balanced backtick spans (the gate's own diagnoses use them
  for argument names) become ``<code>`` with escaped content.
- :func:`code_block`: a fenced block longer than any backtick run inside, with HTML comment
  delimiters and the closing tags of the layout (``</details>``, ``</summary>``) broken by a
  zero-width joiner, so nothing inside can close the fence, a section or forge a marker.

- :func:`no_workflow_commands`: text printed in a GitHub Actions step (logs, a dry run's body), so no
  line of it is a workflow command (``::add-mask::``, ``::stop-commands::``, a forged ``::error``).

All the Markdown ones replace bidirectional overrides (the "Trojan Source" characters) with a visible
``[U+202E]`` and other control characters with U+FFFD, and truncate to a character limit (before
escaping, so an entity is never cut in half).
"""

from __future__ import annotations

import math
import re

ZWJ = "\u200d"
ZWSP = "\u200b"

# Bidirectional controls that reorder what a reader sees (CVE-2021-42574): shown, never obeyed.
_BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
_BIDI_MAP = {ord(c): f"[U+{ord(c):04X}]" for c in _BIDI}
# C0 (except tab and newline), DEL and C1 controls; line/paragraph separators are newlines.
_CONTROL_MAP = {
    i: "\ufffd" for i in [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), *range(0x7F, 0xA0)]
}
_CLEAN_MAP = {**_CONTROL_MAP, **_BIDI_MAP, 0x2028: "\n", 0x2029: "\n"}

_HTML = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
# Where Markdown may or may not be parsed (<summary>): entities read the same either way.
_HTML_STRICT = str.maketrans(
    {"&": "&amp;", "<": "&lt;", ">": "&gt;", **{c: f"&#{ord(c)};" for c in "\\`*_[]|~!"}}
)
# Inline Markdown: emphasis, code, links/images/footnotes, strikethrough, escapes, table pipes.
_MD_PUNCT = re.compile(r"([\\`*_\[\]|~])")
_MENTION = re.compile(r"@")
_ISSUE_REF = re.compile(r"#(?=\d)")
_NEWLINES = re.compile(r"\r\n?|\n")
_BACKTICK_RUN = re.compile(r"`+")
# Closing tags of the HTML blocks the report is laid out with; inert in a code block, broken anyway.
_CLOSING_TAG = re.compile(r"</(?=\s*(?:details|summary|sub|code)\b)", re.IGNORECASE)
# A block construct that could start where a paragraph starts: heading, list, setext/thematic rule.
_BLOCK_START = re.compile(r"^(?:([#+=-])(?=[\s#+=-]|$)|(\d{1,9})([.)])(?=\s|$))")


class Safe(str):
    """Text that is already Markdown; the template engine's finalizer passes it through unchanged.

    Concatenating it with another string yields a plain ``str`` again (and so gets escaped): a
    mistake shows up as visible double escaping, never as an injection.
    """

    __slots__ = ()


def clean(text: object) -> str:
    """Normalise newlines, show bidi overrides, replace control characters."""
    s = "" if text is None else str(text)
    return _NEWLINES.sub("\n", s).translate(_CLEAN_MAP)


def truncate(text: str, limit: int | None, keep: str = "head") -> str:
    """At most ``limit`` characters plus a note of how many were cut (``keep="tail"`` for logs)."""
    if limit is None or len(text) <= limit:
        return text
    cut = len(text) - limit
    if keep == "tail":
        return f"[{cut:,} characters cut] …" + text[-limit:]
    return text[:limit] + f"… [{cut:,} characters cut]"


def _block_safe(s: str) -> str:
    """Where a paragraph or cell starts, no heading, list or rule may start."""
    return _BLOCK_START.sub(
        lambda m: "\\" + m.group(1) if m.group(1) else m.group(2) + "\\" + m.group(3), s
    )


def _escape_line(s: str, newline: str) -> str:
    s = s.translate(_HTML)
    s = _MD_PUNCT.sub(r"\\\1", s)
    s = _MENTION.sub("@" + ZWJ, s)
    s = _ISSUE_REF.sub("#" + ZWJ, s)
    return s.replace("\n", newline)


def inline(text: object, limit: int | None = None, newline: str = "<br>") -> Safe:
    """Untrusted text as one line of Markdown (paragraph or table cell)."""
    return Safe(_block_safe(_escape_line(truncate(clean(text), limit).lstrip(" \t\n"), newline)))


def prose(text: object, limit: int | None = None) -> Safe:
    """The gate's own sentences: like :func:`inline`, but balanced `backtick` spans become <code>."""
    parts = truncate(clean(text), limit).lstrip(" \t\n").split("`")
    if len(parts) % 2 == 0:  # an unbalanced backtick: the last one is literal text
        parts[-2:] = [parts[-2] + "`" + parts[-1]]
    out = [
        (f"<code>{_escape_line(p, ' ')}</code>" if i % 2 else _escape_line(p, "<br>"))
        for i, p in enumerate(parts)
    ]
    return Safe(_block_safe("".join(out)))


def code_inline(text: object, limit: int | None = None) -> Safe:
    """A value shown as code, e.g. a version or a setting: <code> with escaped content."""
    return Safe(f"<code>{_escape_line(truncate(clean(text), limit), ' ')}</code>")


def html_text(text: object, limit: int | None = None) -> Safe:
    """Text inside an HTML element where Markdown is not parsed (e.g. <summary>): entities only."""
    s = _ISSUE_REF.sub("#" + ZWJ, _MENTION.sub("@" + ZWJ, truncate(clean(text), limit)))
    return Safe(s.translate(_HTML_STRICT).replace("\n", " "))


def visible_token(text: object, limit: int | None = 40) -> Safe:
    """A single token with its whitespace made visible (␠ space, ⏎ newline, ⇥ tab)."""
    s = clean(text).replace(" ", "␠").replace("\n", "⏎").replace("\t", "⇥")
    return inline(s, limit)


def breakable(text: str, every: int = 20) -> str:
    """Raw ``text`` (escape it afterwards) with a zero-width space after every ``every`` characters
    without a break opportunity, so a long run (an arithmetic completion, a hash) wraps inside a
    table cell instead of widening the table past the comment column."""
    run = re.compile(rf"[^\s\u200b]{{{every}}}(?=[^\s\u200b])")
    return run.sub(lambda m: m.group(0) + ZWSP, text)


_LONG_WORD = re.compile(r"[^\s\u200b]{17,}")
_NAME_JOINT = re.compile(r"(?<=[^_./]{3})([_./])(?=[^_./]{3})")


def breakable_name(text: str, every: int = 20) -> str:
    """Raw ``text`` (escape it afterwards) whose long identifiers may wrap after an ``_``, ``.`` or
    ``/`` (``prompts_tokenized_differently``, ``RequestOutput.prompt_token_ids``), so a metric's name
    or note stays inside its column; words of up to 16 characters stay whole, and runs with no such
    joint still wrap every ``every`` characters."""
    joints = _LONG_WORD.sub(lambda w: _NAME_JOINT.sub(r"\1" + ZWSP, w.group(0)), text)
    return breakable(joints, every)


def code_block(text: object, lang: str = "", limit: int | None = None, keep: str = "head") -> Safe:
    """A fenced code block nothing inside can close, with HTML comment openers neutralised."""
    s = truncate(clean(text), limit, keep)
    s = s.replace("<!--", "<!" + ZWJ + "--").replace("-->", "--" + ZWJ + ">")
    s = _CLOSING_TAG.sub("<" + ZWJ + "/", s)
    longest = max((len(m) for m in _BACKTICK_RUN.findall(s)), default=0)
    fence = "`" * max(3, longest + 1)
    lang = re.sub(r"[^A-Za-z0-9_+-]", "", lang)
    return Safe(f"{fence}{lang}\n{s}\n{fence}")


# The Actions runner reads every line a step prints (after leading whitespace) that starts with `::` as
# a workflow command, and a legacy `##[command]` anywhere in a line; .NET's ReadLine also ends a line
# at a lone carriage return.
_WORKFLOW_COMMAND = re.compile(r"(^|[\r\n])(\s*):(?=:)")
_LEGACY_COMMAND = re.compile(r"##(?=\[)")


def no_workflow_commands(text: object) -> str:
    """Untrusted text made safe to print in a GitHub Actions step: no line can be a workflow command.

    A zero-width space goes between the two colons of a leading ``::`` and after the ``##`` of ``##[``,
    so ``::add-mask::``, ``::stop-commands::`` or a forged ``::error::`` reads the same but does nothing.
    """
    s = "" if text is None else str(text)
    s = _WORKFLOW_COMMAND.sub(lambda m: f"{m.group(1)}{m.group(2)}:{ZWSP}", s)
    return _LEGACY_COMMAND.sub("##" + ZWSP, s)


def neutralise_comments(markdown: str) -> str:
    """Last line of defence: no HTML comment can open in rendered text (only the marker may)."""
    return markdown.replace("<!--", "<!" + ZWJ + "--")


def marker_id(gate_id: object) -> str:
    """A gate id reduced to characters that cannot end an HTML comment or break the marker line."""
    s = re.sub(r"[^A-Za-z0-9._:/+=-]", "_", clean(gate_id).strip())[:120]
    return s or "_"


def num(value: object) -> str:
    """3 significant digits; scientific below 1e-3 and from 1e5; integers as integers."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if not isinstance(value, float):
        return clean(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "∞" if value > 0 else "−∞"
    if value == 0:
        return "0"
    a = abs(value)
    if a < 1e-3 or a >= 1e5:
        return f"{value:.2e}"
    if value.is_integer():
        return str(int(value))
    if a >= 100:
        return f"{value:.0f}"
    short = f"{value:.3g}"
    return f"{value:#.3g}" if float(short).is_integer() else short  # 1.0000001 -> "1.00", not "1"
