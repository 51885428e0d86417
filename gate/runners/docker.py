"""Run an engine's worker in the user's own image (e.g. the one their trainer runs).

The image holds vLLM; gate's code is mounted read-only at ``/opt/gate-worker`` and put on
PYTHONPATH, so nothing is installed into the image and the orchestrator stays on the host. The
request files, the engine's output folder, a local model, a hook file and the engine's own
PYTHONPATH folders are mounted at their host paths. Both engines in the gate image instead (no
``image``) is :mod:`gate.docker.bundle`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gate.config import DockerConfig, EngineConfig
from gate.contract.request import WorkerRequest
from gate.errors import DockerError, EngineError
from gate.runners.base import OutputLog, Runner, WorkerOutcome
from gate.runners.venv import gate_package_dir

WORKER_ROOT = Path("/opt/gate-worker")


class DockerRunner(Runner):
    kind = "docker"

    def __init__(self, docker_cfg: DockerConfig) -> None:
        super().__init__()
        self.docker_cfg = docker_cfg
        self._client: Any = None

    def python(self, engine: EngineConfig) -> str:
        return engine.python

    def prepare(self, engine: EngineConfig, log) -> None:
        from gate.docker.client import connect

        if not engine.image:
            raise EngineError(
                engine.name, "runner docker needs engines.<name>.image for a per-engine container"
            )
        try:
            self._client = connect()
            _get_or_pull(self._client, engine.image, log, engine.name)
        except DockerError as exc:
            raise EngineError(engine.name, str(exc), exc.log_tail) from None

    def environment(self, engine: EngineConfig) -> dict:
        # The image id is a digest of its content: a re-tagged or rebuilt image is another environment.
        return {
            "kind": "docker",
            "image": engine.image,
            "image_id": self._client.images.get(engine.image).id,
            "python": engine.python,
            "gpus": self.docker_cfg.gpus,
        }

    def worker_env(self, engine: EngineConfig) -> dict[str, str]:
        paths = [
            str(WORKER_ROOT),
            *[p for p in engine.env.get("PYTHONPATH", "").split(os.pathsep) if p],
        ]
        return {"PYTHONPATH": os.pathsep.join(paths)}

    def run_worker(
        self,
        engine: EngineConfig,
        request_paths: Sequence[Path],
        log_path: Path,
        timeout_s: float,
        log,
    ) -> WorkerOutcome:
        import time

        from gate.docker.container import plan_for, run_container

        requests = [WorkerRequest.read(p) for p in request_paths]
        env = {**engine.env, **self.worker_env(engine)}
        command = [self.python(engine), "-m", "gate.worker", *map(str, request_paths)]
        plan = plan_for(
            self.docker_cfg,
            engine.image or "",
            command,
            worker_mounts(engine, requests, request_paths),
            env,
            purpose=f"worker-{engine.name}",
            engines=[engine],
        )
        log_path.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        with open(log_path, "a", encoding="utf-8") as log_file:
            log_file.write(f"$ docker run {engine.image} {' '.join(command)}\n")
            output = OutputLog(log_file, engine.name, log)
            try:
                result = run_container(self._client, plan, timeout_s, output.feed)
            except DockerError as exc:
                raise EngineError(
                    engine.name, f"{exc} (log: {log_path})", exc.log_tail or output.tail_text()
                ) from None
        if result.status_code != 0 or result.oom_killed:
            reason = result.describe(self.docker_cfg.memory) if result.oom_killed else None
            reason = reason or output.last_error or result.describe(self.docker_cfg.memory)
            raise EngineError(
                engine.name, f"{reason} (image {engine.image}; log: {log_path})", output.tail_text()
            )
        return WorkerOutcome(engine.name, log_path, time.perf_counter() - start)


def worker_mounts(
    engine: EngineConfig, requests: list[WorkerRequest], request_paths: Sequence[Path]
) -> list:
    from gate.docker.mounts import Mount, pythonpath_dirs

    mounts = [Mount(gate_package_dir(), target=WORKER_ROOT / "gate")]
    mounts += [Mount(Path(p).parent, writable=True) for p in request_paths]
    for request in requests:
        mounts.append(Mount(Path(request.output_dir), writable=True))
        for value in (request.model, request.tokenizer):
            if value and Path(value).is_absolute():
                mounts.append(Mount(Path(value)))
        hook = request.weight_sync.hook if request.weight_sync else None
        if hook and hook.rpartition(":")[0].endswith(".py"):
            mounts.append(Mount(Path(hook.rpartition(":")[0])))
    mounts += [Mount(p) for p in pythonpath_dirs(engine.env)]
    return mounts


def _get_or_pull(client: Any, name: str, log, engine: str) -> None:
    import docker

    try:
        client.images.get(name)
        return
    except docker.errors.ImageNotFound:
        log(f"[{engine}] pulling {name}")
    try:
        client.images.pull(name)
    except docker.errors.APIError as exc:
        raise DockerError(
            f"engines.{engine}.image: '{name}' is not here and cannot be pulled: {exc.explanation or exc}"
        ) from None
