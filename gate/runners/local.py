"""Run the worker with the current interpreter: for environments that already hold vLLM."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys

from gate.config import EngineConfig
from gate.errors import EngineError
from gate.runners.base import Runner


class LocalRunner(Runner):
    kind = "local"

    def prepare(self, engine: EngineConfig, log) -> None:
        if importlib.util.find_spec("vllm") is None:
            raise EngineError(
                engine.name,
                f"runner 'local' needs vllm in this interpreter ({sys.executable}); "
                "install it here or use runner: venv",
            )

    def python(self, engine: EngineConfig) -> str:
        return sys.executable

    def environment(self, engine: EngineConfig) -> dict:
        dists = importlib.metadata.distributions()
        return {
            "kind": "local",
            "packages": sorted({f"{d.metadata['Name'].lower()}=={d.version}" for d in dists}),
        }
