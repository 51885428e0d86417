"""`gate init` carries every vLLM argument a stack's config sets, or names it with the reason.

Per stack, a config in its own format sets every engine argument that format can hold (the
stacks' code: verl 0.9.1, TRL 1.16.0, OpenRLHF 0.11.2, AReaL 1.0.4 as published; the others from
their repositories' configs, docs/adopt.md), plus settings that look like vLLM's but are the
stack's own. Each test asserts where every argument lands in gate.yaml's engine_args and which
keys are reported as not carried; a key in the stack's vLLM blocks that is neither fails the
invariant test below.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gate.init.mapping import map_config
from gate.init.sources import read_config
from gate.init.stacks import STACKS

R = "actor_rollout_ref.rollout."

# stack -> (file name, config text)
CONFIGS = {
    # The excerpt a new user tried: five of seven arguments carried before, max_model_len
    # (underscore) reported missing, gpu-memory-utilization and max-num-batched-tokens gone unsaid.
    "pipelinerl": (
        "conf.yaml",
        """
vllm_config:
  vllm_kwargs:
    dtype: bfloat16
    gpu-memory-utilization: 0.9
    max-num-batched-tokens: 1024
    logprobs-mode: processed_logprobs
    enable-prefix-caching: false
    async-scheduling: true
    max_model_len: 10000
    no-enable-chunked-prefill: true
    compilation-config:
      mode: 0
    served-model-name: policy
""",
    ),
    "verl": (
        "run.sh",
        f"""
python3 -m verl.trainer.main_ppo \\
  actor_rollout_ref.model.path=Qwen/Qwen3-8B actor_rollout_ref.model.trust_remote_code=True \\
  {R}name=vllm {R}mode=async {R}dtype=float16 {R}tensor_model_parallel_size=2 \\
  {R}gpu_memory_utilization=0.7 {R}max_model_len=8192 {R}max_num_seqs=128 \\
  {R}max_num_batched_tokens=4096 {R}enable_chunked_prefill=False {R}enable_prefix_caching=False \\
  {R}logprobs_mode=processed_logprobs {R}enforce_eager=True +{R}enable_sleep_mode=False \\
  {R}disable_log_stats=False {R}scheduling_policy=priority {R}quantization=fp8 {R}seed=7 \\
  {R}expert_parallel_size=2 {R}enable_rollout_routing_replay=True {R}load_format=dummy \\
  {R}free_cache_engine=True {R}data_parallel_size=2 {R}cudagraph_capture_sizes=[1,2,4] \\
  +{R}engine_kwargs.vllm.disable_cascade_attn=True \\
  +{R}engine_kwargs.vllm.compilation_config.cudagraph_mode=PIECEWISE \\
  +{R}engine_kwargs.vllm.max_num_seqs=64 \\
  {R}speculative_draft=1
""",
    ),
    "trl": (
        "grpo.yaml",
        """
use_vllm: true
vllm_mode: colocate
vllm_tensor_parallel_size: 2
vllm_gpu_memory_utilization: 0.45
vllm_max_model_length: 6144
vllm_enable_sleep_mode: true
vllm_model_impl: transformers
trust_remote_code: true
vllm_server_host: 10.0.0.2
vllm_group_port: 51216
vllm_structured_outputs_regex: "\\\\d+"
vllm_importance_sampling_mode: token_truncate
vllm_kv_offload: true
""",
    ),
    "openrlhf": (
        "train.sh",
        """
python3 -m openrlhf.cli.train_ppo_ray --vllm.num_engines 4 --vllm.tensor_parallel_size 2 \\
  --vllm.gpu_memory_utilization 0.6 --vllm.enable_prefix_caching --vllm.enforce_eager \\
  --vllm.enable_sleep --vllm.sync_backend nccl --data.max_len 4096 --train.seed 3 \\
  --algo.advantage.is_correction_level token --vllm.max_num_seqs 64
""",
    ),
    "nemo-rl": (
        "grpo.yaml",
        """
policy:
  generation:
    vllm_cfg:
      precision: bfloat16
      tensor_parallel_size: 2
      gpu_memory_utilization: 0.6
      max_model_len: 4096
      enable_prefix_caching: false
      logprobs_mode: processed_logprobs
      async_engine: true
      pipeline_parallel_size: 1
    vllm_kwargs:
      max_num_batched_tokens: 2048
      compilation_config:
        mode: 3
        cudagraph_mode: PIECEWISE
""",
    ),
    "prime-rl": (
        "rl.toml",
        """
[inference.vllm]
seed = 0
dtype = "bfloat16"
tensor_parallel_size = 2
gpu_memory_utilization = 0.8
max_model_len = 4096
enable_prefix_caching = true
enforce_eager = true
""",
    ),
    "skyrl": (
        "run.sh",
        """
uv run -m skyrl_train.entrypoints.main_base \\
  generator.inference_engine.model_dtype=bfloat16 \\
  generator.inference_engine.tensor_parallel_size=2 \\
  generator.inference_engine.gpu_memory_utilization=0.8 \\
  generator.inference_engine.enable_prefix_caching=true \\
  generator.inference_engine.engine_init_kwargs.max_num_seqs=128 \\
  generator.inference_engine.engine_init_kwargs.max-num-batched-tokens=8192 \\
  generator.inference_engine.engine_init_kwargs.worker_extension_cls=skyrl.Ext \\
  generator.inference_engine.max_num_batched_tokens=16384
""",
    ),
    "vime": (
        "run.sh",
        """
python train.py --vllm-enable-prefix-caching --vllm-max-num-seqs 256 \\
  --vllm-gpu-memory-utilization 0.8 --vllm-max_model_len 8192 --vllm-host 0.0.0.0
""",
    ),
    "areal": (
        "gsm8k.yaml",
        """
rollout:
  backend: "vllm:d2p1t4"
vllm:
  model: ""
  seed: 1
  dtype: bfloat16
  max_model_len: 32768
  gpu_memory_utilization: 0.9
  no_enable_prefix_caching: true
  no_enable_chunked_prefill: true
  enforce_eager: false
  enable_lora: false
  max_num_seqs: 128
  block_size: 16
  cpu_offload_gb: 0
  disable_sliding_window: true
  max_lora_rank: 16
  worker_extension_cls: areal.engine.vllm_ext.vllm_worker_extension.VLLMWorkerExtension
  uvicorn_log_level: warning
  distributed_executor_backend: mp
""",
    ),
}

# stack -> {engine argument: (value, the key it came from)}; "~" marks the stack's default,
# "=" what the stack fixes whatever its config says
CARRIED = {
    "pipelinerl": {
        "dtype": ("bfloat16", "vllm_config.vllm_kwargs.dtype"),
        "gpu_memory_utilization": (0.9, "vllm_config.vllm_kwargs.gpu-memory-utilization"),
        "max_num_batched_tokens": (1024, "vllm_config.vllm_kwargs.max-num-batched-tokens"),
        "logprobs_mode": ("processed_logprobs", "vllm_config.vllm_kwargs.logprobs-mode"),
        "enable_prefix_caching": (False, "vllm_config.vllm_kwargs.enable-prefix-caching"),
        "async_scheduling": (True, "vllm_config.vllm_kwargs.async-scheduling"),
        "max_model_len": (10000, "vllm_config.vllm_kwargs.max_model_len"),
        "enable_chunked_prefill": (False, "vllm_config.vllm_kwargs.no-enable-chunked-prefill"),
        "compilation_config": ({"mode": 0}, "vllm_config.vllm_kwargs.compilation-config"),
        "quantization": ("bf16_last_layer_fp32", "="),
    },
    "verl": {
        "dtype": ("float16", R + "dtype"),
        "tensor_parallel_size": (2, R + "tensor_model_parallel_size"),
        "gpu_memory_utilization": (0.7, R + "gpu_memory_utilization"),
        "max_model_len": (8192, R + "max_model_len"),
        # engine_kwargs.vllm is spread after the rollout's own keys: it wins, and says so
        "max_num_seqs": (64, R + "engine_kwargs.vllm.max_num_seqs"),
        "max_num_batched_tokens": (4096, R + "max_num_batched_tokens"),
        "enable_chunked_prefill": (False, R + "enable_chunked_prefill"),
        "enable_prefix_caching": (False, R + "enable_prefix_caching"),
        "logprobs_mode": ("processed_logprobs", R + "logprobs_mode"),
        "enforce_eager": (True, R + "enforce_eager"),
        "enable_sleep_mode": (False, R + "enable_sleep_mode"),
        "disable_log_stats": (False, R + "disable_log_stats"),
        "scheduling_policy": ("priority", R + "scheduling_policy"),
        "quantization": ("fp8", R + "quantization"),
        "seed": (7, R + "seed"),
        "enable_expert_parallel": (True, R + "expert_parallel_size"),
        "enable_return_routed_experts": (True, R + "enable_rollout_routing_replay"),
        "trust_remote_code": (True, "actor_rollout_ref.model.trust_remote_code"),
        "disable_cascade_attn": (True, R + "engine_kwargs.vllm.disable_cascade_attn"),
        "compilation_config": (
            {"cudagraph_mode": "PIECEWISE"},
            R + "engine_kwargs.vllm.compilation_config",
        ),
    },
    "trl": {
        "tensor_parallel_size": (2, "vllm_tensor_parallel_size"),
        "gpu_memory_utilization": (0.45, "vllm_gpu_memory_utilization"),
        "max_model_len": (6144, "vllm_max_model_length"),
        "enable_sleep_mode": (True, "vllm_enable_sleep_mode"),
        "model_impl": ("transformers", "vllm_model_impl"),
        "trust_remote_code": (True, "trust_remote_code"),
        "logprobs_mode": ("processed_logprobs", "="),
        "max_num_batched_tokens": (4096, "="),
        "seed": (0, "="),
    },
    "openrlhf": {
        "tensor_parallel_size": (2, "vllm.tensor_parallel_size"),
        "gpu_memory_utilization": (0.6, "vllm.gpu_memory_utilization"),
        "enable_prefix_caching": (True, "vllm.enable_prefix_caching"),
        "enforce_eager": (True, "vllm.enforce_eager"),
        "enable_sleep_mode": (True, "vllm.enable_sleep"),
        "max_model_len": (4096, "data.max_len"),
        "seed": (3, "train.seed"),
        "logprobs_mode": ("processed_logprobs", "algo.advantage.is_correction_level"),
        "dtype": ("bfloat16", "="),
    },
    "nemo-rl": {
        "dtype": ("bfloat16", "policy.generation.vllm_cfg.precision"),
        "tensor_parallel_size": (2, "policy.generation.vllm_cfg.tensor_parallel_size"),
        "gpu_memory_utilization": (0.6, "policy.generation.vllm_cfg.gpu_memory_utilization"),
        "max_model_len": (4096, "policy.generation.vllm_cfg.max_model_len"),
        "enable_prefix_caching": (False, "policy.generation.vllm_cfg.enable_prefix_caching"),
        "logprobs_mode": ("processed_logprobs", "policy.generation.vllm_cfg.logprobs_mode"),
        "async_scheduling": (True, "policy.generation.vllm_cfg.async_engine"),
        "max_num_batched_tokens": (2048, "policy.generation.vllm_kwargs.max_num_batched_tokens"),
        "compilation_config": (
            {"mode": 3, "cudagraph_mode": "PIECEWISE"},
            "policy.generation.vllm_kwargs.compilation_config",
        ),
    },
    "prime-rl": {
        "seed": (0, "inference.vllm.seed"),
        "dtype": ("bfloat16", "inference.vllm.dtype"),
        "tensor_parallel_size": (2, "inference.vllm.tensor_parallel_size"),
        "gpu_memory_utilization": (0.8, "inference.vllm.gpu_memory_utilization"),
        "max_model_len": (4096, "inference.vllm.max_model_len"),
        "enable_prefix_caching": (True, "inference.vllm.enable_prefix_caching"),
        "logprobs_mode": ("processed_logprobs", "="),
    },
    "skyrl": {
        "dtype": ("bfloat16", "generator.inference_engine.model_dtype"),
        "tensor_parallel_size": (2, "generator.inference_engine.tensor_parallel_size"),
        "gpu_memory_utilization": (0.8, "generator.inference_engine.gpu_memory_utilization"),
        "enable_prefix_caching": (True, "generator.inference_engine.enable_prefix_caching"),
        "max_num_seqs": (128, "generator.inference_engine.engine_init_kwargs.max_num_seqs"),
        "max_num_batched_tokens": (
            8192,
            "generator.inference_engine.engine_init_kwargs.max-num-batched-tokens",
        ),
    },
    "vime": {
        "enable_prefix_caching": (True, "vllm-enable-prefix-caching"),
        "max_num_seqs": (256, "vllm-max-num-seqs"),
        "gpu_memory_utilization": (0.8, "vllm-gpu-memory-utilization"),
        "max_model_len": (8192, "vllm-max_model_len"),
        "logprobs_mode": ("processed_logprobs", "="),
    },
    "areal": {
        "seed": (1, "vllm.seed"),
        "tensor_parallel_size": (4, "rollout.backend"),  # the allocation's t4
        "dtype": ("bfloat16", "vllm.dtype"),
        "max_model_len": (32768, "vllm.max_model_len"),
        "gpu_memory_utilization": (0.9, "vllm.gpu_memory_utilization"),
        "enable_prefix_caching": (False, "vllm.no_enable_prefix_caching"),
        "enable_chunked_prefill": (False, "vllm.no_enable_chunked_prefill"),
        "max_num_seqs": (128, "vllm.max_num_seqs"),
        "block_size": (16, "vllm.block_size"),
        "cpu_offload_gb": (0, "vllm.cpu_offload_gb"),  # AReaL passes a 0, not a false
        "disable_sliding_window": (True, "vllm.disable_sliding_window"),
        "max_lora_rank": (16, "vllm.max_lora_rank"),
    },
}

# stack -> the keys reported as not carried, each with words its reason must contain
NOT_CARRIED = {
    "pipelinerl": {"vllm_config.vllm_kwargs.served-model-name": "gate names the model it serves"},
    "verl": {
        R + "load_format": "dummy weights",
        R + "free_cache_engine": "sleep",
        R + "data_parallel_size": "one engine per release",
        R + "cudagraph_capture_sizes": "compilation_config",
        R + "speculative_draft": "no mapping for",
        R + "engine_kwargs.vllm.max_num_seqs": "both set max_num_seqs; the later one",
    },
    "trl": {
        "vllm_server_host": "gate starts its own engine",
        "vllm_group_port": "gate starts its own engine",
        "vllm_structured_outputs_regex": "structured outputs",
        "vllm_importance_sampling_mode": "IS correction",
        "vllm_kv_offload": "no mapping for",
    },
    "openrlhf": {
        "vllm.num_engines": "one engine per release",
        "vllm.max_num_seqs": "no mapping for",
    },
    "nemo-rl": {"policy.generation.vllm_cfg.pipeline_parallel_size": "no mapping for"},
    "prime-rl": {"inference.vllm.enforce_eager": "no mapping for"},
    "skyrl": {
        "generator.inference_engine.engine_init_kwargs.worker_extension_cls": "recipe",
        "generator.inference_engine.max_num_batched_tokens": "no mapping for",
    },
    "vime": {"vllm-host": "gate starts its own engine"},
    "areal": {
        "vllm.model": "passes no such flag",
        "vllm.enforce_eager": "passes no such flag",
        "vllm.enable_lora": "passes no such flag",
        "vllm.worker_extension_cls": "recipe",
        "vllm.uvicorn_log_level": "server launch",
        "vllm.distributed_executor_backend": "executor",
    },
}


def _mapped(stack: str, tmp_path: Path):
    name, text = CONFIGS[stack]
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    config = read_config(path, STACKS[stack].fmt)
    return config, map_config(STACKS[stack], config)


@pytest.mark.parametrize("stack", sorted(CONFIGS))
def test_every_engine_argument_lands_in_engine_args(stack, tmp_path):
    _, mapped = _mapped(stack, tmp_path)
    got = {
        path.removeprefix("engine_args."): f
        for path, f in mapped.fields.items()
        if path.startswith("engine_args.")
    }
    assert {k: f.value for k, f in got.items()} == {k: v for k, (v, _) in CARRIED[stack].items()}
    title = STACKS[stack].title
    for name, (_, where) in CARRIED[stack].items():
        source = got[name].source
        if where == "=":
            assert source.startswith(f"fixed by {title}: "), (name, source)
        elif where.startswith("~"):
            assert source.startswith(f"{title}'s default for {where[1:]}"), (name, source)
        else:
            assert source == f"from {where}", (name, source)


@pytest.mark.parametrize("stack", sorted(CONFIGS))
def test_what_is_not_carried_is_named_with_its_reason(stack, tmp_path):
    _, mapped = _mapped(stack, tmp_path)
    for key, reason in NOT_CARRIED[stack].items():
        line = next((u for u in mapped.unmapped if u.startswith(f"{key}: ")), None)
        assert line is not None, (key, mapped.unmapped)
        assert reason in line, line


@pytest.mark.parametrize("stack", sorted(CONFIGS))
def test_no_key_of_a_stacks_vllm_blocks_disappears_unsaid(stack, tmp_path):
    config, mapped = _mapped(stack, tmp_path)
    s = STACKS[stack]
    blocks = (*s.scopes, *s.passthrough)
    said = " ".join([f.source for f in mapped.fields.values()] + mapped.unmapped)
    for key in config:
        if not key.startswith(blocks) or key.startswith(s.own) or key in s.transport:
            continue
        # the key itself, or the block it is nested in (compilation_config.mode)
        assert any(
            f"{key[: i or None]}" in said
            for i in (None, *[j for j, c in enumerate(key) if c == "."])
        ), key


def test_a_stack_without_cpu_support_for_an_argument_loses_it_under_cpu_with_a_note(tmp_path):
    from gate.init.writer import substitute_cpu

    _, mapped = _mapped("verl", tmp_path)
    notes = substitute_cpu(mapped)
    for name in ("gpu_memory_utilization", "enable_sleep_mode", "quantization",
                 "enable_expert_parallel", "enable_return_routed_experts"):  # fmt: skip
        assert f"engine_args.{name}" not in mapped.fields
        assert any(n.startswith(f"engine_args.{name}: left out") for n in notes), (name, notes)


def test_trls_engine_settings_reach_its_colocated_engine_only(tmp_path):
    """With vllm_mode: server TRL's GRPOConfig vllm_* fields configure no engine (TRL 1.16.0 passes
    them to its colocated LLM(...) only): named, not carried; the processed logprobs `trl
    vllm-serve` hard-codes stay."""
    name, text = CONFIGS["trl"]
    path = tmp_path / name
    path.write_text(text.replace("vllm_mode: colocate", "vllm_mode: server"), encoding="utf-8")
    mapped = map_config(STACKS["trl"], read_config(path, "yaml"))
    engine = {p: f.value for p, f in mapped.fields.items() if p.startswith("engine_args.")}
    assert engine == {"engine_args.logprobs_mode": "processed_logprobs"}
    line = next(u for u in mapped.unmapped if u.startswith("engine_args.gpu_memory_utilization: "))
    assert line == (
        "engine_args.gpu_memory_utilization: 0.45 not carried over (vllm_mode: server: TRL passes "
        "it to its colocated engine only; with vllm_mode: server the engine runs with `trl "
        "vllm-serve`'s flags (processed logprobs hard-coded): set engine_args from that command line)"
    )
