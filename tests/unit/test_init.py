"""`gate init`: each stack's config, in its own format, mapped key by key; the reader; the command.

The configs under data/stacks/ were written for these tests in each stack's documented format.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gate.config import load_config
from gate.errors import ConfigError
from gate.init.mapping import map_config
from gate.init.sources import launch_tokens, read_config, read_launch_tokens, resolve_references
from gate.init.stacks import STACKS

STACK_CONFIGS = Path(__file__).parent / "data" / "stacks"
FILES = {"trl": "trl.yaml", "verl": "verl.sh", "openrlhf": "openrlhf.sh", "nemo-rl": "nemo-rl.yaml",
         "prime-rl": "prime-rl.toml", "pipelinerl": "pipelinerl.yaml", "skyrl": "skyrl.sh", "vime": "vime.sh",
         "areal": "areal.yaml"}  # fmt: skip

# gate.yaml field -> (value, where it came from); "~" marks a stack's default, "=" a value it fixes.
EXPECTED = {
    "trl": {
        "model.path": ("Qwen/Qwen2.5-0.5B-Instruct", "model_name_or_path"),
        "sampling.n": (8, "num_generations"),
        "sampling.max_tokens": (256, "max_completion_length"),
        "sampling.temperature": (0.9, "temperature"),
        "sampling.top_p": (0.95, "top_p"),
        "sampling.top_k": (0, "~top_k"),
        "sampling.repetition_penalty": (1.0, "~repetition_penalty"),
        "engine_args.tensor_parallel_size": (1, "vllm_tensor_parallel_size"),
        "engine_args.gpu_memory_utilization": (0.4, "vllm_gpu_memory_utilization"),
        "engine_args.enable_sleep_mode": (False, "~vllm_enable_sleep_mode"),
        "engine_args.model_impl": ("auto", "~vllm_model_impl"),
        "engine_args.trust_remote_code": (False, "~trust_remote_code"),
        "engine_args.logprobs_mode": ("processed_logprobs", "="),
        "engine_args.max_num_batched_tokens": (4096, "="),
        "engine_args.seed": (0, "="),
        "grpo.loss": ("gspo", "importance_sampling_level"),
        "grpo.clip_eps": (0.0003, "epsilon"),
        "grpo.clip_eps_high": (0.0004, "epsilon"),
    },
    "verl": {
        "model.path": ("Qwen/Qwen3-8B", "actor_rollout_ref.model.path"),
        "sampling.n": (5, "actor_rollout_ref.rollout.n"),
        "sampling.max_tokens": (1024, "data.max_response_length"),
        "sampling.temperature": (1.0, "actor_rollout_ref.rollout.temperature"),
        "sampling.top_p": (1.0, "~actor_rollout_ref.rollout.top_p"),
        "sampling.top_k": (0, "actor_rollout_ref.rollout.top_k"),
        "sampling.repetition_penalty": (1.0, "~actor_rollout_ref.rollout.repetition_penalty"),
        "engine_args.seed": (42, "~actor_rollout_ref.rollout.seed"),
        "engine_args.dtype": ("bfloat16", "~actor_rollout_ref.rollout.dtype"),
        "engine_args.tensor_parallel_size": (
            4,
            "actor_rollout_ref.rollout.tensor_model_parallel_size",
        ),
        "engine_args.gpu_memory_utilization": (
            0.6,
            "actor_rollout_ref.rollout.gpu_memory_utilization",
        ),
        "engine_args.max_num_seqs": (256, "~actor_rollout_ref.rollout.max_num_seqs"),
        "engine_args.max_num_batched_tokens": (
            8192,
            "~actor_rollout_ref.rollout.max_num_batched_tokens",
        ),
        "engine_args.enable_chunked_prefill": (
            True,
            "~actor_rollout_ref.rollout.enable_chunked_prefill",
        ),
        "engine_args.enable_prefix_caching": (
            False,
            "actor_rollout_ref.rollout.enable_prefix_caching",
        ),
        "engine_args.logprobs_mode": (
            "processed_logprobs",
            "~actor_rollout_ref.rollout.logprobs_mode",
        ),
        "engine_args.enforce_eager": (False, "~actor_rollout_ref.rollout.enforce_eager"),
        "engine_args.enable_sleep_mode": (True, "~actor_rollout_ref.rollout.enable_sleep_mode"),
        "engine_args.disable_log_stats": (True, "~actor_rollout_ref.rollout.disable_log_stats"),
        "engine_args.scheduling_policy": ("fcfs", "~actor_rollout_ref.rollout.scheduling_policy"),
        "engine_args.trust_remote_code": (False, "~actor_rollout_ref.model.trust_remote_code"),
        "engine_args.disable_cascade_attn": (
            True,
            "actor_rollout_ref.rollout.engine_kwargs.vllm.disable_cascade_attn",
        ),
        "grpo.loss": ("dr_grpo", "actor_rollout_ref.actor.loss_agg_mode"),
        "grpo.clip_eps": (0.2, "actor_rollout_ref.actor.clip_ratio_low"),
    },
    "openrlhf": {
        "model.path": ("meta-llama/Llama-3.1-8B-Instruct", "actor.model_name_or_path"),
        "sampling.n": (8, "rollout.n_samples_per_prompt"),
        "sampling.max_tokens": (1024, "rollout.max_new_tokens"),
        "sampling.temperature": (0.6, "rollout.temperature"),
        "sampling.top_p": (1.0, "~rollout.top_p"),
        "sampling.top_k": (0, "="),
        "engine_args.seed": (7, "train.seed"),
        "engine_args.dtype": ("bfloat16", "="),
        "engine_args.tensor_parallel_size": (2, "vllm.tensor_parallel_size"),
        "engine_args.gpu_memory_utilization": (0.5, "vllm.gpu_memory_utilization"),
        "engine_args.max_model_len": (4096, "data.max_len"),
        "engine_args.enable_prefix_caching": (True, "vllm.enable_prefix_caching"),
        "engine_args.enforce_eager": (False, "~vllm.enforce_eager"),
        "engine_args.enable_sleep_mode": (False, "~vllm.enable_sleep"),
        "engine_args.logprobs_mode": ("processed_logprobs", "algo.advantage.is_correction_level"),
        "grpo.loss": ("dapo", "actor.policy_loss_type"),
        "grpo.clip_eps": (0.2, "actor.eps_clip_low_high"),
        "grpo.clip_eps_high": (0.28, "actor.eps_clip_low_high"),
    },
    "nemo-rl": {
        "model.path": ("Qwen/Qwen2.5-1.5B", "policy.model_name"),
        "sampling.n": (16, "grpo.num_generations_per_prompt"),
        "sampling.max_tokens": (512, "policy.generation.max_new_tokens"),
        "sampling.temperature": (1.0, "policy.generation.temperature"),
        "sampling.top_p": (1.0, "policy.generation.top_p"),
        "sampling.top_k": (0, "policy.generation.top_k"),
        "engine_args.dtype": ("bfloat16", "policy.generation.vllm_cfg.precision"),
        "engine_args.tensor_parallel_size": (1, "policy.generation.vllm_cfg.tensor_parallel_size"),
        "engine_args.gpu_memory_utilization": (
            0.6,
            "policy.generation.vllm_cfg.gpu_memory_utilization",
        ),
        "engine_args.max_model_len": (
            1024,
            "policy.generation.vllm_cfg.max_model_len",
        ),  # ${...} resolved
        "engine_args.enable_prefix_caching": (
            True,
            "policy.generation.vllm_cfg.enable_prefix_caching",
        ),
        "engine_args.async_scheduling": (False, "policy.generation.vllm_cfg.async_engine"),
    },
    "prime-rl": {
        "model.path": ("PrimeIntellect/Qwen3-0.6B-Reverse-Text-SFT", "model.name"),
        "sampling.n": (16, "orchestrator.group_size"),
        "sampling.max_tokens": (128, "orchestrator.train.sampling.max_completion_tokens"),
        "sampling.temperature": (1.0, "orchestrator.train.sampling.temperature"),
        "sampling.top_p": (1.0, "="),
        "engine_args.seed": (0, "inference.vllm.seed"),
        "engine_args.dtype": ("bfloat16", "inference.vllm.dtype"),
        "engine_args.tensor_parallel_size": (1, "inference.vllm.tensor_parallel_size"),
        "engine_args.max_model_len": (2048, "inference.vllm.max_model_len"),
        "engine_args.enable_prefix_caching": (True, "inference.vllm.enable_prefix_caching"),
        "engine_args.logprobs_mode": ("processed_logprobs", "="),
    },
    "pipelinerl": {
        "model.path": ("Qwen/Qwen2.5-7B", "model_path"),
        "sampling.n": (8, "attempts"),
        "sampling.max_tokens": (8192, "llm.parameters.max_tokens"),
        "sampling.temperature": (1.0, "llm.parameters.temperature"),
        "sampling.top_p": (1.0, "llm.parameters.top_p"),
        "engine_args.dtype": ("bfloat16", "vllm_config.vllm_kwargs.dtype"),
        "engine_args.tensor_parallel_size": (1, "vllm_config.vllm_kwargs.tensor-parallel-size"),
        "engine_args.enable_prefix_caching": (
            False,
            "vllm_config.vllm_kwargs.enable-prefix-caching",
        ),
        "engine_args.logprobs_mode": (
            "processed_logprobs",
            "vllm_config.vllm_kwargs.logprobs-mode",
        ),
        "engine_args.async_scheduling": (True, "vllm_config.vllm_kwargs.async-scheduling"),
        "engine_args.quantization": ("bf16_last_layer_fp32", "="),
        "grpo.loss": ("gspo", "finetune.rl.policy_loss"),
    },
    "skyrl": {
        "model.path": ("Qwen/Qwen2.5-1.5B-Instruct", "trainer.policy.model.path"),
        "sampling.n": (5, "generator.n_samples_per_prompt"),
        "sampling.max_tokens": (1024, "generator.sampling_params.max_generate_length"),
        "sampling.temperature": (1.0, "generator.sampling_params.temperature"),
        "sampling.top_p": (1.0, "generator.sampling_params.top_p"),
        "sampling.top_k": (0, "generator.sampling_params.top_k"),
        "engine_args.seed": (42, "trainer.seed"),
        "engine_args.dtype": ("bfloat16", "generator.inference_engine.model_dtype"),
        "engine_args.tensor_parallel_size": (1, "generator.inference_engine.tensor_parallel_size"),
        "engine_args.gpu_memory_utilization": (
            0.8,
            "generator.inference_engine.gpu_memory_utilization",
        ),
        "engine_args.enable_prefix_caching": (
            True,
            "generator.inference_engine.enable_prefix_caching",
        ),
        "engine_args.max_num_seqs": (
            128,
            "generator.inference_engine.engine_init_kwargs.max_num_seqs",
        ),
    },
    "vime": {
        "model.path": ("/root/Qwen3-4B", "hf-checkpoint"),
        "sampling.n": (8, "n-samples-per-prompt"),
        "sampling.max_tokens": (8192, "rollout-max-response-len"),
        "sampling.temperature": (0.8, "rollout-temperature"),
        "sampling.top_p": (1.0, "rollout-top-p"),
        "engine_args.seed": (42, "rollout-seed"),
        "engine_args.logprobs_mode": ("processed_logprobs", "="),
        "engine_args.enable_prefix_caching": (True, "vllm-enable-prefix-caching"),
        "engine_args.max_num_seqs": (256, "vllm-max-num-seqs"),
    },
    "areal": {
        "model.path": ("Qwen/Qwen2.5-1.5B-Instruct", "actor.path"),
        "sampling.n": (4, "gconfig.n_samples"),
        "sampling.max_tokens": (1024, "gconfig.max_new_tokens"),
        "sampling.temperature": (1.0, "gconfig.temperature"),
        "sampling.top_p": (1.0, "gconfig.top_p"),
        "sampling.top_k": (0, "gconfig.top_k"),
        "engine_args.seed": (1, "vllm.seed"),
        "engine_args.tensor_parallel_size": (1, "rollout.backend"),
        "engine_args.dtype": ("bfloat16", "vllm.dtype"),
        "engine_args.max_model_len": (32768, "vllm.max_model_len"),
        "engine_args.gpu_memory_utilization": (0.9, "vllm.gpu_memory_utilization"),
        "engine_args.enable_prefix_caching": (False, "vllm.no_enable_prefix_caching"),
    },
}


def _mapped(stack: str):
    return map_config(STACKS[stack], read_config(STACK_CONFIGS / FILES[stack], STACKS[stack].fmt))


@pytest.mark.parametrize("stack", sorted(EXPECTED))
def test_each_stacks_config_maps_key_by_key(stack):
    mapped = _mapped(stack)
    got = {path: f.value for path, f in mapped.fields.items()}
    # the mini GRPO run samples at the stack's rollout temperature, where the config names one
    assert got.pop("grpo.temperature", None) == got.get("sampling.temperature")
    assert got == {path: value for path, (value, _) in EXPECTED[stack].items()}
    for path, (_, where) in EXPECTED[stack].items():
        source = mapped.fields[path].source
        if where == "=":
            assert source.startswith(f"fixed by {STACKS[stack].title}: "), (path, source)
        elif where.startswith("~"):
            assert (
                source == f"{STACKS[stack].title}'s default for {where[1:]} (not in your config)"
            ), (path, source)
        else:
            assert f"from {where}" in source, (path, source)


def test_all_nine_stacks_have_a_config_and_a_table():
    assert set(STACKS) == set(FILES) == set(EXPECTED)
    assert len(STACKS) == 9


def test_what_is_not_mapped_is_said_with_the_reason():
    trl = _mapped("trl")
    assert "min_p: 0.05 not carried over (gate samples without min_p)" in trl.unmapped
    assert trl.transport == {"vllm_mode": "colocate"}
    prime = _mapped("prime-rl")  # no default assumed for a stack gate has not read the code of
    assert "sampling.top_k: " not in " ".join(prime.unmapped)  # fixed by prime-rl instead
    assert any(
        u.startswith(
            "engine_args.gpu_memory_utilization: inference.vllm.gpu_memory_utilization not in"
        )
        for u in prime.unmapped
    )
    assert prime.transport == {"inference.weight_broadcast.type": "filesystem"}
    assert _mapped("verl").transport == {
        "actor_rollout_ref.rollout.checkpoint_engine.backend": "naive"
    }


@pytest.mark.parametrize(("config", "loss", "band", "unmapped"), [
    ({}, "grpo", (0.2, 0.2), ()),
    ({"epsilon_high": 0.28}, "dapo", (0.2, 0.28), ()),
    ({"loss_type": "dr_grpo"}, "dr_grpo", (0.2, 0.2), ()),
    ({"loss_type": "grpo"}, "grpo", (0.2, 0.2), ("loss_type: grpo (gate runs a token mean over the batch: TRL's dapo)",)),
    ({"importance_sampling_level": "sequence", "loss_type": "dr_grpo"}, "gspo", (0.2, 0.2), ()),
])  # fmt: skip
def test_trls_objective(config, loss, band, unmapped):
    choice = STACKS["trl"].loss(config)
    assert (choice.loss, (choice.clip_eps, choice.clip_eps_high), choice.unmapped) == (
        loss,
        band,
        unmapped,
    )


def test_verls_and_openrlhfs_objectives():
    a = "actor_rollout_ref.actor."
    verl = STACKS["verl"].loss
    assert verl({a + "clip_ratio_high": 0.28}).loss == "dapo"
    assert (
        verl({a + "loss_agg_mode": "seq-mean-token-sum-norm"}).loss == "grpo"
    )  # std kept: not Dr. GRPO
    assert verl({a + "loss_agg_mode": "seq-mean-token-mean"}).unmapped == (
        f"{a}loss_agg_mode: seq-mean-token-mean (gate's grpo and dapo take the token mean)",
    )
    assert verl({a + "policy_loss.loss_mode": "gspo"}).loss == "gspo"
    openrlhf = STACKS["openrlhf"].loss
    assert openrlhf({"actor.policy_loss_type": "gspo"}).loss == "gspo"
    assert openrlhf({"actor.eps_clip": 0.1}).clip_eps == 0.1
    # IS correction off: OpenRLHF passes no logprobs_mode, so vLLM's raw logprobs are what it trains on
    assert (
        map_config(STACKS["openrlhf"], {}).fields["engine_args.logprobs_mode"].value
        == "raw_logprobs"
    )


def test_launch_scripts_are_split_as_the_shell_would():
    text = 'python3 -m x \\\n  a.b=1 \\\n  +c.d="two words"  # a comment\n--flag --e.f 0.5 --g=h --pair 0.2 0.28\n'
    assert launch_tokens(text, "x.sh") == ["python3", "-m", "x", "a.b=1", "+c.d=two words", "--flag", "--e.f", "0.5",
                                           "--g=h", "--pair", "0.2", "0.28"]  # fmt: skip
    assert read_launch_tokens(launch_tokens(text, "x.sh")) == {
        "a.b": 1, "c.d": "two words", "flag": True, "e.f": 0.5, "g": "h", "pair": [0.2, 0.28]}  # fmt: skip
    assert read_launch_tokens(["a=1", "a=2"]) == {"a": 2}  # the later override wins, as at launch
    with pytest.raises(ConfigError, match=r"x.sh: line 1: cannot split it as the shell would"):
        launch_tokens("a='unclosed\n", "x.sh")


def test_references_to_the_files_own_keys_resolve():
    flat = {"a.b": 3, "c": "${a.b}", "d": "${c}", "e": "${oc.env:HOME}", "f": "${missing}"}
    assert resolve_references(flat) == {
        "a.b": 3,
        "c": 3,
        "d": 3,
        "e": "${oc.env:HOME}",
        "f": "${missing}",
    }


def test_an_unreadable_config_names_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: not valid YAML \(line \d+\)"):
        read_config(bad, "yaml")
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("a = \n")
    with pytest.raises(ConfigError, match=r"bad\.toml: not valid TOML"):
        read_config(bad_toml, "toml")


# -- the command ---------------------------------------------------------------------------------


def _init(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # ``cwd`` stands for the user's repository: gate init writes the workflow at a repository's root,
    # and without this marker that root would be the checkout the tests run in.
    (cwd / ".git").mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "gate", "init", *args], cwd=cwd, capture_output=True, text=True
    )


def test_init_writes_a_gate_yaml_that_loads_with_every_value_annotated(tmp_path):
    proc = _init(
        "--stack", "verl", "--config", str(STACK_CONFIGS / "verl.sh"), "--cpu", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "gate.yaml").read_text()
    assert "  n: 5  # from actor_rollout_ref.rollout.n\n" in text
    assert (
        "  loss: dr_grpo  # from actor_rollout_ref.actor.loss_agg_mode: seq-mean-token-sum-norm"
        in text
    )
    assert (
        "  enable_prefix_caching: false  # from actor_rollout_ref.rollout.enable_prefix_caching\n"
        in text
    )
    cfg = load_config(tmp_path / "gate.yaml")
    args = cfg.engines["new"].engine_args
    assert args["tensor_parallel_size"] == 1 and "gpu_memory_utilization" not in args
    assert cfg.grpo.loss == "dr_grpo" and cfg.sampling.n == 5
    assert "note: engine_args.tensor_parallel_size: 1 instead of 4 (--cpu)" in proc.stderr
    assert (
        "weight transport: actor_rollout_ref.rollout.checkpoint_engine.backend: naive"
        in proc.stderr
    )


def test_init_for_trl_writes_its_colocate_recipe(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "What is 2+3?", "answer": "5"}\n')
    proc = _init(
        "--stack",
        "trl",
        "--config",
        str(STACK_CONFIGS / "trl.yaml"),
        "--dataset",
        str(data),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    cfg = load_config(tmp_path / "gate.yaml")
    assert cfg.weight_update.hook == f"{tmp_path / 'gate_hook.py'}:update"
    assert cfg.engines["new"].env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "model.load_weights([(" in (tmp_path / "gate_hook.py").read_text()
    assert (cfg.engines["old"].spec, cfg.engines["new"].spec) == (
        "vllm==0.25.1",
        "vllm==0.25.1",
    )  # TRL's pin
    # the same recipe under --cpu: on vLLM's CPU platform it loads inside vLLM's layerwise reload
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    proc = _init("--stack", "trl", "--config", str(STACK_CONFIGS / "trl.yaml"), "--cpu", cwd=cpu)
    assert (
        proc.returncode == 0
        and "initialize_layerwise_reload(model)" in (cpu / "gate_hook.py").read_text()
    )
    assert (
        load_config(cpu / "gate.yaml").engines["new"].env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    )
    # server mode is another transport: no colocate recipe for it
    server = tmp_path / "server"
    server.mkdir()
    cfg_text = (
        (STACK_CONFIGS / "trl.yaml").read_text().replace("vllm_mode: colocate", "vllm_mode: server")
    )
    (server / "trl.yaml").write_text(cfg_text)
    proc = _init("--stack", "trl", "--config", "trl.yaml", "--dataset", str(data), cwd=server)
    assert proc.returncode == 0 and not (server / "gate_hook.py").exists()
    assert "no recipe for TRL (GRPOTrainer) with vllm_mode: server" in proc.stderr


def _init_edited(
    folder: Path, stack: str, old: str, new: str
) -> tuple[Path, subprocess.CompletedProcess]:
    """``gate init --cpu`` on the stack's test config with ``old`` replaced by ``new``, in ``folder``."""
    folder.mkdir()
    source = STACK_CONFIGS / FILES[stack]
    text = source.read_text()
    assert old in text, (source, old)
    (folder / source.name).write_text(text.replace(old, new))
    return folder, _init("--stack", stack, "--config", source.name, "--cpu", cwd=folder)


def test_init_for_prime_rl_writes_server_mode_and_its_filesystem_push_idle_and_in_flight(tmp_path):
    proc = _init(
        "--stack",
        "prime-rl",
        "--config",
        str(STACK_CONFIGS / "prime-rl.toml"),
        "--cpu",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "gate.yaml").read_text()
    assert "mode: server  # prime-rl drives vLLM through its own vllm serve wrapper\n" in text
    cfg = load_config(tmp_path / "gate.yaml")
    assert all(
        e.mode == "server" and e.server.dev_mode for e in cfg.engines.values()
    )  # /pause, /collective_rpc, /resume
    assert cfg.weight_update.hook == f"{tmp_path / 'gate_hook.py'}:prime_rl_update"
    assert list(cfg.weight_sync.inflight.updates) == [
        f"{tmp_path / 'gate_hook.py'}:prime_rl_update_inflight"
    ]
    recipe = (tmp_path / "gate_hook.py").read_text()
    assert '"/pause?mode=keep&clear_cache=false"' in recipe and '"reload_weights"' in recipe
    # its NCCL broadcast is another transport: gate's own push, said so
    nccl, proc = _init_edited(tmp_path / "nccl", "prime-rl", 'type = "filesystem"', 'type = "nccl"')
    assert proc.returncode == 0 and not (nccl / "gate_hook.py").exists()
    assert "no recipe for prime-rl with inference.weight_broadcast.type: nccl" in proc.stderr
    assert load_config(nccl / "gate.yaml").engines["new"].mode == "server"


def test_init_for_areal_writes_its_abort_and_resubmit_push_for_disk_updates_only(tmp_path):
    proc = _init(
        "--stack", "areal", "--config", str(STACK_CONFIGS / "areal.yaml"), "--cpu", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    cfg = load_config(tmp_path / "gate.yaml")
    assert cfg.engines["new"].mode == "server"
    assert cfg.weight_update.hook == f"{tmp_path / 'gate_hook.py'}:areal_update"
    assert list(cfg.weight_sync.inflight.updates) == [
        f"{tmp_path / 'gate_hook.py'}:areal_update_inflight"
    ]
    assert (
        "weight transport: rollout.backend: vllm:d4p1t1, actor.weight_update_mode: disk"
        in proc.stderr
    )
    # AReaL's default is its NCCL broadcast (xccl): no recipe where the config leaves the mode unset
    xccl, proc = _init_edited(tmp_path / "xccl", "areal", "  weight_update_mode: disk\n", "")
    assert proc.returncode == 0 and not (xccl / "gate_hook.py").exists()
    assert (
        "no recipe for AReaL with rollout.backend: vllm:d4p1t1; gate's built-in push stands"
        in proc.stderr
    )


def _init_in_process_recipe(folder: Path, stack: str, marker: str) -> None:
    """``gate init --cpu`` on the stack's test config writes its recipe (``marker`` in it) as the
    hook, with the engine's model in gate's process, where the push runs."""
    proc = _init(
        "--stack", stack, "--config", str(STACK_CONFIGS / FILES[stack]), "--cpu", cwd=folder
    )
    assert proc.returncode == 0, proc.stderr
    cfg = load_config(folder / "gate.yaml")
    assert cfg.weight_update.hook == f"{folder / 'gate_hook.py'}:update"
    assert cfg.engines["new"].env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert marker in (folder / "gate_hook.py").read_text()


def test_init_for_verl_writes_its_bucketed_recipe_where_the_backend_is_naive(tmp_path):
    _init_in_process_recipe(tmp_path, "verl", "def send_buckets(")
    # verl's other checkpoint engines (nccl, nixl, hccl) are other transports: no recipe for them
    nccl, proc = _init_edited(tmp_path / "nccl", "verl", "checkpoint_engine.backend=naive",
                              "checkpoint_engine.backend=nccl")  # fmt: skip
    assert proc.returncode == 0 and not (nccl / "gate_hook.py").exists()
    assert (
        "no recipe for verl with actor_rollout_ref.rollout.checkpoint_engine.backend: nccl"
        in proc.stderr
    )


def test_init_for_openrlhf_writes_its_broadcast_recipe_where_the_engines_are_apart(tmp_path):
    _init_in_process_recipe(tmp_path, "openrlhf", "def update_weight(worker, name")
    # colocated, OpenRLHF hands CUDA-IPC handles instead; with sync_with_ray, Ray's collective
    # carries the broadcast: no recipe for either
    for name, flag in [("colocated", "--train.colocate_all"), ("ray", "--vllm.sync_with_ray")]:
        folder, proc = _init_edited(
            tmp_path / name, "openrlhf", "   --train.seed 7", f"   {flag} \\\n   --train.seed 7"
        )
        assert proc.returncode == 0 and not (folder / "gate_hook.py").exists(), proc.stderr
        assert (
            "no recipe for OpenRLHF with" in proc.stderr and f"{flag[2:]}: True" in proc.stderr
        ), proc.stderr


def test_init_for_nemo_rl_writes_its_refit_recipe_where_colocated_on_the_default_transport(
    tmp_path,
):
    _init_in_process_recipe(tmp_path, "nemo-rl", "def update_weights_via_ipc_zmq(")
    # not colocated (a packed NCCL broadcast), or another refit transport: no recipe
    for name, old, new in [("apart", "enabled: true", "enabled: false"),
                           ("sparse", "    colocated:", "    refit_transport: vllm_zmq_sparse\n    colocated:")]:  # fmt: skip
        folder, proc = _init_edited(tmp_path / name, "nemo-rl", old, new)
        assert proc.returncode == 0 and not (folder / "gate_hook.py").exists(), proc.stderr
        assert "no recipe for NeMo-RL with policy.generation.colocated.enabled:" in proc.stderr


def test_a_stack_that_runs_vllm_in_process_writes_no_mode(tmp_path):
    proc = _init(
        "--stack", "verl", "--config", str(STACK_CONFIGS / "verl.sh"), "--cpu", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "\nmode:" not in (tmp_path / "gate.yaml").read_text()
    assert load_config(tmp_path / "gate.yaml").engines["new"].mode == "offline"


def test_init_refuses_bad_input_with_one_line_and_exit_2(tmp_path):
    cases = [
        (("--stack", "ray", "--config", str(STACK_CONFIGS / "trl.yaml"), "--cpu"), "gate: error: --stack: unknown stack 'ray' (one of trl, verl,"),
        (("--stack", "trl", "--config", "missing.yaml", "--cpu"), "gate: error: missing.yaml: the stack's config file not found"),
        # a Hub id where no datasets package (or no network) can read it: how to give the prompts
        (("--stack", "trl", "--config", str(STACK_CONFIGS / "trl.yaml")), "gate: error: dataset_name: 'trl-lib/DeepMath-103K'"),
        (("--stack", "prime-rl", "--config", str(STACK_CONFIGS / "prime-rl.toml")), f"gate: error: {STACK_CONFIGS / 'prime-rl.toml'}: prime-rl's prompts come from a verifiers environment"),
        (("--stack", "openrlhf", "--config", str(STACK_CONFIGS / "openrlhf.sh")), f"gate: error: {STACK_CONFIGS / 'openrlhf.sh'}: gate init needs the prompts to replay and the config names none (data.prompt_dataset / prompt_data): pass --dataset FILE"),
    ]  # fmt: skip
    for args, message in cases:
        proc = _init(*args, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.startswith(message), proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "gate.yaml").exists()


def test_init_never_overwrites_without_force(tmp_path):
    (tmp_path / "gate.yaml").write_text("mine\n")
    args = ("--stack", "areal", "--config", str(STACK_CONFIGS / "areal.yaml"), "--cpu")
    proc = _init(*args, cwd=tmp_path)
    assert proc.returncode == 2 and "gate.yaml: exists; --force overwrites it" in proc.stderr
    assert (tmp_path / "gate.yaml").read_text() == "mine\n"
    assert _init(*args, "--force", cwd=tmp_path).returncode == 0
    assert (
        load_config(tmp_path / "gate.yaml").engines["new"].engine_args["enable_prefix_caching"]
        is False
    )


def test_init_freezes_a_prompt_set_from_the_stacks_dataset(tmp_path):
    rows = [
        {
            "prompt": [{"role": "user", "content": "What is 2+3?"}],
            "reward_model": {"ground_truth": "5"},
        },
        {"id": "q2", "question": "What is 4*4?", "answer": 16},
        {"prompt": "Say hi."},
    ]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = _init("--stack", "prime-rl", "--config", str(STACK_CONFIGS / "prime-rl.toml"), "--dataset", str(data),
                 "--prompts-limit", "2", "--old", "vllm==0.26.0", "--new", "vllm==0.27.1", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    records = [
        json.loads(line) for line in (tmp_path / "gate-prompts.jsonl").read_text().splitlines()
    ]
    assert records == [
        {
            "id": "train-00000",
            "messages": [{"role": "user", "content": "What is 2+3?"}],
            "answer": "5",
        },
        {"id": "q2", "prompt": "What is 4*4?", "answer": "16"},
    ]
    cfg = load_config(tmp_path / "gate.yaml")
    assert [Path(p).name for p in cfg.prompts] == ["gate-prompts.manifest.json"]
    assert (cfg.engines["old"].spec, cfg.engines["new"].spec) == ("vllm==0.26.0", "vllm==0.27.1")
    raw = yaml.safe_load((tmp_path / "gate.yaml").read_text())
    assert raw["model"]["path"] == "PrimeIntellect/Qwen3-0.6B-Reverse-Text-SFT"
    assert (
        "frozen from the first 2 of 3 records of train.jsonl"
        in (tmp_path / "gate.yaml").read_text()
    )


def test_init_writes_the_pull_request_workflow_at_the_repositorys_root(tmp_path):
    """The README's workflow with the stack's specs, gate.yaml's path and the files whose change
    starts the gate; never over an existing one without --force; not under --cpu."""
    from gate.init import workflow

    repo = tmp_path / "repo"
    (repo / "configs").mkdir(parents=True)
    (repo / "configs" / "prime-rl.toml").write_text((STACK_CONFIGS / "prime-rl.toml").read_text())
    data = repo / "train.jsonl"
    data.write_text('{"prompt": "What is 2+3?", "answer": "5"}\n')
    args = ("--stack", "prime-rl", "--config", "configs/prime-rl.toml", "--dataset", "train.jsonl",
            "--out", "rl-gate", "--old", "vllm==0.26.0", "--new", "vllm==0.27.1")  # fmt: skip
    proc = _init(*args, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    target = repo / ".github" / "workflows" / "vllm-gate.yml"
    assert f"wrote {target}" in proc.stderr
    expected = workflow.WorkflowValues("rl-gate/gate.yaml", "vllm==0.26.0", "vllm==0.27.1", (
        "requirements*.txt", "pyproject.toml", "uv.lock", "rl-gate/gate.yaml", "configs/prime-rl.toml",
        "rl-gate/gate_hook.py", "baselines/**"))  # fmt: skip
    assert target.read_text() == workflow.render(expected)
    wf = yaml.safe_load(target.read_text())
    step = next(s for s in wf["jobs"]["gate"]["steps"] if s.get("id") == "gate")
    assert (step["with"]["config"], step["with"]["old-spec"], step["with"]["new-spec"]) == (
        "rl-gate/gate.yaml",
        "vllm==0.26.0",
        "vllm==0.27.1",
    )
    assert wf[True]["pull_request"]["paths"] == list(expected.watched)  # PyYAML reads `on:` as True
    target.write_text("mine\n")
    proc = _init(*args, "--force", cwd=repo)  # gate's own files exist now too
    assert proc.returncode == 0 and target.read_text() != "mine\n", proc.stderr
    target.write_text("mine\n")
    for own in ("gate.yaml", "gate_hook.py", "gate-prompts.jsonl"):
        (repo / "rl-gate" / own).unlink()
    proc = _init(*args, cwd=repo)
    assert proc.returncode == 2 and f"{target}: exists; --force overwrites it" in proc.stderr
    proc = _init(
        "--stack",
        "prime-rl",
        "--config",
        "configs/prime-rl.toml",
        "--cpu",
        "--out",
        "cpu",
        cwd=repo,
    )
    assert proc.returncode == 0 and "workflow: not written under --cpu" in proc.stderr
    assert target.read_text() == "mine\n"


def test_the_example_workflow_is_the_template_filled_with_the_readmes_values():
    """examples/workflows/gate-self-hosted.yml is what gate init writes; after editing the template,
    `python -m gate.init.workflow` writes it again."""
    from gate.init import workflow

    assert workflow.EXAMPLE.read_text() == workflow.render(workflow.README_VALUES)
    # values that plain YAML would misread are quoted: they come back as written
    odd = workflow.WorkflowValues(
        "my gate.yaml", "vllm @ https://x/y.whl#sha256=0", "vllm: 1", ('a "b"', "c#d")
    )
    wf = yaml.safe_load(workflow.render(odd))
    step = next(s for s in wf["jobs"]["gate"]["steps"] if s.get("id") == "gate")
    assert (step["with"]["config"], step["with"]["old-spec"], step["with"]["new-spec"]) == (
        odd.config,
        odd.old_spec,
        odd.new_spec,
    )
    assert wf[True]["pull_request"]["paths"] == list(odd.watched)


def test_init_freezes_a_prompt_set_from_verls_parquet_dataset(tmp_path):
    """verl's data preprocessing writes Parquet: a chat-message `prompt` column and a
    `reward_model` struct; only the first --prompts-limit rows are read."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = [{"data_source": "gsm8k", "prompt": [{"role": "user", "content": f"What is {i}+{i}?"}],
             "reward_model": {"style": "rule", "ground_truth": str(2 * i)}} for i in range(5)]  # fmt: skip
    data = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data, row_group_size=2)
    proc = _init("--stack", "verl", "--config", str(STACK_CONFIGS / "verl.sh"), "--dataset", str(data),
                 "--prompts-limit", "3", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    records = [
        json.loads(line) for line in (tmp_path / "gate-prompts.jsonl").read_text().splitlines()
    ]
    assert records == [
        {
            "id": f"train-{i:05d}",
            "messages": [{"role": "user", "content": f"What is {i}+{i}?"}],
            "answer": str(2 * i),
        }
        for i in range(3)
    ]
    assert (
        "frozen from the first 3 of 5 records of train.parquet"
        in (tmp_path / "gate.yaml").read_text()
    )


def test_an_unreadable_parquet_dataset_or_another_format_is_one_line(tmp_path):
    pytest.importorskip("pyarrow")
    bad = tmp_path / "train.parquet"
    bad.write_bytes(b"not parquet")
    proc = _init(
        "--stack",
        "verl",
        "--config",
        str(STACK_CONFIGS / "verl.sh"),
        "--dataset",
        str(bad),
        cwd=tmp_path,
    )
    assert (
        proc.returncode == 2 and "train.parquet: cannot read the Parquet dataset" in proc.stderr
    ), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    csv = tmp_path / "train.csv"
    csv.write_text("prompt\nhi\n")
    proc = _init(
        "--stack",
        "verl",
        "--config",
        str(STACK_CONFIGS / "verl.sh"),
        "--dataset",
        str(csv),
        cwd=tmp_path,
    )
    assert (
        proc.returncode == 2
        and "gate init reads JSONL or Parquet datasets (got .csv)" in proc.stderr
    )


def test_a_dataset_record_without_a_prompt_names_the_line(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "a"}\n{"text": "b"}\n')
    proc = _init(
        "--stack",
        "areal",
        "--config",
        str(STACK_CONFIGS / "areal.yaml"),
        "--dataset",
        str(data),
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        "d.jsonl:2: no prompt: none of prompt, messages, question, problem, query, input is set"
        in proc.stderr
    )
