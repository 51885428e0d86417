"""Runners: how an engine environment is prepared and how the worker is started inside it.

``local`` uses the current interpreter, ``venv`` a cached virtual environment per engine spec,
``docker`` (with ``engines.<name>.image``) a container from the user's own image. All return the
same :class:`~gate.runners.base.WorkerOutcome`; failures become EngineError. Both engines on
docker without images run in the gate image instead: :mod:`gate.docker.bundle`.
"""

from __future__ import annotations

from gate.config import DockerConfig, EngineConfig
from gate.errors import ConfigError
from gate.runners.base import Runner


def get_runner(engine: EngineConfig, docker: DockerConfig | None = None) -> Runner:
    if engine.runner == "local":
        from gate.runners.local import LocalRunner

        return LocalRunner()
    if engine.runner == "venv":
        from gate.runners.venv import VenvRunner

        return VenvRunner()
    if engine.runner == "docker":
        from gate.runners.docker import DockerRunner

        return DockerRunner(docker or DockerConfig())
    raise ConfigError(
        f"engines.{engine.name}.runner: '{engine.runner}' is not available in this version of gate"
    )
