"""The ``gate`` command line.

Exit codes: 0 PASS or WARN (``fail_on: warn`` makes WARN 1), 1 FAIL, 2 usage or config error,
3 ERROR (the gate could not judge). Errors print one line (plus an engine's log tail where there
is one); a traceback is a bug.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from gate import __version__
from gate.config import BUILTIN_CONFIG, RUNNER_KINDS, GateConfig, check_no_credentials, load_config
from gate.errors import EXIT_ERROR, EXIT_OK, EXIT_USAGE, ConfigError, GateError
from gate.runners.base import stderr_log


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return args.func(args)
    except GateError as exc:
        # Messages and log tails can quote untrusted text (a report, an engine's output): no line of
        # it may read as a workflow command in a job that holds a write token.
        from gate.render.escape import no_workflow_commands

        print(no_workflow_commands(f"gate: error: {exc}"), file=sys.stderr)
        if getattr(exc, "log_tail", ""):
            print(no_workflow_commands(_indent(exc.log_tail)), file=sys.stderr)
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

    run = sub.add_parser("run", help="replay through the old and the new engine, then judge")
    _config_args(run)
    run.add_argument(
        "--out", type=Path, help="run directory to create (default: runs/<time>-<gate_id>)"
    )
    run.add_argument(
        "--only",
        choices=("old", "new"),
        help="replay one engine only (judged against the baseline)",
    )
    run.add_argument(
        "--fail-on",
        choices=("fail", "warn"),
        help="exit 1 on this verdict or worse (default: config)",
    )
    run.add_argument("--no-reuse", action="store_true",
                     help="replay the old engine even when its stored evidence matches (it is stored afresh)")  # fmt: skip
    run.set_defaults(func=cmd_run)

    key = sub.add_parser(
        "key", help="print the old engine's evidence-cache key (for actions/cache)"
    )
    _config_args(key)
    key.set_defaults(func=cmd_key)

    check = sub.add_parser(
        "check", help="judge an existing run directory again (e.g. with other thresholds)"
    )
    check.add_argument("run_dir", type=Path)
    check.add_argument(
        "-c", "--config", type=Path, help="gate.yaml (default: the one the run used)"
    )
    check.add_argument("--fail-on", choices=("fail", "warn"))
    check.set_defaults(func=cmd_check)

    calibrate = sub.add_parser(
        "calibrate", help="A/A: the old engine against itself; prints noise floors"
    )
    _config_args(calibrate)
    calibrate.add_argument("--out", type=Path, help="run directory to create")
    calibrate.set_defaults(func=cmd_calibrate)

    baseline = sub.add_parser("baseline", help="record or update the stored baseline")
    baseline_sub = baseline.add_subparsers(metavar="ACTION")
    for action, helptext in (("record", "write a new baseline (refuses to overwrite)"),
                             ("update", "overwrite the baseline on purpose and say what changed")):  # fmt: skip
        p = baseline_sub.add_parser(action, help=helptext)
        _config_args(p)
        p.add_argument(
            "--from-run",
            type=Path,
            help="a `gate calibrate` run directory to record from (else one is run)",
        )
        p.add_argument("--out", type=Path, help="calibration run directory to create")
        p.set_defaults(func=cmd_baseline, overwrite=action == "update")

    prepare = sub.add_parser(
        "prepare", help="build (or reuse) both engine environments without replaying"
    )
    _config_args(prepare)
    prepare.set_defaults(func=cmd_prepare)

    prompts = sub.add_parser("prompts", help="prompt-set tools")
    prompts_sub = prompts.add_subparsers(metavar="ACTION")
    freeze = prompts_sub.add_parser(
        "freeze", help="validate a JSONL prompt set and write its manifest"
    )
    freeze.add_argument("file", type=Path)
    freeze.add_argument("--name")
    freeze.add_argument("--description", default="")
    freeze.set_defaults(func=cmd_prompts_freeze)

    from gate.github.cli import register as register_github
    from gate.render.cli import register as register_render
    from gate.repeat import register as register_repeat

    register_render(sub)  # gate report, gate merge
    register_repeat(sub)  # gate repeat
    register_github(sub)  # gate comment, gate publish
    return parser


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", type=Path, default=None,
                   help=f"gate.yaml (default: the built-in CPU default, {BUILTIN_CONFIG.name})")  # fmt: skip
    p.add_argument("--old", metavar="SPEC", help="override the old engine's pip spec")
    p.add_argument("--new", metavar="SPEC", help="override the new engine's pip spec")
    p.add_argument("--runner", choices=RUNNER_KINDS, help="override both engines' runner")


def _load(args: argparse.Namespace) -> GateConfig:
    cfg = load_config(args.config or BUILTIN_CONFIG)
    engines = dict(cfg.engines)
    for name, spec in (("old", args.old), ("new", args.new)):
        if spec:
            check_no_credentials(
                spec, "command line", f"--{name}"
            )  # the config's own check, for overrides
            engines[name] = dataclasses.replace(engines[name], spec=spec)
    if args.runner:
        engines = {n: dataclasses.replace(e, runner=args.runner) for n, e in engines.items()}
    cfg = dataclasses.replace(cfg, engines=engines)
    if getattr(args, "fail_on", None):
        cfg = dataclasses.replace(cfg, fail_on=args.fail_on)
    return cfg


def _route_to_gate_image(
    cfg: GateConfig,
    command: list[str],
    writable: Sequence[Path] = (),
    readable: Sequence[Path] = (),
    engine_runs: int = 2,
    environment: dict[str, str] | None = None,
) -> int | None:
    """Run ``gate <command>`` in the gate image when ``cfg`` asks for it; None when it runs here.

    Every command that runs engines starts with this (tests/unit/test_docker_plan.py checks each
    one), so none can take a docker config to the per-engine runner, which needs an image per
    engine. Inside, the same command runs with this config, its engine specs and the venv runner,
    which finds the venvs the image was built with. ``writable`` folders are mounted read-write
    (created first), ``readable`` ones read-only beside the config's own paths; ``engine_runs``
    engine replays size the container's timeout.
    """
    from gate.docker.bundle import run_in_gate_image, uses_gate_image

    if not uses_gate_image(cfg):
        return None
    old, new = cfg.engines["old"].spec, cfg.engines["new"].spec
    argv = [*command, "-c", cfg.source, "--runner", "venv", "--old", old, "--new", new]
    return run_in_gate_image(
        cfg, argv, list(writable), engine_runs, stderr_log, tuple(readable), environment or {}
    )


def _run_path(out: Path | None, cfg: GateConfig) -> Path:
    from gate.rundir import default_path

    return (out or default_path(cfg.gate_id)).resolve()


def cmd_run(args: argparse.Namespace) -> int:
    from gate.replay import default_jobs, run_gate

    cfg = _load(args)
    code = _run_in_gate_image(args, cfg)
    if code is not None:
        return code
    # The evidence cache serves a whole old-vs-new run; --only asks for one engine on purpose.
    reuse = None if args.only else not args.no_reuse
    result = run_gate(cfg, args.out, stderr_log, default_jobs(cfg, args.only), reuse_old=reuse)
    for engine in result.engines:
        stderr_log(
            f"  {engine.name}: {engine.spec}: {engine.status}"
            + (f": {engine.error}" if engine.error else "")
        )
    if result.status != "ok":
        failed = [e for e in result.engines if e.status != "ok"]
        for engine in failed:
            if engine.log_tail:
                stderr_log(f"--- {engine.name} log tail ---\n{_indent(engine.log_tail)}")
        stderr_log(
            f"gate: error: {len(failed)} engine(s) could not produce evidence; partial run kept at {result.run_dir}"
        )
    code = _judge_and_report(result.run_dir, cfg)
    print(result.run_dir)
    return code


def _run_in_gate_image(args: argparse.Namespace, cfg: GateConfig) -> int | None:
    from gate.evidence_cache import cache_dir

    out = _run_path(args.out, cfg)
    command = ["run", "--out", str(out), *(["--only", args.only] if args.only else [])]
    command += [
        *(["--fail-on", args.fail_on] if args.fail_on else []),
        *(["--no-reuse"] if args.no_reuse else []),
    ]
    writable, environment = [out.parent], {}
    if not args.only:  # the host's evidence cache, at its own path: the image and the host share it
        evidence = cache_dir().resolve()
        writable.append(evidence)
        environment["GATE_EVIDENCE_DIR"] = str(evidence)
    code = _route_to_gate_image(
        cfg, command, writable, engine_runs=1 if args.only else 2, environment=environment
    )
    if code is not None:
        print(out if out.exists() else out.with_name(out.name + ".incomplete"))
    return code


def cmd_key(args: argparse.Namespace) -> int:
    """The digest of everything the old engine's evidence depends on that is known before any install."""
    from gate import evidence_cache
    from gate.fingerprint import model_fingerprint
    from gate.replay import default_jobs, evidence_key_groups, load_prompts

    cfg = _load(args)
    prompt_sets, prompts = load_prompts(cfg)
    groups = evidence_key_groups(
        cfg, default_jobs(cfg, "old")[0], prompt_sets, prompts, model_fingerprint(cfg.model.path)
    )
    print(f"gate-old-{evidence_cache.config_key(groups)}")
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    run_file = args.run_dir / "run.json"
    if not run_file.is_file():
        raise ConfigError(f"{run_file}: not a gate run directory")
    config = args.config or Path(json.loads(run_file.read_text())["config"])
    cfg = load_config(config)
    if args.fail_on:
        cfg = dataclasses.replace(cfg, fail_on=args.fail_on)
    return _judge_and_report(args.run_dir, cfg)


def _judge_and_report(run_dir: Path, cfg: GateConfig) -> int:
    from gate import report
    from gate.judge import judge

    judgment = judge(run_dir, cfg)
    path = report.write(run_dir, report.build(run_dir, cfg, judgment))
    for check in judgment.checks:
        stderr_log(f"  {check.status.icon} {check.status.value:<5} {check.id}: {check.summary}")
        if check.diagnosis:
            stderr_log(f"        {check.diagnosis}")
    b = judgment.baseline
    stderr_log(
        f"  baseline: {b.status.value}: {b.message}"
        + "".join(f"\n        {d}" for d in b.differences)
    )
    for error in judgment.errors:
        stderr_log(f"  ERROR: {error}")
    stderr_log(f"verdict: {judgment.verdict.icon} {judgment.verdict.value}  (report: {path})")
    return judgment.exit_code(cfg.fail_on)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from gate.calibrate import calibrate

    cfg = _load(args)
    out = _run_path(args.out, cfg)
    code = _route_to_gate_image(cfg, ["calibrate", "--out", str(out)], [out.parent], engine_runs=2)
    if code is not None:
        return code
    result, noise = calibrate(cfg, args.out, stderr_log)
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

    cfg = _load(args)
    if cfg.baseline is None:
        raise ConfigError(f"{cfg.source}: baseline: required to record a baseline")
    out = Path(cfg.baseline)
    if out.exists() and not args.overwrite:
        raise ConfigError(
            f"{out}: baseline already exists; `gate baseline update` overwrites it on purpose"
        )
    code = _baseline_in_gate_image(args, cfg, out)
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
        result, noise = calibrate(cfg, args.out, stderr_log)
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


def _baseline_in_gate_image(args: argparse.Namespace, cfg: GateConfig, out: Path) -> int | None:
    command = ["baseline", "update" if args.overwrite else "record"]
    writable, readable = [out.resolve().parent], ()
    if args.from_run:
        command += ["--from-run", str(args.from_run.resolve())]
        readable = (args.from_run.resolve(),)
    else:
        run = _run_path(args.out, cfg)
        command += ["--out", str(run)]
        writable.append(run.parent)
    return _route_to_gate_image(cfg, command, writable, readable, engine_runs=2)


def cmd_prepare(args: argparse.Namespace) -> int:
    from gate.replay import EngineJob, PreparedEngine

    cfg = _load(args)
    # In the image, `gate prepare` builds (or reuses) it, then finds both engine venvs in it.
    code = _route_to_gate_image(cfg, ["prepare"], engine_runs=0)
    if code is not None:
        return code
    environments = [
        PreparedEngine(EngineJob(e.name, e), cfg.docker, stderr_log).start()
        for e in cfg.engine_order
    ]
    try:
        for env in environments:
            env.wait()
            stderr_log(
                f"[{env.engine.name}] ready: {env.engine.spec} ({env.engine.runner}, {env.prepare_s:.0f}s)"
            )
    finally:
        for env in environments:
            env.cancel()
    return EXIT_OK


def cmd_prompts_freeze(args: argparse.Namespace) -> int:
    from gate.promptset import freeze_prompt_set

    out = freeze_prompt_set(args.file, args.name, args.description)
    print(out)
    return EXIT_OK


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines())


if __name__ == "__main__":
    sys.exit(main())
