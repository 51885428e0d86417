"""The file seam between the orchestrator and an engine worker.

The orchestrator writes a :class:`WorkerRequest` as JSON; ``python -m gate.worker`` reads it inside
an engine environment and writes the files named in :data:`OUTPUT_FILES` into ``output_dir``.
This module is imported on both sides: the standard library and msgspec (a dependency of the gate
and of every vLLM release) only.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

REQUEST_SCHEMA_VERSION = 2

# The parameters the mini GRPO run trains unless told otherwise: the last two decoder layers, a
# subset whose optimizer state fits beside the engine, and that holds the q/k/v and gate/up weights
# vLLM packs into one tensor (so the push's packing is tested). gate.yaml's default and the
# request's are this one value.
GRPO_TRAINABLE_DEFAULT: dict[str, int] = {"last_layers": 2}

EVIDENCE_FILE = "evidence.npz"  # per-token arrays, layout in docs/evidence.md
ENGINE_FILE = "engine.json"  # identity, effective configuration, timings
TEXTS_FILE = "texts.json"  # decoded prompts and completions, for humans and reports
OUTPUT_FILES = (EVIDENCE_FILE, ENGINE_FILE, TEXTS_FILE)

# Progress lines the worker prints on stderr start with this; the orchestrator echoes them.
PROGRESS_PREFIX = "[gate-worker] "


@dataclass(frozen=True)
class PromptItem:
    """One prompt: plain text, chat messages or token ids, plus an optional reference continuation."""

    id: str
    prompt: str | None = None
    # role and content, and on assistant turns optionally reasoning / reasoning_content
    messages: list[dict[str, str]] | None = None
    reference: str | None = None
    answer: str | None = None  # the verifiable final answer (GRPO reward)
    prompt_token_ids: list[int] | None = None  # pre-tokenized: the token-in path, sent as they are


@dataclass(frozen=True)
class SamplingRequest:
    """The sampling transform both the engine and the trainer-side reference apply."""

    n: int
    temperature: float
    top_p: float
    top_k: int  # 0 disables top-k
    max_tokens: int
    seed: int
    logprobs: int  # top-k alternatives recorded per generated token
    # vLLM's penalties (neutral: off); requests from gate versions before them decode as off
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def penalties(self) -> Penalties:
        return Penalties(self.repetition_penalty, self.presence_penalty, self.frequency_penalty)


@dataclass(frozen=True)
class Penalties:
    """vLLM's repetition, presence and frequency penalties; the defaults turn each off."""

    repetition: float = 1.0
    presence: float = 0.0
    frequency: float = 0.0

    @property
    def on(self) -> bool:
        return self != Penalties()


@dataclass(frozen=True)
class ReferenceRequest:
    """How the trainer-side reference (transformers) scores tokens."""

    dtype: str  # float32 | bfloat16 | float16
    lm_head_fp32: bool  # fp32 final projection on a lower-precision trunk
    batch_tokens: int  # padded tokens per forward pass
    # accelerate placement: "auto" | "balanced" | "balanced_low_0" | "sequential", or module ->
    # GPU index / "cpu"; None keeps the whole reference on one device.
    device_map: str | dict[str, int | str] | None = None
    max_memory: dict[str, str | int] | None = None  # "0" (GPU index) or "cpu" -> "20GiB" or bytes


@dataclass(frozen=True)
class InflightRequest:
    """The weight-sync probe's in-flight phase (gate/worker/inflight.py)."""

    updates: list[str]  # built-in update names (inflight.BUILTIN_UPDATES) or hook specs
    requests: int  # concurrent greedy requests
    max_tokens: int  # tokens each generates (ignore_eos: every request runs to this length)
    switch_after: int  # the update starts once every request has this many tokens
    timeout_s: float  # the whole update, requests included: past it the phase is an error
    perturbation: float | None = None  # None: the idle probe's (WeightSyncRequest.perturbation)


@dataclass(frozen=True)
class WeightSyncRequest:
    """The in-place weight-update probe (gate/worker/weight_sync.py)."""

    perturbation: float  # new weights = old + perturbation * std(tensor) * N(0, 1)
    seed: int
    probes: int  # questions, each asked alone and behind a shared multi-block prefix
    max_tokens: int
    hook: str | None = None  # "package.module:function" or "/path/file.py:function"
    inflight: InflightRequest | None = None  # None: the in-flight phase is off
    sleep_level: int = 0  # 0: no sleep/wake cycle after the pushes


# How the GRPO run derives its sampling seeds (gate/worker/grpo.py sampling_seed), recorded in a
# baseline's GRPO design: 1 gave all prompts of a step one seed; 2 gives each prompt its own.
GRPO_SEED_SCHEME = 2


@dataclass(frozen=True)
class GrpoRequest:
    """The mini GRPO run (gate/worker/grpo.py)."""

    steps: int
    prompts_per_step: int
    group_size: int
    max_tokens: int
    temperature: float
    lr: float
    clip_eps: float
    seeds: list[int]
    # The parameters the trainer updates ("all", "lm_head", "norms" or {"last_layers": N}) and its
    # optimizer ("adamw" | "sgd"); gate.yaml's grpo section has the same defaults.
    trainable: str | dict[str, int] = dataclasses.field(
        default_factory=lambda: dict(GRPO_TRAINABLE_DEFAULT)
    )
    optimizer: str = "adamw"
    # The objective (gate/worker/policy_loss.py) and the clip band's upper edge, 1 + clip_eps_high
    # (None: symmetric).
    loss: str = "grpo"
    clip_eps_high: float | None = None
    # The held-out eval set (indices into WorkerRequest.prompts, never trained on) and the samples
    # per eval prompt: the step-0 policy is evaluated once, each seed's trained policy after its
    # last step.
    eval_prompts: list[int] = dataclasses.field(default_factory=list)
    eval_samples: int = 16
    eval_held_out: bool = True  # False: the eval prompts stay in the training pool
    # Shifts every sampling seed (rollouts and evals), not the prompt schedule: a replicate with
    # independent samples for the A/A study. 0 in every gate run.
    sampling_seed_offset: int = 0


# How each adapter version reaches the engine (gate/worker/lora.py): "new-id" gives every version
# its own name, integer id and folder (AReaL's disk mode, TRL's async GRPO); "same-id" removes the
# adapter and loads the new version under one id, name and folder (verl, AReaL's xccl mode);
# "in-place" reloads it under the same id with vLLM's load_inplace (SkyRL, prime-rl). Both of the
# last reset the prefix cache, which keys blocks by the adapter's name and path, not its contents.
LORA_NAMINGS = ("new-id", "same-id", "in-place")


@dataclass(frozen=True)
class LoraRequest:
    """LoRA mode: the policy is the base model plus an adapter the engine loads per version."""

    rank: int
    alpha: float
    target_modules: list[str]  # module names as PEFT matches them: the last part of the path
    use_rslora: bool = False  # scaling alpha / sqrt(rank) instead of alpha / rank
    naming: str = "new-id"  # one of LORA_NAMINGS
    # The stack's own adapter push: fn(llm, version) -> the LoRARequest generation then uses
    # ("package.module:function" or "file.py:function"); None: the built-in path for ``naming``.
    hook: str | None = None
    # The adapter versions gate makes: each merged change is ``size`` x its weight's std, seeded
    # (weight_sync.perturbation and weight_sync.seed: the full-weight probe's relative step).
    size: float = 0.2
    seed: int = 0

    @property
    def scaling(self) -> float:
        """What PEFT multiplies ``B @ A`` by."""
        return self.alpha / (self.rank**0.5 if self.use_rslora else self.rank)


@dataclass(frozen=True)
class ServerRequest:
    """Server mode: the worker replays through vLLM's OpenAI-compatible server (gate/worker/server.py)."""

    request_fields: list[str]  # the sampling fields each request sets; the server fills the rest
    args: list[str] = field(default_factory=list)  # extra server flags, appended as given
    startup_timeout_s: float = 600.0
    request_timeout_s: float = 300.0
    max_in_flight: int = 64
    dev_mode: bool = True  # VLLM_SERVER_DEV_MODE=1 (weight push, prefix-cache reset, settings)


@dataclass(frozen=True)
class WorkerRequest:
    engine_name: str
    model: str
    tokenizer: str | None
    engine_args: dict[str, Any]
    # Engine arguments that may be dropped, and recorded as dropped, when this engine
    # release does not know them (e.g. logprobs_mode before vLLM 0.10).
    optional_engine_args: list[str]
    prompts: list[PromptItem]
    sampling: SamplingRequest
    greedy_max_tokens: int  # 0 skips the greedy pass
    teacher_forced: bool  # score prompt + reference with prompt_logprobs
    reference: ReferenceRequest
    output_dir: str
    # Submit prompts to the engine in a permuted order (A/A calibration): per-prompt seeds keep the
    # samples comparable while batch composition changes. None keeps the prompt-set order.
    order_seed: int | None = None
    # Score the teacher-forced sequences again, reversed and one at a time (determinism-parity).
    batch_invariance: bool = False
    weight_sync: WeightSyncRequest | None = None
    grpo: GrpoRequest | None = None
    schema_version: int = REQUEST_SCHEMA_VERSION
    # "offline" (vllm.LLM in the worker) or "server" (HTTP to vLLM's OpenAI-compatible server).
    mode: str = "offline"
    server: ServerRequest | None = None  # set in server mode
    lora: LoraRequest | None = None  # LoRA mode: the weight-sync probe pushes adapter versions

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    def write(self, path: Path) -> None:
        path.write_text(self.to_json() + "\n", encoding="utf-8")

    @classmethod
    def from_json(cls, text: str) -> WorkerRequest:
        """The request in ``text``, every field's type checked (msgspec, as for every file the gate
        writes and reads back); ValueError names the field."""
        raw = json.loads(text)
        version = raw.get("schema_version") if isinstance(raw, dict) else None
        if version != REQUEST_SCHEMA_VERSION:
            raise ValueError(
                f"request schema_version {version!r} is not "
                f"{REQUEST_SCHEMA_VERSION}: the gate package in this engine environment is stale"
            )
        try:
            return msgspec.convert(raw, cls)
        except msgspec.ValidationError as exc:
            raise ValueError(f"request: {exc}") from None

    @classmethod
    def read(cls, path: Path) -> WorkerRequest:
        return cls.from_json(Path(path).read_text(encoding="utf-8"))
