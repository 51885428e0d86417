"""Worker-side engine set-up that needs no engine: process settings and what transformers must load."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from gate.worker import engine as eng


def test_tensor_parallel_workers_are_spawned_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    eng.prepare_process()
    assert eng.os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    eng.prepare_process()
    assert eng.os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"


@pytest.mark.parametrize(
    "engine_args, model_kwargs, tokenizer_kwargs",
    [
        ({"dtype": "bfloat16"}, {}, {}),
        ({"trust_remote_code": True}, {"trust_remote_code": True}, {"trust_remote_code": True}),
        (
            {"trust_remote_code": False, "revision": "abc123"},
            {"revision": "abc123"},
            {"revision": "abc123"},
        ),
        (
            {"revision": "abc123", "tokenizer_revision": "tok9", "code_revision": "code7"},
            {"revision": "abc123", "code_revision": "code7"},
            {"revision": "tok9"},
        ),
    ],
    ids=["plain", "remote-code", "revision", "separate-revisions"],
)
def test_transformers_loads_what_the_engine_loads(engine_args, model_kwargs, tokenizer_kwargs):
    assert eng.hf_load_kwargs(engine_args) == model_kwargs
    assert eng.hf_load_kwargs(engine_args, for_tokenizer=True) == tokenizer_kwargs


def test_a_local_folder_has_no_hub_revision(tmp_path):
    assert eng.resolve_model_revision(str(tmp_path), {}) is None


def test_offline_the_hub_revision_comes_from_the_local_cache(tmp_path, monkeypatch):
    # huggingface_hub's own offline resolution over a cache laid out as it lays it out.
    from huggingface_hub import constants

    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--acme--tiny-model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(sha)
    (repo / "snapshots" / sha).mkdir(parents=True)
    (repo / "snapshots" / sha / "config.json").write_text("{}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    said: list[str] = []
    assert eng.resolve_model_revision("acme/tiny-model", {}, said.append) == sha
    assert said == []
    # Not cached and not reachable: the requested revision stays, and the log says why.
    assert eng.resolve_model_revision("acme/other-model", {"revision": "v1"}, said.append) == "v1"
    assert len(said) == 1 and "could not be resolved" in said[0] and "revision v1" in said[0]
