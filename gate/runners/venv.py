"""One cached virtual environment per engine spec.

A venv lives under ``$GATE_CACHE_DIR/venvs/<name>-<hash>/`` (default ``~/.cache/gate``), keyed by
the pip spec, extra pip arguments, the Python version and the fix-up revision, so CI can restore
the folder and reuse it. ``gate-venv.json`` is written last: a folder without it is a broken
install and is rebuilt. The gate package is copied in (no dependencies) and put on the path with
a ``.pth`` file, refreshed whenever its content hash changes; engine dependencies are untouched.
The Dockerfile builds its engine environments with this same module (``python -m gate.runners.venv``).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from gate.config import EngineConfig
from gate.errors import EngineError
from gate.runners.base import Runner, run_logged, stderr_log

# Bump when the install recipe changes, so cached venvs built the old way are not reused.
FIXUP_REVISION = 1
STAMP = "gate-venv.json"
# PyPI's torchvision/torchaudio/torchcodec beside a +cpu torch fail at import
# ("operator torchvision::nms does not exist"); vLLM runs text models without them.
_BROKEN_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
_PIP_ECHO = re.compile(r"^(Collecting|Successfully installed|ERROR:)")


def cache_root() -> Path:
    return Path(os.environ.get("GATE_CACHE_DIR") or Path.home() / ".cache" / "gate")


def venv_key(spec: str, pip_args: tuple[str, ...]) -> str:
    payload = json.dumps(
        {"spec": spec, "pip_args": list(pip_args), "python": sys.version_info[:2], "fixups": FIXUP_REVISION},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def venv_path(spec: str, pip_args: tuple[str, ...] = ()) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", spec)[:48]
    return cache_root() / "venvs" / f"{slug}-{venv_key(spec, pip_args)}"


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
        self._gate_src: dict[str, Path] = {}

    def python(self, engine: EngineConfig) -> str:
        return str(venv_path(engine.spec, engine.pip_args) / "bin" / "python")

    def prepare(self, engine: EngineConfig, log) -> None:
        self._gate_src[engine.name] = ensure_venv(engine.name, engine.spec, engine.pip_args, log)[1]

    def worker_env(self, engine: EngineConfig) -> dict[str, str]:
        return {"PYTHONPATH": str(self._gate_src[engine.name])}


def ensure_venv(name: str, spec: str, pip_args: tuple[str, ...], log) -> tuple[Path, Path]:
    """Build or reuse the venv for ``spec``; returns (venv, the gate code folder inside it)."""
    path = venv_path(spec, pip_args)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two gate runs on one runner must not build the same venv
        stamp = path / STAMP
        if not stamp.is_file():
            _build(name, spec, pip_args, path, log)
        return path, _sync_gate_package(path)


def _build(name: str, spec: str, pip_args: tuple[str, ...], path: Path, log) -> None:
    if path.exists():
        log(f"[{name}] removing incomplete venv {path}")
        shutil.rmtree(path)
    log_path = path.with_name(path.name + ".install.log")
    log_path.unlink(missing_ok=True)
    log(f"[{name}] creating venv for {spec} at {path} (first use; a few minutes)")
    start = time.perf_counter()
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONUNBUFFERED": "1"}
    py = str(path / "bin" / "python")
    try:
        _run([sys.executable, "-m", "venv", str(path)], env, log_path, name, "venv creation", log)
        _run([py, "-m", "pip", "install", "--progress-bar", "off", spec, *pip_args], env, log_path, name,
             f"pip install {spec}", log, echo=_PIP_ECHO)  # fmt: skip
        removed = _apply_fixups(py, env, log_path, name, log)
        versions = _probe_versions(py, env, log_path, name, log)
    except EngineError:
        shutil.rmtree(path, ignore_errors=True)
        raise
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    stamp = {
        "spec": spec,
        "pip_args": list(pip_args),
        "fixup_revision": FIXUP_REVISION,
        "removed_packages": removed,
        "versions": versions,
        "site_packages": site,
        "install_s": round(time.perf_counter() - start, 1),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (path / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
    log(f"[{name}] venv ready in {stamp['install_s']:.0f}s: {versions}")


def _run(cmd, env, log_path: Path, name: str, what: str, log, echo: re.Pattern | None = None) -> None:
    def relay(line: str) -> None:
        if echo is not None and echo.match(line):
            log(f"[{name}] {line if len(line) <= 160 else line[:157] + '...'}")

    run_logged(cmd, env, log_path, timeout_s=3600, engine=name, what=what, log=log, line_hook=relay)


def _apply_fixups(py: str, env: dict, log_path: Path, name: str, log) -> list[str]:
    """Probe, don't assume: remove the torch companions only where they fail to import."""
    probe = subprocess.run([py, "-c", "import torchvision"], env=env, capture_output=True, text=True)
    if probe.returncode == 0 or "No module named 'torchvision'" in probe.stderr:
        return []
    log(f"[{name}] torchvision fails to import beside this torch; removing {', '.join(_BROKEN_COMPANIONS)}")
    _run([py, "-m", "pip", "uninstall", "-y", *_BROKEN_COMPANIONS], env, log_path, name, "pip uninstall", log)
    return list(_BROKEN_COMPANIONS)


def _probe_versions(py: str, env: dict, log_path: Path, name: str, log) -> dict[str, str]:
    code = (
        "import json, numpy, torch, transformers, vllm; "
        "print(json.dumps({m.__name__: m.__version__ for m in (vllm, torch, transformers, numpy)}))"
    )
    proc = subprocess.run([py, "-c", code], env=env, capture_output=True, text=True)
    with open(log_path, "a", encoding="utf-8") as fh:
        fh.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise EngineError(name, f"installed venv cannot import vllm: {last} (log: {log_path})", proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _sync_gate_package(path: Path) -> Path:
    """Copy this gate package (code only) into ``gate-src/<hash>/`` of the venv; returns that folder.

    One folder per content hash, so a worker that is running keeps its code while another gate
    version is copied in; the runner puts the folder on the worker's PYTHONPATH, and a ``.pth``
    file points at the newest one for manual use (``<venv>/bin/python -m gate.worker``).
    """
    digest = gate_source_hash()
    src = path / "gate-src" / digest
    if not (src / "gate" / "__init__.py").is_file():
        tmp = src.with_name(f"{digest}.copying")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(gate_package_dir(), tmp / "gate", ignore=shutil.ignore_patterns("__pycache__", "assets", "*.pyc"))
        shutil.rmtree(src, ignore_errors=True)
        tmp.rename(src)
        _prune_old_copies(src.parent, keep=src, max_kept=4)
    site = Path(json.loads((path / STAMP).read_text())["site_packages"])
    (site / "gate-src.pth").write_text(str(src) + "\n")
    return src


def _prune_old_copies(root: Path, keep: Path, max_kept: int) -> None:
    copies = sorted((p for p in root.iterdir() if p.is_dir() and p != keep), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in copies[max_kept - 1 :]:
        shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m gate.runners.venv SPEC [--pip-arg ARG]``: build (or reuse) a venv, print its path."""
    parser = argparse.ArgumentParser(prog="python -m gate.runners.venv", description=main.__doc__)
    parser.add_argument("spec")
    parser.add_argument("--pip-arg", action="append", default=[])
    parser.add_argument("--name", default="engine")
    args = parser.parse_args(argv)
    try:
        path, _ = ensure_venv(args.name, args.spec, tuple(args.pip_arg), stderr_log)
    except EngineError as exc:
        print(f"error: {exc}\n{exc.log_tail}", file=sys.stderr)
        return exc.exit_code
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
