"""The setting-meaning table and config-parity's comparison by meaning, against hand-made engines.

Each case states what vLLM does, read off the release's source (cited in gate/analysis/setting_meaning.py).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gate.analysis.setting_meaning import (
    OFF,
    EngineFacts,
    Meaning,
    meaning,
    parse_version,
    restore_advice,
)
from gate.checks.config_parity import compare
from gate.checks.context import Context
from gate.config.checks_section import parse_settings
from gate.contract.engine_record import EngineRecord
from gate.judge import run_checks
from gate.verdict import Status

from ..factory import RUN, make_evidence

V0 = EngineFacts("V0", (0, 8, 5), {})
V1_OLD = EngineFacts("V1", (0, 9, 2), {})
V1 = EngineFacts("V1", (0, 32, 0), {"dtype": "float32"})
UNKNOWN_ENGINE = EngineFacts(None, None, {})


@pytest.mark.parametrize(
    "raw, expected",
    [("0.10.2", (0, 10, 2)), ("0.10.2+cpu", (0, 10, 2)), ("v0.11.0rc1", (0, 11, 0)), ("1", (1,)),
     (None, None), ("dev", None)],
)  # fmt: skip
def test_parse_version(raw, expected):
    assert parse_version(raw) == expected


@pytest.mark.parametrize(
    "key, value, engine, expected",
    [
        # logprobs_mode: V0 ignores the field (reads the V1 default) and reports processed logprobs
        ("logprobs_mode", None, V0, "processed_logprobs"),
        ("logprobs_mode", "raw_logprobs", V0, "processed_logprobs"),
        ("logprobs_mode", None, V1_OLD, "raw_logprobs"),
        ("logprobs_mode", "processed_logprobs", V1, "processed_logprobs"),
        ("logprobs_mode", "LogprobsMode.PROCESSED_LOGPROBS", V1, "processed_logprobs"),
        ("logprobs_mode", "RAW_LOGPROBS", V1, "raw_logprobs"),
        ("logprobs_mode", "processed_logits", V1, "processed_logits"),
        # async scheduling: V0 has none; a release without the field schedules synchronously
        ("async_scheduling", None, V0, False),
        ("async_scheduling", True, V0, False),
        ("async_scheduling", None, V1, False),
        ("async_scheduling", True, V1, True),
        ("async_scheduling", False, V1, False),
        ("enable_prefix_caching", True, V1, True),
        # top-k off: -1 in old releases, 0 in new ones, None = SamplingParams' default
        ("default_sampling_params.top_k", -1, V1, OFF),
        ("default_sampling_params.top_k", 0, V1, OFF),
        ("default_sampling_params.top_k", None, V1, OFF),
        ("default_sampling_params.top_k", 20, V1, 20),
        # SamplingParams' default; 0.33 reads it from generation_config.json too
        ("default_sampling_params.skip_special_tokens", None, V1, True),
        ("default_sampling_params.skip_special_tokens", False, V1, False),
        ("model_runner", "V2", V1, "V2"),
        ("default_sampling_params.top_p", 1.0, V1, OFF),
        ("default_sampling_params.top_p", None, V1, OFF),
        ("default_sampling_params.top_p", 0.9, V1, 0.9),
        ("default_sampling_params.min_p", 0, V1, OFF),
        ("default_sampling_params.min_p", 0.05, V1, 0.05),
        ("default_sampling_params.repetition_penalty", 1.0, V1, OFF),
        ("default_sampling_params.repetition_penalty", 1.1, V1, 1.1),
        ("default_sampling_params.presence_penalty", 0.0, V1, OFF),
        ("default_sampling_params.frequency_penalty", None, V1, OFF),
        ("default_sampling_params.temperature", None, V1, 1.0),
        ("default_sampling_params.temperature", 0.7, V1, 0.7),
        ("default_sampling_params.max_tokens", None, V1, 16),
        ("default_sampling_params.seed", None, V1, None),
        # spellings of dtypes and compilation modes
        ("dtype", "torch.float32", V1, "float32"),
        ("dtype", "float", V1, "float32"),
        ("dtype", "half", V1, "float16"),
        ("dtype", "torch.bfloat16", V1, "bfloat16"),
        ("kv_cache_dtype", "auto", V1, "float32"),
        ("kv_cache_dtype", "fp8", V1, "fp8_e4m3"),
        ("kv_cache_dtype", "fp8_e5m2", V1, "fp8_e5m2"),
        ("compilation_mode", 3, V1, "vllm_compile"),
        ("compilation_mode", "PIECEWISE", V1, "vllm_compile"),
        ("compilation_mode", "CompilationMode.VLLM_COMPILE", V1, "vllm_compile"),
        ("compilation_mode", "DYNAMO_ONCE", V1, "dynamo_trace_once"),
        ("compilation_mode", 0, V1, "none"),
        ("attention_backend", None, V1, "auto"),
        ("attention_backend", "FLASH_ATTN", V1, "flash_attn"),
        ("logits_processors", [], V1, None),
        ("logits_processors", None, V1, None),
        ("logits_processors", ["m:P"], V1, ["m:P"]),
        ("override_generation_config", {}, V1, None),
        (
            "override_generation_config",
            {"top_k": -1, "top_p": 1.0},
            V1,
            None,
        ),  # the defaults: no override
        ("override_generation_config", {"top_k": 20, "top_p": 1.0}, V1, {"top_k": 20}),
        ("generation_config_overrides", {"repetition_penalty": 1.0}, V1, None),
        (
            "generation_config_overrides",
            {"repetition_penalty": 1.3},
            V1,
            {"repetition_penalty": 1.3},
        ),
        ("generation_config_overrides", {"max_new_tokens": 5}, V1, {"max_new_tokens": 5}),
        ("dropped_engine_args", [], V1, None),
        ("quantization", None, V1, None),
        ("some_new_setting", 3, V1, 3),
    ],
)
def test_known_meanings(key, value, engine, expected):
    m = meaning(key, value, engine)
    assert m.known and m.value == expected, m


@pytest.mark.parametrize(
    "key, value, engine",
    [
        ("logprobs_mode", None, V1),  # a V1 release that has the field never records None
        ("logprobs_mode", None, UNKNOWN_ENGINE),
        ("enable_prefix_caching", None, V1),
        ("dtype", None, V1),
        ("kv_cache_dtype", None, V1),
        ("kv_cache_dtype", "auto", UNKNOWN_ENGINE),  # "auto" without the model dtype
        ("compilation_mode", None, V1),
        ("generation_config_overrides", None, V1),  # a release without get_diff_sampling_param
        ("some_new_setting", None, V1),
    ],
)
def test_unknown_meanings(key, value, engine):
    assert not meaning(key, value, engine).known


def test_a_value_of_an_unexpected_type_compares_as_given():
    assert meaning("default_sampling_params.top_k", "many", V1) == Meaning("many")


def test_restore_advice_states_the_old_meaning():
    assert restore_advice("async_scheduling", Meaning(False)) == (
        "pass async_scheduling=False to keep the scheduling path of the baseline"
    )
    assert "logprobs_mode='processed_logprobs'" in restore_advice(
        "logprobs_mode", Meaning("processed_logprobs")
    )
    assert "generation_config='vllm'" in restore_advice(
        "default_sampling_params.top_k", Meaning(OFF)
    )
    assert (
        restore_advice("max_num_seqs", Meaning(256))
        == "pin it in engine_args (max_num_seqs=256 on the old engine)"
    )


# --- config-parity by meaning ---------------------------------------------------------------


def _meta(generation="V1", version="0.32.0", effective=None, dsp=None, **extra) -> dict:
    eff = {"logprobs_mode": "processed_logprobs", "async_scheduling": False, "enable_prefix_caching": False,
           "dtype": "float32", "kv_cache_dtype": "auto"}  # fmt: skip
    eff.update(effective or {})
    meta = {"identity": {"engine_generation": generation, "vllm": version}, "effective": eff,
            "default_sampling_params": {"top_k": 0, "top_p": 1.0, "temperature": 1.0} if dsp is None else dsp,
            "generation_config_overrides": {}, "dropped_engine_args": []}  # fmt: skip
    meta.update(extra)
    return meta


def _parity(tmp_path: Path, old_meta: dict, new_meta: dict, acknowledge=()):
    ctx = Context(
        new=_evidence(tmp_path / "new", new_meta, 2), old=_evidence(tmp_path / "old", old_meta, 1),
        run=copy.deepcopy(RUN), acknowledge=frozenset(acknowledge),
    )  # fmt: skip
    return next(
        r for r in run_checks(ctx, parse_settings({}, "gate.yaml")) if r.id == "config-parity"
    )


def _evidence(folder: Path, meta: dict, seed: int):
    e = make_evidence(folder, seed=seed)
    full = json.loads((folder / "engine.json").read_text())
    full.update(meta)
    e.engine = EngineRecord.from_json(full, folder / "engine.json")
    return e


def test_v0_old_engine_against_an_equivalent_v1_passes(tmp_path):
    # V0 records neither logprobs_mode nor async_scheduling; it reports processed logprobs and
    # schedules synchronously, as the new engine is told to: nothing changed in meaning.
    old = _meta("V0", "0.8.5", effective={"logprobs_mode": None, "async_scheduling": None},
                dsp={"top_k": -1, "top_p": 1.0, "temperature": 1.0})  # fmt: skip
    r = _parity(tmp_path, old, _meta())
    assert set(r.details["same_meaning"]) == {
        "logprobs_mode",
        "async_scheduling",
        "default_sampling_params.top_k",
    }
    # The generation itself did change (policy: warn), and that is the only finding.
    assert {m.name: m.status for m in r.measurements if m.status != Status.PASS} == {
        "engine_generation": Status.WARN
    }
    assert set(r.details["diff"]) == {"engine_generation"}
    assert (
        "async_scheduling=False" not in r.diagnosis
    )  # never advise what the new engine already does


def test_v0_against_raw_logprobs_fails_with_a_fix_that_makes_sense(tmp_path):
    old = _meta("V0", "0.8.5", effective={"logprobs_mode": None, "async_scheduling": None})
    new = _meta(effective={"logprobs_mode": "raw_logprobs", "async_scheduling": True})
    r = _parity(tmp_path, old, new, acknowledge=["engine_generation"])
    status = {m.name: m.status for m in r.measurements}
    assert status["logprobs_mode"] == Status.FAIL and status["async_scheduling"] == Status.FAIL
    assert "pass logprobs_mode='processed_logprobs'" in r.diagnosis
    assert "pass async_scheduling=False" in r.diagnosis
    assert r.status == Status.FAIL


def test_top_k_spelled_minus_one_and_zero_is_the_same(tmp_path):
    old = _meta(version="0.10.2", dsp={"top_k": -1, "top_p": 1.0, "temperature": 1.0})
    r = _parity(tmp_path, old, _meta())
    assert r.status == Status.PASS and "spelled differently" in r.summary
    assert r.details["same_meaning"]["default_sampling_params.top_k"]["meaning"] == OFF
    real = _meta(dsp={"top_k": 50, "top_p": 1.0, "temperature": 1.0})
    r = _parity(tmp_path / "b", old, real)
    assert (
        r.status == Status.FAIL
        and "default_sampling_params.top_k changed 'off' -> 50" in r.diagnosis
    )


def test_a_setting_without_meaning_warns_not_comparable(tmp_path):
    old = _meta(effective={"enable_prefix_caching": None})
    r = _parity(tmp_path, old, _meta())
    m = next(m for m in r.measurements if m.name == "enable_prefix_caching")
    assert m.status == Status.WARN and "not comparable: old has no such setting" in m.note
    assert r.status == Status.WARN
    r = _parity(tmp_path / "ack", old, _meta(), acknowledge=["enable_prefix_caching"])
    assert r.status == Status.PASS


def test_no_default_sampling_params_recorded_is_not_comparable(tmp_path):
    old = _meta(dsp={})
    old["default_sampling_params"] = None
    r = _parity(tmp_path, old, _meta(dsp={"top_k": 20}))
    m = next(m for m in r.measurements if m.name == "default_sampling_params.top_k")
    assert m.status == Status.WARN and "no default sampling params" in m.note


def test_advice_follows_the_direction_of_the_change(tmp_path):
    # An old engine with async scheduling on and a new one without: restore True, not False.
    r = _parity(tmp_path, _meta(effective={"async_scheduling": True}), _meta())
    assert (
        "pass async_scheduling=True" in r.diagnosis and "async_scheduling=False" not in r.diagnosis
    )


def test_kv_auto_equals_the_model_dtype(tmp_path):
    r = _parity(tmp_path, _meta(effective={"kv_cache_dtype": "float32"}), _meta())
    assert r.status == Status.PASS
    r = _parity(tmp_path / "b", _meta(), _meta(effective={"kv_cache_dtype": "fp8"}))
    assert r.status == Status.FAIL and "'float32' -> 'fp8_e4m3'" in r.diagnosis


def test_compare_lists_every_raw_difference():
    diffs = compare(*(EngineRecord.from_json(_meta(effective={"seed": s})) for s in (0, 1)))
    assert [(d.key, d.same_meaning) for d in diffs] == [("seed", False)]


def test_an_override_to_the_default_is_no_change(tmp_path):
    new = _meta(override_generation_config={"top_k": -1})
    new["effective"]["override_generation_config"] = {"top_k": -1}
    new["generation_config_overrides"] = {"top_k": -1}
    r = _parity(tmp_path, _meta(generation_config_overrides={}), new)
    assert r.status == Status.PASS, r.diagnosis
    new["generation_config_overrides"] = {"top_k": 40}
    r = _parity(tmp_path / "b", _meta(), new)
    assert r.status == Status.WARN and "pass generation_config='vllm'" in r.diagnosis
