"""The seam's contract (gate/contract): declared evidence keys, their axes, the engine record, the
schema version. What holds the two sides together is that neither spells a key itself."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest

from gate.contract import evidence as ev
from gate.contract import keys
from gate.contract.engine_record import EngineRecord, EngineRecordError

from ..factory import make_evidence

PACKAGE = Path(__file__).resolve().parents[2] / "gate"
# Names an evidence key could be spelled with: the declared ones and any of the RL passes' prefixes.
_KEY_PREFIXES = tuple(f"{p}_" for p in (keys.WS, keys.WSI, keys.GRPO))


def literal_keys(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """String literals in ``source`` that name an evidence array (line, text)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if keys.declared(text) is not None or (
                text.startswith(_KEY_PREFIXES) and text.replace("_", "").isalnum()
            ):
                found.append((node.lineno, text))
    return found


def _outside_contract() -> list[Path]:
    return [
        p for p in sorted(PACKAGE.rglob("*.py")) if "contract" not in p.relative_to(PACKAGE).parts
    ]


def test_no_module_outside_the_contract_spells_an_evidence_key():
    spelled = {
        f"{p.relative_to(PACKAGE)}:{line}": text
        for p in _outside_contract()
        for line, text in literal_keys(p.read_text(encoding="utf-8"), str(p))
    }
    # Names that are not evidence arrays although spelled like one: two summary.json sections, the
    # GRPO pass's time in engine.json's timings, and the prompt record's field
    # (PromptItem.prompt_token_ids, read from prompt sets). Listed so that a new one is a decision.
    allowed = {"grpo_mean_per_step", "grpo_per_seed", "grpo_s", keys.PROMPT_TOKEN_IDS}
    assert {k: v for k, v in spelled.items() if v not in allowed} == {}


def test_a_key_renamed_on_the_worker_side_fails_here():
    """The worker spelling a key of its own (as it did before the contract) is caught twice: the
    scan above finds the literal, and the worker's layout check refuses the array."""
    source = (PACKAGE / "worker" / "weight_sync.py").read_text(encoding="utf-8")
    assert "keys.WS_ENGINE_LOGPROB" in source
    renamed = source.replace("keys.WS_ENGINE_LOGPROB", '"ws_engine_logprobs"', 1)
    assert "ws_engine_logprobs" in [text for _, text in literal_keys(renamed)]
    arrays = {keys.WS_OFFSETS: np.array([0, 2]), "ws_engine_logprobs": np.zeros(2, np.float32)}
    with pytest.raises(
        ev.EvidenceError, match=r"ws_engine_logprobs: not an evidence key of schema 1"
    ):
        ev.check_layout(arrays, Path("evidence.npz"))


def test_every_declared_key_has_a_pass_and_an_axis_and_the_passes_are_known():
    assert keys.DECLARED
    for key in keys.DECLARED.values():
        assert key.passname in keys.PASSES and isinstance(key.axis, keys.Axis)
    assert keys.axis_of(keys.WSI_SWITCH_START) is keys.Axis.SEQUENCE
    assert keys.axis_of(keys.pass_key(keys.SAMPLE, keys.TOPK_IDS)) is keys.Axis.TOKEN
    assert keys.axis_of(keys.grpo_se_key("reward")) is keys.Axis.SEED_STEP
    with pytest.raises(KeyError, match="sample_nonsense: not an evidence key"):
        keys.axis_of("sample_nonsense")


def test_the_factory_builds_evidence_the_contract_accepts(tmp_path):
    e = make_evidence(tmp_path / "e")
    assert all(keys.declared(k) is not None for k in e.arrays)
    assert {k.passname for k in map(keys.declared, e.arrays)} >= {
        keys.SAMPLE,
        keys.WS,
        keys.WSI,
        keys.GRPO,
    }
    assert e.engine.schema_version == keys.EVIDENCE_SCHEMA_VERSION


@pytest.mark.parametrize(
    "key, rows, message",
    [
        (
            keys.WS_TRAINER_NEW_LOGPROB,
            63,
            r"ws_trainer_new_logprob: 63 rows, expected 64 \(tokens\)",
        ),
        (keys.WSI_SWITCH_END, 3, r"wsi_switch_end: 3 rows, expected 4 \(sequences\)"),
        (keys.WS_BEFORE_TRAINER_LOGPROB, 5, r"ws_before_\w+: \d+ rows, expected \d+ \(tokens\)"),
    ],
)
def test_an_array_off_its_axis_is_refused_naming_it(tmp_path, key, rows, message):
    e = make_evidence(tmp_path / "e")
    e.arrays[key] = e.arrays[key][:rows]
    with pytest.raises(ev.EvidenceError, match=message):
        ev.validate(e)


def test_grpo_arrays_share_one_seeds_by_steps_grid(tmp_path):
    e = make_evidence(tmp_path / "e")
    e.arrays[keys.grpo_key("entropy")] = np.zeros((1, 5))
    with pytest.raises(ev.EvidenceError, match=r"grpo_\*: \[seeds, steps\] shapes differ"):
        ev.validate(e)


def test_evidence_of_another_schema_version_is_refused_with_what_to_do(tmp_path):
    e = make_evidence(tmp_path / "e")
    record = json.loads((e.path / "engine.json").read_text())
    (e.path / "engine.json").write_text(json.dumps(record | {"schema_version": 2}))
    with pytest.raises(
        ev.EvidenceError,
        match=r"engine\.json: schema_version 2: .* schema 1 only; run the engine again",
    ):
        ev.load(e.path)
    # Written before the version was recorded: the same layout, read as version 1.
    (e.path / "engine.json").write_text(
        json.dumps({k: v for k, v in record.items() if k != "schema_version"})
    )
    assert ev.load(e.path).engine.schema_version == 1


def test_the_engine_record_names_the_file_and_field_it_refuses():
    with pytest.raises(
        EngineRecordError,
        match=r"^run/engine\.json: Expected `object`, got `array` - at `\$\.weight_sync`$",
    ):
        EngineRecord.from_json({"weight_sync": []}, "run/engine.json")
    with pytest.raises(
        EngineRecordError, match=r"Expected `int \| null`, got `bool` - at `\$\.order_seed`"
    ):
        EngineRecord.from_json({"order_seed": True})
    with pytest.raises(EngineRecordError, match=r"got `int` - at `\$\.identity\.vllm`"):
        EngineRecord.from_json({"identity": {"vllm": 32}})
    with pytest.raises(EngineRecordError, match="expected a JSON object"):
        EngineRecord.from_json([])


def test_sections_recorded_as_null_read_as_empty_and_absence_keeps_its_meaning():
    record = EngineRecord.from_json({"weight_sync": None, "grpo": None, "identity": None})
    assert record.weight_sync == {} and record.grpo == {} and record.identity.vllm is None
    assert record.batch_invariance is None  # the pass did not run
    assert record.default_sampling_params is None  # a release that records none: unknown defaults


def test_the_worker_side_refuses_a_key_the_record_does_not_declare():
    with pytest.raises(TypeError, match="weight_sync_typo"):
        EngineRecord.from_worker({"identity": {"vllm": "0.32.0"}, "weight_sync_typo": {}})
    record = EngineRecord.from_worker({"identity": {"vllm": "0.32.0"}, "grpo": None})
    assert record.grpo == {}
    assert EngineRecord.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_the_identity_fingerprint_leaves_out_machine_paths_and_unrecorded_fields():
    record = EngineRecord.from_json(
        {"identity": {"vllm": "0.32.0", "executable": "/venv/bin/python"}}
    )
    assert record.identity.fingerprint() == {"vllm": "0.32.0"}


def test_run_json_and_a_baseline_manifest_are_checked_against_their_records(tmp_path):
    """run.json and manifest.json may come from elsewhere (an artifact, a hand edit): a field of
    the wrong type is one line naming the file and the field, exit code 2, not a KeyError later."""
    from gate.errors import ConfigError
    from gate.run_record import BaselineManifest, checked, read_run_manifest

    run = {"model": {"sha256": "a"}, "prompt_sets": [{"name": "p", "sha256": "b", "records": "20"}]}
    (tmp_path / "run.json").write_text(json.dumps(run))
    with pytest.raises(
        ConfigError,
        match=r"run\.json: Expected `int`, got `str` - at `\$\.prompt_sets\[0\]\.records`",
    ):
        read_run_manifest(tmp_path)
    run["prompt_sets"][0]["records"] = 20
    run["engines"] = {"new": {"spec": "vllm==0.34.0", "status": "ok", "worker_s": 1.5}}
    (tmp_path / "run.json").write_text(json.dumps(run))
    assert read_run_manifest(tmp_path) == run  # readers take the JSON object, checked
    manifest = {"schema": 1, **run, "engine": {"identity": {"vllm": 34}}}
    with pytest.raises(ConfigError, match=r"manifest\.json: .* - at `\$\.engine\.identity\.vllm`"):
        checked(manifest, BaselineManifest, "manifest.json")
