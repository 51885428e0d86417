"""Host paths a container needs, bind-mounted at the same absolute path.

Same-path mounts keep every path in the config, the worker request and the report valid on both
sides, so nothing is rewritten. Read-only unless the container must write there (the run
directory's parent, a baseline being recorded).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gate.config import GateConfig


@dataclass(frozen=True)
class Mount:
    path: Path  # on the host
    writable: bool = False
    target: Path | None = None  # in the container; None: the same path (the default for inputs)


def config_paths(cfg: GateConfig) -> list[Path]:
    """Everything a gate command reads: the config file, model, prompt sets, baseline, hook, engine PYTHONPATHs."""
    paths = [Path(cfg.source)]
    for value in (cfg.model.path, cfg.model.tokenizer):
        if value and Path(value).is_absolute():  # a hub id is fetched into the mounted HF cache
            paths.append(Path(value))
    paths += [Path(m).parent for m in cfg.prompts]  # the manifest and the JSONL beside it
    if cfg.baseline and Path(cfg.baseline).exists():
        paths.append(Path(cfg.baseline))
    if cfg.weight_update.hook:
        module = cfg.weight_update.hook.rpartition(":")[0]
        if module.endswith(".py"):
            paths.append(Path(module))
    for engine in cfg.engine_order:
        paths += pythonpath_dirs(engine.env)
    return paths


def pythonpath_dirs(env: dict[str, str]) -> list[Path]:
    return [
        Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).is_absolute()
    ]


def normalize(mounts: list[Mount]) -> list[Mount]:
    """One mount per path, writable winning; drop a mount already inside a mount that grants as much.

    Mounts with their own target (the caches) are kept as they are.
    """
    best: dict[Path, bool] = {}
    kept = [m for m in mounts if m.target is not None]
    for m in mounts:
        path = m.path.resolve()
        if m.target is None and path.exists():
            best[path] = best.get(path, False) or m.writable
    for path, writable in sorted(best.items()):
        covered = any(
            other != path and path.is_relative_to(other) and (best[other] or not writable)
            for other in best
        )
        if not covered:
            kept.append(Mount(path, writable))
    return kept


def as_volumes(mounts: list[Mount]) -> dict[str, dict[str, str]]:
    """The SDK's ``volumes=`` mapping."""
    return {
        str(m.path): {"bind": str(m.target or m.path), "mode": "rw" if m.writable else "ro"}
        for m in mounts
    }
