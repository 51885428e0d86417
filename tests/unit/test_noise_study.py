"""scripts/noise_study.py's configuration and tables, and the engine patch's fault list, without engines."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from types import ModuleType

import pytest

from tests.conftest import REPO

PATCHES = REPO / "tests" / "faults" / "engine_patches"


@pytest.fixture(scope="module")
def study() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "noise_study", REPO / "scripts" / "noise_study.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_each_phase_puts_the_fault_on_top_of_the_noise(study):
    assert study.noise_env(0.0) == {}
    phases = {p.name: p for p in study._phases(0.03, (0.01, 0.04), temperature=True)}
    assert list(phases) == ["aa", "clean", "noise+0.04", "temperature"]  # 0.01 < 0.03: not tried
    assert phases["aa"].new_env is None  # the new engine is the old one
    assert phases["clean"].new_env["GATE_FAULT"] == "logit_noise"
    # independent Gaussian noise adds in quadrature: 0.03 on both engines, 0.04 more on the new one
    assert float(phases["noise+0.04"].new_env["GATE_NOISE_SIGMA"]) == pytest.approx(
        math.hypot(0.03, 0.04)
    )
    temperature = phases["temperature"].new_env
    assert temperature["GATE_FAULT"] == "logit_noise,temperature_scale"
    assert temperature["GATE_FAULT_TEMPERATURE_FACTOR"] == "1.02"
    at_zero = {p.name: p for p in study._phases(0.0, (0.01,), temperature=True)}
    assert (
        at_zero["clean"].new_env == {}
        and at_zero["temperature"].new_env["GATE_FAULT"] == "temperature_scale"
    )


def _phase(name, flagged, fail=0, fault=None, by_check=None):
    kind = "null" if name in ("aa", "clean") else "fault"
    return {"phase": name, "kind": kind, "fault": fault, "seeds": 40, "fail": fail, "warn": flagged - fail,
            "flagged": flagged, "errors": 0, "by_check": by_check or {}}  # fmt: skip


def test_the_level_finds_the_smallest_fault_flagged_in_95_percent(study):
    results = [_phase("aa", 1, by_check={"greedy-and-length": {"WARN": 1}}), _phase("clean", 0),
               _phase("noise+0.02", 30, fault=0.02), _phase("noise+0.05", 38, fault=0.05),
               _phase("noise+0.1", 40, fault=0.1)]  # fmt: skip
    design = {
        "runs": 3,
        "pairs": 3,
        "false_alarm_rate": 0.05,
        "metrics": {"mean_abs_drift": {"floor": 3e-3}},
    }
    level = study._level(0.01, design, results)
    assert level["smallest_noise_fault_detected"] == 0.05  # 38 of 40 = 95%
    assert level["null_ok"]  # FAIL 0, WARN 1 of 40 <= 5%
    assert not study._level(0.01, design, [_phase("aa", 3)])["null_ok"]  # 3 of 40 WARN > 5%
    result = {"seeds": 40, "need": 0.95, "temperature_factor": 1.02, "levels": [level]}
    table = study.noise_table(result).splitlines()
    assert table[2] == (
        "| 0.01 | 3 starts, 5% per floor | 0 / 1 of 40 (greedy-and-length 1 WARN) | 0 / 0 of 40 | 0.05 | - |"
    )


def _import_patch(faults: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(PATCHES), "GATE_FAULT": faults}
    code = "import sys; print(sorted(f.name for f in sys.meta_path if type(f).__name__ == '_PatchOnImport'))"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def test_the_engine_patch_combines_faults_and_refuses_what_it_cannot_apply():
    both = _import_patch("logit_noise, temperature_scale")
    assert both.returncode == 0 and both.stdout.strip() == "['logit_noise', 'temperature_scale']", (
        both.stderr
    )
    unknown = _import_patch("logit_noise,typo")
    assert unknown.returncode != 0 and "GATE_FAULT='typo': unknown fault" in unknown.stderr
    twice = _import_patch("logit_noise,logit_noise")
    assert twice.returncode != 0 and "two faults patch the same module" in twice.stderr


def test_the_real_model_study_is_the_example_cut_to_a_studys_size(study, tmp_path):
    """--model smollm2: examples/smollm2-cpu.yaml with the first 6 single-turn and 6 multi-turn
    conversations of its chat set (frozen again, so the replays are pinned to the cut), completions
    of 32 tokens, the RL passes off, its own gate id, both engines under the level's noise."""
    cfg = study._config(tmp_path / "sigma-0.03", None, tmp_path / "baseline", "smollm2")
    assert cfg.gate_id == "smollm2-cpu-noise-study"
    assert (
        cfg.model.builtin == "smollm2-135m-instruct"
        and cfg.engines["new"].engine_args["dtype"] == "bfloat16"
    )
    assert not cfg.weight_sync.enabled and not cfg.grpo.enabled
    assert study._size(cfg) == {
        "prompts": 12,
        "n": 4,
        "max_tokens": 32,
        "temperature": 0.8,
        "top_p": 0.9,
    }
    _, items = study.load_prompts(cfg)
    turns = [len(item.messages) for item in items]
    assert all(t == 1 for t in turns[:6]) and all(t > 1 for t in turns[6:]), turns
    old, new = cfg.engines["old"].env, cfg.engines["new"].env
    assert old == new and old.items() >= study.noise_env(0.03).items()
    assert old["VLLM_CPU_KVCACHE_SPACE"] == "1"  # the example's own engine settings stay
    # the default keeps the tiny model and its own prompt sets
    default = study._config(tmp_path / "sigma-0", None, tmp_path / "baseline")
    assert default.gate_id != cfg.gate_id and default.model.builtin is None
