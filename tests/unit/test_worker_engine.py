"""Worker-side engine set-up that needs no engine: process settings and what transformers must load."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")

from gate.worker import engine as eng
from gate.worker import hub, layout


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
    assert hub.hf_load_kwargs(engine_args) == model_kwargs
    assert hub.hf_load_kwargs(engine_args, for_tokenizer=True) == tokenizer_kwargs


def test_a_local_folder_has_no_hub_revision(tmp_path):
    assert hub.resolve_model_revision(str(tmp_path), {}) is None


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
    assert hub.resolve_model_revision("acme/tiny-model", {}, said.append) == sha
    assert said == []
    # Not cached and not reachable: the requested revision stays, and the log says why.
    assert hub.resolve_model_revision("acme/other-model", {"revision": "v1"}, said.append) == "v1"
    assert len(said) == 1 and "could not be resolved" in said[0] and "revision v1" in said[0]


@pytest.mark.parametrize(
    "ranks, cpus, expected",
    [
        (2, [0, 1], "0|1"),
        (2, range(8), "0-3|4-7"),
        (3, range(8), "0-2|3-5|6-7"),  # the remainder goes to the first groups
        (2, [4, 5, 6, 7, 12, 13], "4-6|7,12-13"),  # an affinity mask with a gap
        (1, [3], "3"),
    ],
)
def test_cpu_thread_binding_splits_the_allowed_cpus_into_contiguous_groups(ranks, cpus, expected):
    assert layout.cpu_thread_binding(ranks, list(cpus)) == expected


def test_fewer_cpus_than_ranks_is_refused():
    with pytest.raises(
        ValueError, match=r"4 CPU engine rank\(s\) need at least one CPU each.*may use 2 \(0-1\)"
    ):
        layout.cpu_thread_binding(4, [0, 1])


@pytest.mark.parametrize(
    "engine_args, on_cpu, environ, expected",
    [
        ({"tensor_parallel_size": 2}, True, {}, [("VLLM_CPU_OMP_THREADS_BIND", "0-1|2-3")]),
        (
            {"tensor_parallel_size": 2, "pipeline_parallel_size": 2},
            True,
            {},
            [("VLLM_CPU_OMP_THREADS_BIND", "0|1|2|3")],
        ),
        (
            {"tensor_parallel_size": 2},
            True,
            {"VLLM_CPU_OMP_THREADS_BIND": "nobind"},
            [],
        ),  # the user's wins
        ({"tensor_parallel_size": 2}, False, {}, []),  # GPUs: nothing to bind
        ({}, True, {}, []),  # one rank: vLLM's own binding
    ],
)
def test_the_gate_binds_threads_only_for_cpu_ranks_the_user_left_unbound(
    engine_args, on_cpu, environ, expected
):
    settings = layout.engine_environment(engine_args, on_cpu, environ, [0, 1, 2, 3])
    assert [(s.name, s.value) for s in settings] == expected
    assert all("NUMA" in s.reason for s in settings)


@pytest.mark.parametrize(
    "engine_args, expected",
    [({}, False), ({"tensor_parallel_size": 2}, True), ({"pipeline_parallel_size": 2}, True),
     ({"distributed_executor_backend": "mp"}, True), ({"distributed_executor_backend": "uni"}, False)],
)  # fmt: skip
def test_which_engines_run_workers_in_other_processes(engine_args, expected):
    assert layout.runs_workers_in_processes(engine_args) is expected


KNOWN_ARGS = {"enable_chunked_prefill", "max_num_batched_tokens", "max_model_len"}


@pytest.mark.parametrize(
    ("engine_args", "on_cpu", "known", "set_it"),
    [
        ({}, True, KNOWN_ARGS, True),
        ({"max_model_len": 256, "max_num_batched_tokens": 256}, True, KNOWN_ARGS, True),
        ({}, False, KNOWN_ARGS, False),  # a CUDA generator has an offset
        ({"enable_chunked_prefill": True}, True, KNOWN_ARGS, False),  # the user's choice
        ({"enable_chunked_prefill": False}, True, KNOWN_ARGS, False),
        # a budget below a whole prompt: vLLM would refuse to start without chunked prefill
        ({"max_model_len": 256, "max_num_batched_tokens": 128}, True, KNOWN_ARGS, False),
        ({"max_num_batched_tokens": 4096}, True, KNOWN_ARGS, False),  # the model's length unknown
        ({}, True, {"max_model_len"}, False),  # a release without the argument
    ],
)  # fmt: skip
def test_cpu_engines_prefill_each_prompt_in_one_step_where_the_user_left_batching_to_vllm(
    engine_args, on_cpu, known, set_it
):
    settings = layout.one_step_prefill(engine_args, on_cpu, known)
    assert bool(settings) is set_it
    applied = layout.with_engine_args(engine_args, settings)
    if set_it:
        assert [(s.name, s.value, s.kind) for s in settings] == [
            ("enable_chunked_prefill", "false", "engine_arg")
        ]
        assert "CPU Generator does not use offset" in settings[0].reason
        assert applied == {**engine_args, "enable_chunked_prefill": False}
    else:
        assert applied == engine_args


def test_only_environment_settings_reach_the_environment(monkeypatch):
    monkeypatch.delenv("GATE_TEST_SETTING", raising=False)
    settings = [layout.GateSetting("GATE_TEST_SETTING", "1", "why"),
                layout.GateSetting("enable_chunked_prefill", "false", "why", kind="engine_arg")]  # fmt: skip
    layout.apply_environment(settings)
    assert layout.env_settings(settings) == settings[:1]
    assert os.environ["GATE_TEST_SETTING"] == "1"
    assert "enable_chunked_prefill" not in os.environ
