"""``gate calibrate`` and ``gate baseline record|update``: noise floors from A/A runs, and the stored baseline."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gate.commands.common import (
    ImageRoute,
    Subparsers,
    add_config_args,
    config_from_args,
    ready_for_engines,
    route_to_gate_image,
    run_path,
)
from gate.config import GateConfig
from gate.errors import EXIT_ERROR, EXIT_OK, ConfigError
from gate.runners.base import stderr_log


def add_calibrate(sub: Subparsers) -> None:
    calibrate = sub.add_parser(
        "calibrate", help="A/A: the old engine against itself; prints noise floors"
    )
    add_config_args(calibrate)
    calibrate.add_argument("--out", type=Path, help="run directory to create")
    _add_runs(calibrate)
    calibrate.set_defaults(func=cmd_calibrate)


def add_baseline(sub: Subparsers) -> None:
    baseline = sub.add_parser("baseline", help="record or update the stored baseline")
    baseline_sub = baseline.add_subparsers(metavar="ACTION")
    for action, helptext in (
        ("record", "write a new baseline (refuses to overwrite)"),
        ("update", "overwrite the baseline on purpose and say what changed"),
    ):
        p = baseline_sub.add_parser(action, help=helptext)
        add_config_args(p)
        p.add_argument(
            "--from-run",
            type=Path,
            help="a `gate calibrate` run directory to record from (else one is run)",
        )
        p.add_argument("--out", type=Path, help="calibration run directory to create")
        _add_runs(p)
        p.set_defaults(func=cmd_baseline, overwrite=action == "update")


def _runs(raw: str) -> int:
    value = int(raw)
    if value < 2:
        raise argparse.ArgumentTypeError(f"--runs: at least 2 engine starts, got {value}")
    return value


def _add_runs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runs",
        type=_runs,
        default=None,
        help="engine starts of the old engine, in permuted orders (default: 3 with a GPU, 2 on the "
        "CPU where every start is bit-identical)",
    )


def cmd_calibrate(args: argparse.Namespace) -> int:
    from gate.calibrate import calibrate, default_runs

    cfg = config_from_args(args)
    ready_for_engines(cfg)
    out = run_path(args.out, cfg)
    runs = args.runs or default_runs()
    route = ImageRoute(
        ("calibrate", "--out", str(out), "--runs", str(runs)),
        writable=(out.parent,),
        engine_runs=runs,
    )
    code = route_to_gate_image(cfg, route)
    if code is not None:
        return code
    result, noise = calibrate(cfg, args.out, stderr_log, runs)
    if noise is None:
        stderr_log(f"gate: error: calibration could not run; partial run kept at {result.run_dir}")
        return EXIT_ERROR
    for name, value in sorted(noise.items()):
        stderr_log(f"  noise {name}: {value:.3g}")
    print(result.run_dir)
    return EXIT_OK


def cmd_baseline(args: argparse.Namespace) -> int:
    from gate import baseline
    from gate.calibrate import NOISE_FILE, calibrate

    cfg = config_from_args(args)
    if cfg.baseline is None:
        raise ConfigError(f"{cfg.source}: baseline: required to record a baseline")
    out = Path(cfg.baseline)
    if out.exists() and not args.overwrite:
        raise ConfigError(
            f"{out}: baseline already exists; `gate baseline update` overwrites it on purpose"
        )
    if not args.from_run:  # it calibrates: engines start
        ready_for_engines(cfg)
    code = route_to_gate_image(cfg, baseline_image_route(args, cfg, out))
    if code is not None:
        return code
    if args.from_run:
        run_dir = args.from_run
        noise_path = run_dir / NOISE_FILE
        if not noise_path.is_file():
            raise ConfigError(
                f"{noise_path}: missing; --from-run needs a `gate calibrate` run directory"
            )
        noise = json.loads(noise_path.read_text())
    else:
        result, noise = calibrate(cfg, args.out, stderr_log, args.runs)
        if noise is None:
            stderr_log(
                f"gate: error: calibration could not run; partial run kept at {result.run_dir}"
            )
            return EXIT_ERROR
        run_dir = result.run_dir
    changes = baseline.write(out, run_dir, "old", noise, overwrite=args.overwrite, log=stderr_log)
    stderr_log(f"baseline {'updated' if args.overwrite else 'recorded'} at {out}")
    for change in changes:
        stderr_log(f"  changed: {change}")
    if args.overwrite and not changes:
        stderr_log("  nothing changed")
    print(out)
    return EXIT_OK


def baseline_image_route(args: argparse.Namespace, cfg: GateConfig, out: Path) -> ImageRoute:
    """``gate baseline`` in the gate image: it writes the baseline ``out`` and reads or writes a calibration run."""
    command = ["baseline", "update" if args.overwrite else "record"]
    writable: list[Path] = [out.resolve().parent]
    readable: tuple[Path, ...] = ()
    if args.from_run:
        command += ["--from-run", str(args.from_run.resolve())]
        readable = (args.from_run.resolve(),)
    else:
        run = run_path(args.out, cfg)
        command += ["--out", str(run)]
        if args.runs:
            command += ["--runs", str(args.runs)]
        writable.append(run.parent)
    return ImageRoute(tuple(command), tuple(writable), readable, engine_runs=args.runs or 2)
