"""The ``venv`` runner: one cached virtual environment per engine spec.

How a venv is built lives in :mod:`gate.runners.venv_build` (shared with the Dockerfile). This
module adds what a run needs on top: a file lock so two gate runs on one runner do not build the
same venv, and gate's own code copied in (no dependencies) and put on the worker's path, refreshed
whenever its content hash changes; engine dependencies are untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import threading
from pathlib import Path

from gate.config import EngineConfig
from gate.errors import EngineError
from gate.files import exclusive_lock, recover_swap, staged_folder
from gate.runners.base import Runner, run_logged, stderr_log
from gate.runners.venv_build import (
    STAMP,
    VenvBuildError,
    build,
    find_uv,
    is_built,
    parse_cli,
    venv_path,
)


def gate_package_dir() -> Path:
    return Path(__file__).resolve().parent.parent


def gate_source_hash() -> str:
    """Hash of the gate package's Python files: what the worker needs, not the shipped assets."""
    digest = hashlib.sha256()
    root = gate_package_dir()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


class VenvRunner(Runner):
    kind = "venv"

    def __init__(self) -> None:
        super().__init__()
        self._gate_src: dict[str, Path] = {}

    def python(self, engine: EngineConfig) -> str:
        return str(venv_path(engine.spec, engine.pip_args) / "bin" / "python")

    def prepare(self, engine: EngineConfig, log) -> None:
        self._gate_src[engine.name] = ensure_venv(
            engine.name, engine.spec, engine.pip_args, log, engine.installer, self.cancelled
        )[1]

    def environment(self, engine: EngineConfig) -> dict:
        path = venv_path(engine.spec, engine.pip_args)
        stamp = json.loads((path / STAMP).read_text())
        return {"kind": "venv", "packages": installed_packages(Path(stamp["site_packages"]))}

    def worker_env(self, engine: EngineConfig) -> dict[str, str]:
        env = {"PYTHONPATH": str(self._gate_src[engine.name])}
        # A uv-built venv has no pip, and vLLM's /server_info then lists packages with `uv pip list`
        # (vllm.collect_env): without uv on PATH it answers HTTP 500 and server mode cannot start.
        uv = find_uv()
        if uv:
            path = engine.env.get("PATH") or os.environ.get("PATH", "")
            env["PATH"] = os.pathsep.join([str(Path(uv).parent), path])
        return env


def ensure_venv(
    name: str,
    spec: str,
    pip_args: tuple[str, ...],
    log,
    installer: str = "auto",
    cancel: threading.Event | None = None,
) -> tuple[Path, Path]:
    """Build or reuse the venv for ``spec``; returns (venv, the gate code folder inside it)."""
    path = venv_path(spec, pip_args)
    path.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(
        path.with_name(path.name + ".lock")
    ):  # two gate runs must not build the same venv
        if not is_built(path):
            try:
                build(name, spec, pip_args, path, _runner_for(name, log, cancel), log, installer)
            except VenvBuildError as exc:
                raise EngineError(name, str(exc), exc.log_tail) from None
        return path, _sync_gate_package(path)


def installed_packages(site_packages: Path) -> list[str]:
    """``name==version`` of every distribution in a site-packages folder: what an install resolved to."""
    found = []
    for meta in site_packages.glob("*.dist-info"):
        name, _, version = meta.name[: -len(".dist-info")].partition("-")
        found.append(f"{name.lower().replace('_', '-')}=={version}")
    return sorted(found)


def _runner_for(name: str, log, cancel: threading.Event | None):
    def run(cmd, env, log_path: Path, what: str, echo: re.Pattern | None) -> None:
        def relay(line: str) -> None:
            if echo is not None and echo.match(line):
                log(f"[{name}] {line if len(line) <= 160 else line[:157] + '...'}")

        run_logged(
            cmd,
            env,
            log_path,
            timeout_s=3600,
            engine=name,
            what=what,
            log=log,
            line_hook=relay,
            cancel=cancel,
        )

    return run


def _sync_gate_package(path: Path) -> Path:
    """Copy this gate package (code only) into ``gate-src/<hash>/`` of the venv; returns that folder.

    One folder per content hash, so a worker that is running keeps its code while another gate
    version is copied in; the runner puts the folder on the worker's PYTHONPATH, and a ``.pth``
    file points at the newest one for manual use (``<venv>/bin/python -m gate.worker``).
    """
    digest = gate_source_hash()
    src = path / "gate-src" / digest
    recover_swap(src)
    if not (src / "gate" / "__init__.py").is_file():
        with staged_folder(src) as tmp:
            shutil.copytree(
                gate_package_dir(),
                tmp / "gate",
                ignore=shutil.ignore_patterns("__pycache__", "assets", "*.pyc"),
            )
        _prune_old_copies(src.parent, keep=src, max_kept=4)
    pth = Path(json.loads((path / STAMP).read_text())["site_packages"]) / "gate-src.pth"
    if (
        not pth.is_file() or pth.read_text() != f"{src}\n"
    ):  # an image's venv is read-only at run time
        pth.write_text(f"{src}\n")
    return src


def _prune_old_copies(root: Path, keep: Path, max_kept: int) -> None:
    copies = sorted(
        (p for p in root.iterdir() if p.is_dir() and p != keep),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in copies[max_kept - 1 :]:
        shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m gate.runners.venv SPEC [--pip-args ARGS]``: build (or reuse) a venv with gate's code; print its path."""
    args = parse_cli(argv, "python -m gate.runners.venv", main.__doc__)
    try:
        path, _ = ensure_venv(args.name, args.spec, args.pip_args, stderr_log, args.installer)
    except EngineError as exc:
        print(f"error: {exc}\n{exc.log_tail}", file=sys.stderr)
        return exc.exit_code
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
