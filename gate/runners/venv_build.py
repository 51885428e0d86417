"""How an engine environment is built: one venv per pip spec, keyed by a hash.

Standard library only, and runnable as a plain file, because this is the one recipe both the
``venv`` runner (imported) and the Dockerfile (``python3 venv_build.py SPEC``, copied in alone so
the engine layers rebuild only when the recipe changes) use; the image and the runner cannot
drift apart.

A venv lives under ``$GATE_CACHE_DIR/venvs/<name>-<hash>/`` (default ``~/.cache/gate``), keyed by
the pip spec, the extra pip arguments, the Python version and the fix-up revision.
``gate-venv.json`` is written last: a folder without it is a broken install and is rebuilt.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Callable

# Bump when the install recipe changes, so cached venvs built the old way are not reused.
FIXUP_REVISION = 1
STAMP = "gate-venv.json"
# PyPI's torchvision/torchaudio/torchcodec beside a +cpu torch fail at import
# ("operator torchvision::nms does not exist"); vLLM runs text models without them.
BROKEN_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
PIP_MILESTONES = re.compile(r"^(Collecting|Successfully installed|ERROR:)")

Log = Callable[[str], None]
# run(cmd, env, log_path, what, echo): runs cmd with its output appended to log_path; raises on failure.
Run = Callable[[list[str], dict, Path, str, "re.Pattern | None"], None]


class VenvBuildError(Exception):
    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


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


def is_built(path: Path) -> bool:
    return (path / STAMP).is_file()


def build(name: str, spec: str, pip_args: tuple[str, ...], path: Path, run: Run, log: Log) -> dict:
    """Create the venv at ``path``, install ``spec``, repair what needs it; returns the stamp."""
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
        run([sys.executable, "-m", "venv", str(path)], env, log_path, "venv creation", None)
        run([py, "-m", "pip", "install", "--progress-bar", "off", spec, *pip_args], env, log_path,
            f"pip install {spec}", PIP_MILESTONES)  # fmt: skip
        removed = _apply_fixups(py, env, log_path, name, run, log)
        versions = _probe_versions(py, env, log_path)
    except BaseException:
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
    return stamp


def _apply_fixups(py: str, env: dict, log_path: Path, name: str, run: Run, log: Log) -> list[str]:
    """Probe, don't assume: remove the torch companions only where they fail to import."""
    probe = subprocess.run([py, "-c", "import torchvision"], env=env, capture_output=True, text=True)
    if probe.returncode == 0 or "No module named 'torchvision'" in probe.stderr:
        return []
    log(f"[{name}] torchvision fails to import beside this torch; removing {', '.join(BROKEN_COMPANIONS)}")
    run([py, "-m", "pip", "uninstall", "-y", *BROKEN_COMPANIONS], env, log_path, "pip uninstall", None)
    return list(BROKEN_COMPANIONS)


def _probe_versions(py: str, env: dict, log_path: Path) -> dict[str, str]:
    code = (
        "import json, numpy, torch, transformers, vllm; "
        "print(json.dumps({m.__name__: m.__version__ for m in (vllm, torch, transformers, numpy)}))"
    )
    proc = subprocess.run([py, "-c", code], env=env, capture_output=True, text=True)
    with open(log_path, "a", encoding="utf-8") as fh:
        fh.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise VenvBuildError(f"installed venv cannot import vllm: {last} (log: {log_path})", proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_plain(cmd: list[str], env: dict, log_path: Path, what: str, echo: re.Pattern | None) -> None:
    """The script-mode runner: output to ``log_path``, pip's milestones echoed to stderr."""
    tail: deque[str] = deque(maxlen=25)
    with open(log_path, "a", encoding="utf-8") as log_file:
        log_file.write(f"$ {shlex.join(cmd)}\n")
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        assert proc.stdout is not None
        for line in proc.stdout:
            log_file.write(line)
            tail.append(line.rstrip("\n"))
            if echo is not None and echo.match(line):
                print(line.rstrip("\n")[:160], file=sys.stderr, flush=True)
        rc = proc.wait()
    if rc != 0:
        raise VenvBuildError(f"{what} exited with code {rc} (log: {log_path})", "\n".join(tail))


def parse_cli(argv: list[str] | None, prog: str, description: str) -> tuple[str, tuple[str, ...], str]:
    """``SPEC [--pip-args "ARGS"] [--name NAME]`` -> (spec, pip_args, name); shared by both entry points."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("spec")
    parser.add_argument("--pip-args", default="", help="extra pip arguments, one shell-quoted string")
    parser.add_argument("--name", default="engine")
    args = parser.parse_args(argv)
    return args.spec, tuple(shlex.split(args.pip_args)), args.name


def main(argv: list[str] | None = None) -> int:
    """``python3 venv_build.py SPEC [--pip-args "ARGS"]``: build the venv for SPEC unless built; print its path."""
    spec, pip_args, name = parse_cli(argv, "venv_build.py", main.__doc__)
    path = venv_path(spec, pip_args)
    if not is_built(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            build(name, spec, pip_args, path, run_plain, lambda m: print(m, file=sys.stderr, flush=True))
        except VenvBuildError as exc:
            print(f"error: {exc}\n{exc.log_tail}", file=sys.stderr)
            return 3
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
