"""The server process's own decisions (gate/worker/serve.py): flags, dropped arguments, settings.

``decide`` is what the launcher does with vLLM's answers (EngineArgs' fields, the platform); here
those answers are given, so every branch is checked without vLLM. The launcher running vLLM's real
server is tested in tests/integration/test_server_mode.py (engine.json ``server.command`` and
``server.launched_as``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")  # serve.decide reads engine.split_engine_args (a torch-side module)

from gate.worker import serve

KNOWN = {"dtype", "max_model_len", "logprobs_mode", "tensor_parallel_size", "seed"}


def _plan(tmp_path: Path, **engine_args) -> serve.LaunchPlan:
    return serve.LaunchPlan(
        model="/m", tokenizer=None, engine_args={"dtype": "float32", **engine_args},
        optional_engine_args=["logprobs_mode", "async_scheduling"], port=8123,
        extra_args=["--generation-config", "vllm"], facts=str(tmp_path / "facts.json"),
    )  # fmt: skip


def test_a_one_rank_cpu_server_runs_the_plain_command_with_its_executor_in_the_engine_core(
    tmp_path,
):
    facts = serve.decide(_plan(tmp_path, async_scheduling=False, max_model_len=256), "/venv/bin/python",
                         KNOWN, on_cpu=True, environ={}, cpus=[0, 1])  # fmt: skip
    assert facts.command[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert (
        "--async-scheduling" not in facts.command and "--no-async-scheduling" not in facts.command
    )
    assert facts.command[-2:] == ["--generation-config", "vllm"]  # server.args last, as given
    assert facts.dropped_engine_args == ["async_scheduling"]
    assert facts.engine_args == {"dtype": "float32", "max_model_len": 256}
    assert [(s.name, s.value) for s in facts.gate_settings] == [
        ("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    ]


def test_a_tensor_parallel_cpu_server_gets_its_thread_binding_and_keeps_its_worker_processes(
    tmp_path,
):
    facts = serve.decide(_plan(tmp_path, tensor_parallel_size=2), "py", KNOWN, on_cpu=True, environ={},
                         cpus=[0, 1])  # fmt: skip
    assert [(s.name, s.value) for s in facts.gate_settings] == [
        ("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    ]


def test_a_gpu_server_gets_no_setting(tmp_path):
    facts = serve.decide(_plan(tmp_path), "py", KNOWN, on_cpu=False, environ={}, cpus=[0, 1])
    assert facts.gate_settings == [] and facts.dropped_engine_args == []


def test_a_cpu_server_prefills_every_prompt_in_one_step_unless_told_otherwise(tmp_path):
    known = KNOWN | {"enable_chunked_prefill"}
    facts = serve.decide(_plan(tmp_path, max_model_len=256), "py", known, on_cpu=True, environ={},
                         cpus=[0, 1])  # fmt: skip
    assert "--no-enable-chunked-prefill" in facts.command
    assert facts.engine_args["enable_chunked_prefill"] is False
    setting = next(s for s in facts.gate_settings if s.kind == "engine_arg")
    assert (setting.name, setting.value) == ("enable_chunked_prefill", "false")
    chosen = serve.decide(_plan(tmp_path, enable_chunked_prefill=True), "py", known, on_cpu=True,
                          environ={}, cpus=[0, 1])  # fmt: skip
    assert "--enable-chunked-prefill" in chosen.command
    assert all(s.kind == "env" for s in chosen.gate_settings)
    gpu = serve.decide(_plan(tmp_path), "py", known, on_cpu=False, environ={}, cpus=[0, 1])
    assert gpu.gate_settings == [] and "enable_chunked_prefill" not in gpu.engine_args


def test_an_unknown_required_argument_is_refused_as_offline(tmp_path):
    with pytest.raises(ValueError, match=r"no engine argument\(s\) \['no_such_arg'\]"):
        serve.decide(_plan(tmp_path, no_such_arg=1), "py", KNOWN, on_cpu=True, environ={}, cpus=[0])


def test_facts_round_trip_and_an_absent_file_reads_as_nothing(tmp_path):
    plan = _plan(tmp_path, seed=0)
    facts = serve.decide(plan, "py", KNOWN, on_cpu=True, environ={}, cpus=[0])
    Path(plan.facts).write_text(json.dumps(serve.asdict(facts)))
    assert serve.read_facts(Path(plan.facts)) == facts
    assert serve.read_facts(tmp_path / "absent.json") is None
    plan.write(tmp_path / "plan.json")
    assert serve.LaunchPlan.read(tmp_path / "plan.json") == plan


def test_the_launcher_refuses_a_bad_plan_before_any_server_starts(tmp_path):
    """The real launcher process, with a vLLM stand-in: the error goes to facts.json (the worker
    raises it as offline does) and the process exits 2 without running the server module."""
    stub = tmp_path / "stub"
    (stub / "vllm" / "engine").mkdir(parents=True)
    (stub / "vllm" / "__init__.py").write_text("")
    (stub / "vllm" / "engine" / "__init__.py").write_text("")
    (stub / "vllm" / "engine" / "arg_utils.py").write_text(
        "import dataclasses\n@dataclasses.dataclass\nclass EngineArgs:\n    dtype: str = 'auto'\n"
    )
    (stub / "vllm" / "platforms.py").write_text(
        "class _P:\n    def is_cpu(self):\n        return True\ncurrent_platform = _P()\n"
    )
    plan = _plan(tmp_path, no_such_arg=1)
    plan.write(tmp_path / "plan.json")
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "gate.worker.serve", str(tmp_path / "plan.json")],
                          env={"PYTHONPATH": f"{stub}:{repo}", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == serve.EXIT_BAD_ARGS, proc.stderr
    assert (
        serve.read_facts(Path(plan.facts))
        == "this vLLM release has no engine argument(s) ['no_such_arg']"
    )
    assert "no_such_arg" in proc.stderr
