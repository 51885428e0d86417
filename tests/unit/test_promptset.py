import json

import pytest

from gate.errors import ConfigError
from gate.promptset import load_prompt_set, sha256_file


def test_roundtrip_plain_and_chat(write_prompts):
    manifest = write_prompts([
        {"id": "a", "prompt": "1+1=", "reference": "2", "answer": "2"},
        {"id": "b", "messages": [{"role": "user", "content": "hi"}]},
    ])
    ps = load_prompt_set(manifest)
    assert [i.id for i in ps.items] == ["a", "b"]
    assert ps.items[1].messages == [{"role": "user", "content": "hi"}]
    assert ps.answers == ("2", None)
    assert ps.sha256 == sha256_file(ps.path)
    assert json.loads(manifest.read_text())["records"] == 2


def test_changed_file_is_refused(write_prompts):
    manifest = write_prompts([{"id": "a", "prompt": "1+1="}])
    data = manifest.with_name("set.jsonl")
    data.write_text(data.read_text().replace("1+1", "1+2"))
    with pytest.raises(ConfigError, match="does not match the frozen hash"):
        load_prompt_set(manifest)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"prompt": "x"}, "id: required string"),
        ({"id": "a"}, "exactly one of them is required"),
        ({"id": "a", "prompt": "x", "messages": []}, "exactly one of them is required"),
        ({"id": "a", "messages": [{"role": "user"}]}, "messages: must be a non-empty list"),
        ({"id": "a", "prompt": "x", "extra": 1}, "extra: unknown key"),
        ({"id": "a", "prompt": "x", "reference": 3}, "reference: must be a string"),
    ],
)
def test_bad_records_name_file_line_and_field(tmp_path, record, message):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "ok", "prompt": "fine"}) + "\n" + json.dumps(record) + "\n")
    from gate.promptset import freeze_prompt_set

    with pytest.raises(ConfigError) as info:
        freeze_prompt_set(path)
    assert f"{path}:2:" in str(info.value)
    assert message in str(info.value)


def test_duplicate_ids_and_missing_files(tmp_path, write_prompts):
    with pytest.raises(ConfigError, match="duplicate id 'a'"):
        write_prompts([{"id": "a", "prompt": "x"}, {"id": "a", "prompt": "y"}])
    with pytest.raises(ConfigError, match="manifest not found"):
        load_prompt_set(tmp_path / "none.manifest.json")
    manifest = write_prompts([{"id": "a", "prompt": "x"}], name="gone")
    manifest.with_name("gone.jsonl").unlink()
    with pytest.raises(ConfigError, match="prompt file .* not found"):
        load_prompt_set(manifest)


def test_shipped_sets_are_frozen_and_valid():
    from gate.config import BUILTIN_CONFIG, load_config

    sets = [load_prompt_set(p) for p in load_config(BUILTIN_CONFIG).prompts]
    arith = next(s for s in sets if s.name == "arith")
    assert len(arith.items) >= 64
    assert all(a for a in arith.answers)  # verifiable: every arithmetic prompt has an answer
    assert any(item.messages for s in sets for item in s.items)  # the chat-template path is exercised
