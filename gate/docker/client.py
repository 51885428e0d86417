"""Connecting to the Docker daemon through the Docker SDK for Python."""

from __future__ import annotations

from typing import Any

from gate.errors import ConfigError, DockerError

# Every container gate starts carries this label, so leftovers can be found (and tests can prove
# there are none).
MANAGED_LABEL = "io.github.vllm-upgrade-gate.managed"


def connect() -> Any:
    """A ``docker.DockerClient`` for the daemon the environment points at (DOCKER_HOST or the socket)."""
    try:
        import docker
    except ImportError:
        raise ConfigError(
            "runner docker needs the Docker SDK for Python: pip install 'vllm-upgrade-gate[docker]'"
        ) from None
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise DockerError(
            f"cannot reach the Docker daemon ({exc}); is dockerd running and DOCKER_HOST right?"
        ) from None
    return client


def managed_containers(client: Any) -> list:
    """Containers gate started that still exist (running or not)."""
    return client.containers.list(all=True, filters={"label": MANAGED_LABEL})
