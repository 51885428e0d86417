"""``gate comment`` and ``gate publish``: the GitHub side of a gate run.

``gate/cli.py`` calls :func:`register` with its subparsers.

- ``gate comment REPORT_OR_RUN_DIR``: the sticky PR comment (``gate.github.comment``). The token comes
  from ``$GITHUB_TOKEN`` (or ``$GH_TOKEN``), never from the command line.
- ``gate publish REPORT_OR_RUN_DIR``: job summary, step outputs and annotations (``gate.github.actions``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gate.errors import EXIT_OK
from gate.github import actions
from gate.github.comment import MODES

COMMENT_BUDGET = 65_000


def register(subparsers: argparse._SubParsersAction) -> None:
    comment = subparsers.add_parser(
        "comment", help="create or update the sticky PR comment with the verdict (GitHub Actions)"
    )
    comment.add_argument("report", type=Path, metavar="REPORT_OR_RUN_DIR")
    comment.add_argument("--mode", choices=MODES, default="always",
                         help="always (default) | on-change | on-failure | off")  # fmt: skip
    comment.add_argument("--gate-id", help="the marker's id (default: the report's gate_id); one comment per id")
    comment.add_argument("--author", help="the login whose comment is ours (default: GET /user, else github-actions[bot])")
    comment.add_argument("--pr-number", help="the PR to comment on (default: from $GITHUB_EVENT_PATH)")
    comment.add_argument("--pr-number-file", type=Path,
                         help="a file holding the PR number (workflow_run on a fork PR); default: pr-number beside the report")  # fmt: skip
    comment.add_argument("--dry-run", action="store_true", help="print the body and what would be done; no API call")
    comment.set_defaults(func=cmd_comment)

    publish = subparsers.add_parser(
        "publish", help="write the job summary, step outputs and annotations (GitHub Actions)"
    )
    publish.add_argument("report", type=Path, metavar="REPORT_OR_RUN_DIR")
    publish.add_argument("--fail-on", choices=("fail", "warn"), help="for the exit-code output (default: the report's)")
    publish.add_argument("--comment-url", default="", help="put this into the comment-url output")
    publish.add_argument("--gate-id", help="name the gate so in the summary and annotations (default: the report's gate_id)")
    publish.add_argument("--no-annotations", action="store_true")
    publish.set_defaults(func=cmd_publish)


def cmd_comment(args: argparse.Namespace) -> int:
    from gate.github.client import GitHubClient, token_from_env
    from gate.github.comment import upsert_comment
    from gate.github.event import NON_PR_EVENTS, NoPullRequest, resolve_pull_request, verify_workflow_run_pr
    from gate.render.markdown import render_comment

    report, report_path = actions.load_report(args.report)
    gate_id = args.gate_id or str(report.get("gate_id") or "gate")
    if args.mode == "off":
        _log("gate comment: skipped (comment mode is off)")
        return EXIT_OK
    rendered = render_comment(report, gate_id=gate_id, budget=COMMENT_BUDGET)
    if getattr(rendered, "dropped", None):
        _log(f"gate comment: sections dropped to fit GitHub's limit: {', '.join(map(str, rendered.dropped))}")
    try:
        pr = resolve_pull_request(pr_number=args.pr_number, pr_number_file=args.pr_number_file,
                                  search_dirs=(report_path.parent,))  # fmt: skip
    except NoPullRequest as exc:
        if exc.event_name not in NON_PR_EVENTS:
            raise
        _log(f"gate comment: skipped (a '{exc.event_name}' event is not about a pull request)")
        actions.write_outputs({"comment-url": "", "comment-action": "skipped"})
        return EXIT_OK
    if args.dry_run:
        _log(f"gate comment: dry run: {pr.repo}#{pr.number}, gate id {gate_id}, mode {args.mode}, "
             f"{len(rendered.text):,} characters")  # fmt: skip
        print(rendered.text)
        return EXIT_OK
    with GitHubClient(token_from_env()) as client:
        verify_workflow_run_pr(client, pr)
        result = upsert_comment(client, pr.repo, pr.number, rendered.text, gate_id, report["verdict"],
                                args.mode, args.author)  # fmt: skip
    _log(f"gate comment: {result.action} ({result.reason})" + (f": {result.url}" if result.url else ""))
    actions.write_outputs({"comment-url": result.url or "", "comment-action": result.action})
    return EXIT_OK


def cmd_publish(args: argparse.Namespace) -> int:
    from gate.render.markdown import render_summary

    report, report_path = actions.load_report(args.report)
    if args.gate_id:
        report = {**report, "gate_id": args.gate_id}
    code = actions.exit_code_for(report, args.fail_on)
    written = actions.write_step_summary(report, lambda r, budget: render_summary(r, budget=budget))
    outputs = actions.outputs_for(report, report_path.resolve(), code, args.comment_url)
    in_actions = actions.write_outputs(outputs)
    if not args.no_annotations:
        actions.emit(actions.annotations(report))
    summary = f"job summary {written:,} bytes" if written is not None else "no job summary ($GITHUB_STEP_SUMMARY unset)"
    outputs_note = "outputs set" if in_actions else "no outputs ($GITHUB_OUTPUT unset)"
    _log(f"gate publish: {report['verdict']}; {summary}; {outputs_note}")
    return EXIT_OK


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
