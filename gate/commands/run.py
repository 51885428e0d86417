"""``gate run``, ``gate key``, ``gate check`` and ``gate prepare``: one old-vs-new run and its judgment."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

from gate.commands.common import (
    ImageRoute,
    Subparsers,
    add_config_args,
    config_from_args,
    indent,
    materialize_builtin_model,
    ready_for_engines,
    route_to_gate_image,
    run_path,
)
from gate.config import GateConfig, load_config
from gate.errors import EXIT_OK, ConfigError
from gate.files import INCOMPLETE_SUFFIX, RUN_FILE
from gate.runners.base import stderr_log
from gate.verdict import FAIL_ON

if TYPE_CHECKING:
    from gate.engine_jobs import EngineJob


def add_run(sub: Subparsers) -> None:
    run = sub.add_parser("run", help="replay through the old and the new engine, then judge")
    add_config_args(run)
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
        choices=FAIL_ON,
        help="exit 1 on this verdict or worse (default: config)",
    )
    run.add_argument(
        "--no-reuse",
        action="store_true",
        help="replay the old engine even when its stored evidence matches (it is stored afresh)",
    )
    run.add_argument(
        "--no-memory-check",
        action="store_true",
        help="run even when the memory plan says the run does not fit (it is still printed)",
    )
    run.set_defaults(func=cmd_run)


def add_key(sub: Subparsers) -> None:
    key = sub.add_parser(
        "key", help="print the old engine's evidence-cache key (for actions/cache)"
    )
    add_config_args(key)
    key.set_defaults(func=cmd_key)


def add_check(sub: Subparsers) -> None:
    check = sub.add_parser(
        "check", help="judge an existing run directory again (e.g. with other thresholds)"
    )
    check.add_argument("run_dir", type=Path)
    check.add_argument(
        "-c", "--config", type=Path, help="gate.yaml (default: the one the run used)"
    )
    check.add_argument("--fail-on", choices=FAIL_ON)
    check.set_defaults(func=cmd_check)


def add_prepare(sub: Subparsers) -> None:
    prepare = sub.add_parser(
        "prepare", help="build (or reuse) both engine environments without replaying"
    )
    add_config_args(prepare)
    prepare.set_defaults(func=cmd_prepare)


def cmd_run(args: argparse.Namespace) -> int:
    from gate.engine_jobs import default_jobs
    from gate.replay import run_gate

    cfg = config_from_args(args)
    ready_for_engines(cfg)
    jobs = default_jobs(cfg, args.only)
    plan = memory_plan_for(cfg, jobs, check=not args.no_memory_check)
    out = run_path(args.out, cfg)
    code = route_to_gate_image(cfg, run_image_route(args, out))
    if code is not None:
        print(out if out.exists() else out.with_name(out.name + INCOMPLETE_SUFFIX))
        return code
    # The evidence cache serves a whole old-vs-new run; --only asks for one engine on purpose.
    reuse = None if args.only else not args.no_reuse
    result = run_gate(cfg, args.out, stderr_log, jobs, reuse_old=reuse, memory_plan=plan)
    for engine in result.engines:
        stderr_log(
            f"  {engine.name}: {engine.spec}: {engine.status}"
            + (f": {engine.error}" if engine.error else "")
        )
    if result.status != "ok":
        failed = [e for e in result.engines if e.status != "ok"]
        for engine in failed:
            if engine.log_tail:
                stderr_log(f"--- {engine.name} log tail ---\n{indent(engine.log_tail)}")
        stderr_log(
            f"gate: error: {len(failed)} engine(s) could not produce evidence; partial run kept at {result.run_dir}"
        )
    code = judge_and_report(result.run_dir, cfg)
    print(result.run_dir)
    return code


def memory_plan_for(cfg: GateConfig, jobs: list[EngineJob], check: bool) -> dict:
    """Print the memory plan of ``jobs``; refuse (ConfigError, exit 2) a run that cannot fit unless
    ``check`` is off. Before any engine starts or any image is built: a refusal costs nothing."""
    from gate import memory_plan
    from gate.worker_request import load_prompts

    _, prompts = load_prompts(cfg)
    plan = memory_plan.plan_run(cfg, [job.engine for job in jobs], prompts)
    stderr_log(plan.table())
    if check:
        plan.check(cfg.source)
    elif not plan.fits():
        stderr_log("memory plan: does not fit; running anyway (--no-memory-check)")
    return plan.as_dict()


def run_image_route(args: argparse.Namespace, out: Path) -> ImageRoute:
    """``gate run`` in the gate image: it writes ``out``, and a whole run shares the evidence cache."""
    from gate.evidence_cache import cache_dir
    from gate.host import EVIDENCE_DIR_ENV

    command = ["run", "--out", str(out), *(["--only", args.only] if args.only else [])]
    command += [
        *(["--fail-on", args.fail_on] if args.fail_on else []),
        *(["--no-reuse"] if args.no_reuse else []),
        *(["--no-memory-check"] if args.no_memory_check else []),
    ]
    writable, environment = [out.parent], {}
    if not args.only:  # the host's evidence cache, at its own path: the image and the host share it
        evidence = cache_dir().resolve()
        writable.append(evidence)
        environment[EVIDENCE_DIR_ENV] = str(evidence)
    return ImageRoute(
        tuple(command), tuple(writable), engine_runs=1 if args.only else 2, environment=environment
    )


def cmd_key(args: argparse.Namespace) -> int:
    """The digest of everything the old engine's evidence depends on that is known before any install."""
    from gate import evidence_cache
    from gate.engine_jobs import default_jobs
    from gate.fingerprint import model_fingerprint
    from gate.old_evidence import evidence_key_groups
    from gate.worker_request import load_prompts

    cfg = config_from_args(args)
    if cfg.model.builtin is not None:  # its fingerprint is part of the key
        materialize_builtin_model(cfg)
    prompt_sets, prompts = load_prompts(cfg)
    groups = evidence_key_groups(
        cfg, default_jobs(cfg, "old")[0], prompt_sets, prompts, model_fingerprint(cfg.model.path)
    )
    print(f"gate-old-{evidence_cache.config_key(groups)}")
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    run_file = args.run_dir / RUN_FILE
    if not run_file.is_file():
        raise ConfigError(f"{run_file}: not a gate run directory")
    config = args.config or Path(json.loads(run_file.read_text())["config"])
    cfg = load_config(config)
    if args.fail_on:
        cfg = dataclasses.replace(cfg, fail_on=args.fail_on)
    return judge_and_report(args.run_dir, cfg)


def judge_and_report(run_dir: Path, cfg: GateConfig) -> int:
    """Judge ``run_dir``, write its report.json, log each check and the verdict; the exit code."""
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


def cmd_prepare(args: argparse.Namespace) -> int:
    from gate.engine_jobs import EngineJob, PreparedEngine

    cfg = config_from_args(args)
    ready_for_engines(cfg)
    # In the image, `gate prepare` builds (or reuses) it, then finds both engine venvs in it.
    code = route_to_gate_image(cfg, ImageRoute(("prepare",), engine_runs=0))
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
