"""The gate image (the root ``Dockerfile``): recipe, tag, build context, build and label checks.

An image is identified by what went into it: the base image (by content: its local image id, so a
tag that moved upstream and was pulled again is another recipe), both engine specs and pip
arguments, gate's code and the Dockerfile. The tag spells the specs out and ends in a digest of the
rest, so ``docker images`` says what an image holds, and a changed recipe never reuses a stale image.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate import __version__, host
from gate.config import GateConfig, check_no_credentials
from gate.errors import ConfigError, DockerError
from gate.host import cache_root
from gate.runners.venv import gate_package_dir, gate_source_hash

REPOSITORY = "gate-engines"
LABEL_PREFIX = "io.github.vllm-upgrade-gate"
LABEL_OLD, LABEL_NEW = f"{LABEL_PREFIX}.vllm-old", f"{LABEL_PREFIX}.vllm-new"
LABEL_PIP_OLD, LABEL_PIP_NEW = f"{LABEL_PREFIX}.pip-args-old", f"{LABEL_PREFIX}.pip-args-new"
# Build output worth showing live: the step headers and the venv recipe's own milestones.
_SHOWN = re.compile(r"^(Step \d+/\d+ :|\[(old|new)\] |ERROR|error: )")
# The classic builder colours a RUN's stderr (where venv_build.py writes its milestones) red.
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class ImageRecipe:
    base_image: str
    old_spec: str
    new_spec: str
    old_pip_args: tuple[str, ...] = ()
    new_pip_args: tuple[str, ...] = ()
    system_packages: tuple[str, ...] = ()
    base_image_id: str = (
        ""  # the base image's content digest (local image id); in the tag, not a build argument
    )

    @classmethod
    def from_config(cls, cfg: GateConfig, base_image_id: str = "") -> ImageRecipe:
        old, new = cfg.engines["old"], cfg.engines["new"]
        # The build arguments end up in the image's labels and history: the config's own check, again
        # for specs given on the command line (--old, --new).
        for engine in (old, new):
            check_no_credentials(engine.spec, cfg.source, f"engines.{engine.name}.spec")
            for i, arg in enumerate(engine.pip_args):
                check_no_credentials(arg, cfg.source, f"engines.{engine.name}.pip_args[{i}]")
        return cls(
            cfg.docker.base_image,
            old.spec,
            new.spec,
            old.pip_args,
            new.pip_args,
            cfg.docker.system_packages,
            base_image_id,
        )

    def build_args(self) -> dict[str, str]:
        return {
            "BASE_IMAGE": self.base_image,
            "SYSTEM_PACKAGES": " ".join(self.system_packages),
            "VLLM_OLD": self.old_spec,
            "VLLM_NEW": self.new_spec,
            "PIP_ARGS_OLD": shlex.join(self.old_pip_args),
            "PIP_ARGS_NEW": shlex.join(self.new_pip_args),
            "GATE_VERSION": __version__,
        }

    def tag(self, source_root: Path) -> str:
        payload = json.dumps(
            {
                **self.build_args(),
                "base_image_id": self.base_image_id,
                "gate": gate_source_hash(),
                "dockerfile": _sha256(source_root / "Dockerfile"),
            },
            sort_keys=True,
        )
        digest = hashlib.sha256(payload.encode()).hexdigest()[:12]
        return f"{REPOSITORY}:{_slug(self.old_spec)}--{_slug(self.new_spec)}-{digest}"[
            : len(REPOSITORY) + 1 + 128
        ]

    def expected_labels(self) -> dict[str, str]:
        return {
            LABEL_OLD: self.old_spec,
            LABEL_NEW: self.new_spec,
            LABEL_PIP_OLD: shlex.join(self.old_pip_args),
            LABEL_PIP_NEW: shlex.join(self.new_pip_args),
        }


def _slug(spec: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", spec).strip(".-")[:48]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_root() -> Path:
    """The gate checkout holding the Dockerfile: $GATE_SOURCE_DIR (the Action sets it to its own
    checkout), else the folder above the imported package (a checkout or an editable install)."""
    root = host.settings().source_dir or gate_package_dir().parent
    if not (root / "Dockerfile").is_file() or not (root / "pyproject.toml").is_file():
        raise DockerError(
            f"no gate Dockerfile in {root}; point GATE_SOURCE_DIR at a gate checkout, or build the image "
            "there (docker build, see the README) and set docker.image to it"
        )
    return root


def ensure_image(client: Any, cfg: GateConfig, log: Callable[[str], None]) -> str:
    """The gate image for ``cfg``: the one named in docker.image (checked), a cached build, or a new build."""
    if cfg.docker.image:
        check_labels(
            _get_or_pull(client, cfg.docker.image, "docker.image", cfg.source),
            ImageRecipe.from_config(cfg),
            cfg.source,
        )
        return cfg.docker.image
    recipe = recipe_for(client, cfg, log)
    root = source_root()
    tag = recipe.tag(root)
    if _exists(client, tag):
        log(f"[docker] reusing image {tag}")
        return tag
    build_image(client, recipe, root, tag, cfg.docker.build_network, log)
    return tag


def recipe_for(
    client: Any, cfg: GateConfig, log: Callable[[str], None] = lambda _: None
) -> ImageRecipe:
    """The recipe of the image ``cfg`` builds, with its base image resolved to the local image id.

    The build uses the base image found here (it pulls only what is missing), so the id of that
    image is what the tag must cover: pulling a moved tag, or a new digest in docker.base_image,
    makes another tag and a rebuild.
    """
    base = _get_or_pull(client, cfg.docker.base_image, "docker.base_image", cfg.source, log)
    return ImageRecipe.from_config(cfg, base_image_id=base.id)


def build_image(
    client: Any, recipe: ImageRecipe, root: Path, tag: str, network: str, log: Callable[[str], None]
) -> None:
    import docker

    log_path = cache_root() / "docker" / f"build-{tag.replace(':', '_')}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log(
        f"[docker] building {tag} from {recipe.base_image} (the engine venvs take a few minutes; log: {log_path})"
    )
    start = time.perf_counter()
    tail: deque[str] = deque(maxlen=40)
    with (
        tempfile.TemporaryDirectory(prefix="gate-build-") as context,
        open(log_path, "w", encoding="utf-8") as fh,
    ):
        _write_context(root, Path(context))
        try:
            stream = client.api.build(
                path=context,
                tag=tag,
                buildargs=recipe.build_args(),
                network_mode=network,
                rm=True,
                forcerm=True,
                pull=False,
                decode=True,
            )
            for chunk in stream:
                if "error" in chunk or "errorDetail" in chunk:
                    message = chunk.get("error") or chunk["errorDetail"].get(
                        "message", "build failed"
                    )
                    fh.write(message + "\n")
                    raise DockerError(
                        f"image build failed: {message.strip()} (log: {log_path})", "\n".join(tail)
                    )
                for line in _COLOUR.sub("", chunk.get("stream", "")).splitlines():
                    fh.write(line + "\n")
                    tail.append(line)
                    if _SHOWN.match(line):
                        log(f"[docker] {line[:160]}")
        except docker.errors.APIError as exc:
            raise DockerError(
                f"image build failed: {exc.explanation or exc} (log: {log_path})", "\n".join(tail)
            ) from None
    size_gb = client.images.get(tag).attrs.get("Size", 0) / 1e9
    log(f"[docker] built {tag} in {time.perf_counter() - start:.0f}s ({size_gb:.1f} GB)")


def _write_context(root: Path, context: Path) -> None:
    """Only what the Dockerfile copies: a checkout's venvs and caches never reach the daemon. The
    code is the running gate's own, the code the tag's digest was taken from."""
    shutil.copy2(root / "Dockerfile", context / "Dockerfile")
    shutil.copy2(root / "pyproject.toml", context / "pyproject.toml")
    shutil.copytree(
        gate_package_dir(), context / "gate", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )


def check_labels(image: Any, recipe: ImageRecipe, source: str) -> None:
    labels = image.labels or {}
    for key, expected in recipe.expected_labels().items():
        found = labels.get(key)
        if found != expected:
            field = {
                LABEL_OLD: "engines.old.spec",
                LABEL_NEW: "engines.new.spec",
                LABEL_PIP_OLD: "engines.old.pip_args",
                LABEL_PIP_NEW: "engines.new.pip_args",
            }[key]
            raise ConfigError(
                f"{source}: docker.image: image {image.tags[0] if image.tags else image.short_id} was built with "
                f"{key.rsplit('.', 1)[-1]}={found!r} but {field} is {expected!r}; rebuild it or drop docker.image"
            )


def _exists(client: Any, name: str) -> bool:
    import docker

    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def _get_or_pull(
    client: Any, name: str, field: str, source: str, log: Callable[[str], None] = lambda _: None
) -> Any:
    import docker

    try:
        return client.images.get(name)
    except docker.errors.ImageNotFound:
        log(f"[docker] pulling {name} ({field})")
    try:
        return client.images.pull(name)
    except docker.errors.APIError as exc:
        raise ConfigError(
            f"{source}: {field}: image '{name}' is not here and cannot be pulled: {exc.explanation or exc}"
        ) from None
