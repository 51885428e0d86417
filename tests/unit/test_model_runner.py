"""gate/worker/model_runner.py: which model runner an engine ran on, from its config or the
release's rule (the rule itself is held to each release's source in tests/compat; the live runner's
class on the real CPU engines in tests/integration/test_replay_engines.py)."""

from __future__ import annotations

import pytest

from gate.worker import model_runner as mr


class _Config:
    def __init__(self, answer):
        self._answer = answer

    @property
    def use_v2_model_runner(self) -> bool:
        if isinstance(self._answer, Exception):
            raise self._answer
        return self._answer


def test_the_engines_config_decides_where_it_has_the_property():
    assert mr.of_config(_Config(True)) == "V2"
    assert mr.of_config(_Config(False)) == "V1"
    # HiSparse with VLLM_USE_V2_MODEL_RUNNER=0 raises: the engine would not start that way
    assert mr.of_config(_Config(ValueError("HiSparse requires Model Runner V2"))) is None


@pytest.mark.parametrize(("v1", "v2", "per_engine", "env", "triton", "expected"), [
    (False, True, False, {}, True, "V2"),  # 0.34: V1 removed
    (True, False, False, {}, None, "V1"),  # before Model Runner V2
    (True, True, False, {}, True, "V1"),  # up to 0.21: opt-in
    (True, True, False, {"VLLM_USE_V2_MODEL_RUNNER": "1"}, True, "V2"),
    (True, True, True, {}, False, "V1"),  # 0.22-0.33 without Triton (the CPU wheels)
    (True, True, True, {}, True, None),  # 0.22-0.33 with Triton: per model, at start
    (True, True, True, {"VLLM_USE_V2_MODEL_RUNNER": "0"}, True, "V1"),
    (True, True, True, {"VLLM_USE_V2_MODEL_RUNNER": "true"}, False, "V2"),
    (False, False, False, {}, None, None),
])  # fmt: skip
def test_the_releases_rule_where_the_config_is_out_of_reach(
    monkeypatch, v1, v2, per_engine, env, triton, expected
):
    present = {mr._V1_MODULE: v1, mr._V2_MODULE: v2}
    monkeypatch.setattr(mr, "_module_exists", lambda name: present[name])
    monkeypatch.setattr(mr, "_decides_per_engine", lambda: per_engine)
    assert mr.by_release(env, has_triton=triton) == expected
    # a config without the property (before 0.22, from 0.34) falls back to the same rule
    monkeypatch.setattr(mr, "triton_present", lambda: triton)
    monkeypatch.setattr(mr.os, "environ", env)
    assert mr.of_config(object()) == expected
