"""Worker-side engine set-up that needs no engine: process settings and what transformers must load."""

from __future__ import annotations

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


def test_output_tail_keeps_what_child_processes_write_and_passes_it_through(capfd):
    import subprocess
    import sys

    tail = eng.OutputTail(max_lines=10)
    try:
        subprocess.run([sys.executable, "-c", "import sys; [print(f'(Worker_TP1 pid=9) line {i}', file=(sys.stderr, sys.stdout)[i % 2], flush=True) for i in range(5)]"],
                       check=True)  # fmt: skip
        for _ in range(50):
            if len(tail.lines()) == 5:
                break
            __import__("time").sleep(0.02)
    finally:
        tail.close()
    assert sorted(tail.lines()) == [f"(Worker_TP1 pid=9) line {i}" for i in range(5)]
    out = capfd.readouterr()  # each line went through to its own stream
    assert "(Worker_TP1 pid=9) line 0" in out.err and "(Worker_TP1 pid=9) line 1" in out.out
