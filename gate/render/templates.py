"""The Jinja2 environment every Markdown section renders with, and its escaping.

Templates live in ``templates/<name>.md.j2``. Every value a template prints passes the finalizer:
numbers are formatted, :class:`~gate.render.escape.Safe` text (already escaped) passes as it is, and
anything else is untrusted text escaped for one Markdown line (gate.render.escape). Filters do the
rest (``code``, ``prose``, ``token``, ``html``, ``cells``).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from gate.render import escape as esc
from gate.render.escape import Safe


def finalize(value: Any) -> str:
    if isinstance(value, Safe):
        return value
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return Safe(esc.num(value))
    return esc.inline(value)


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
        autoescape=False,  # Markdown, not HTML: escaping is the finalizer's and the filters' job
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        finalize=finalize,
    )
    env.filters.update(
        prose=esc.prose,
        code=esc.code_inline,
        token=esc.visible_token,
        html=esc.html_text,
        cells=cells,
    )
    return env


def cells(values: Iterable[Any], bold: bool = False) -> Safe:
    """Table cells joined by pipes, each escaped (and bold when asked and not empty)."""
    out = [finalize(v) for v in values]
    return Safe(" | ".join(f"**{v}**" if bold and v else v for v in out))


def render(name: str, **ctx: Any) -> str:
    """``templates/<name>.md.j2`` rendered, stripped."""
    return environment().get_template(f"{name}.md.j2").render(**ctx).strip()
