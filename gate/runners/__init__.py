"""Runners: how an engine environment is prepared and how the worker is started inside it.

``local`` uses the current interpreter, ``venv`` a cached virtual environment per engine spec.
All return the same :class:`~gate.runners.base.WorkerOutcome`; failures become EngineError.
"""

from __future__ import annotations

from gate.config import EngineConfig
from gate.errors import ConfigError
from gate.runners.base import Runner


def get_runner(engine: EngineConfig) -> Runner:
    if engine.runner == "local":
        from gate.runners.local import LocalRunner

        return LocalRunner()
    if engine.runner == "venv":
        from gate.runners.venv import VenvRunner

        return VenvRunner()
    raise ConfigError(f"engines.{engine.name}.runner: '{engine.runner}' is not available in this version of gate")
