"""``gate comment`` and ``gate publish``: the GitHub side of a gate run.

- ``gate comment REPORT_OR_RUN_DIR``: the sticky PR comment (``gate.github.comment``). The token comes
  from ``$GITHUB_TOKEN`` (or ``$GH_TOKEN``), never from the command line.
- ``gate publish REPORT_OR_RUN_DIR``: job summary, step outputs and annotations (``gate.github.actions``).

Under ``workflow_run`` for a fork's run the report is the pull request's own word: the comment and the
summary say so, with the run's conclusion and head from the event, and leave out the report's commands.
With ``--missing-report error`` a run that left no report gets an ERROR comment linking the run (exit 3)
instead of a red job and no verdict on the PR.

Everything printed here may carry report text, so it goes through
:func:`gate.commands.common.log_untrusted` or :func:`gate.render.escape.no_workflow_commands`: the
runner parses a step's output for commands.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gate.commands.common import Subparsers, log_untrusted
from gate.errors import EXIT_ERROR, EXIT_OK, ConfigError
from gate.files import REPORT_FILE
from gate.github import actions
from gate.github.comment import MODES
from gate.render.budget import COMMENT_BUDGET
from gate.render.escape import no_workflow_commands
from gate.report_model import SCHEMA, Report, load_report
from gate.verdict import FAIL_ON

if TYPE_CHECKING:
    from gate.github.event import PullRequest, WorkflowRun


def register(sub: Subparsers) -> None:
    """``gate comment`` and ``gate publish``, e.g. on a parser of one's own."""
    add_comment(sub)
    add_publish(sub)


def add_comment(sub: Subparsers) -> None:
    comment = sub.add_parser(
        "comment", help="create or update the sticky PR comment with the verdict (GitHub Actions)"
    )
    comment.add_argument("report", type=Path, metavar="REPORT_OR_RUN_DIR")
    comment.add_argument(
        "--mode",
        choices=MODES,
        default="always",
        help="always (default) | on-change | on-failure | off",
    )
    comment.add_argument(
        "--gate-id", help="the marker's id (default: the report's gate_id); one comment per id"
    )
    comment.add_argument(
        "--author",
        help="the login whose comment is ours (default: GET /user, else github-actions[bot])",
    )
    comment.add_argument(
        "--pr-number", help="the PR to comment on (default: from $GITHUB_EVENT_PATH)"
    )
    comment.add_argument(
        "--pr-number-file",
        type=Path,
        help="a file holding the PR number (workflow_run on a fork PR); default: pr-number beside the report",
    )
    comment.add_argument(
        "--missing-report",
        choices=("usage", "error"),
        default="usage",
        help="no report.json at REPORT_OR_RUN_DIR: usage (default) exits 2; error, under workflow_run, "
        "comments an ERROR verdict linking the run that produced none, and exits 3",
    )
    comment.add_argument(
        "--dry-run", action="store_true", help="print the body and what would be done; no API call"
    )
    comment.set_defaults(func=cmd_comment)


def add_publish(sub: Subparsers) -> None:
    publish = sub.add_parser(
        "publish", help="write the job summary, step outputs and annotations (GitHub Actions)"
    )
    publish.add_argument("report", type=Path, metavar="REPORT_OR_RUN_DIR")
    publish.add_argument(
        "--fail-on",
        choices=FAIL_ON,
        help="for the exit-code output (default: the report's)",
    )
    publish.add_argument("--comment-url", default="", help="put this into the comment-url output")
    publish.add_argument(
        "--gate-id",
        help="name the gate so in the summary and annotations (default: the report's gate_id)",
    )
    publish.add_argument("--no-annotations", action="store_true")
    publish.set_defaults(func=cmd_publish)


def cmd_comment(args: argparse.Namespace) -> int:
    from gate.github.event import workflow_run

    run = workflow_run()
    pr_run = run if run is not None and run.from_fork else None
    try:
        report, report_path = load_report(args.report, require_verdict=True)
    except ConfigError:
        if args.missing_report != "error" or actions.has_report(args.report):
            raise
        if run is None:
            raise ConfigError(
                f"{args.report}: no {REPORT_FILE} here; --missing-report error only applies under a "
                "workflow_run event (it names the run that produced none)"
            ) from None
        return _comment_missing_report(args, run)
    gate_id = args.gate_id or report.gate_id or "gate"
    return _comment(args, report, gate_id, (report_path.parent,), pr_run)


def _comment_missing_report(args: argparse.Namespace, run: WorkflowRun) -> int:
    """The PR's run left no report: say so on the PR (ERROR), so the gate never goes quiet."""
    where = (
        f"the workflow run {run.html_url}" if run.html_url else "the pull request's workflow run"
    )
    conclusion = f" (it concluded '{run.conclusion}')" if run.conclusion else ""
    gate_id: str = args.gate_id or "gate"
    report = Report.from_dict(
        {
            "schema": SCHEMA,
            "gate_id": gate_id,
            "verdict": "ERROR",
            "exit_code": EXIT_ERROR,
            "counts": {},
            "checks": [],
            "errors": [
                f"The pull request's run produced no report: {where}{conclusion} uploaded no {REPORT_FILE}. "
                "Its log says why; re-run it once that is fixed."
            ],
        }
    )
    log_untrusted(
        f"gate comment: {args.report}: no {REPORT_FILE}; commenting an ERROR verdict for the run"
    )
    code = _comment(args, report, gate_id, (), None, missing_from=run)
    return EXIT_ERROR if code == EXIT_OK else code


def _comment(
    args: argparse.Namespace,
    report: Report,
    gate_id: str,
    search_dirs: tuple[Path, ...],
    pr_run: WorkflowRun | None,
    missing_from: WorkflowRun | None = None,
) -> int:
    """Comment ``report``; ``pr_run`` labels it as a fork run's own word, ``missing_from`` is the run that left none."""
    from gate.github.client import GitHubClient, token_from_env
    from gate.github.comment import upsert_comment
    from gate.github.event import (
        NON_PR_EVENTS,
        NoPullRequest,
        resolve_pull_request,
        verify_workflow_run_pr,
    )
    from gate.render.markdown import render_comment

    if args.mode == "off":
        log_untrusted("gate comment: skipped (comment mode is off)")
        return EXIT_OK
    rendered = render_comment(report, gate_id=gate_id, budget=COMMENT_BUDGET, pr_run=pr_run)
    if rendered.dropped:
        log_untrusted(
            f"gate comment: sections dropped to fit GitHub's limit: {', '.join(map(str, rendered.dropped))}"
        )
    try:
        pr = resolve_pull_request(
            pr_number=args.pr_number,
            pr_number_file=None if missing_from else args.pr_number_file,
            search_dirs=search_dirs,
        )
    except NoPullRequest as exc:
        if missing_from is not None and exc.event_name == "workflow_run":
            pr = None  # a fork's run: the number was in the artifact; ask GitHub below
        elif exc.event_name in NON_PR_EVENTS:
            log_untrusted(
                f"gate comment: skipped (a '{exc.event_name}' event is not about a pull request)"
            )
            actions.write_outputs({"comment-url": "", "comment-action": "skipped"})
            return EXIT_OK
        else:
            raise
    if args.dry_run:
        target = f"{pr.repo}#{pr.number}" if pr else "the open PR of the run's head"
        log_untrusted(
            f"gate comment: dry run: {target}, gate id {gate_id}, mode {args.mode}, {len(rendered.text):,} characters"
        )
        print(no_workflow_commands(rendered.text))
        return EXIT_OK
    with GitHubClient(token_from_env()) as client:
        if pr is None:  # only a fork's run that left no report gets here (see above)
            assert missing_from is not None
            pr = _run_pull_request(client, missing_from)
        verify_workflow_run_pr(client, pr)
        result = upsert_comment(
            client,
            pr.repo,
            pr.number,
            rendered.text,
            gate_id,
            report.verdict or "ERROR",
            args.mode,
            args.author,
        )
    log_untrusted(
        f"gate comment: {result.action} ({result.reason})"
        + (f": {result.url}" if result.url else "")
    )
    actions.write_outputs({"comment-url": result.url or "", "comment-action": result.action})
    return EXIT_OK


def _run_pull_request(client: Any, run: WorkflowRun) -> PullRequest:
    from gate.github.event import PullRequest, find_run_pr

    number = find_run_pr(client, run)
    if number is None:
        raise ConfigError(
            f"no open pull request of {run.base_repo} has the run's head {run.head_repo}:{run.head_branch}; "
            "pass --pr-number"
        )
    return PullRequest(
        run.base_repo, number, "workflow_run", "event", run.head_sha, run.head_repo, run.head_branch
    )


def cmd_publish(args: argparse.Namespace) -> int:
    from gate.github.event import workflow_run
    from gate.render.markdown import render_summary

    report, report_path = load_report(args.report, require_verdict=True)
    if args.gate_id:
        report = dataclasses.replace(report, gate_id=args.gate_id)
    run = workflow_run()
    pr_run = run if run is not None and run.from_fork else None
    code = actions.exit_code_for(report, args.fail_on)
    written = actions.write_step_summary(
        report, lambda r, budget: render_summary(r, budget=budget, pr_run=pr_run)
    )
    outputs = actions.outputs_for(report, report_path.resolve(), code, args.comment_url)
    in_actions = actions.write_outputs(outputs)
    if not args.no_annotations:
        actions.emit(actions.annotations(report))
    summary = (
        f"job summary {written:,} bytes"
        if written is not None
        else "no job summary ($GITHUB_STEP_SUMMARY unset)"
    )
    outputs_note = "outputs set" if in_actions else "no outputs ($GITHUB_OUTPUT unset)"
    log_untrusted(f"gate publish: {report.verdict}; {summary}; {outputs_note}")
    return EXIT_OK
