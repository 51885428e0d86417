"""A gate command run inside the gate image: both engines and the judgment in one container.

The host builds (or reuses) the image, mounts every path the config names at the same absolute
path (read-only) plus the folders the command writes, and runs the same command inside with the
``venv`` runner, which finds the engine venvs the image was built with. The container's exit
code is the command's (0 PASS, 1 FAIL, 2 usage, 3 ERROR); anything else is an ERROR here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from gate.config import GateConfig
from gate.errors import EXIT_ERROR, ConfigError, DockerError

# Start-up, install checks and judgment on top of the engines' own timeouts.
_CONTAINER_OVERHEAD_S = 900


def uses_gate_image(cfg: GateConfig) -> bool:
    """True when the command should run in the gate image: both engines on docker, neither with its own image."""
    docker_engines = [e for e in cfg.engine_order if e.runner == "docker"]
    if not docker_engines:
        return False
    own = [e.name for e in docker_engines if e.image]
    if own and len(own) == len(docker_engines):
        return False  # per-engine containers from the user's images; the orchestrator stays here
    if len(docker_engines) == 2 and not own:
        return True
    lacking = next(e.name for e in docker_engines if not e.image)
    raise ConfigError(
        f"{cfg.source}: engines.{lacking}.image: required here; runner docker without an image runs both engines "
        "in the gate image, so set runner: docker on both engines or give this engine its own image"
    )


def run_in_gate_image(
    cfg: GateConfig,
    argv: list[str],
    writable: list[Path],
    engine_runs: int,
    log: Callable[[str], None],
    readable: tuple[Path, ...] = (),
    environment: dict[str, str] | None = None,
) -> int:
    """Run ``gate <argv>`` in the gate image for ``cfg``; returns its exit code.

    The config's own paths are mounted read-only, ``readable`` too (e.g. a run to record from),
    ``writable`` read-write (created first).
    """
    from gate.docker.client import connect
    from gate.docker.container import plan_for, run_container
    from gate.docker.image import ensure_image
    from gate.docker.mounts import Mount, config_paths

    client = connect()
    image = ensure_image(client, cfg, log)
    for folder in writable:
        folder.mkdir(parents=True, exist_ok=True)
    mounts = [Mount(p) for p in (*config_paths(cfg), *readable)] + [
        Mount(p, writable=True) for p in writable
    ]
    plan = plan_for(
        cfg.docker,
        image,
        argv,
        mounts,
        environment or {},
        purpose=argv[0],
        engines=cfg.engine_order,
    )
    log(f"[docker] gate {argv[0]} in {image} (gpus: {_gpus(cfg.docker.gpus)})")
    timeout = engine_runs * cfg.timeout_s + _CONTAINER_OVERHEAD_S
    result = run_container(
        client, plan, timeout, on_line=lambda line: print(line, file=sys.stderr, flush=True)
    )
    if result.oom_killed or result.status_code not in range(0, EXIT_ERROR + 1):
        raise DockerError(result.describe(cfg.docker.memory), result.tail)
    return result.status_code


def _gpus(gpus: str | tuple[str, ...]) -> str:
    return gpus if isinstance(gpus, str) else ",".join(gpus)
