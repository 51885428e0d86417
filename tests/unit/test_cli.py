"""The CLI's contract: exit codes, one-line errors, and an orchestrator that never imports engines."""

import subprocess
import sys

from gate.cli import main
from gate.errors import EXIT_ERROR, EXIT_USAGE


def test_config_error_exit_code_and_one_line(minimal_config, capsys):
    path = minimal_config(extra="sampling: {temperture: 0.5}\n")
    assert main(["run", "-c", str(path)]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sampling.temperture: unknown key" in err[0]


def test_prompt_hash_mismatch_is_a_usage_error(minimal_config, tmp_path, capsys):
    path = minimal_config()
    data = tmp_path / "set.jsonl"
    data.write_text(data.read_text().replace("1+1", "2+2"))
    assert main(["run", "-c", str(path)]) == EXIT_USAGE
    assert "does not match the frozen hash" in capsys.readouterr().err


def test_engine_error_is_exit_3_and_leaves_no_complete_run(minimal_config, tmp_path, capsys):
    # The local runner in an interpreter without vllm cannot produce evidence: an ERROR, not a traceback.
    path = minimal_config(extra="runner: local\n")
    out = tmp_path / "run"
    assert main(["run", "-c", str(path), "--out", str(out)]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "runner 'local' needs vllm" in err and "Traceback" not in err
    assert not out.exists()
    assert (tmp_path / "run.incomplete" / "run.json").is_file()


def test_existing_run_directory_is_never_overwritten(minimal_config, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    assert main(["run", "-c", str(minimal_config()), "--out", str(out)]) == EXIT_USAGE
    assert "already exists" in capsys.readouterr().err


def test_orchestrator_imports_no_engine_libraries():
    code = (
        "import sys, gate.cli, gate.replay, gate.runners.venv, gate.runners.local, gate.contract.evidence; "
        "bad = [m for m in ('torch', 'vllm', 'transformers') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_command_prints_help():
    assert main([]) == EXIT_USAGE


def test_python_m_gate_is_the_console_script():
    proc = subprocess.run([sys.executable, "-m", "gate", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # the subcommands, one per line indented by four, in the order the help has always had
    listed = [
        line.split()[0]
        for line in proc.stdout.splitlines()
        if line.startswith("    ") and line[4] != " "
    ]
    assert listed == ["init", "run", "key", "check", "calibrate", "baseline", "prepare", "prompts", "report",
                      "merge", "repeat", "bisect", "comment", "publish"]  # fmt: skip


def test_an_error_quoting_untrusted_text_cannot_forge_a_workflow_command(tmp_path, capsys):
    hostile = tmp_path / "run\n::error title=forged::pwned\n::add-mask::x"
    assert main(["check", str(hostile)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "pwned" in err and not any(line.lstrip().startswith("::") for line in err.splitlines())
