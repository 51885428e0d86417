"""Copies of a trainer's state dict for a push: detached, on the host, or perturbed into a new policy.

Every helper keeps tied weights tied (``lm_head.weight`` is ``embed_tokens.weight`` under
``tie_word_embeddings``): names of one tensor share one copy, as the trainer's model holds them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

AliasKey = tuple[str, int, tuple[int, ...], tuple[int, ...]]


def alias_key(tensor: torch.Tensor) -> AliasKey:
    """Equal for names that are the same tensor (tied weights), different for distinct views of one buffer."""
    return (str(tensor.device), tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))


def clone_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A detached copy that keeps tied tensors tied: names of one tensor share one clone."""
    clones: dict[AliasKey, torch.Tensor] = {}
    return {
        name: _once(clones, alias_key(t), partial(_detached_clone, t))
        for name, t in state_dict.items()
    }


def host_state_dict(state_dict: dict[str, torch.Tensor], pin: bool) -> dict[str, torch.Tensor]:
    """A detached copy in host memory (page-locked when ``pin``) that keeps tied tensors tied:
    what the trainer's model loads from, by ``load_state_dict``, without a second device copy."""
    copies: dict[AliasKey, torch.Tensor] = {}
    return {
        name: _once(copies, alias_key(t), partial(_to_host, t, pin))
        for name, t in state_dict.items()
    }


def _to_host(tensor: torch.Tensor, pin: bool) -> torch.Tensor:
    if tensor.device.type == "cpu" and not pin:
        return tensor.detach().clone()
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
    return host.copy_(tensor.detach())


def perturbed(
    state_dict: dict[str, torch.Tensor], scale: float, seed: int
) -> dict[str, torch.Tensor]:
    """A new policy: every float tensor moved by ``scale`` times its own std, reproducibly.

    Once per tensor, not per name: tied weights (``tie_word_embeddings``: ``lm_head.weight`` is
    ``embed_tokens.weight``) get one perturbation, and both names map to the same new tensor.
    Independent noise would leave the trainer with whichever name it loads last and the engine
    with the one it reads (vLLM's Llama/Qwen2 skip ``lm_head.*`` when tied): a false partial update.
    """
    gen = torch.Generator().manual_seed(seed)
    done: dict[AliasKey, torch.Tensor] = {}
    return {
        name: _once(done, alias_key(t), partial(_perturb, t, scale, gen))
        for name, t in state_dict.items()
    }


def tied_name_groups(state_dict: dict[str, torch.Tensor]) -> list[list[str]]:
    """The names the trainer holds as one tensor (tied weights), each group sorted; [] when none.

    A tied model's engine holds one tensor for such a group and keeps one value for it, so a
    push that sends the names apart (an untied view) leaves it serving one of them as both.
    """
    groups: dict[AliasKey, list[str]] = {}
    for name, tensor in state_dict.items():
        groups.setdefault(alias_key(tensor), []).append(name)
    return sorted(sorted(names) for names in groups.values() if len(names) > 1)


def _detached_clone(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone()


def _once(
    memo: dict[AliasKey, torch.Tensor], key: AliasKey, make: Callable[[], torch.Tensor]
) -> torch.Tensor:
    if key not in memo:
        memo[key] = make()
    return memo[key]


def _perturb(tensor: torch.Tensor, scale: float, gen: torch.Generator) -> torch.Tensor:
    if not (tensor.is_floating_point() and tensor.numel() > 1):
        return tensor.clone()
    noise = torch.randn(tensor.shape, generator=gen, dtype=torch.float32).to(
        tensor.device, tensor.dtype
    )
    return tensor + scale * tensor.float().std().to(tensor.dtype) * noise
