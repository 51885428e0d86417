"""gate/host.py: the GATE_* variables, the cache root, the GPU rule, ranks; and loading a config
touching nothing of the host (no process, no file)."""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gate import host
from gate.errors import EXIT_USAGE, ConfigError

# -- the GATE_* variables ---------------------------------------------------------------------------


def test_unset_variables_take_their_defaults():
    s = host.HostSettings.from_environ({})
    cache = Path.home() / ".cache" / "gate"
    assert s == host.HostSettings(
        cache_dir=cache, evidence_dir=cache / "evidence", vllm_source_dir=cache / "vllm-source",
        model_wheels=None, source_dir=None, push_dir=None, worker_rpc_timeout_s=600.0,
        worker_phase_timeout_s=None,
    )  # fmt: skip
    empty = {"GATE_CACHE_DIR": "", "GATE_PUSH_DIR": ""}  # an empty variable counts as unset
    assert host.HostSettings.from_environ(empty) == s


def test_every_variable_is_read():
    s = host.HostSettings.from_environ({
        "GATE_CACHE_DIR": "/c", "GATE_EVIDENCE_DIR": "/e", "GATE_VLLM_SOURCE_DIR": "/v",
        "GATE_MODEL_WHEELS": "/w", "GATE_SOURCE_DIR": "/s", "GATE_PUSH_DIR": "/p",
        "GATE_WORKER_RPC_TIMEOUT_S": "42", "GATE_WORKER_PHASE_TIMEOUT_S": "0.5",
    })  # fmt: skip
    assert (s.cache_dir, s.evidence_dir, s.vllm_source_dir) == (Path("/c"), Path("/e"), Path("/v"))
    assert (s.model_wheels, s.source_dir, s.push_dir) == (Path("/w"), Path("/s"), Path("/p"))
    assert (s.worker_rpc_timeout_s, s.worker_phase_timeout_s) == (42.0, 0.5)
    derived = host.HostSettings.from_environ({"GATE_CACHE_DIR": "/c"})
    assert (derived.evidence_dir, derived.vllm_source_dir) == (
        Path("/c/evidence"),
        Path("/c/vllm-source"),
    )


@pytest.mark.parametrize("name, value, message", [
    ("GATE_WORKER_RPC_TIMEOUT_S", "ten", "GATE_WORKER_RPC_TIMEOUT_S='ten': expected a number of seconds"),
    ("GATE_WORKER_RPC_TIMEOUT_S", "0", "GATE_WORKER_RPC_TIMEOUT_S='0': must be > 0"),
    ("GATE_WORKER_PHASE_TIMEOUT_S", "1m", "GATE_WORKER_PHASE_TIMEOUT_S='1m': expected a number of seconds"),
])  # fmt: skip
def test_a_malformed_value_is_one_line_naming_the_variable(name, value, message):
    with pytest.raises(host.HostSettingError) as info:
        host.HostSettings.from_environ({name: value})
    assert str(info.value) == message
    # The CLI's usage error (exit 2); the worker's ValueError, as before.
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)
    assert info.value.exit_code == EXIT_USAGE


def test_a_phase_bound_of_zero_or_less_is_no_bound():
    assert (
        host.HostSettings.from_environ({"GATE_WORKER_PHASE_TIMEOUT_S": "0"}).worker_phase_timeout_s
        is None
    )
    assert (
        host.HostSettings.from_environ({"GATE_WORKER_PHASE_TIMEOUT_S": "-1"}).worker_phase_timeout_s
        is None
    )


def test_settings_are_read_when_asked_not_at_import(monkeypatch, tmp_path):
    monkeypatch.setenv("GATE_CACHE_DIR", str(tmp_path))
    assert host.cache_root() == tmp_path
    monkeypatch.delenv("GATE_CACHE_DIR")
    assert host.cache_root() == Path.home() / ".cache" / "gate"


@pytest.mark.parametrize("value", [None, "", "/somewhere/cache"])
def test_the_plain_file_venv_recipe_finds_the_same_cache_root(monkeypatch, value):
    """The Dockerfile runs gate/runners/venv_build.py alone, where gate cannot be imported: its
    fallback must say what gate.host says."""
    if value is None:
        monkeypatch.delenv("GATE_CACHE_DIR", raising=False)
    else:
        monkeypatch.setenv("GATE_CACHE_DIR", value)
    path = Path(host.__file__).parent / "runners" / "venv_build.py"
    monkeypatch.setitem(sys.modules, "gate.host", None)  # `from gate.host import ...` fails
    spec = importlib.util.spec_from_file_location("plain_venv_build", path)
    assert spec is not None and spec.loader is not None
    plain = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "plain_venv_build", plain)
    spec.loader.exec_module(plain)
    assert plain.cache_root is not host.cache_root
    monkeypatch.delitem(sys.modules, "gate.host")
    assert plain.cache_root() == host.cache_root()


# -- the GPU rule -----------------------------------------------------------------------------------

SMI = """0, GPU-aaaa1111-0000, NVIDIA H100 80GB HBM3, 81559 MiB, 1024 MiB, 550.54.15
1, GPU-bbbb2222-0000, NVIDIA H100 80GB HBM3, 81559 MiB, 0 MiB, 550.54.15
2, GPU-cccc3333-0000, NVIDIA H100 80GB HBM3, 81559 MiB, [N/A], 550.54.15
"""
GPUS = host.parse_gpus(SMI)


def test_nvidia_smi_rows_are_read_and_recorded_as_before():
    assert [g.index for g in GPUS] == [0, 1, 2]
    # The device class's record (run.json, baselines, the evidence key) is nvidia-smi's own
    # `name, memory.total, driver_version` line, as it was before the probe moved here.
    assert GPUS[0].record == "NVIDIA H100 80GB HBM3, 81559 MiB, 550.54.15"
    assert (GPUS[0].total_bytes, GPUS[0].used_bytes) == (81559 * 2**20, 1024 * 2**20)
    assert GPUS[2].used_bytes == 0  # [N/A]


@pytest.mark.parametrize("devices, expected", [
    (None, [0, 1, 2]),  # unset: every GPU
    ("", []),  # set but empty: none, as CUDA reads it
    ("2,0", [2, 0]),  # in the list's order
    (" 1 ", [1]),
    ("0,7,1", [0]),  # CUDA stops at the first entry that names no GPU
    ("GPU-bbbb2222-0000,GPU-cccc", [1, 2]),  # UUIDs, or a unique prefix of one
    ("GPU-", []),  # a prefix of several: no GPU
    ("1,1", [1]),
])  # fmt: skip
def test_cuda_visible_devices_is_read_as_cuda_reads_it(devices, expected):
    seen = host.cuda_visible(GPUS, devices)
    assert seen is not None and [g.index for g in seen] == expected


def test_mig_instances_cannot_be_told():
    assert host.cuda_visible(GPUS, "MIG-1234") is None


def test_an_engine_sees_its_own_list_over_the_gates_and_a_container_its_docker_gpus():
    gate_env = {"CUDA_VISIBLE_DEVICES": "0"}

    def indices(runner, docker_gpus, engine_env):
        seen = host.engine_gpus(GPUS, runner, docker_gpus, engine_env, gate_env)
        return None if seen is None else [g.index for g in seen]

    assert indices("venv", "all", {}) == [0]  # the gate's list, inherited
    assert indices("venv", "all", {"CUDA_VISIBLE_DEVICES": "1,2"}) == [1, 2]  # replaced, not capped
    assert indices("local", "none", {}) == [0]  # docker.gpus is the docker runner's only
    assert indices("docker", "all", {}) == [0, 1, 2]  # the gate's variable is not passed in
    assert indices("docker", ("2", "1"), {}) == [2, 1]
    assert indices("docker", ("1", "2"), {"CUDA_VISIBLE_DEVICES": "1"}) == [2]  # inside: renumbered
    assert indices("docker", "none", {"CUDA_VISIBLE_DEVICES": "0"}) == []


def test_no_nvidia_smi_is_unknown_not_zero(monkeypatch):
    monkeypatch.setattr(host.shutil, "which", lambda name: None)
    assert host.probe_gpus() is None


def test_parallel_ranks_multiply_and_default_to_one():
    assert host.parallel_ranks({}) == 1
    assert host.parallel_ranks({"tensor_parallel_size": 2, "pipeline_parallel_size": 3}) == 6
    assert host.parallel_ranks({"tensor_parallel_size": None, "pipeline_parallel_size": 0}) == 1


# -- loading a config touches nothing of the host ---------------------------------------------------


def _no_process_and_no_probe(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError(f"loading a config ran something: {args}")

    for module, name in ((subprocess, "run"), (subprocess, "Popen"), (shutil, "which")):
        monkeypatch.setattr(module, name, refuse)


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _builtin_gpu_config(minimal_config) -> Path:
    """model.builtin on GPU specs with two ranks each: what converted a model (building the old
    engine's venv) and asked nvidia-smi while the config loaded."""
    engines = ("engines:\n  old: {spec: vllm==0.32.0}\n  new: {spec: vllm==0.33.0}\n"
               "engine_args: {tensor_parallel_size: 2}\n")  # fmt: skip
    path = minimal_config(engines=engines)
    path.write_text(
        path.read_text().replace(
            "model: {path: ./model}", "model: {builtin: smollm2-135m-instruct}"
        )
    )
    return path


def test_loading_a_config_runs_no_process_and_writes_no_file(minimal_config, tmp_path, monkeypatch):
    from gate.commands.common import config_from_args
    from gate.config import BUILTIN_CONFIG, load_config

    cache = tmp_path / "cache"
    monkeypatch.setenv("GATE_CACHE_DIR", str(cache))
    builtin = _builtin_gpu_config(minimal_config)
    before = _files(tmp_path)
    _no_process_and_no_probe(monkeypatch)
    for config in (BUILTIN_CONFIG, builtin):
        load_config(config)
        for runner in (None, "venv", "docker"):
            args = argparse.Namespace(config=config, old=None, new=None, runner=runner)
            cfg = config_from_args(args)
    assert cfg.model.builtin == "smollm2-135m-instruct" and cfg.model.path.startswith(str(cache))
    assert not cache.exists() and _files(tmp_path) == before


def test_the_engine_commands_check_gpus_and_convert_the_model_before_engines(
    minimal_config, tmp_path, monkeypatch
):
    import dataclasses

    from gate.commands import common
    from gate.config import load_config

    monkeypatch.setenv("GATE_CACHE_DIR", str(tmp_path / "cache"))
    cfg = load_config(_builtin_gpu_config(minimal_config))
    converted = []
    monkeypatch.setattr(
        common, "materialize_builtin_model", lambda c: converted.append(c.model.builtin)
    )
    monkeypatch.setattr(host, "probe_gpus", lambda: host.parse_gpus(SMI)[:1])
    with pytest.raises(ConfigError, match=r"engines\.old\.engine_args\.tensor_parallel_size: 2 rank\(s\) need "
                                          r"one GPU each, and 1 GPU\(s\) are visible to this engine"):  # fmt: skip
        common.ready_for_engines(cfg)
    assert converted == []  # refused first: nothing built
    monkeypatch.setattr(host, "probe_gpus", lambda: host.parse_gpus(SMI))
    common.ready_for_engines(cfg)
    assert converted == ["smollm2-135m-instruct"]
    # Both engines in the gate image: the image's own run converts it; no venv is built here.
    docker = {n: dataclasses.replace(e, runner="docker") for n, e in cfg.engines.items()}
    common.ready_for_engines(dataclasses.replace(cfg, engines=docker))
    assert converted == ["smollm2-135m-instruct"]


def test_the_device_class_records_the_gpus_this_process_sees(monkeypatch):
    from gate import device

    monkeypatch.setattr(host, "probe_gpus", lambda: host.parse_gpus(SMI))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert device.visible_gpus() == [g.record for g in GPUS]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert device.visible_gpus() == [GPUS[1].record]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # none, where it used to read as every GPU
    assert device.visible_gpus() == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-1234")  # unresolvable: the GPUs it lives on
    assert device.visible_gpus() == [g.record for g in GPUS]
    monkeypatch.setattr(host, "probe_gpus", lambda: None)
    assert device.visible_gpus() == []
