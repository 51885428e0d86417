"""`gate init` freezes the prompts the stack's own config names (no --dataset): each stack's
dataset key and record fields (tests/unit/data/stacks and the stacks' loaders, docs/adopt.md),
local files, folders of them, and one-line errors for what it cannot read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gate.config import load_config
from gate.errors import ConfigError
from gate.init import dataset
from gate.init.sources import read_config
from gate.init.stacks import STACKS


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _frozen(stack: str, config_text: str, folder: Path, name: str, limit: int = 64) -> list[dict]:
    """The records gate init keeps from the dataset ``config_text`` names (run from ``folder``)."""
    config_file = folder / name
    config_file.write_text(config_text, encoding="utf-8")
    config = read_config(config_file, STACKS[stack].fmt)
    named = dataset.from_stack_config(STACKS[stack].dataset, config, config_file, folder)
    dataset.convert(named.files, folder / "out.jsonl", limit, named.prompt_key, named.answer_key)
    return [json.loads(line) for line in (folder / "out.jsonl").read_text().splitlines()]


def test_verl_reads_its_train_files_with_its_prompt_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _jsonl(tmp_path / "data" / "a.jsonl", [
        {"question": [{"role": "user", "content": "1+1?"}], "reward_model": {"ground_truth": "2"},
         "prompt": "not this one"},
    ])  # fmt: skip
    _jsonl(tmp_path / "data" / "b.jsonl", [{"question": "2+2?", "answer": "4"}])
    got = _frozen("verl", "python3 -m verl.trainer.main_ppo data.train_files=\"['data/a.jsonl','data/b.jsonl']\" "
                  "data.prompt_key=question\n", tmp_path, "run.sh")  # fmt: skip
    assert got == [
        {"id": "a-00000", "messages": [{"role": "user", "content": "1+1?"}], "answer": "2"},
        {"id": "b-00001", "prompt": "2+2?", "answer": "4"},
    ]


def test_openrlhf_reads_a_comma_separated_mix_with_its_input_and_label_keys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _jsonl(tmp_path / "math.jsonl", [{"context": "3*3?", "gold": 9, "input": "ignored"}])
    _jsonl(tmp_path / "more" / "train.jsonl", [{"context": "5-1?", "gold": 4}])
    _jsonl(tmp_path / "more" / "test.jsonl", [{"context": "held out", "gold": 0}])
    got = _frozen("openrlhf", "--data.prompt_dataset math.jsonl,more --data.input_key context "
                  "--data.label_key gold\n", tmp_path, "train.sh")  # fmt: skip
    # a folder of splits: its train file only
    assert [(r["prompt"], r["answer"]) for r in got] == [("3*3?", "9"), ("5-1?", "4")]


def test_a_folder_of_parquet_splits_as_a_hub_repository_copy_holds_them(tmp_path, monkeypatch):
    """AReaL's gsm8k path is a Hub id or a local copy of the repository: main/train-*.parquet."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    monkeypatch.chdir(tmp_path)
    (tmp_path / "gsm8k" / "main").mkdir(parents=True)
    for split, n in (("train", 3), ("test", 2)):
        rows = [{"question": f"{split} {i}", "answer": f"#### {i}"} for i in range(n)]
        pq.write_table(
            pa.Table.from_pylist(rows),
            tmp_path / "gsm8k" / "main" / f"{split}-00000-of-00001.parquet",
        )
    got = _frozen("areal", "train_dataset:\n  path: gsm8k\n  type: rl\n", tmp_path, "gsm8k.yaml")
    assert [r["prompt"] for r in got] == ["train 0", "train 1", "train 2"]


def test_nemo_rl_reads_its_response_dataset_input_and_output_keys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _jsonl(tmp_path / "d.jsonl", [{"problem": "7+1?", "expected": "8", "answer": "no"}])
    text = ("data:\n  train:\n    dataset_name: ResponseDataset\n    data_path: d.jsonl\n"
            "    input_key: problem\n    output_key: expected\n")  # fmt: skip
    assert _frozen("nemo-rl", text, tmp_path, "grpo.yaml") == [
        {"id": "d-00000", "prompt": "7+1?", "answer": "8"}
    ]


def test_pipelinerl_finds_a_dataset_name_under_its_custom_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _jsonl(
        tmp_path / "datasets" / "custom" / "sums.jsonl", [{"task": "2+5?", "answer": "\\boxed{7}"}]
    )
    got = _frozen("pipelinerl", "train_dataset_names:\n  - sums\n", tmp_path, "conf.yaml")
    assert got == [{"id": "sums-00000", "prompt": "2+5?", "answer": "\\boxed{7}"}]


def test_skyrl_and_trl_and_vime_forms(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _jsonl(tmp_path / "gsm.jsonl", [
        {"prompt": [{"role": "user", "content": "9/3?"}], "reward_spec": {"ground_truth": "3"}},
        {"prompt": [{"role": "user", "content": "8/4?"}], "reward_spec": {"ground_truth": "2"}},
    ])  # fmt: skip
    skyrl = _frozen("skyrl", "python -m skyrl_train.entrypoints.main_base data.train_data=\"['gsm.jsonl']\"\n",
                    tmp_path, "run.sh")  # fmt: skip
    assert [r["answer"] for r in skyrl] == ["3", "2"]
    # TRL's mixture form: load_dataset("json", data_files=...)
    trl = _frozen(
        "trl",
        "datasets:\n  - path: json\n    data_files: gsm.jsonl\n",
        tmp_path,
        "grpo.yaml",
        limit=1,
    )
    assert trl == [
        {"id": "gsm-00000", "messages": [{"role": "user", "content": "9/3?"}], "answer": "3"}
    ]
    # slime's row slice: noted, the first records are read
    config_file = tmp_path / "run.sh"
    config_file.write_text("python train.py --prompt-data gsm.jsonl@[0:1]\n")
    named = dataset.from_stack_config(
        STACKS["vime"].dataset, read_config(config_file, "flags"), config_file, tmp_path
    )
    assert named.files == (tmp_path / "gsm.jsonl",)
    assert named.notes == (
        "prompt-data: the row slice of 'gsm.jsonl@[0:1]' is not applied; the first records are",
    )


def test_what_cannot_be_read_is_one_line_naming_the_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config_file = tmp_path / "run.sh"
    config_file.write_text(
        "python -m skyrl_train.entrypoints.main_base data.train_data=\"['~/nowhere/train.parquet']\"\n"
    )
    config = read_config(config_file, "flags")
    with pytest.raises(
        ConfigError, match=r"^data.train_data: '~/nowhere/train.parquet' not found \(looked in "
    ):
        dataset.from_stack_config(STACKS["skyrl"].dataset, config, config_file, tmp_path)
    (tmp_path / "empty").mkdir()
    config_file.write_text("python train.py --prompt-data empty\n")
    with pytest.raises(ConfigError, match="empty: no JSONL or Parquet file in this dataset folder"):
        dataset.from_stack_config(
            STACKS["vime"].dataset, read_config(config_file, "flags"), config_file, tmp_path
        )
    # shaped like a Hub id (org/name), but a data file: a missing file, not a Hub dataset
    config_file.write_text("python train.py --prompt-data data/train.jsonl\n")
    with pytest.raises(ConfigError, match=r"^prompt-data: 'data/train.jsonl' not found"):
        dataset.from_stack_config(
            STACKS["vime"].dataset, read_config(config_file, "flags"), config_file, tmp_path
        )


def test_gate_init_freezes_the_configs_dataset_without_dataset_flag(tmp_path):
    _jsonl(tmp_path / "data" / "train.jsonl", [
        {"prompt": [{"role": "user", "content": f"{i}+1?"}], "reward_model": {"ground_truth": str(i + 1)}}
        for i in range(4)
    ])  # fmt: skip
    (tmp_path / "verl.sh").write_text(
        "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen3-8B "
        "data.train_files=data/train.jsonl actor_rollout_ref.rollout.n=4\n"
    )
    (tmp_path / ".git").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "gate", "init", "--stack", "verl", "--config", "verl.sh",
         "--prompts-limit", "3", "--new", "vllm==0.34.0"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    records = (tmp_path / "gate-prompts.jsonl").read_text().splitlines()
    assert len(records) == 3 and json.loads(records[2])["answer"] == "3"
    text = (tmp_path / "gate.yaml").read_text()
    assert (
        "# frozen from the first 3 of 4 records of train.jsonl, named by data.train_files" in text
    )
    assert [Path(p).name for p in load_config(tmp_path / "gate.yaml").prompts] == [
        "gate-prompts.manifest.json"
    ]
