"""The mini RL run's objectives (gate/worker/policy_loss.py) against hand-computed values.

Two sequences, lengths 2 and 1, with token ratios 1.5, 0.9 (advantage +1) and 1.1 (advantage -1).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from gate.config.sections import GrpoConfig
from gate.errors import ConfigError
from gate.worker.policy_loss import PolicyLoss, advantages, policy_loss

LENGTHS = [2, 1]
RATIOS = [1.5, 0.9, 1.1]


def _run(
    name: str, eps_low: float, eps_high: float, ratios=RATIOS, lengths=LENGTHS, adv=(1.0, -1.0)
):
    d = torch.tensor([math.log(r) for r in ratios], dtype=torch.float64, requires_grad=True)
    loss, clipped = policy_loss(d, torch.tensor(adv, dtype=torch.float64), lengths,
                                PolicyLoss(name, eps_low, eps_high, max_tokens=4))  # fmt: skip
    loss.backward()
    return loss.item(), clipped.tolist(), d.grad.tolist()


def test_grpo_is_the_token_mean_of_the_clipped_objective():
    loss, clipped, grad = _run("grpo", 0.2, 0.2)
    # min(1.5, 1.2) = 1.2 (clipped), min(0.9, 0.9) = 0.9, min(-1.1, -1.2) = -1.1, over 3 tokens
    assert loss == pytest.approx(-(1.2 + 0.9 - 1.1) / 3)
    assert clipped == [True, False, False]
    # d/dd of -r*A/3 is -r*A/3 where unclipped; a clipped token gets no gradient
    assert grad == pytest.approx([0.0, -0.9 / 3, 1.1 / 3])


def test_dapo_clips_higher_only_above():
    loss, clipped, _ = _run("dapo", 0.2, 0.28)
    assert loss == pytest.approx(-(1.28 + 0.9 - 1.1) / 3)
    assert clipped == [True, False, False]
    # 1.25 is clipped by grpo's 1.2 and kept by dapo's 1.28; 0.75 is below both lower edges
    assert _run("grpo", 0.2, 0.2, ratios=[1.25, 0.75, 1.0])[1] == [True, True, False]
    assert _run("dapo", 0.2, 0.28, ratios=[1.25, 0.75, 1.0])[1] == [False, True, False]


def test_dr_grpo_sums_tokens_over_the_generation_budget():
    loss, _, grad = _run("dr_grpo", 0.2, 0.2)
    # no per-sequence length normalisation: the token sum over (2 sequences x max_tokens 4)
    assert loss == pytest.approx(-(1.2 + 0.9 - 1.1) / 8)
    assert grad == pytest.approx([0.0, -0.9 / 8, 1.1 / 8])


def test_gspo_clips_one_ratio_per_sequence():
    loss, clipped, grad = _run("gspo", 3e-4, 4e-4)
    s0, s1 = math.sqrt(1.5 * 0.9), 1.1  # exp of each sequence's mean log-ratio
    assert s0 == pytest.approx(1.161895, abs=1e-6)
    # sequence 0 (A=+1): min(s0, 1.0004) = 1.0004, no gradient; sequence 1 (A=-1): -s1
    assert loss == pytest.approx(-(1.0004 - s1) / 2)
    assert clipped == [True, True, True]  # each token carries its sequence's ratio
    assert grad == pytest.approx([0.0, 0.0, s1 / 2])


def test_gspo_spreads_an_unclipped_sequences_gradient_over_its_tokens():
    ratios = [1.0001, 0.9999, 1.0]
    loss, clipped, grad = _run("gspo", 3e-4, 4e-4, ratios=ratios)
    s0 = math.sqrt(1.0001 * 0.9999)
    assert loss == pytest.approx(-(s0 - 1.0) / 2)
    assert clipped == [False, False, False]
    # d s0 / d d_t = s0 / len(seq 0); the loss averages 2 sequences
    assert grad == pytest.approx([-s0 / 2 / 2, -s0 / 2 / 2, 1.0 / 2])


def test_gspo_leaves_an_empty_completion_out():
    loss, clipped, _ = _run("gspo", 3e-4, 4e-4, ratios=[1.0, 1.0], lengths=[2, 0])
    assert math.isfinite(loss) and loss == pytest.approx(-1.0) and clipped == [False, False]


def test_advantages_drop_the_std_only_for_dr_grpo():
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    centred = np.array([[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0]])
    np.testing.assert_allclose(advantages(rewards, PolicyLoss("dr_grpo", 0.2, 0.2, 4)), centred)
    for name in ("grpo", "dapo", "gspo"):
        got = advantages(rewards, PolicyLoss(name, 0.2, 0.2, 4))
        np.testing.assert_allclose(got, centred / np.array([[0.5 + 1e-4], [1e-4]]))


def test_the_default_objective_is_the_one_the_baselines_were_recorded_with():
    """grpo must stay bit-identical to the loss the committed GRPO bands were recorded with."""
    gen = torch.Generator().manual_seed(0)
    lengths = [5, 3, 7, 1]
    d = (torch.randn(sum(lengths), generator=gen) * 0.3).requires_grad_()
    seq_adv = torch.randn(len(lengths), generator=gen)
    loss, _ = policy_loss(d, seq_adv, lengths, PolicyLoss("grpo", 0.2, 0.2, 16))
    token_adv = torch.repeat_interleave(seq_adv, torch.tensor(lengths))
    ratio = torch.exp(d)
    before = -torch.minimum(ratio * token_adv, ratio.clamp(0.8, 1.2) * token_adv).mean()
    assert torch.equal(loss, before)


def test_an_unknown_loss_is_refused():
    with pytest.raises(ValueError, match="unknown policy loss 'ppo'"):
        PolicyLoss("ppo", 0.2, 0.2, 4)


@pytest.mark.parametrize(("settings", "band"), [
    ({}, (0.2, 0.2)),
    ({"clip_eps": 0.1}, (0.1, 0.1)),
    ({"loss": "dapo"}, (0.2, 0.28)),
    ({"loss": "dapo", "clip_eps": 0.1, "clip_eps_high": 0.3}, (0.1, 0.3)),
    ({"loss": "gspo"}, (3e-4, 4e-4)),
    ({"loss": "dr_grpo", "clip_eps_high": 0.3}, (0.2, 0.3)),
])  # fmt: skip
def test_the_clip_band_defaults_to_the_losss_own(settings, band):
    config = GrpoConfig(**settings)
    config.validate("gate.yaml: grpo")
    assert config.clip_band() == pytest.approx(band)


@pytest.mark.parametrize(("settings", "message"), [
    ({"loss": "ppo"}, "gate.yaml: grpo.loss: must be one of ('grpo', 'dapo', 'dr_grpo', 'gspo')"),
    ({"loss": "gspo", "clip_eps": 0.2}, "grpo.clip_eps_high: set it beside clip_eps: gspo's band is asymmetric (0.0003 / 0.0004)"),
    ({"clip_eps": 1.5}, "grpo.clip_eps: must be in (0, 1) (got 1.5)"),
])  # fmt: skip
def test_bad_loss_settings_name_the_field(settings, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        GrpoConfig(**settings).validate("gate.yaml: grpo")
