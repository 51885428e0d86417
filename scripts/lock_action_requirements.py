#!/usr/bin/env python3
"""Regenerate action-requirements.txt, the hash-locked install of the GitHub Action (action.yml).

The action installs exactly these files (``pip install --require-hashes``) and then the gate itself with
``--no-deps``: a compromised or yanked release of a dependency cannot reach the runner (and the PR's
write token) without a reviewed change to the lock. The lock covers pyproject.toml's runtime
dependencies, the ``docker`` extra (``runner: docker``) and the build backend (the gate is built
without an isolated build env, so setuptools comes from the lock too). One universal lock serves
every Python the project supports and every platform (uv records each platform's hashes).

Run after a change to the dependencies, or with ``--upgrade`` to move every pin to the newest release:

    python scripts/lock_action_requirements.py [--upgrade]

tests/unit/test_action_lock.py fails when the lock no longer covers pyproject.toml.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "action-requirements.txt"
# The registry the action installs from on a runner; this machine's pip/uv settings (local wheel
# folders, extra indexes, constraints) must not leak into a lock that GitHub runners use.
INDEX = "https://pypi.org/simple"


def main(argv: list[str]) -> int:
    uv = shutil.which("uv")
    if uv is None:
        print("uv is not installed (pip install uv)", file=sys.stderr)
        return 2
    pyproject = _load_toml((REPO / "pyproject.toml").read_text())
    build = pyproject["build-system"]["requires"]
    oldest = re.fullmatch(r">=\s*(\d+\.\d+)", pyproject["project"]["requires-python"].strip())
    if oldest is None:
        print("requires-python is not of the form >=X.Y", file=sys.stderr)
        return 2
    cmd = [
        uv, "pip", "compile", "--no-config", "--quiet",
        "pyproject.toml", "--extra", "docker",
        "-",  # the build backend's requirements, from stdin (a temp file's path would end up in the lock)
        "--universal", "--python-version", oldest.group(1),
        "--generate-hashes", "--index-url", INDEX,
        "--custom-compile-command", "python scripts/lock_action_requirements.py",
        "-o", LOCK.name,
        *argv,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
    return subprocess.run(
        cmd, cwd=REPO, env=env, input="\n".join(build) + "\n", text=True
    ).returncode


def _load_toml(text: str) -> dict[str, Any]:
    # tomllib is standard from Python 3.11; the lock is made by a maintainer, never on a runner.
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib.loads(text)
    raise SystemExit("scripts/lock_action_requirements.py needs Python 3.11 or later (tomllib)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
