"""The policy-gradient objectives RL stacks train with, for the mini GRPO run (gate/worker/grpo.py).

Each takes the per-token log-ratio ``d = lp_trainer - lp_rollout`` (flat over the batch, with grad),
the per-sequence advantages and the sequences' lengths, and returns the loss and, per token,
whether the loss clipped it (the ``clip_frac`` the run reports). They differ where stacks differ:

- ``grpo``: token-level PPO clip, ``min(r A, clip(r, 1 - eps, 1 + eps) A)`` averaged over every
  token of the batch (TRL's and verl's ``token-mean``), advantages normalised by the group's std.
- ``dapo``: the same with clip-higher, an upper edge ``1 + eps_high`` above the lower one
  (DAPO, arXiv:2503.14476: 0.2 / 0.28). DAPO's dynamic sampling and overlong shaping change which
  samples train, not the objective, and are not run here.
- ``dr_grpo``: no std normalisation of the advantages and no per-sequence length normalisation:
  each sequence's token sum over a constant, the generation budget (Dr. GRPO, arXiv:2503.20783;
  verl's ``seq-mean-token-sum-norm``).
- ``gspo``: one importance ratio per sequence, ``exp(mean_t d)``, clipped at the sequence level with
  a band of a few 1e-4 (GSPO, arXiv:2507.18071: 3e-4 / 4e-4), the loss a mean over sequences.

Torch, numpy and the standard library only: this runs in the engine's environment.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# grpo.loss's values; their clip bands' defaults are the config's (gate/config/sections.py).
LOSSES = ("grpo", "dapo", "dr_grpo", "gspo")
STD_EPS = 1e-4  # keeps a group whose rewards are all equal at advantage 0, not 0/0


@dataclass(frozen=True)
class PolicyLoss:
    name: str
    eps_low: float
    eps_high: float
    max_tokens: int  # Dr. GRPO's constant normaliser: the generation budget

    def __post_init__(self) -> None:
        if self.name not in LOSSES:
            raise ValueError(f"unknown policy loss {self.name!r}: one of {LOSSES}")


def advantages(rewards: np.ndarray, loss: PolicyLoss) -> np.ndarray:
    """[prompts, group] rewards -> advantages: centred on the group's mean, and divided by its std
    except for Dr. GRPO, which drops that normalisation (it up-weights easy and hard prompts)."""
    centred = rewards - rewards.mean(axis=1, keepdims=True)
    if loss.name == "dr_grpo":
        return centred
    return centred / (rewards.std(axis=1, keepdims=True) + STD_EPS)


def policy_loss(
    d: torch.Tensor, seq_adv: torch.Tensor, lengths: list[int], loss: PolicyLoss
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scalar loss, [tokens] bool clipped) for the flat log-ratios ``d`` of ``len(lengths)``
    sequences, sequence ``i`` owning ``lengths[i]`` consecutive tokens."""
    counts = torch.as_tensor(lengths, device=d.device)
    owner = torch.repeat_interleave(torch.arange(len(lengths), device=d.device), counts)
    if loss.name == "gspo":
        # the sequence's mean log-ratio: sum via index_add, so the gradient reaches every token
        seq_d = torch.zeros(len(lengths), dtype=d.dtype, device=d.device).index_add(0, owner, d)
        seq_d = seq_d / counts.clamp(min=1).to(d.dtype)
        ratio = torch.exp(seq_d)
        objective = _clipped(ratio, seq_adv, loss)
        present = counts > 0  # an empty completion has no ratio and no say
        clipped = _outside(ratio, loss)[owner]
        return -objective[present].mean(), clipped
    ratio = torch.exp(d)
    objective = _clipped(ratio, seq_adv[owner], loss)
    clipped = _outside(ratio, loss)
    if loss.name == "dr_grpo":
        return -objective.sum() / (len(lengths) * loss.max_tokens), clipped
    return -objective.mean(), clipped


def _clipped(ratio: torch.Tensor, adv: torch.Tensor, loss: PolicyLoss) -> torch.Tensor:
    return torch.minimum(ratio * adv, ratio.clamp(1 - loss.eps_low, 1 + loss.eps_high) * adv)


def _outside(ratio: torch.Tensor, loss: PolicyLoss) -> torch.Tensor:
    return ((ratio < 1 - loss.eps_low) | (ratio > 1 + loss.eps_high)).detach()
