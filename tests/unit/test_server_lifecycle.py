"""Server mode's process lifecycle (gate/worker/server.py) with real child processes.

The server here is a small stdlib HTTP program standing in for vLLM's (what is under test is the
start, the health wait and the stop, not vLLM); vLLM's own server runs in
tests/integration/test_server_mode.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gate.worker import server as srv

# Serves /health (200 after ``delay`` seconds, 503 before), and starts a child of its own, as
# vLLM's API server starts its engine core: stopping must end both.
FAKE_SERVER = textwrap.dedent(
    """
    import http.server, subprocess, sys, time
    port, delay, mode = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    if mode == "crash":
        print("fatal: cannot load the model", flush=True)
        sys.exit(7)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(f"engine core pid={child.pid}", flush=True)
    start = time.time()
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = mode == "ok" and time.time() - start > delay
            self.send_response(200 if ok else 503)
            self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    path = tmp_path / "fake_server.py"
    path.write_text(FAKE_SERVER)
    return path


def _command(fake: Path, delay: float = 0.3, mode: str = "ok"):
    return lambda port: [sys.executable, str(fake), str(port), str(delay), mode]


@contextlib.contextmanager
def _running(command, env, log_path: Path, timeout_s: float, say) -> Iterator[srv.Server]:
    """The worker's sequence: a free port, start, wait for /health, always stop."""
    port = srv.free_port()
    with srv.started_server(command(port), port, env, log_path, say) as server:
        server.wait_healthy(timeout_s)
        yield server


def _engine_core_pid(server: srv.Server) -> int:
    for _ in range(100):
        for line in server.lines():
            if line.startswith("engine core pid="):
                return int(line.split("=")[1])
        time.sleep(0.05)
    raise AssertionError("the fake server never reported its child")


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.time() + within_s
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # A zombie counts as gone: it runs nothing (its parent reaps it).
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


def test_engine_args_become_the_servers_flags():
    flags = srv.engine_arg_flags({"max_model_len": 256, "enable_prefix_caching": False, "enforce_eager": True,
                                  "hf_overrides": {"head_dtype": "float32"}, "seed": None,
                                  "logprobs_mode": "processed_logprobs"})  # fmt: skip
    assert flags == ["--max-model-len", "256", "--no-enable-prefix-caching", "--enforce-eager",
                     "--hf-overrides", '{"head_dtype": "float32"}', "--logprobs-mode", "processed_logprobs"]  # fmt: skip


def test_the_command_runs_the_module_with_the_given_interpreter_on_loopback():
    cmd = srv.server_command(
        "/venv/bin/python", "/m", "/tok", {"dtype": "float32"}, 8123, ["--chat-template", "t"]
    )
    assert cmd[:5] == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/m",
    ]
    assert (
        cmd[cmd.index("--tokenizer") + 1] == "/tok" and cmd[cmd.index("--dtype") + 1] == "float32"
    )
    assert cmd[-6:] == ["--host", "127.0.0.1", "--port", "8123", "--chat-template", "t"]


def test_the_server_environment_enables_dev_mode_and_drops_the_offline_in_process_setting():
    env = srv.server_environment(
        {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PATH": "/bin"}, dev_mode=True
    )
    assert env == {"PATH": "/bin", "VLLM_SERVER_DEV_MODE": "1"}
    assert "VLLM_SERVER_DEV_MODE" not in srv.server_environment({}, dev_mode=False)


def test_a_one_rank_cpu_server_keeps_its_executor_in_the_engine_core():
    name, value, reason = srv.executor_in_engine_core(ranks=1, on_cpu=True)
    assert (name, value) == ("VLLM_ENABLE_V1_MULTIPROCESSING", "0") and "TP=1" in reason
    assert srv.server_environment({name: "1"}, False) == {}  # the launcher sets the gate's own
    assert srv.executor_in_engine_core(ranks=2, on_cpu=True) is None  # TP=2 needs its mp workers
    assert srv.executor_in_engine_core(ranks=1, on_cpu=False) is None  # a GPU server does it itself


def test_a_healthy_server_is_served_then_stopped_with_its_children(fake, tmp_path):
    with _running(
        _command(fake), os.environ, tmp_path / "server.log", 30, lambda m: None
    ) as server:
        assert srv._health_ok(server.base_url)
        child = _engine_core_pid(server)
        pgid = server.proc.pid
    assert srv.group_alive(pgid) is False
    assert _gone(child)
    assert "engine core pid=" in (tmp_path / "server.log").read_text()


def test_the_start_up_time_and_its_limit_count_from_the_process_start(fake, tmp_path):
    """The worker imports and tokenizes while the server starts, then waits: the wait must not
    restart the clock (startup_timeout_s is the server's, and engine_start_s its start-up)."""
    port = srv.free_port()
    with srv.started_server(_command(fake, delay=0.2)(port), port, os.environ, tmp_path / "s.log",
                            lambda m: None) as server:  # fmt: skip
        time.sleep(1.0)
        assert server.wait_healthy(30) >= 1.0
    port = srv.free_port()
    with srv.started_server(_command(fake, mode="sick")(port), port, os.environ, tmp_path / "t.log",
                            lambda m: None) as server:  # fmt: skip
        time.sleep(1.2)
        began = time.perf_counter()
        with pytest.raises(srv.ServerError, match="within 1s"):
            server.wait_healthy(1)
        assert time.perf_counter() - began < 0.5


def test_stopping_twice_ends_the_group_once(fake, tmp_path):
    port = srv.free_port()
    said: list[str] = []
    with srv.started_server(
        _command(fake)(port), port, os.environ, tmp_path / "s.log", said.append
    ) as server:
        server.wait_healthy(30)
        first = server.stop()
        assert server.stop() == first
    assert said[-1] == f"server stopped (exit code {first})"


def _serve(command, tmp_path: Path, timeout_s: float = 30, say=lambda m: None) -> None:
    with _running(command, os.environ, tmp_path / "s.log", timeout_s, say):
        pass


def test_a_server_that_crashes_at_start_is_an_error_with_its_log_tail(fake, tmp_path):
    with pytest.raises(srv.ServerError, match="exited with code 7") as info:
        _serve(_command(fake, mode="crash"), tmp_path)
    assert "fatal: cannot load the model" in str(info.value)


def test_a_server_that_never_becomes_healthy_times_out_and_is_stopped(fake, tmp_path):
    seen: list[str] = []
    with pytest.raises(srv.ServerError, match=r"did not answer .*/health within 1s"):
        _serve(_command(fake, mode="sick"), tmp_path, timeout_s=1, say=seen.append)
    assert any(m.startswith("server stopped") for m in seen)
    assert _fake_pids(fake) == []


def _fake_pids(fake: Path) -> list[int]:
    out = subprocess.run(["pgrep", "-f", str(fake)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def test_a_taken_port_is_a_start_failure(fake, tmp_path, monkeypatch):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    taken = holder.getsockname()[1]
    monkeypatch.setattr(srv, "free_port", lambda host=srv.HOST: taken)
    try:
        with pytest.raises(srv.ServerError, match="exited with code") as info:
            _serve(_command(fake), tmp_path)
        assert "Address already in use" in str(info.value)
    finally:
        holder.close()


# A worker stand-in: starts the fake server through started_server and waits to be signalled.
WORKER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from gate.worker import server as srv
    fake, out = sys.argv[1], Path(sys.argv[2])
    port = srv.free_port()
    cmd = [sys.executable, fake, str(port), "0", "ok"]
    with srv.started_server(cmd, port, os.environ, out / "s.log", lambda m: None) as server:
        server.wait_healthy(30)
        child = None
        while child is None:
            child = next((l for l in server.lines() if l.startswith("engine core pid=")), None)
            time.sleep(0.05)
        (out / "pids").write_text(f"{server.proc.pid} {child.split('=')[1]}")
        time.sleep(600)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_no_server_outlives_its_worker(fake, tmp_path, sig):
    """SIGTERM (the orchestrator's timeout) and SIGINT (Ctrl-C) unwind through the stop: the server
    and its children go. SIGKILL cannot unwind: the kernel ends the server's main process
    (PR_SET_PDEATHSIG), whose own shutdown ends its children (vLLM's engine core watches it)."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    # Default SIGINT handling in the stand-in: under a shell that starts the suite in the background
    # without job control, SIGINT arrives ignored, Python then installs no KeyboardInterrupt, and
    # the SIGINT case would wait out the stand-in's sleep (seen: a run started with nohup ... &).
    worker = subprocess.Popen(
        [sys.executable, str(script), str(fake), str(tmp_path)], start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    pids = tmp_path / "pids"
    for _ in range(300):
        if pids.exists() and pids.read_text():
            break
        time.sleep(0.1)
    server_pid, core_pid = map(int, pids.read_text().split())
    os.kill(worker.pid, sig)
    worker.wait(timeout=30)
    assert _gone(server_pid), f"server {server_pid} left after {sig!r}"
    if sig != signal.SIGKILL:
        assert _gone(core_pid), f"engine core {core_pid} left after {sig!r}"
    else:
        os.kill(core_pid, signal.SIGKILL)  # the stand-in's child does not watch its parent
