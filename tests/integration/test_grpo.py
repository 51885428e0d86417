"""The mini GRPO run through real engines: a clean upgrade stays in band, raw logprobs do not."""

from __future__ import annotations

import numpy as np
import pytest

from gate import baseline as bl
from gate.config import BUILTIN_CONFIG, load_config

from .conftest import replay, variant_config

pytestmark = pytest.mark.engine


def test_clean_upgrade_trajectory_is_inside_the_band(default_replay):
    check = default_replay.check("grpo-trajectory")
    assert check["status"] == "PASS", check["summary"]
    assert check["details"]["compared_with"] == "baseline"
    assert all(step is None for step in check["details"]["first_exit"].values())
    grpo = default_replay.report["grpo"]  # per-step metrics land in report.json for the renderer
    assert set(grpo["metrics"]) >= {"reward", "k3_kl", "clip_frac", "entropy", "response_length", "step_s"}
    assert len(grpo["metrics"]["reward"]["new"]) == grpo["steps"] == load_config(BUILTIN_CONFIG).grpo.steps
    assert all(s > 0 for s in grpo["metrics"]["push_s"]["new"])  # every step pushed; how fast: scripts/bench_replay.py


def test_reward_rises_over_the_run_on_the_committed_band():
    base = bl.load(load_config(BUILTIN_CONFIG).baseline)
    reward = base.evidence["grpo_reward"]  # [seeds, steps] of the reference engine
    assert reward.shape[0] >= 3
    k = reward.shape[1] // 4
    first, last = reward[:, :k].mean(), reward[:, -k:].mean()
    assert last - first > 0.08, (first, last)  # the trajectory carries signal


def test_raw_logprobs_leave_the_band_from_step_zero(raw_mode_replay):
    check = raw_mode_replay.check("grpo-trajectory")
    assert check["status"] == "FAIL"
    assert check["details"]["first_exit"]["k3_kl"] == 0
    assert check["details"]["first_exit"]["clip_frac"] == 0
    assert "from step 0" in check["diagnosis"]
    k3 = np.asarray(check["details"]["metrics"]["k3_kl"]["new"])
    assert k3.min() > 1e-3


def test_gspo_trains_in_the_cpu_defaults_grpo_pass(tmp_path_factory):
    """grpo.loss: gspo runs in the worker: one importance ratio per sequence, clipped at 3e-4/4e-4.
    At step 0 the trainer holds the engine's weights (fp32 both), so no sequence is outside that
    band; once trained, sequences leave it, which a token-level band of 0.2 would not show."""
    tmp = tmp_path_factory.mktemp("gspo")
    config = variant_config(tmp, grpo={"loss": "gspo"}, baseline=None)
    run = replay(tmp / "run", "-c", str(config), "--only", "new")
    new = run.evidence("new")
    trainer = new.engine["grpo"]["trainer"]
    assert trainer["loss"] == "gspo" and trainer["clip_band"] == [3e-4, 4e-4], trainer
    clip = new["grpo_clip_frac"][0]
    assert clip[0] == 0.0 and clip[1:].max() > 0.0, clip
    assert np.all(np.isfinite(new["grpo_reward"])) and np.all(np.isfinite(new["grpo_k3_kl"]))
    log = (run.run_dir / "engines" / "new" / "worker.log").read_text()
    assert "on the gspo loss, clip band [1 - 0.0003, 1 + 0.0004]" in log
