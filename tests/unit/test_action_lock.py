"""action-requirements.txt, the action's hash-locked install, covers what the gate needs.

The action installs this file with ``pip install --require-hashes`` and then the gate with ``--no-deps``
(action.yml): a runtime dependency, a `docker` extra dependency or a build requirement that the lock
lacks, or pins outside pyproject.toml's range, fails here instead of on a user's runner. Regenerate
with ``python scripts/lock_action_requirements.py``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "action-requirements.txt"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# Every Python the project supports (requires-python >=3.10) on the platforms runners have.
PYTHONS = ["3.10", "3.11", "3.12", "3.13", "3.14"]
PLATFORMS = [("linux", "Linux"), ("darwin", "Darwin")]


def _entries() -> list[tuple[Requirement, list[str]]]:
    """(requirement, hashes) per lock entry; continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", LOCK.read_text())
    entries = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        hashes = re.findall(r"--hash=(\S+)", line)
        spec = re.sub(r"--hash=\S+", "", line).strip()
        entries.append((Requirement(spec), hashes))
    return entries


def _needed() -> list[Requirement]:
    deps = [*PYPROJECT["project"]["dependencies"], *PYPROJECT["project"]["optional-dependencies"]["docker"],
            *PYPROJECT["build-system"]["requires"]]  # fmt: skip
    return [Requirement(d) for d in deps]


def _environments() -> list[dict[str, str]]:
    envs = []
    for python in PYTHONS:
        for sys_platform, system in PLATFORMS:
            env = default_environment()
            env.update(python_version=python, python_full_version=f"{python}.0", sys_platform=sys_platform,
                       platform_system=system, implementation_name="cpython", platform_python_implementation="CPython")  # fmt: skip
            envs.append(env)
    return envs


def test_every_entry_is_pinned_and_hashed():
    entries = _entries()
    assert entries
    for req, hashes in entries:
        (spec,) = req.specifier
        assert spec.operator == "==", f"{req}: the lock pins exact versions"
        assert hashes and all(h.startswith("sha256:") for h in hashes), f"{req}: no sha256 hashes"


@pytest.mark.parametrize(
    "env", _environments(), ids=lambda e: f"{e['sys_platform']}-py{e['python_version']}"
)
def test_the_lock_covers_the_runtime_the_docker_extra_and_the_build(env):
    active = {}
    for req, _ in _entries():
        if req.marker is None or req.marker.evaluate(env):
            name = canonicalize_name(req.name)
            assert name not in active, f"two pins of {name} apply on {env['python_version']}"
            active[name] = next(iter(req.specifier)).version
    for need in _needed():
        if need.marker is not None and not need.marker.evaluate(env):
            continue
        name = canonicalize_name(need.name)
        assert name in active, (
            f"{need} (pyproject.toml) is not in {LOCK.name}: python scripts/lock_action_requirements.py"
        )
        assert need.specifier.contains(active[name], prereleases=True), (
            f"{LOCK.name} pins {name}=={active[name]}, outside {need}"
        )


def test_the_action_installs_from_the_lock_with_hashes_and_the_gate_without_deps():
    install = next(
        s
        for s in yaml.safe_load((REPO / "action.yml").read_text())["runs"]["steps"]
        if s.get("id") == "install"
    )
    script = install["run"]
    assert 'lock="$GATE_SRC/action-requirements.txt"' in script
    assert re.search(r"pip install .*--require-hashes -r ", script)
    # anything else pip installs comes without dependencies: nothing unhashed from the registry
    others = [
        line
        for line in script.splitlines()
        if "pip install" in line and "--require-hashes" not in line
    ]
    assert others and all(
        "--no-deps" in line and "--no-build-isolation" in line for line in others
    ), others


def test_the_local_runner_keeps_the_interpreter_s_packages_and_locks_the_rest(tmp_path):
    """runner: local installs only what the interpreter lacks (its vllm was built against its numpy),
    always setuptools (the build needs a recent one); the filter is the action's own heredoc."""
    install = next(
        s
        for s in yaml.safe_load((REPO / "action.yml").read_text())["runs"]["steps"]
        if s.get("id") == "install"
    )
    script = install["run"]
    start = script.index("<< 'EOF'\n") + len("<< 'EOF'\n")
    code = script[start : script.index("\nEOF\n", start)]
    proc = subprocess.run(
        [sys.executable, "-c", code, str(LOCK)], capture_output=True, text=True, check=True
    )
    kept = {
        canonicalize_name(Requirement(re.sub(r"--hash=\S+", "", line)).name): line
        for line in proc.stdout.splitlines()
    }
    assert "pyyaml" not in kept and "numpy" not in kept  # this interpreter has them
    assert "setuptools" in kept and "pywin32" in kept  # always / nobody here has it
    assert all("--hash=sha256:" in line for line in kept.values())  # entries keep their hashes
