"""gate init: a stack's LoRA settings become gate.yaml's lora section, or are named with why not
(gate/init/lora.py; the keys and pushes were read in each stack's code, docs/lora.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gate.config import load_config
from gate.init.lora import target_modules
from gate.init.mapping import map_config
from gate.init.sources import read_config
from gate.init.stacks import STACKS

STACK_CONFIGS = Path(__file__).parent / "data" / "stacks"


def _mapped(stack: str, tmp_path: Path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return map_config(STACKS[stack], read_config(path, STACKS[stack].fmt))


def _fields(mapped) -> dict:
    return {
        k: f.value
        for k, f in mapped.fields.items()
        if k.startswith(("lora.", "grpo.enabled", "weight_sync."))
    }


def _verl(*overrides: str) -> str:
    return (
        "python3 -m verl.trainer.main_ppo \\\n"
        + "".join(f"    {o} \\\n" for o in overrides)
        + "    trainer.n_gpus_per_node=8\n"
    )


def test_verl_fsdp_lora_is_same_id_with_its_defaults_named(tmp_path):
    mapped = _mapped("verl", tmp_path, "run.sh", _verl("actor_rollout_ref.model.lora_rank=32"))
    assert _fields(mapped) == {
        "lora.enabled": True,
        "lora.rank": 32,
        "lora.alpha": 16.0,  # verl's default
        "lora.target_modules": ["all-linear"],
        "lora.naming": "same-id",
        "grpo.enabled": False,
        "weight_sync.inflight.enabled": False,
    }
    f = mapped.fields
    assert f["lora.rank"].source == "from actor_rollout_ref.model.lora_rank"
    assert "the stack's default for actor_rollout_ref.model.lora_alpha" in f["lora.alpha"].source
    assert "remove_lora" in f["lora.naming"].source
    assert "pushes full weights" in f["grpo.enabled"].source


def test_verl_megatron_names_become_the_modules_vllm_adapts(tmp_path):
    mapped = _mapped(
        "verl",
        tmp_path,
        "run.sh",
        _verl("actor_rollout_ref.model.lora.rank=8", "actor_rollout_ref.model.lora.alpha=16"),
    )
    f = mapped.fields
    assert f["lora.target_modules"].value == [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
    ]  # fmt: skip
    assert "Megatron names" in f["lora.target_modules"].source
    assert (f["lora.rank"].value, f["lora.alpha"].value) == (8, 16.0)


@pytest.mark.parametrize(
    ("stack", "name", "text", "words"),
    [
        ("verl", "run.sh", _verl("actor_rollout_ref.model.lora_rank=16", "actor_rollout_ref.model.lora.merge=True"),
         "verl merges the adapter into the weights and pushes them whole with lora.merge"),
        ("trl", "grpo.yaml", "model_name_or_path: Qwen/Qwen3-0.6B\nuse_peft: true\nlora_r: 16\n",
         "TRL's GRPOTrainer merges the adapter"),
        ("nemo-rl", "grpo.yaml", "policy:\n  model_name: Qwen/Qwen3-0.6B\n  dtensor_cfg:\n    lora_cfg:\n      enabled: true\n",
         "NeMo-RL merges the adapter"),
        ("openrlhf", "run.sh", "python3 -m openrlhf.cli.train_ppo_ray --actor.model_name_or_path m --ds.lora.rank 8\n",
         "OpenRLHF #1349"),
        ("pipelinerl", "conf.yaml", "model_path: m\nfinetune:\n  lora:\n    enabled: true\n",
         "prepare_lora_model is not called"),
        ("skyrl", "run.sh", "python -m skyrl_train.entrypoints.main_base trainer.policy.model.lora.rank=8 trainer.strategy=megatron\n",
         "SkyRL's Megatron backend merges"),
        ("prime-rl", "rl.toml", "[trainer.model.lora]\nrank = 8\n",
         "gate's LoRA mode runs offline only for now"),
        ("areal", "grpo.yaml", "actor:\n  use_lora: true\n  lora_rank: 16\n",
         "gate's LoRA mode runs offline only for now"),
    ],
)  # fmt: skip
def test_lora_that_does_not_reach_vllm_as_an_adapter_here_is_named_not_carried(
    stack, name, text, words, tmp_path
):
    mapped = _mapped(stack, tmp_path, name, text)
    assert not any(k.startswith("lora.") for k in mapped.fields), mapped.fields
    said = [line for line in mapped.unmapped if line.startswith("lora:")]
    assert len(said) == 1 and words in said[0], mapped.unmapped


def test_skyrl_fsdp_lora_is_reloaded_in_place(tmp_path):
    mapped = _mapped(
        "skyrl",
        tmp_path,
        "run.sh",
        "python -m skyrl_train.entrypoints.main_base trainer.policy.model.lora.rank=8 "
        "trainer.policy.model.lora.alpha=16 trainer.policy.model.lora.target_modules=all-linear\n",
    )
    assert _fields(mapped)["lora.naming"] == "in-place"
    assert _fields(mapped)["lora.target_modules"] == ["all-linear"]


def test_no_lora_in_the_config_adds_nothing(tmp_path):
    for stack, file in (("verl", "verl.sh"), ("trl", "trl.yaml"), ("skyrl", "skyrl.sh")):
        config = read_config(STACK_CONFIGS / file, STACKS[stack].fmt)
        mapped = map_config(STACKS[stack], config)
        assert _fields(mapped) == {} and not any(u.startswith("lora") for u in mapped.unmapped)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("all-linear", ["all-linear"]), (["all-linear"], ["all-linear"]), ([], ["all-linear"]),
     ("q_proj", ["q_proj"]), (["linear_qkv", "linear_fc2"], ["q_proj", "k_proj", "v_proj", "down_proj"])],
)  # fmt: skip
def test_target_modules_keep_peft_shorthand_and_translate_megatron_names(value, expected):
    assert target_modules(value)[0] == expected


def test_gate_init_writes_a_lora_config_that_loads(tmp_path):
    config = tmp_path / "run.sh"
    config.write_text(
        (STACK_CONFIGS / "verl.sh")
        .read_text()
        .replace(
            "trainer.n_gpus_per_node=8",
            "actor_rollout_ref.model.lora_rank=16 actor_rollout_ref.model.lora_alpha=32 "
            "trainer.n_gpus_per_node=8",
        )
    )
    (tmp_path / ".git").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "gate", "init", "--stack", "verl", "--config", str(config), "--cpu",
         "--dataset", str(Path(__file__).parents[2] / "gate/assets/prompts/arith.jsonl")],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "gate.yaml").read_text()
    assert "lora:\n  enabled: true  # from actor_rollout_ref.model.lora_rank: 16 > 0\n" in text
    assert "weight_sync:\n  inflight:\n    enabled: false  # LoRA mode" in text
    cfg = load_config(tmp_path / "gate.yaml")
    assert cfg.lora.enabled and (cfg.lora.rank, cfg.lora.alpha, cfg.lora.naming) == (
        16,
        32.0,
        "same-id",
    )
    assert cfg.weight_update.hook is None and not cfg.grpo.enabled
    assert "no recipe: your verl config trains a LoRA adapter" in proc.stderr
