"""The mini GRPO run through real engines: a clean upgrade stays in band, raw logprobs do not."""

from __future__ import annotations

import numpy as np
import pytest

from gate import baseline as bl
from gate.config import BUILTIN_CONFIG, load_config

pytestmark = pytest.mark.engine


def test_clean_upgrade_trajectory_is_inside_the_band(default_replay):
    check = default_replay.check("grpo-trajectory")
    assert check["status"] == "PASS", check["summary"]
    assert check["details"]["compared_with"] == "baseline"
    assert all(step is None for step in check["details"]["first_exit"].values())
    grpo = default_replay.report["grpo"]  # per-step metrics land in report.json for the renderer
    assert set(grpo["metrics"]) >= {
        "reward",
        "k3_kl",
        "clip_frac",
        "entropy",
        "response_length",
        "step_s",
    }
    assert (
        len(grpo["metrics"]["reward"]["new"])
        == grpo["steps"]
        == load_config(BUILTIN_CONFIG).grpo.steps
    )
    assert all(
        s > 0 for s in grpo["metrics"]["push_s"]["new"]
    )  # every step pushed; how fast: scripts/bench_replay.py


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
