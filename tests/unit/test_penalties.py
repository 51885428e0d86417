"""Sampling penalties (issue 26, class 7) on the orchestrator's side: the config, what run.json
records, and what the checks say when an engine's penalised logprobs leave the reference's. The
reference's arithmetic is in test_reference.py, the engines in test_faults.py (row 26f)."""

from __future__ import annotations

import copy

import pytest

from gate.checks.context import Context
from gate.config.checks_section import parse_settings
from gate.config.sections import SamplingConfig
from gate.errors import ConfigError
from gate.judge import run_checks
from gate.verdict import Status

from ..factory import RUN, make_evidence


def test_run_json_records_a_penalty_only_where_it_is_on():
    # A baseline matches a run on this mapping: one recorded before penalties existed stays comparable.
    assert "repetition_penalty" not in SamplingConfig().record()
    on = SamplingConfig(repetition_penalty=1.1, frequency_penalty=0.2).record()
    assert on["repetition_penalty"] == 1.1 and on["frequency_penalty"] == 0.2
    assert "presence_penalty" not in on


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("repetition_penalty", 0.0, "repetition_penalty: must be > 0"),
        ("presence_penalty", 2.5, "presence_penalty: must be in [-2, 2]"),
        ("frequency_penalty", -3.0, "frequency_penalty: must be in [-2, 2]"),
    ],
)
def test_penalties_out_of_vllms_range_are_refused_with_the_field_named(field, value, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        SamplingConfig(**{field: value}).validate("gate.yaml: sampling")


def _context(tmp_path, sampling: dict, new_offset: float = 0.0) -> Context:
    run = copy.deepcopy(RUN)
    run["sampling"].update(sampling)
    old = make_evidence(tmp_path / "old", seed=1)
    new = make_evidence(tmp_path / "new", seed=1, engine_noise=new_offset)
    return Context(new=new, old=old, run=run)


def test_with_a_penalty_on_temperature_one_is_no_longer_the_identity(tmp_path):
    plain = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}
    assert _context(tmp_path / "a", plain).transform_is_identity
    penalised = _context(tmp_path / "b", {**plain, "presence_penalty": 0.5})
    assert not penalised.transform_is_identity and penalised.penalties == {"presence_penalty": 0.5}


def test_a_mismatch_under_penalties_names_them_and_the_public_case(tmp_path):
    ctx = _context(tmp_path, {"repetition_penalty": 1.3}, new_offset=0.3)
    result = next(
        r for r in run_checks(ctx, parse_settings({}, "t")) if r.id == "train-inference-mismatch"
    )
    assert result.status == Status.FAIL
    assert (
        "penalties on (repetition_penalty 1.3)" in result.diagnosis
        and "vLLM #52461" in result.diagnosis
    )
    plain = _context(tmp_path / "plain", {}, new_offset=0.3)
    result = next(
        r for r in run_checks(plain, parse_settings({}, "t")) if r.id == "train-inference-mismatch"
    )
    assert result.status == Status.FAIL and "vLLM #52461" not in result.diagnosis
