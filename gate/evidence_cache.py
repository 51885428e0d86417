"""The old engine's evidence, kept between runs, so a pull request that leaves it unchanged
replays only the new engine.

An entry is keyed by everything that shapes what the old engine's worker writes:

- ``engine``: spec, pip arguments, runner, and the prepared environment's content (the resolved
  package versions of a venv, the image id of a container);
- ``engine_args`` and ``env`` (with the Python files on the engine's own PYTHONPATH);
- ``request``: the worker request without its output folder: prompts, sampling, greedy,
  teacher-forced, reference, weight-sync and GRPO settings, the weight-update hook;
- ``hook``: the hook file's sha256; ``inflight_hooks``: each in-flight hook file's; ``prompts``: each prompt set's sha256; ``model``: its fingerprint;
- ``worker``: the hash of the worker's code (gate.worker and what it imports, nothing else);
- ``device``: the device class (:mod:`gate.device`).

Layout::

    <cache>/<digest>/entry.json    the key, provenance, sha256 of every file
    <cache>/<digest>/files/        the engine folder of the run that made it

``<cache>`` is :func:`cache_dir`; keep it between runs (``actions/cache`` with ``gate key``).

Entries are written to a staging folder and swapped in (:func:`gate.files.staged_folder`), so a
reader sees a whole entry or none; an entry whose files no longer match their hashes is reported
and ignored, never trusted.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate import host
from gate.config import EngineConfig, GateConfig
from gate.device import device_class
from gate.files import recover_swap, staged_folder
from gate.fingerprint import model_fingerprint
from gate.promptset import PromptSet, sha256_file

ENTRY_FILE = "entry.json"
FILES_DIR = "files"
# Bump when the key's meaning changes, so entries keyed the old way are never matched.
KEY_VERSION = 1
# Files of an engine folder that are rewritten for each run rather than reused.
_PER_RUN = frozenset({"request.json"})

Log = Callable[[str], None]


@dataclass(frozen=True)
class EvidenceKey:
    groups: dict[str, Any]

    @property
    def digest(self) -> str:
        payload = json.dumps(
            {"key_version": KEY_VERSION, **self.groups}, sort_keys=True, default=str
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:32]

    def differences(self, other: dict[str, Any]) -> list[str]:
        """The groups whose value differs from ``other`` (a stored entry's groups)."""
        mine = json.loads(json.dumps(self.groups, sort_keys=True, default=str))
        return sorted(g for g in mine.keys() | other.keys() if mine.get(g) != other.get(g))


@dataclass(frozen=True)
class CachedEvidence:
    path: Path
    digest: str
    created: str
    source_run: str
    run_entry: dict[str, Any]  # the run.json engine entry of the run that made it

    def provenance(self) -> dict[str, str]:
        return {"key": self.digest, "created": self.created, "source_run": self.source_run}


def cache_dir() -> Path:
    """``$GATE_EVIDENCE_DIR``, else ``$GATE_CACHE_DIR/evidence`` (the gate image mounts the host's here)."""
    return host.settings().evidence_dir


def config_groups(
    cfg: GateConfig,
    engine: EngineConfig,
    request: dict[str, Any],
    prompt_sets: list[PromptSet],
    fingerprint: dict,
) -> dict[str, Any]:
    """Every key group that is known before the engine's environment is prepared."""
    # The output folder differs per run; the engine arguments have a group of their own; local
    # folders and the hook file count by content (below), not by where this checkout put them.
    request = {k: v for k, v in request.items() if k not in ("output_dir", "engine_args")}
    for field in ("model", "tokenizer"):
        if request.get(field) and Path(request[field]).is_dir():
            request[field] = "<local folder>"
    if request.get("weight_sync") and request["weight_sync"].get("hook"):
        request["weight_sync"] = {
            **request["weight_sync"],
            "hook": _hook_name(request["weight_sync"]["hook"]),
        }
    if request.get("lora") is None:  # off: keys made before LoRA mode existed stay valid
        request.pop("lora", None)
    elif request["lora"].get("hook"):
        request["lora"] = {**request["lora"], "hook": _hook_name(request["lora"]["hook"])}
    inflight = (request.get("weight_sync") or {}).get("inflight")
    if inflight:  # built-in names as they are; hooks by name here and by content below
        updates = [_hook_name(u) if ":" in u else u for u in inflight["updates"]]
        request["weight_sync"] = {
            **request["weight_sync"],
            "inflight": {**inflight, "updates": updates},
        }
    return {
        "engine": {
            "spec": engine.spec,
            "pip_args": list(engine.pip_args),
            "runner": engine.runner,
            "image": engine.image,
            "python": engine.python,
        },
        "engine_args": engine.engine_args,
        "env": {"values": engine.env, "pythonpath_code": _pythonpath_code(engine.env)},
        "request": request,
        "hook": _hook_hash(cfg.weight_update.hook),
        **({"lora_hook": _hook_hash(cfg.lora.hook)} if cfg.lora.hook else {}),
        "inflight_hooks": [_hook_hash(u) for u in cfg.weight_sync.inflight.updates if ":" in u],
        "prompts": sorted(p.sha256 for p in prompt_sets),
        "model": {
            "weights": _local_or_id(cfg.model.path, fingerprint),
            "tokenizer": _local_or_id(cfg.model.tokenizer, model_fingerprint(cfg.model.tokenizer))
            if cfg.model.tokenizer
            else None,
        },
        "worker": worker_code_hash(),
        "device": device_class(),
    }


def engine_key(config: dict[str, Any], environment: dict[str, Any]) -> EvidenceKey:
    return EvidenceKey({**config, "environment": environment})


def config_key(config: dict[str, Any]) -> str:
    """What ``gate key`` prints: a digest of the key groups known before any install.

    It changes with everything but the resolved environment, which only a prepared environment
    knows; a cache restored under it is then matched exactly, entry by entry.
    """
    return EvidenceKey(config).digest


def lookup(key: EvidenceKey, log: Log, root: Path | None = None) -> CachedEvidence | None:
    """The stored entry for ``key`` if it is whole and intact; a damaged one is reported and ignored."""
    path = (root or cache_dir()) / key.digest
    recover_swap(path)
    entry_path = path / ENTRY_FILE
    if not entry_path.is_file():
        return None
    try:
        entry = json.loads(entry_path.read_text(encoding="utf-8"))
        files: dict[str, str] = entry["files"]
        stale = key.differences(entry["key"])
        damaged = [
            name for name, digest in files.items() if not _intact(path / FILES_DIR / name, digest)
        ]
        extra = sorted(set(_list_files(path / FILES_DIR)) - set(files))
        result = CachedEvidence(
            path, key.digest, entry["created"], entry["source_run"], entry["run_entry"]
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log(f"[old] warning: ignoring cached evidence {path}: unreadable entry ({exc})")
        return None
    if stale or damaged or extra:
        what = (
            f"key groups {stale} differ"
            if stale
            else f"files changed since stored: {sorted(damaged + extra)}"
        )
        log(f"[old] warning: ignoring cached evidence {path}: {what}")
        return None
    return result


def store(
    key: EvidenceKey,
    engine_dir: Path,
    run_entry: dict[str, Any],
    source_run: Path,
    log: Log,
    root: Path | None = None,
) -> Path:
    """Keep ``engine_dir`` as the entry for ``key`` (replacing a damaged or older one)."""
    root = root or cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    final = root / key.digest
    with staged_folder(final, mode=0o700) as tmp:  # as tempfile.mkdtemp made it before
        shutil.copytree(
            engine_dir, tmp / FILES_DIR, ignore=lambda d, names: [n for n in names if n in _PER_RUN]
        )
        entry = {
            "key_version": KEY_VERSION,
            "key": json.loads(json.dumps(key.groups, sort_keys=True, default=str)),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "source_run": str(source_run),
            "run_entry": run_entry,
            "files": {
                name: sha256_file(tmp / FILES_DIR / name) for name in _list_files(tmp / FILES_DIR)
            },
        }
        (tmp / ENTRY_FILE).write_text(json.dumps(entry, indent=2) + "\n", encoding="utf-8")
    log(f"[old] evidence kept for later runs: {final}")
    return final


def restore(cached: CachedEvidence, dest: Path) -> None:
    """Copy the entry's files into ``dest`` (an engine folder that holds this run's request.json)."""
    shutil.copytree(cached.path / FILES_DIR, dest, dirs_exist_ok=True)


def worker_code_hash(package: Path | None = None) -> str:
    """sha256 of the worker package and every gate module it imports, by content.

    Only this code runs inside the engine environment; an edit to the orchestrator (checks,
    rendering) leaves stored evidence valid, an edit to anything the worker imports does not.
    """
    package = package or Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(worker_modules(package)):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def worker_modules(package: Path) -> set[Path]:
    """The files of ``gate.worker`` and, transitively, of the gate modules they import."""
    todo = [package / "__init__.py", *sorted((package / "worker").glob("*.py"))]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        for module in _gate_imports(path):
            parts = module.split(".")[1:]
            base = package.joinpath(*parts)
            todo += [base.with_suffix(".py"), base / "__init__.py"]
    return seen


def _gate_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] == "gate"
        ):
            found.add(node.module)
            found.update(
                f"{node.module}.{alias.name}" for alias in node.names
            )  # ``from gate import evidence``
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "gate")
    return found


def _local_or_id(model: str, fingerprint: dict) -> dict:
    """A local folder by its content fingerprint; a hub id by its name (the worker resolves it)."""
    if fingerprint.get("sha256"):
        return {k: fingerprint.get(k) for k in ("sha256", "method")}
    return {"hub_id": model}


def _hook_name(hook: str) -> str:
    """A hook as the key names it: a file's name without its folder, a module as it is."""
    module, _, func = hook.rpartition(":")
    return f"{Path(module).name if module.endswith('.py') else module}:{func}"


def _hook_hash(hook: str | None) -> str | None:
    if not hook:
        return None
    module, _, _ = hook.rpartition(":")
    # A module hook lives in the engine environment, which the "environment" group covers.
    return sha256_file(Path(module)) if module.endswith(".py") and Path(module).is_file() else None


def _pythonpath_code(env: dict[str, str]) -> dict[str, str]:
    """sha256 of each Python file on the engine's PYTHONPATH (logits processors, engine patches)."""
    hashes = {}
    for folder in filter(None, env.get("PYTHONPATH", "").split(os.pathsep)):
        root = Path(folder)
        if root.is_dir():
            for path in sorted(root.rglob("*.py")):
                if "__pycache__" not in path.parts:
                    hashes[str(path)] = sha256_file(path)
    return hashes


def _list_files(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _intact(path: Path, digest: str) -> bool:
    return path.is_file() and sha256_file(path) == digest
