"""report.json -> Markdown: the sticky PR comment, the job summary and the full artifact.

The public face of the renderer. :mod:`gate.render.sections` builds the sections from the typed
report (:mod:`gate.report_model`), :mod:`gate.render.charts` draws the GRPO trajectories, and
:func:`gate.render.budget.fit` drops the least important sections until the text fits the output's
budget, saying how many were omitted. The marker line ``<!-- gate-report:<id> -->`` opens every
comment and is the only HTML comment in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from gate.render import sections
from gate.render.budget import (
    CHARACTERS,
    COMMENT,
    COMMENT_BUDGET,
    FULL,
    SUMMARY,
    SUMMARY_BUDGET,
    UTF8,
    UTF16,
    fit,
    marker,
)
from gate.report_model import Report

if TYPE_CHECKING:
    from gate.github.event import WorkflowRun


@dataclass(frozen=True)
class Rendered:
    text: str
    dropped: tuple[str, ...]  # keys of the sections left out to meet the budget


def render_comment(
    report: Report,
    gate_id: str | None = None,
    budget: int = COMMENT_BUDGET,
    pr_run: WorkflowRun | None = None,
) -> Rendered:
    """The sticky PR comment: marker line first, under ``budget`` characters (UTF-16 units, the stricter count).

    ``pr_run``: the report is the artifact of this pull-request run (a fork's), so it is labelled as the
    PR's own result, with the run's conclusion and head from the event, and its commands are left out.
    """
    head = marker(gate_id if gate_id is not None else report.gate_id or "") + "\n"
    text, dropped = fit(
        sections.build(report, COMMENT, pr_run),
        budget - UTF16.size(head),
        UTF16,
        partial(sections.omitted_note, limit_name="GitHub's comment limit"),
    )
    return Rendered(head + text, dropped)


def render_summary(
    report: Report, budget: int = SUMMARY_BUDGET, pr_run: WorkflowRun | None = None
) -> str:
    """The job summary ($GITHUB_STEP_SUMMARY): same content, under ``budget`` UTF-8 bytes."""
    text, _ = fit(
        sections.build(report, SUMMARY, pr_run),
        budget,
        UTF8,
        partial(sections.omitted_note, limit_name="GitHub's job summary limit"),
    )
    return text


def render_full(report: Report) -> str:
    """Everything, uncapped: the file uploaded as an artifact."""
    text, _ = fit(
        sections.build(report, FULL),
        None,
        CHARACTERS,
        partial(sections.omitted_note, limit_name=""),
    )
    return text
