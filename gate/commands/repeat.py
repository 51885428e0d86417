"""``gate repeat``: old vs new over many sampling seeds (the library is :mod:`gate.repeat`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gate.commands.common import (
    ImageRoute,
    Subparsers,
    add_config_args,
    config_from_args,
    ready_for_engines,
    route_to_gate_image,
)
from gate.errors import ConfigError
from gate.repeat import ENGINES, FLAGGED, counts, repetition_seeds, replayed_engines, run_repeat
from gate.runners.base import stderr_log
from gate.worker_request import load_prompts


def add_repeat(sub: Subparsers) -> None:
    p = sub.add_parser(
        "repeat", help="old vs new over many sampling seeds (one engine start per engine)"
    )
    add_config_args(p)
    seeds = p.add_mutually_exclusive_group(required=True)
    seeds.add_argument(
        "--seeds", type=int, metavar="N", help="N repetitions with non-overlapping sampling seeds"
    )
    seeds.add_argument("--seed-list", metavar="S1,S2,...", help="explicit sampling seeds")
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="folder to create (seed-<k>/ run directories, repeat.json)",
    )
    p.add_argument(
        "--only", choices=ENGINES, help="replay one engine only (old: evidence to reuse later)"
    )
    p.add_argument(
        "--old-from",
        type=Path,
        metavar="REPEAT_DIR",
        help="reuse the old engine's per-seed evidence from an earlier `gate repeat` folder",
    )
    p.set_defaults(func=cmd_repeat)


def cmd_repeat(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    ready_for_engines(cfg)
    if args.seed_list:
        seeds = parse_seed_list(args.seed_list)
    else:
        seeds = repetition_seeds(cfg, len(load_prompts(cfg)[1]), args.seeds)
    code = route_to_gate_image(cfg, repeat_image_route(args, seeds))
    if code is not None:
        return code
    result = run_repeat(cfg, seeds, args.out, stderr_log, only=args.only, old_from=args.old_from)
    c = counts(result.outcomes)
    if result.engine_error:
        stderr_log(
            f"gate: error: an engine could not produce evidence for {c['checks_verdict']['ERROR']} seed(s)"
        )
    stderr_log(
        f"repeat: {c['seeds']} seed(s) in {result.wall_s:.0f}s; flagged (a check WARN or FAIL) {c['flagged']}; "
        f"checks FAIL {c['checks_verdict']['FAIL']}, WARN {c['checks_verdict']['WARN']}, PASS {c['checks_verdict']['PASS']}; "
        f"verdicts {', '.join(f'{k} {v}' for k, v in c['verdict'].items() if v)}"
    )
    for o in result.outcomes:  # stdout: one line per seed, for scripts
        print(
            f"{o.seed}\t{o.checks_verdict}\t{o.verdict}\t{','.join(k for k, v in o.checks.items() if v in FLAGGED) or '-'}"
        )
    sys.stdout.flush()
    return result.exit_code


def parse_seed_list(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seed-list: expected comma-separated integers, got {text!r}") from None


def repeat_image_route(args: argparse.Namespace, seeds: list[int]) -> ImageRoute:
    """``gate repeat`` in the gate image: the seeds as the host computed them, each engine once per seed."""
    out = Path(args.out).resolve()
    command = ["repeat", "--seed-list", ",".join(map(str, seeds)), "--out", str(out)]
    command += ["--only", args.only] if args.only else []
    readable: tuple[Path, ...] = ()
    if args.old_from:  # read from where the host has it
        readable = (Path(args.old_from).resolve(),)
        command += ["--old-from", str(readable[0])]
    engines = len(replayed_engines(args.only, args.old_from))
    return ImageRoute(tuple(command), (out.parent,), readable, engine_runs=engines * len(seeds))
