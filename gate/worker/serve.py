"""The server's own process: decide the flags and settings inside it, then run vLLM's server module.

``python -m gate.worker.serve PLAN.json`` is what the worker starts in server mode. Which
engine arguments this release knows (``EngineArgs``' fields) and whether it runs on the CPU
platform are vLLM's answers, and asking them imports vLLM: 10 to 15 s on a 2-core runner. The
server's own module imports the same modules anyway, so this process asks, writes what it decided
to ``facts`` (the plain command it runs, dropped arguments, the environment it set and why), and
then runs ``vllm.entrypoints.openai.api_server`` as ``python -m`` would (:func:`runpy.run_module`
with the argument list of that command). The worker meanwhile imports its own vLLM, transformers
and tokenizer on another core instead of before the server could start.

The process is the API server itself: same pid, process group, environment and argument list as
the plain command, whose engine core vLLM starts exactly as it would for that command.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gate.files import atomic_write_text
from gate.host import parallel_ranks
from gate.worker.layout import (
    GateSetting,
    engine_environment,
    env_settings,
    one_step_prefill,
    with_engine_args,
)
from gate.worker.server import SERVER_MODULE, executor_in_engine_core, server_command

EXIT_BAD_ARGS = 2


@dataclass(frozen=True)
class LaunchPlan:
    """What the worker asks for (PLAN.json)."""

    model: str
    tokenizer: str | None
    engine_args: dict[str, Any]  # as requested (with the resolved revision)
    optional_engine_args: list[str]
    port: int
    extra_args: list[str]
    facts: str  # where this process writes LaunchFacts as JSON

    @classmethod
    def read(cls, path: Path) -> LaunchPlan:
        return cls(**json.loads(path.read_text(encoding="utf-8")))

    def write(self, path: Path) -> None:
        atomic_write_text(path, json.dumps(asdict(self), indent=2))


@dataclass(frozen=True)
class LaunchFacts:
    """What this process decided: the plain command it runs and the environment it set for it."""

    # python -m vllm.entrypoints.openai.api_server ...: engine.json server.command
    command: list[str]
    engine_args: dict[str, Any]
    dropped_engine_args: list[str]
    gate_settings: list[GateSetting]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LaunchFacts:
        settings = [GateSetting(**s) for s in data["gate_settings"]]
        return cls(data["command"], data["engine_args"], data["dropped_engine_args"], settings)


def decide(
    plan: LaunchPlan,
    python: str,
    known: set[str],
    on_cpu: bool,
    environ: Mapping[str, str],
    cpus: Sequence[int],
) -> LaunchFacts:
    """The server's flags and the environment the gate sets for it (ValueError: a bad argument)."""
    from gate.worker.engine import split_engine_args

    engine_args, dropped = split_engine_args(plan.engine_args, plan.optional_engine_args, known)
    settings = engine_environment(engine_args, on_cpu, environ, cpus)
    in_core = executor_in_engine_core(parallel_ranks(engine_args), on_cpu)
    if in_core is not None:
        settings.append(GateSetting(*in_core))
    settings += one_step_prefill(engine_args, on_cpu, known)
    engine_args = with_engine_args(engine_args, settings)
    command = server_command(
        python, plan.model, plan.tokenizer, engine_args, plan.port, plan.extra_args
    )
    return LaunchFacts(command, engine_args, dropped, settings)


def read_facts(path: Path) -> LaunchFacts | str | None:
    """The facts the server process wrote; its error message where it refused the plan; None when
    it wrote nothing (it has not got that far, or died first)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return str(data["error"]) if "error" in data else LaunchFacts.from_json(data)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m gate.worker.serve <plan.json>", file=sys.stderr)
        return EXIT_BAD_ARGS
    plan = LaunchPlan.read(Path(argv[0]))
    from gate.worker.engine import on_cpu_platform, supported_engine_args

    try:
        facts = decide(
            plan,
            sys.executable,
            supported_engine_args(),
            on_cpu_platform(),
            os.environ,
            sorted(os.sched_getaffinity(0)),
        )
    except ValueError as exc:
        atomic_write_text(Path(plan.facts), json.dumps({"error": str(exc)}))
        print(f"gate: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_ARGS
    for setting in env_settings(facts.gate_settings):
        os.environ[setting.name] = setting.value
    atomic_write_text(Path(plan.facts), json.dumps(asdict(facts), indent=2))
    print(f"$ {' '.join(facts.command)}", flush=True)
    # As `python -m SERVER_MODULE <flags>`: argv[0] becomes the module's path, __main__ its code.
    sys.argv = [SERVER_MODULE, *facts.command[3:]]
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
