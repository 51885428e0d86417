"""The ``gate`` command line: the parser built from :mod:`gate.commands`, dispatch, and exit codes.

Exit codes: 0 PASS or WARN (``fail_on: warn`` makes WARN 1), 1 FAIL, 2 usage or config error,
3 ERROR (the gate could not judge). Errors print one line (plus an engine's log tail where there
is one); a traceback is a bug.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from gate import __version__
from gate.commands import baseline, bisect, github, init, prompts, repeat, report, run
from gate.commands.common import Command, Subparsers, indent, log_untrusted
from gate.errors import EXIT_ERROR, EXIT_USAGE, GateError

# In the order `gate --help` lists them.
_SUBCOMMANDS: tuple[Callable[[Subparsers], None], ...] = (
    init.add_init,
    run.add_run,
    run.add_key,
    run.add_check,
    baseline.add_calibrate,
    baseline.add_baseline,
    run.add_prepare,
    prompts.add_prompts,
    report.add_report,
    report.add_merge,
    repeat.add_repeat,
    bisect.add_bisect,
    github.add_comment,
    github.add_publish,
)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    command: Command = args.func
    try:
        return command(args)
    except GateError as exc:
        # Messages and log tails can quote untrusted text (a report, an engine's output): no line of
        # it may read as a workflow command in a job that holds a write token.
        log_untrusted(f"gate: error: {exc}")
        log_tail: str = getattr(exc, "log_tail", "")  # an engine's or a container's last lines
        if log_tail:
            log_untrusted(indent(log_tail))
        return exc.exit_code
    except KeyboardInterrupt:
        print("gate: interrupted", file=sys.stderr)
        return EXIT_ERROR


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gate", description="CI gate for vLLM upgrades in RL training stacks."
    )
    parser.add_argument("--version", action="version", version=f"gate {__version__}")
    sub = parser.add_subparsers(metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


if __name__ == "__main__":
    sys.exit(main())
