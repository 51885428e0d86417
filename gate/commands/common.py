"""What the commands share: the config arguments, loading the config, logging, and gate-image routing.

:func:`route_to_gate_image` is the one place that decides whether an engine-running command runs
here or re-runs itself in the gate image; every command that takes ``--runner`` (except ``gate
key``, which only reads the config) calls it before it starts an engine, so none can take a docker
config to the per-engine runner, which needs an image per engine (tests/unit/test_docker_plan.py
checks each one).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

from gate.config import (
    BUILTIN_CONFIG,
    RUNNER_KINDS,
    GateConfig,
    check_gpus_fit,
    check_no_credentials,
    load_config,
)
from gate.docker import bundle
from gate.render.escape import no_workflow_commands
from gate.runners.base import stderr_log

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Command: TypeAlias = Callable[[argparse.Namespace], int]


# -- the config arguments ------------------------------------------------------------------------


def add_config_args(p: argparse.ArgumentParser) -> None:
    """``-c/--config``, ``--old``, ``--new``, ``--runner``: every command that builds engines takes them."""
    p.add_argument(
        "-c",
        "--config",
        type=Path,
        default=None,
        help=f"gate.yaml (default: the built-in CPU default, {BUILTIN_CONFIG.name})",
    )
    p.add_argument("--old", metavar="SPEC", help="override the old engine's pip spec")
    p.add_argument("--new", metavar="SPEC", help="override the new engine's pip spec")
    p.add_argument("--runner", choices=RUNNER_KINDS, help="override both engines' runner")


def config_from_args(args: argparse.Namespace) -> GateConfig:
    """The config ``--config`` names (or the built-in one) with the command line's overrides applied.

    No side effects (no process, no file): a command that starts engines calls
    :func:`ready_for_engines` before it does.
    """
    cfg = load_config(args.config or BUILTIN_CONFIG)
    engines = dict(cfg.engines)
    for name, spec in (("old", args.old), ("new", args.new)):
        if spec:
            # The config's own check, for overrides: a spec is logged and stored in run.json.
            check_no_credentials(spec, "command line", f"--{name}")
            engines[name] = dataclasses.replace(engines[name], spec=spec)
    if args.runner:
        engines = {n: dataclasses.replace(e, runner=args.runner) for n, e in engines.items()}
    cfg = dataclasses.replace(cfg, engines=engines)
    if getattr(args, "fail_on", None):
        cfg = dataclasses.replace(cfg, fail_on=args.fail_on)
    return cfg


def ready_for_engines(cfg: GateConfig) -> None:
    """What this machine must have before a command installs or starts an engine: every engine's
    ranks fit the GPUs it will see (nvidia-smi), and ``model.builtin``'s folder.

    A command that re-runs in the gate image (:func:`route_to_gate_image`) converts the model
    there, so no engine venv is built on this host for it; the GPU check is cheap and refuses
    before an image is built.
    """
    check_gpus_fit(cfg)
    if cfg.model.builtin is not None and not bundle.uses_gate_image(cfg):
        materialize_builtin_model(cfg)


def materialize_builtin_model(cfg: GateConfig) -> None:
    """Convert ``model.builtin`` into its folder (cfg.model.path) unless an intact one is there.

    The conversion needs torch and transformers, which live in the engine environments: it runs
    in the old engine's venv (built now if needed; the run reuses it), or in this Python for the
    local runner.
    """
    from gate.models import BUILTIN_MODELS, materialize
    from gate.runners.venv import ensure_venv, gate_package_dir

    engine = cfg.engines["old"]
    if engine.runner == "local":
        python, gate_src = sys.executable, gate_package_dir().parent
    else:
        venv, gate_src = ensure_venv(
            engine.name, engine.spec, engine.pip_args, stderr_log, engine.installer
        )
        python = str(venv / "bin" / "python")
    assert cfg.model.builtin is not None
    materialize(BUILTIN_MODELS[cfg.model.builtin], python, gate_src, stderr_log)


def run_path(out: Path | None, cfg: GateConfig) -> Path:
    """The run directory a command creates: ``--out``, else ``runs/<time>-<gate_id>``; absolute."""
    from gate.rundir import default_path

    return (out or default_path(cfg.gate_id)).resolve()


# -- logging -------------------------------------------------------------------------------------


def log_untrusted(message: str) -> None:
    """A line on stderr that may quote untrusted text (a report, an engine's output).

    The Actions runner parses a step's output for workflow commands, and the job may hold a write
    token: no line of the message may read as one.
    """
    print(no_workflow_commands(message), file=sys.stderr, flush=True)


def indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines())


# -- the gate image ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageRoute:
    """A command as it re-runs in the gate image: its own arguments and the host folders it uses.

    Host paths are mounted at the same absolute paths, so ``command`` names them as the host does.
    """

    command: tuple[str, ...]  # the subcommand and its arguments; the config arguments are added
    writable: tuple[Path, ...] = ()  # mounted read-write (created first)
    readable: tuple[Path, ...] = ()  # mounted read-only beside the config's own paths
    engine_runs: int = 2  # engine replays the command makes: they size the container's timeout
    environment: Mapping[str, str] = field(default_factory=dict)


def route_to_gate_image(cfg: GateConfig, route: ImageRoute) -> int | None:
    """Run ``route`` in the gate image when ``cfg`` asks for it and return its exit code; None: run here.

    Inside, the same command runs with this config, its engine specs and the venv runner, which
    finds the venvs the image was built with.
    """
    if not bundle.uses_gate_image(cfg):
        return None
    old, new = cfg.engines["old"].spec, cfg.engines["new"].spec
    argv = [*route.command, "-c", cfg.source, "--runner", "venv", "--old", old, "--new", new]
    return bundle.run_in_gate_image(
        cfg,
        argv,
        list(route.writable),
        route.engine_runs,
        stderr_log,
        route.readable,
        dict(route.environment),
    )
