"""Where each RL stack keeps what gate.yaml needs: one table per stack.

Key names, hard-coded engine arguments and defaults come from the stacks' code: TRL 1.16.0, verl
0.9.1 and OpenRLHF 0.11.2 as published on the package registry (their defaults are filled in when a
config leaves a key out, and the written gate.yaml says so); NeMo-RL, prime-rl, PipelineRL, SkyRL,
vime and AReaL from their repositories' configs (docs/adopt.md lists the snapshots). For those six
no default is assumed: a key the config does not set is reported, and gate's own default stands.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gate.init.lora import LoraKeys, NoAdapterPath, same

# The gate.yaml fields a stack's config can fill (dotted paths), in the order gate.yaml lists them.
SAMPLING = (
    "sampling.n",
    "sampling.max_tokens",
    "sampling.temperature",
    "sampling.top_p",
    "sampling.top_k",
)
ENGINE = (
    "engine_args.dtype", "engine_args.seed", "engine_args.tensor_parallel_size", "engine_args.max_model_len",
    "engine_args.gpu_memory_utilization", "engine_args.max_num_seqs", "engine_args.max_num_batched_tokens",
    "engine_args.enable_chunked_prefill", "engine_args.enable_prefix_caching", "engine_args.logprobs_mode",
    "engine_args.enforce_eager", "engine_args.enable_sleep_mode", "engine_args.model_impl",
    "engine_args.async_scheduling", "engine_args.quantization", "engine_args.trust_remote_code",
)  # fmt: skip


def off_is_zero(value: Any) -> Any:
    """Stacks write top-k off as -1 (vLLM's convention) or null; gate.yaml as 0."""
    return 0 if value is None or value == -1 else value


def allocation_tp(value: Any) -> Any:
    """AReaL's ``rollout.backend`` allocation (``vllm:d4p1t2``): the engine's tensor-parallel size,
    which AReaL passes as the server's --tensor-parallel-size; None where it names none."""
    found = re.search(r"(?:^|[:.|])(?:[dp]\d+)*t(\d+)", str(value)) if value is not None else None
    return int(found.group(1)) if found else None


def unset_is_raw(value: Any) -> Any:
    """No logprobs_mode passed: vLLM's default, raw logprobs (what the stack then trains on)."""
    return "raw_logprobs" if value in (None, "", "None") else value


@dataclass(frozen=True)
class Key:
    """Where a stack keeps one gate.yaml field: the first of ``keys`` the config sets; else the
    stack's own ``default`` (read from its code) when it has one known to gate."""

    keys: tuple[str, ...]
    default: Any = None
    has_default: bool = False
    convert: Callable[[Any], Any] | None = None


def key(*keys: str, convert: Callable[[Any], Any] | None = None, **default: Any) -> Key:
    """``key("a.b", "c", default=1)``: a default only where one is given (None is a value)."""
    return Key(keys, default.get("default"), "default" in default, convert)


@dataclass(frozen=True)
class LossChoice:
    """The stack's objective as gate.yaml's grpo.loss, the clip band, and the keys that decided."""

    loss: str
    clip_eps: float | None
    clip_eps_high: float | None
    why: str
    unmapped: tuple[str, ...] = ()
    band_why: str = ""  # where the clip band came from, when not from ``why``'s keys


@dataclass(frozen=True)
class DatasetKeys:
    """Where a stack's config names its training prompts (docs/adopt.md, "The prompts")."""

    keys: tuple[str, ...]  # the first the config sets names the data
    # a field name of the records, each as (the config key that renames it, the stack's default)
    prompt: tuple[str | None, str | None] = (None, None)
    answer: tuple[str | None, str | None] = (None, None)
    comma_separated: bool = False  # OpenRLHF's "a.jsonl,b.parquet"
    split: str = "train"  # the file or folder part a folder of splits is read from
    # how the stack's entries that are not file paths are resolved (PipelineRL: a name is a local
    # JSONL under these folders)
    search: tuple[str, ...] = ()
    none_why: str = ""  # a stack whose prompts come from elsewhere: where, and what to do


@dataclass(frozen=True)
class Stack:
    name: str
    title: str
    fmt: str  # gate.init.sources.FORMATS: how its config is read
    vllm_spec: str  # what its repository pins, as the old engine's default
    fields: Mapping[str, Key]
    # what the stack passes to vLLM whatever its config says: gate path -> (value, why)
    fixed: Mapping[str, tuple[Any, str]] = field(default_factory=dict)
    # config prefixes whose keys are engine arguments passed to vLLM as they are
    passthrough: tuple[str, ...] = ()
    # values the stack leaves out when it turns the pass-through block into flags (AReaL passes no
    # false, empty or null one: vLLM's default stands)
    passthrough_skips: tuple[Any, ...] = (None,)
    # config prefixes where the stack keeps its vLLM settings: a key set there that gate neither
    # carries nor lists with a reason is reported by name, so nothing is dropped unsaid
    scopes: tuple[str, ...] = ()
    # key prefixes inside the scopes that are the stack's own and never reach vLLM (placement,
    # its agent loop, its logging): read, not reported
    own: tuple[str, ...] = ()
    # keys that say how weights reach vLLM (reported: the recipe depends on them)
    transport: tuple[str, ...] = ()
    loss: Callable[[Mapping[str, Any]], LossChoice] | None = None
    # engine settings the stack passes only in some mode: (key, value, its default) when they hold,
    # the gate.yaml paths they fill, and why they reach no engine otherwise
    only_when: tuple[tuple[str, Any, Any], tuple[str, ...], str] | None = None
    # stack keys gate does not reproduce, with why (reported when the config sets them)
    ignored: Mapping[str, str] = field(default_factory=dict)
    # gate/init/recipes/<recipe>.py: the stack's update path, and what it needs in the engine's env
    recipe: str | None = None
    recipe_env: Mapping[str, str] = field(default_factory=dict)
    # (key, value, the stack's default) each: the recipe applies when every key is its value, set
    # or by default
    recipe_when: tuple[tuple[str, Any, Any], ...] = ()
    # the recipe's functions: weight_update.hook, and fn(engine, state_dict) for the in-flight probe
    # where the stack updates while requests run
    recipe_hook: str = "update"
    recipe_inflight: str | None = None
    # gate's mode: "server" where the stack drives vLLM's OpenAI server, with why
    mode: tuple[str, str] = ("offline", "")
    dataset: DatasetKeys = DatasetKeys(())
    # where the stack's config sets a LoRA adapter (gate/init/lora.py): the first that is on counts
    lora: tuple[LoraKeys | NoAdapterPath, ...] = ()


def first_set(config: Mapping[str, Any], *keys: str, default: Any = None) -> tuple[Any, str | None]:
    """(value, key) of the first of ``keys`` the config sets, its last part spelled with ``-`` or
    ``_`` (vLLM's argument parser takes both, and stacks that pass keys as flags write either);
    (default, None) when none is."""
    for k in keys:
        for spelled in spellings(k):
            if spelled in config:
                return config[spelled], spelled
    return default, None


def spellings(key: str) -> tuple[str, ...]:
    """``a.max-model-len`` -> (itself, ``a.max_model_len``): the two spellings of its last part."""
    head, dot, last = key.rpartition(".")
    other = last.replace("-", "_") if "-" in last else last.replace("_", "-")
    return (key,) if other == last else (key, head + dot + other)


def _loss_from_band(
    low: float, high: float, base: str, why: str, band_why: str, unmapped: tuple[str, ...] = ()
) -> LossChoice:
    """A token-level PPO clip with an upper edge above the lower one is DAPO's clip-higher."""
    if base == "grpo" and high > low:
        return LossChoice(
            "dapo", low, high, why + f", clip-higher {low:g} / {high:g}", unmapped, band_why
        )
    return LossChoice(base, low, high, why, unmapped, band_why)


def trl_loss(config: Mapping[str, Any]) -> LossChoice:
    level, _ = first_set(config, "importance_sampling_level", default="token")
    loss_type, _ = first_set(config, "loss_type", default="dapo")
    low, _ = first_set(config, "epsilon", default=0.2)
    high, _ = first_set(config, "epsilon_high", default=None)
    high = low if high is None else high
    band = "from epsilon / epsilon_high (TRL's defaults 0.2 / epsilon where unset)"
    if level == "sequence":
        return LossChoice(
            "gspo", low, high, "from importance_sampling_level: sequence", band_why=band
        )
    if loss_type == "dr_grpo":
        return _loss_from_band(low, high, "dr_grpo", "from loss_type: dr_grpo", band)
    unmapped: tuple[str, ...] = ()
    if loss_type not in ("dapo", "bnpo"):  # both are a token mean over the batch, as gate's grpo is
        unmapped = (f"loss_type: {loss_type} (gate runs a token mean over the batch: TRL's dapo)",)
    return _loss_from_band(low, high, "grpo", f"from loss_type: {loss_type}", band, unmapped)


def verl_loss(config: Mapping[str, Any]) -> LossChoice:
    a = "actor_rollout_ref.actor."
    mode, _ = first_set(config, a + "policy_loss.loss_mode", default="vanilla")
    agg, _ = first_set(config, a + "loss_agg_mode", default="token-mean")
    clip, _ = first_set(config, a + "clip_ratio", default=0.2)
    low, _ = first_set(config, a + "clip_ratio_low", default=clip)
    high, _ = first_set(config, a + "clip_ratio_high", default=clip)
    std, _ = first_set(config, "algorithm.norm_adv_by_std_in_grpo", default=True)
    band = f"from {a}clip_ratio_low / clip_ratio_high (verl's default: clip_ratio, 0.2)"
    if mode == "gspo":
        return LossChoice("gspo", low, high, f"from {a}policy_loss.loss_mode: gspo", band_why=band)
    if agg == "seq-mean-token-sum-norm" and std is False:
        why = f"from {a}loss_agg_mode: {agg}, algorithm.norm_adv_by_std_in_grpo: false"
        return _loss_from_band(low, high, "dr_grpo", why, band)
    unmapped = []
    if mode != "vanilla":
        unmapped.append(f"{a}policy_loss.loss_mode: {mode} (gate runs PPO clip, gspo or Dr. GRPO)")
    if agg != "token-mean":
        unmapped.append(f"{a}loss_agg_mode: {agg} (gate's grpo and dapo take the token mean)")
    why = f"from {a}policy_loss.loss_mode: {mode}, {a}loss_agg_mode: {agg}"
    return _loss_from_band(low, high, "grpo", why, band, tuple(unmapped))


def openrlhf_loss(config: Mapping[str, Any]) -> LossChoice:
    kind, _ = first_set(config, "actor.policy_loss_type", default="ppo")
    eps, _ = first_set(config, "actor.eps_clip", default=0.2)
    pair, _ = first_set(config, "actor.eps_clip_low_high", default=None)
    low, high = (pair[0], pair[1]) if isinstance(pair, list) and len(pair) == 2 else (eps, eps)
    band = (
        "from actor.eps_clip_low_high" if pair else "from actor.eps_clip (OpenRLHF's default 0.2)"
    )
    if kind == "gspo":
        return LossChoice("gspo", low, high, "from actor.policy_loss_type: gspo", band_why=band)
    agg, _ = first_set(config, "actor.loss_agg_mode", default="token-mean")
    unmapped = []
    if agg != "token-mean":
        unmapped.append(f"actor.loss_agg_mode: {agg} (gate's grpo takes the token mean)")
    return _loss_from_band(
        low, high, "grpo", f"from actor.policy_loss_type: {kind}", band, tuple(unmapped)
    )


def pipelinerl_loss(config: Mapping[str, Any]) -> LossChoice:
    loss, where = first_set(
        config, "finetune.rl.policy_loss", "rl.policy_loss", "policy_loss", default=None
    )
    if loss == "gspo":
        return LossChoice("gspo", None, None, f"from {where}: gspo")
    why = f"from {where}: {loss}" if where else "policy_loss not set"
    return LossChoice("grpo", None, None, why)


# TRL 1.16.0 vllm_generation.py: only its colocated LLM(...) gets these; `trl vllm-serve` has flags
# of its own (and hard-codes processed logprobs)
TRL_COLOCATE_ONLY = (
    ("vllm_mode", "colocate", "colocate"),
    tuple(f"engine_args.{k}" for k in ("tensor_parallel_size", "gpu_memory_utilization", "max_model_len",
          "enable_sleep_mode", "model_impl", "trust_remote_code", "max_num_batched_tokens", "seed")),
    "TRL passes it to its colocated engine only; with vllm_mode: server the engine runs with `trl "
    "vllm-serve`'s flags (processed logprobs hard-coded): set engine_args from that command line",
)  # fmt: skip
R = "actor_rollout_ref.rollout."
# verl's rollout keys that never reach vLLM (verl 0.9.1 workers/config/rollout.py): its agent loop,
# placement, logging and weight-sync mechanics
VERL_OWN = (
    "name", "do_sample", "val_kwargs.", "calculate_log_probs", "prompt_length", "log_prob_", "agent.",
    "trace.", "multi_turn.", "server.", "prometheus.", "profiler.", "custom", "checkpoint_manager_class",
    "layered_summon", "layer_name_map", "multi_stage_wake_up", "over_sample_rate", "sglang_engine_mode",
    "nnodes", "n_gpus_per_node", "router_config_path", "moe_load_balance_metrics_interval",
    "engine_kwargs.sglang.", "engine_kwargs.trtllm.", "ignore_eos", "full_determinism",
)  # fmt: skip
G, V = "policy.generation.", "policy.generation.vllm_cfg."
IE, SP = "generator.inference_engine.", "generator.sampling_params."


def _areal_naming(config: Mapping[str, Any]) -> tuple[str, str]:
    mode = config.get("actor.weight_update_mode", "xccl")
    if mode == "disk":
        return "new-id", (
            "actor.weight_update_mode: disk: AReaL loads each version under a new name "
            "{lora_name}-v{version} through /v1/load_lora_adapter"
        )
    return "same-id", (
        f"actor.weight_update_mode: {mode}: AReaL removes the adapter (remove_adapter) and adds "
        "the new version under the same id"
    )


_MERGES_FULL = "merges the adapter into the weights and pushes them whole"
_TRL_LORA = NoAdapterPath(
    ("use_peft",),
    f"TRL's GRPOTrainer {_MERGES_FULL} (merge_adapter, push, unmerge_adapter): gate's "
    "full-weight probe is that path",
)
_NEMO_LORA = NoAdapterPath(
    ("policy.dtensor_cfg.lora_cfg.enabled", "policy.megatron_cfg.peft.enabled"),
    f"NeMo-RL {_MERGES_FULL} (W + B @ A * scale, or Megatron-Bridge's export): gate's "
    "full-weight probe is that path",
)
_OPENRLHF_LORA = NoAdapterPath(
    ("ds.lora.rank",),
    "OpenRLHF 0.11.2 sends the PEFT parameter names to vLLM's load_weights unmerged, with no "
    "enable_lora (reported broken upstream, OpenRLHF #1349): there is no adapter path to test",
)
_PIPELINERL_LORA = NoAdapterPath(
    ("finetune.lora.enabled",),
    "PipelineRL's training path never applies it (prepare_lora_model is not called) and pushes "
    "every parameter whole",
)
_VERL_SAME_ID = same(
    "same-id", "verl removes adapter 123 (remove_lora) and adds the new version under it"
)
_VERL_MERGE = ("actor_rollout_ref.model.lora.merge", True, False)
_VERL_MERGE_WHY = f"verl {_MERGES_FULL} with lora.merge"
_VERL_LORA = (
    LoraKeys(
        rank="actor_rollout_ref.model.lora_rank",
        alpha="actor_rollout_ref.model.lora_alpha",
        target_modules="actor_rollout_ref.model.target_modules",
        defaults=(0, 16, "all-linear"),
        naming=_VERL_SAME_ID,
        merges_when=_VERL_MERGE,
        merges_why=_VERL_MERGE_WHY,
    ),
    LoraKeys(  # the Megatron backend's block
        rank="actor_rollout_ref.model.lora.rank",
        alpha="actor_rollout_ref.model.lora.alpha",
        target_modules="actor_rollout_ref.model.lora.target_modules",
        defaults=(0, 32, ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]),
        naming=_VERL_SAME_ID,
        merges_when=_VERL_MERGE,
        merges_why=_VERL_MERGE_WHY,
    ),
)
_SKYRL_LORA = (
    LoraKeys(
        rank="trainer.policy.model.lora.rank",
        alpha="trainer.policy.model.lora.alpha",
        target_modules="trainer.policy.model.lora.target_modules",
        defaults=(0, 16, "all-linear"),
        naming=same(
            "in-place",
            "SkyRL reloads its one adapter (skyrl-lora) under the same id with load_inplace",
        ),
        merges_when=("trainer.strategy", "megatron", None),
        merges_why=f"SkyRL's Megatron backend {_MERGES_FULL} by default (merge_lora)",
    ),
)
_PRIME_RL_LORA = (
    LoraKeys(
        rank="trainer.model.lora.rank",
        alpha="trainer.model.lora.alpha",
        target_modules="trainer.model.lora.target_modules",
        defaults=(
            16,
            32.0,
            ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        ),
        naming=same(
            "in-place",
            "prime-rl reloads its adapter under the same name and id with load_inplace",
        ),
        on_when_present="trainer.model.lora.",
    ),
)
_AREAL_LORA = (
    LoraKeys(
        rank="actor.lora_rank",
        alpha="actor.lora_alpha",
        target_modules="actor.target_modules",
        defaults=(32, 16, []),
        naming=_areal_naming,
        switch="actor.use_lora",
    ),
)


STACKS: dict[str, Stack] = {
    s.name: s
    for s in (
        Stack(
            name="trl",
            lora=(_TRL_LORA,),
            title="TRL (GRPOTrainer)",
            fmt="yaml",
            vllm_spec="vllm==0.25.1",
            fields={
                "model.path": key("model_name_or_path"),
                "sampling.n": key("num_generations", default=8),
                "sampling.max_tokens": key("max_completion_length", default=512),
                "sampling.temperature": key("temperature", default=1.0),
                "sampling.top_p": key("top_p", default=1.0),
                "sampling.top_k": key("top_k", default=0, convert=off_is_zero),
                "sampling.repetition_penalty": key("repetition_penalty", default=1.0),
                "engine_args.tensor_parallel_size": key("vllm_tensor_parallel_size", default=1),
                "engine_args.gpu_memory_utilization": key(
                    "vllm_gpu_memory_utilization", default=0.3
                ),
                "engine_args.max_model_len": key("vllm_max_model_length", default=None),
                "engine_args.enable_sleep_mode": key("vllm_enable_sleep_mode", default=False),
                "engine_args.model_impl": key("vllm_model_impl", default="auto"),
                "engine_args.trust_remote_code": key("trust_remote_code", default=False),
            },
            fixed={
                "engine_args.logprobs_mode": (
                    "processed_logprobs",
                    "TRL's colocated LLM(...) and `trl vllm-serve` both pass it",
                ),
                "engine_args.max_num_batched_tokens": (4096, "TRL's colocated LLM(...) passes it"),
                "engine_args.seed": (
                    0,
                    "TRL seeds each engine with process_index // tp: rank 0's engine",
                ),
            },
            transport=("vllm_mode",),
            loss=trl_loss,
            scopes=("vllm_",),
            ignored={
                "min_p": "gate samples without min_p",
                "generation_kwargs": "extra SamplingParams are not replayed",
                "vllm_importance_sampling_correction": "the trainer's IS correction is the trainer's, not the engine's",
                **dict.fromkeys(
                    (
                        "vllm_importance_sampling_mode",
                        "vllm_importance_sampling_cap",
                        "vllm_importance_sampling_clip_min",
                        "vllm_importance_sampling_clip_max",
                    ),
                    "the trainer's IS correction is the trainer's, not the engine's",
                ),
                **dict.fromkeys(
                    (
                        "vllm_server_base_url",
                        "vllm_server_host",
                        "vllm_server_port",
                        "vllm_server_timeout",
                        "vllm_group_port",
                    ),
                    "TRL's client of a server it did not start; gate starts its own engine",
                ),
                "vllm_structured_outputs_regex": "a per-request SamplingParams: gate samples without structured outputs",
                "vllm_guided_decoding_regex": "a per-request SamplingParams: gate samples without guided decoding",
            },
            dataset=DatasetKeys(
                # datasets: [{path: json, data_files: ...}] (a mixture) or dataset_name (a Hub id or
                # a folder); the prompt is always the "prompt" column
                ("datasets", "dataset_name"),
                prompt=(None, "prompt"),
                split="train",
            ),
            recipe="trl_colocate",
            # the model in this process, as under TRL's external launcher
            recipe_env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
            recipe_when=(("vllm_mode", "colocate", "colocate"),),
            # TRL 1.16.0 vllm_generation.py: only the colocated LLM(...) gets them
            only_when=TRL_COLOCATE_ONLY,
        ),
        Stack(
            name="verl",
            lora=_VERL_LORA,
            title="verl",
            fmt="yaml",
            vllm_spec="vllm==0.24.0",
            fields={
                "model.path": key("actor_rollout_ref.model.path"),
                "sampling.n": key(R + "n", default=1),
                "sampling.max_tokens": key(
                    R + "response_length", "data.max_response_length", default=512
                ),
                "sampling.temperature": key(R + "temperature", default=1.0),
                "sampling.top_p": key(R + "top_p", default=1.0),
                "sampling.top_k": key(R + "top_k", default=-1, convert=off_is_zero),
                "sampling.repetition_penalty": key(R + "repetition_penalty", default=1.0),
                "engine_args.seed": key(R + "seed", default=42),
                "engine_args.dtype": key(R + "dtype", default="bfloat16"),
                "engine_args.tensor_parallel_size": key(
                    R + "tensor_model_parallel_size", default=2
                ),
                "engine_args.gpu_memory_utilization": key(
                    R + "gpu_memory_utilization", default=0.5
                ),
                "engine_args.max_model_len": key(R + "max_model_len", default=None),
                "engine_args.max_num_seqs": key(R + "max_num_seqs", default=256),
                "engine_args.max_num_batched_tokens": key(
                    R + "max_num_batched_tokens", default=8192
                ),
                "engine_args.enable_chunked_prefill": key(
                    R + "enable_chunked_prefill", default=True
                ),
                "engine_args.enable_prefix_caching": key(R + "enable_prefix_caching", default=True),
                "engine_args.logprobs_mode": key(R + "logprobs_mode", default="processed_logprobs"),
                "engine_args.enforce_eager": key(R + "enforce_eager", default=False),
                "engine_args.enable_sleep_mode": key(R + "enable_sleep_mode", default=True),
                "engine_args.disable_log_stats": key(R + "disable_log_stats", default=True),
                "engine_args.scheduling_policy": key(R + "scheduling_policy", default="fcfs"),
                "engine_args.quantization": key(R + "quantization", default=None),
                # verl passes expert_parallel_size > 1 as vLLM's switch
                "engine_args.enable_expert_parallel": key(
                    R + "expert_parallel_size",
                    default=1,
                    convert=lambda n: True if n and n > 1 else None,
                ),
                "engine_args.enable_return_routed_experts": key(
                    R + "enable_rollout_routing_replay",
                    default=False,
                    convert=lambda on: True if on else None,
                ),
                "engine_args.trust_remote_code": key(
                    "actor_rollout_ref.model.trust_remote_code", default=False
                ),
            },
            passthrough=(R + "engine_kwargs.vllm.",),
            scopes=(R,),
            own=tuple(R + k for k in VERL_OWN),
            transport=(R + "mode", R + "checkpoint_engine.backend"),
            loss=verl_loss,
            dataset=DatasetKeys(
                ("data.train_files",),
                prompt=("data.prompt_key", "prompt"),
                answer=(None, "reward_model.ground_truth"),
            ),
            recipe="verl_bucketed",
            # the model in this process: collective_rpc runs the receiver beside the sender's thread
            recipe_env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
            recipe_when=((R + "checkpoint_engine.backend", "naive", "naive"),),
            ignored={
                R
                + "multi_turn.enable": "multi-turn tool rollouts are not replayed; single turns are",
                R
                + "load_format": "verl starts the engine on dummy weights and syncs the policy in; "
                "gate loads the checkpoint, then pushes weights in its probes",
                R + "data_parallel_size": "gate runs one engine per release",
                R + "cudagraph_capture_sizes": "verl merges it into compilation_config: set "
                "engine_args.compilation_config by hand",
                R
                + "free_cache_engine": "verl's own sleep/wake between rollouts; gate's probe sleeps "
                "the engine when enable_sleep_mode is on",
                R
                + "skip_tokenizer_init": "verl's vLLM server passes skip_tokenizer_init=False whatever it says",
                R + "pipeline_model_parallel_size": "verl requires 1 for vLLM and never passes it",
            },
        ),
        Stack(
            name="openrlhf",
            lora=(_OPENRLHF_LORA,),
            title="OpenRLHF",
            fmt="flags",
            vllm_spec="vllm==0.27.1",
            fields={
                "model.path": key("actor.model_name_or_path"),
                "sampling.n": key("rollout.n_samples_per_prompt", default=1),
                # unset, OpenRLHF generates up to data.max_len minus each prompt's length
                "sampling.max_tokens": key("rollout.max_new_tokens"),
                "sampling.temperature": key("rollout.temperature", default=1.0),
                "sampling.top_p": key("rollout.top_p", default=1.0),
                "engine_args.seed": key("train.seed", default=42),
                "engine_args.tensor_parallel_size": key("vllm.tensor_parallel_size", default=1),
                "engine_args.gpu_memory_utilization": key(
                    "vllm.gpu_memory_utilization", default=0.95
                ),
                "engine_args.max_model_len": key("data.max_len", default=2048),
                "engine_args.enable_prefix_caching": key(
                    "vllm.enable_prefix_caching", default=False
                ),
                "engine_args.enforce_eager": key("vllm.enforce_eager", default=False),
                "engine_args.enable_sleep_mode": key("vllm.enable_sleep", default=False),
                # processed only when its IS correction is on; otherwise nothing is passed: vLLM's raw
                "engine_args.logprobs_mode": key(
                    "algo.advantage.is_correction_level",
                    default="off",
                    convert=lambda level: (
                        "raw_logprobs" if level == "off" else "processed_logprobs"
                    ),
                ),
            },
            fixed={
                "engine_args.dtype": (
                    "bfloat16",
                    "OpenRLHF's create_vllm_engines hard-codes it; WorkerWrap asserts it",
                ),
                "sampling.top_k": (0, "OpenRLHF samples with top_k -1 (off)"),
            },
            transport=(
                "vllm.sync_backend",
                "vllm.sync_with_ray",
                "train.colocate_all",
                "train.async_enable",
            ),
            scopes=("vllm.",),
            ignored={"vllm.num_engines": "gate runs one engine per release"},
            loss=openrlhf_loss,
            dataset=DatasetKeys(
                ("data.prompt_dataset", "prompt_data"),
                prompt=("data.input_key", "input"),
                answer=("data.label_key", None),
                comma_separated=True,
            ),
            recipe="openrlhf_broadcast",
            # the engine's model in gate's process, where the push runs (as verl's and NeMo-RL's)
            recipe_env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
            # the broadcast to every engine (colocated, OpenRLHF hands CUDA-IPC handles instead;
            # with sync_with_ray, Ray's collective carries it)
            recipe_when=(
                ("train.colocate_all", False, False),
                ("vllm.sync_with_ray", False, False),
            ),
        ),
        Stack(
            name="nemo-rl",
            lora=(_NEMO_LORA,),
            title="NeMo-RL",
            fmt="yaml",
            vllm_spec="vllm==0.25.1",
            fields={
                "model.path": key("policy.model_name"),
                "sampling.n": key("grpo.num_generations_per_prompt"),
                "sampling.max_tokens": key(G + "max_new_tokens"),
                "sampling.temperature": key(G + "temperature"),
                "sampling.top_p": key(G + "top_p"),
                "sampling.top_k": key(G + "top_k", convert=off_is_zero),
                "engine_args.dtype": key(V + "precision"),
                "engine_args.tensor_parallel_size": key(V + "tensor_parallel_size"),
                "engine_args.gpu_memory_utilization": key(V + "gpu_memory_utilization"),
                "engine_args.max_model_len": key(V + "max_model_len"),
                "engine_args.enable_prefix_caching": key(V + "enable_prefix_caching"),
                "engine_args.logprobs_mode": key(V + "logprobs_mode"),
                "engine_args.async_scheduling": key(V + "async_engine"),
            },
            passthrough=(G + "vllm_kwargs.",),
            scopes=(V,),
            transport=(G + "colocated.enabled", G + "refit_transport"),
            dataset=DatasetKeys(
                # with dataset_name: ResponseDataset; a built-in name is NeMo-RL's own loader
                ("data.train.data_path",),
                prompt=("data.train.input_key", "input"),
                answer=("data.train.output_key", "output"),
            ),
            recipe="nemo_rl_ipc_zmq",
            # the model in this process: collective_rpc runs the worker side beside the sender's thread
            recipe_env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
            # colocated, on the topology's default transport (null: CUDA IPC when colocated)
            recipe_when=(
                (G + "colocated.enabled", True, True),
                (G + "refit_transport", None, None),
            ),
        ),
        Stack(
            name="prime-rl",
            lora=_PRIME_RL_LORA,
            title="prime-rl",
            fmt="toml",
            vllm_spec="vllm==0.26.0",
            fields={
                "model.path": key("model.name"),
                "sampling.n": key("orchestrator.group_size"),
                "sampling.max_tokens": key(
                    "orchestrator.train.sampling.max_completion_tokens",
                    "orchestrator.sampling.max_tokens",
                ),
                "sampling.temperature": key(
                    "orchestrator.train.sampling.temperature", "orchestrator.sampling.temperature"
                ),
                "engine_args.seed": key("inference.vllm.seed"),
                "engine_args.dtype": key("inference.vllm.dtype"),
                "engine_args.tensor_parallel_size": key("inference.vllm.tensor_parallel_size"),
                "engine_args.gpu_memory_utilization": key("inference.vllm.gpu_memory_utilization"),
                "engine_args.max_model_len": key("inference.vllm.max_model_len"),
                "engine_args.enable_prefix_caching": key("inference.vllm.enable_prefix_caching"),
            },
            fixed={
                "sampling.top_p": (1.0, "prime-rl samples with top_p 1"),
                "engine_args.logprobs_mode": ("processed_logprobs", "prime-rl's server default"),
            },
            transport=("inference.weight_broadcast.type",),
            scopes=("inference.vllm.",),
            ignored={
                "inference.enable_fp32_lm_head": "prime-rl's fp32 head is its own plugin; set hf_overrides.head_dtype where vLLM supports it"
            },
            mode=("server", "prime-rl drives vLLM through its own vllm serve wrapper"),
            dataset=DatasetKeys(
                (),
                none_why="prime-rl's prompts come from a verifiers environment "
                "([[orchestrator.train.source]] env.taskset.id), not a file its config names: "
                "export the taskset's prompts to JSONL and pass --dataset",
            ),
            recipe="server_folder_reload",
            recipe_when=(("inference.weight_broadcast.type", "filesystem", "filesystem"),),
            recipe_hook="prime_rl_update",
            recipe_inflight="prime_rl_update_inflight",
        ),
        Stack(
            name="pipelinerl",
            lora=(_PIPELINERL_LORA,),
            title="PipelineRL",
            fmt="yaml",
            vllm_spec="vllm==0.18.1",
            fields={
                "model.path": key("model_path"),
                "sampling.n": key("attempts"),
                "sampling.max_tokens": key("llm.parameters.max_tokens"),
                "sampling.temperature": key("llm.parameters.temperature"),
                "sampling.top_p": key("llm.parameters.top_p"),
                "sampling.top_k": key("llm.parameters.top_k", convert=off_is_zero),
            },
            # PipelineRL passes each key of vllm_kwargs to vLLM as a flag, in either spelling
            passthrough=("vllm_config.vllm_kwargs.", "vllm_kwargs."),
            fixed={
                "engine_args.quantization": (
                    "bf16_last_layer_fp32",
                    "PipelineRL always passes it (its own registered quantization)",
                )
            },
            loss=pipelinerl_loss,
            dataset=DatasetKeys(
                # each name a built-in, an org/name Hub id, or a local JSONL whose records hold
                # task and answer
                ("train_dataset_names",),
                prompt=(None, "task"),
                answer=(None, "answer"),
                search=("datasets/custom", "datasets/custom_runs"),
            ),
        ),
        Stack(
            name="skyrl",
            lora=_SKYRL_LORA,
            title="SkyRL",
            fmt="yaml",
            vllm_spec="vllm==0.26.0",
            fields={
                "model.path": key("trainer.policy.model.path"),
                "sampling.n": key("generator.n_samples_per_prompt"),
                "sampling.max_tokens": key(SP + "max_generate_length"),
                "sampling.temperature": key(SP + "temperature"),
                "sampling.top_p": key(SP + "top_p"),
                "sampling.top_k": key(SP + "top_k", convert=off_is_zero),
                "engine_args.seed": key("trainer.seed"),
                "engine_args.dtype": key(IE + "model_dtype"),
                "engine_args.tensor_parallel_size": key(IE + "tensor_parallel_size"),
                "engine_args.gpu_memory_utilization": key(IE + "gpu_memory_utilization"),
                "engine_args.enable_prefix_caching": key(IE + "enable_prefix_caching"),
            },
            passthrough=(IE + "engine_init_kwargs.",),
            scopes=(IE,),
            transport=(IE + "weight_sync_backend", "trainer.placement.colocate_all"),
            ignored={SP + "min_p": "gate samples without min_p"},
            dataset=DatasetKeys(
                ("data.train_data",),
                prompt=(None, "prompt"),
                answer=(None, "reward_spec.ground_truth"),
            ),
        ),
        Stack(
            name="vime",
            title="slime with vime (vLLM)",
            fmt="flags",
            vllm_spec="vllm",
            fields={
                "model.path": key("hf-checkpoint"),
                "sampling.n": key("n-samples-per-prompt"),
                "sampling.max_tokens": key("rollout-max-response-len"),
                "sampling.temperature": key("rollout-temperature"),
                "sampling.top_p": key("rollout-top-p"),
                "sampling.top_k": key("rollout-top-k", convert=off_is_zero),
                "engine_args.seed": key("rollout-seed"),
            },
            fixed={
                "engine_args.logprobs_mode": (
                    "processed_logprobs",
                    "vime forces processed logprobs",
                )
            },
            passthrough=("vllm-",),
            dataset=DatasetKeys(
                ("prompt-data",), prompt=("input-key", "input"), answer=("label-key", None)
            ),
        ),
        Stack(
            name="areal",
            lora=_AREAL_LORA,
            title="AReaL",
            fmt="yaml",
            vllm_spec="vllm==0.19.1",
            fields={
                "model.path": key("actor.path"),
                "sampling.n": key("gconfig.n_samples"),
                "sampling.max_tokens": key("gconfig.max_new_tokens"),
                "sampling.temperature": key("gconfig.temperature"),
                "sampling.top_p": key("gconfig.top_p"),
                "sampling.top_k": key("gconfig.top_k", convert=off_is_zero),
                "engine_args.seed": key("vllm.seed"),
                "engine_args.tensor_parallel_size": key("rollout.backend", convert=allocation_tp),
                "engine_args.dtype": key("vllm.dtype"),
                "engine_args.max_model_len": key("vllm.max_model_len"),
                "engine_args.gpu_memory_utilization": key("vllm.gpu_memory_utilization"),
                "engine_args.enable_prefix_caching": key(
                    "vllm.no_enable_prefix_caching", convert=lambda off: not off
                ),
                "engine_args.logprobs_mode": key("vllm.logprobs_mode", convert=unset_is_raw),
            },
            # vLLMConfig: every field becomes a `vllm serve` flag (cli_args.py get_py_cmd), except
            # the false, empty and null ones
            passthrough=("vllm.",),
            passthrough_skips=(None, False, "", []),
            transport=("rollout.backend", "actor.weight_update_mode"),
            mode=("server", "AReaL drives vLLM through its own server (areal_vllm_server)"),
            # a built-in dataset's Hub id (openai/gsm8k) or local copy, or a save_to_disk folder
            dataset=DatasetKeys(("train_dataset.path",), split="train"),
            recipe="server_folder_reload",
            # AReaL's default is xccl: a broadcast over its own NCCL group (GPU only)
            recipe_when=(("actor.weight_update_mode", "disk", "xccl"),),
            recipe_hook="areal_update",
            recipe_inflight="areal_update_inflight",
        ),
    )
}
