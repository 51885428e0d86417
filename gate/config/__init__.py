"""gate.yaml: typed, validated configuration.

``load_config`` decodes the file with msgspec against Structs derived from the section dataclasses
(gate.config.schema), so an unknown or mistyped key fails with its full path
(``gate.yaml: sampling.temperture: unknown key``), then resolves paths and checks values.

- sections: the frozen dataclasses the code reads (GateConfig and its sections)
- schema: gate.yaml's Structs and JSON Schema (docs/gate.schema.json)
- decode: msgspec errors as gate.yaml keys
- load: reading, resolving and checking a gate.yaml
- credentials: refusing credentials in pip URLs
"""

from gate.config.credentials import check_no_credentials
from gate.config.load import check_gpus_fit, load_config, parse_config
from gate.config.schema import json_schema
from gate.config.sections import (
    BUILTIN_CONFIG,
    ENGINE_MODES,
    GPU_CHOICES,
    INSTALLERS,
    IPC_MODES,
    OPTIONAL_ENGINE_ARGS,
    REFERENCE_DTYPES,
    RUNNER_KINDS,
    SERVER_PENALTY_FIELDS,
    SERVER_REQUEST_FIELDS,
    DockerConfig,
    EngineConfig,
    GateConfig,
    GreedyConfig,
    GrpoConfig,
    InflightConfig,
    LoraConfig,
    ModelConfig,
    ReferenceConfig,
    SamplingConfig,
    ServerConfig,
    TeacherForcedConfig,
    WeightSyncConfig,
    WeightUpdateConfig,
)

__all__ = [
    "BUILTIN_CONFIG",
    "ENGINE_MODES",
    "GPU_CHOICES",
    "INSTALLERS",
    "IPC_MODES",
    "OPTIONAL_ENGINE_ARGS",
    "REFERENCE_DTYPES",
    "RUNNER_KINDS",
    "SERVER_PENALTY_FIELDS",
    "SERVER_REQUEST_FIELDS",
    "DockerConfig",
    "EngineConfig",
    "GateConfig",
    "GreedyConfig",
    "GrpoConfig",
    "InflightConfig",
    "LoraConfig",
    "ModelConfig",
    "ReferenceConfig",
    "SamplingConfig",
    "ServerConfig",
    "TeacherForcedConfig",
    "WeightSyncConfig",
    "WeightUpdateConfig",
    "check_gpus_fit",
    "check_no_credentials",
    "json_schema",
    "load_config",
    "parse_config",
]
