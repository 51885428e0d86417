"""``gate report`` and ``gate merge``: render a report.json as Markdown, combine several into one.

Bad input (a missing or unreadable file, invalid JSON, an unknown schema major version) raises
:class:`~gate.errors.ConfigError` naming the file, which the CLI prints as one line with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gate.commands.common import Subparsers
from gate.errors import EXIT_OK, ConfigError
from gate.files import atomic_write_text
from gate.report_model import Report, load_report

FORMATS = ("comment", "summary", "full")


def register(sub: Subparsers) -> None:
    """``gate report`` and ``gate merge``, e.g. on a parser of one's own."""
    add_report(sub)
    add_merge(sub)


def add_report(sub: Subparsers) -> None:
    report = sub.add_parser(
        "report", help="render a report.json as Markdown (PR comment, job summary or full)"
    )
    report.add_argument("source", type=Path, metavar="RUN_DIR_OR_REPORT_JSON")
    report.add_argument("--out", type=Path, metavar="FILE.md", help="write here (default: stdout)")
    report.add_argument(
        "--format",
        choices=FORMATS,
        default="comment",
        help="comment: under 65,000 characters with the marker line; summary: under 1 MB; full: everything",
    )
    report.add_argument("--gate-id", help="gate id in the comment marker (default: the report's)")
    report.set_defaults(func=cmd_report)


def add_merge(sub: Subparsers) -> None:
    merge = sub.add_parser(
        "merge", help="combine several report.json files into one verdict and report"
    )
    merge.add_argument("reports", type=Path, nargs="+", metavar="REPORT.json")
    merge.add_argument("--out", type=Path, required=True, metavar="merged.json")
    merge.set_defaults(func=cmd_merge)


def render(report: Report, fmt: str = "comment", gate_id: str | None = None) -> str:
    """``report`` as the Markdown ``--format`` names."""
    from gate.render import markdown

    if fmt == "comment":
        return markdown.render_comment(report, gate_id=gate_id).text
    if fmt == "summary":
        return markdown.render_summary(report)
    if fmt == "full":
        return markdown.render_full(report)
    raise ConfigError(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r}")


def cmd_report(args: argparse.Namespace) -> int:
    text = render(load_report(args.source)[0], args.format, args.gate_id)
    if args.out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        _write(args.out, text)
        print(f"gate: wrote {args.out} ({len(text):,} characters, {args.format})", file=sys.stderr)
    return EXIT_OK


def cmd_merge(args: argparse.Namespace) -> int:
    from gate.merge import merge_reports

    reports = [load_report(p)[0] for p in args.reports]
    merged = merge_reports(reports)
    _write(args.out, json.dumps(merged, indent=2, allow_nan=False, default=str) + "\n")
    print(
        f"gate: merged {len(merged['parts'])} part(s) into {args.out}: {merged['verdict']}",
        file=sys.stderr,
    )
    return EXIT_OK


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write: {exc.strerror or exc}") from None
