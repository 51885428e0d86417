"""``gate prompts freeze``: validate a JSONL prompt set and write the manifest that pins it."""

from __future__ import annotations

import argparse
from pathlib import Path

from gate.commands.common import Subparsers
from gate.errors import EXIT_OK


def add_prompts(sub: Subparsers) -> None:
    prompts = sub.add_parser("prompts", help="prompt-set tools")
    prompts_sub = prompts.add_subparsers(metavar="ACTION")
    freeze = prompts_sub.add_parser(
        "freeze", help="validate a JSONL prompt set and write its manifest"
    )
    freeze.add_argument("file", type=Path)
    freeze.add_argument("--name")
    freeze.add_argument("--description", default="")
    freeze.set_defaults(func=cmd_prompts_freeze)


def cmd_prompts_freeze(args: argparse.Namespace) -> int:
    from gate.promptset import freeze_prompt_set

    out = freeze_prompt_set(args.file, args.name, args.description)
    print(out)
    return EXIT_OK
