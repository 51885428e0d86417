"""Worker-side engine set-up that needs no engine: process settings and what transformers must load."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from gate.worker import engine as eng  # noqa: E402


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
        ({"trust_remote_code": False, "revision": "abc123"}, {"revision": "abc123"}, {"revision": "abc123"}),
        ({"revision": "abc123", "tokenizer_revision": "tok9", "code_revision": "code7"},
         {"revision": "abc123", "code_revision": "code7"}, {"revision": "tok9"}),
    ],
    ids=["plain", "remote-code", "revision", "separate-revisions"],
)
def test_transformers_loads_what_the_engine_loads(engine_args, model_kwargs, tokenizer_kwargs):
    assert eng.hf_load_kwargs(engine_args) == model_kwargs
    assert eng.hf_load_kwargs(engine_args, for_tokenizer=True) == tokenizer_kwargs
