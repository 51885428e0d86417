"""``gate bisect``: which release between a good and a bad pin changed the gate's judgment."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gate.commands.common import Subparsers, config_from_args, ready_for_engines
from gate.config import BUILTIN_CONFIG, GateConfig
from gate.errors import EXIT_ERROR, EXIT_OK, ConfigError
from gate.runners.base import stderr_log


def add_bisect(sub: Subparsers) -> None:
    p = sub.add_parser(
        "bisect",
        help="find the first release between a good and a bad pin where the judgment changes",
        description="Replays each release between --good and --bad (from the installer's package indexes) "
        "against the good release's evidence, judged as `gate run` judges, and bisects for the first one "
        "where the target changes. Every release runs with the new engine's settings.",
    )
    # No --old/--new/--runner: --good/--bad are the pins, and every release gets a venv of its own.
    p.add_argument(
        "-c",
        "--config",
        type=Path,
        default=None,
        help=f"gate.yaml (default: the built-in CPU default, {BUILTIN_CONFIG.name})",
    )
    p.set_defaults(old=None, new=None, runner=None)
    p.add_argument(
        "--good",
        metavar="SPEC",
        help="the release where the target held (default: engines.old.spec)",
    )
    p.add_argument(
        "--bad", metavar="SPEC", help="the release where it changed (default: engines.new.spec)"
    )
    p.add_argument(
        "--check",
        action="append",
        default=[],
        metavar="ID",
        help="target: the worst status of these checks (repeat for several; default: the verdict)",
    )
    p.add_argument(
        "--metric",
        metavar="CHECK:NAME",
        help="target: one measurement: its status where it has bounds, else whether its value moved",
    )
    p.add_argument("--pre", action="store_true", help="include pre- and dev releases")
    p.add_argument("--include-yanked", action="store_true", help="include yanked releases")
    p.add_argument(
        "--reruns",
        type=int,
        default=1,
        help="replays of a step whose statistic lies within its noise of a bound (default 1)",
    )
    p.add_argument("--out", type=Path, help="output folder (default: runs/<time>-<gate_id>-bisect)")
    p.add_argument(
        "--attach",
        type=Path,
        metavar="REPORT",
        help="add the result to this report.json (or run directory): its comment and summary show it",
    )
    p.set_defaults(func=cmd_bisect)


def cmd_bisect(args: argparse.Namespace) -> int:
    from gate import bisect, releases
    from gate.checks import registry
    from gate.runners.venv_build import pip_settings

    cfg = config_from_args(args)
    _check_runner(cfg)
    good = releases.parse_pin(
        args.good or cfg.engines["old"].spec, "--good" if args.good else "engines.old.spec"
    )
    bad = releases.parse_pin(
        args.bad or cfg.engines["new"].spec, "--bad" if args.bad else "engines.new.spec"
    )
    if good.project != bad.project:
        raise ConfigError(
            f"bisect: --good is {good.project} and --bad is {bad.project}: one package's releases"
        )
    if good.version == bad.version:
        raise ConfigError(f"bisect: --good and --bad are the same release ({good.text})")
    if args.reruns < 0:
        raise ConfigError("bisect: --reruns must be >= 0")
    target = bisect.TargetSpec.parse(args.check, args.metric, [c.id for c in registry()])
    stderr_log(f"bisect: listing {bad.project}'s releases from the installer's indexes")
    listed = releases.list_releases(bad.project, pip_settings())
    candidates = releases.between(listed, good.version, bad.version, args.pre, args.include_yanked)
    left_out = [
        r.text for r in listed if good.version < r.version < bad.version and r not in candidates
    ]
    stderr_log(
        f"bisect: {len(candidates)} release(s) between {good.text} and {bad.text}: "
        f"{', '.join(r.text for r in candidates) or 'none'}"
        + (f" (left out: {', '.join(left_out)}: pre-release or yanked)" if left_out else "")
    )
    if good.version > bad.version:
        candidates = list(reversed(candidates))  # a change undone: walk from the good side
    out = (
        args.out or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.gate_id}-bisect"
    ).resolve()
    if out.exists():
        raise ConfigError(f"{out}: already exists; choose another --out")
    ready_for_engines(cfg)
    out.mkdir(parents=True)
    result = bisect.bisect(
        cfg, bad, good.text, bad.text, candidates, target, out, stderr_log, args.reruns
    )
    _, md_path = bisect.write(result, out)
    if args.attach is not None:
        bisect.attach(result, args.attach)
        stderr_log(f"bisect: added to {args.attach}")
    for step in result.steps:
        status = step.reading.status if step.reading else "-"
        stderr_log(f"  {step.version:<14} {step.outcome:<9} {status:<5} {step.reason}")
    stderr_log(
        f"bisect: {result.status}"
        + (
            f": first changed {result.first_changed}, last held {result.last_held}"
            if result.first_changed
            else ""
        )
        + f" ({result.replays} replays, {result.wall_s:.0f} s; {md_path})"
    )
    print(out)
    return EXIT_OK if result.status in ("found", "no-change", "adjacent") else EXIT_ERROR


def _check_runner(cfg: GateConfig) -> None:
    runner = cfg.engines["new"].runner
    if runner != "venv":
        raise ConfigError(
            f"{cfg.source}: engines.new.runner: {runner}: bisect builds one environment per release "
            "and needs the venv runner"
        )
