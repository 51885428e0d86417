"""config-parity's rows for the sampling defaults a server fills in (gate/analysis/server_defaults.py)."""

from __future__ import annotations

from gate.analysis.server_defaults import findings
from gate.contract.engine_record import EngineRecord
from gate.verdict import Status

SAMPLING = {"n": 4, "temperature": 0.7, "top_p": 1.0, "top_k": 0, "max_tokens": 32}


def _meta(applied: dict, confirmed: bool = True) -> EngineRecord:
    return EngineRecord(mode="server", server={"applied_defaults": applied, "effective_confirmed": confirmed,
                        "reported_defaults_source": "the model's `generation_config.json`"})  # fmt: skip


def test_offline_engines_give_no_rows():
    assert findings(EngineRecord(), EngineRecord(), SAMPLING) == []


def test_a_default_the_trainer_does_not_apply_fails_naming_generation_config_and_the_fix():
    [found] = findings(None, _meta({"top_k": 20}), SAMPLING)
    assert (
        found.measurement.status == Status.FAIL
        and found.measurement.name == "server_defaults.top_k"
    )
    assert "generation_config" in found.problem and "--generation-config vllm" in found.problem


def test_a_default_equal_to_the_trainers_transform_passes():
    [found] = findings(None, _meta({"temperature": 0.7, "top_k": -1}), SAMPLING)[:1]
    assert found.measurement.status == Status.PASS and found.problem == ""
    assert all(
        f.measurement.status == Status.PASS for f in findings(None, _meta({"top_k": -1}), SAMPLING)
    )


def test_a_repetition_penalty_the_trainer_does_not_know_fails():
    [found] = findings(None, _meta({"repetition_penalty": 1.3}), SAMPLING)
    assert found.measurement.status == Status.FAIL


def test_a_changed_default_between_engines_warns_and_unconfirmed_parameters_warn():
    rows = findings(_meta({"max_tokens": 16}), _meta({"max_tokens": 64}, confirmed=False), SAMPLING)
    by_name = {f.measurement.name: f for f in rows}
    assert by_name["server_defaults.changed.max_tokens"].measurement.status == Status.WARN
    assert by_name["server_defaults.unconfirmed"].measurement.status == Status.WARN
    assert (
        by_name["server_defaults.max_tokens"].measurement.status == Status.PASS
    )  # lengths, not logprobs
