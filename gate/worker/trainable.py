"""What the mini GRPO trainer updates (``grpo.trainable``) and with which optimizer (``grpo.optimizer``).

Training every parameter with AdamW costs 16 bytes per parameter (fp32 weight, gradient and two
moments): 128 GB for an 8B model, more than one GPU holds beside the engine. A subset keeps the
gradient and optimizer state to that subset; the frozen rest needs no gradient and, with plain
SGD, nothing at all besides the weights. Whatever trains, the push still sends the whole state
dict through the engine's update path.

The model itself runs in the engine's dtype. A trained parameter in a lower precision gets an fp32
master copy that the optimizer steps (its update would round away in bf16) and that is written
back into the model after each step; an fp32 parameter is its own master, so an fp32 model trains
exactly as a plain optimizer over its parameters would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

_OPTIMIZERS = ("adamw", "sgd")


@dataclass(frozen=True)
class TrainableSet:
    """The parameters selected for training; every other one has ``requires_grad`` off."""

    spec: str | dict[str, int]  # grpo.trainable as requested
    names: tuple[str, ...]  # one name per trained tensor
    parameters: tuple[torch.nn.Parameter, ...]  # the model's own, in the dtype it runs
    # What the optimizer steps: fp32 copies, or the parameters themselves when they are fp32.
    masters: tuple[torch.nn.Parameter, ...]
    total_parameters: int  # elements in the whole model, a tied tensor once
    tied_lm_head: bool  # "lm_head" selected a projection shared with the input embeddings

    @property
    def trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters)


def select_trainable(model: torch.nn.Module, spec: str | dict[str, int]) -> TrainableSet:
    """Mark the parameters ``spec`` names trainable (and no other): "all", "lm_head", "norms" or
    {"last_layers": N}, the last N decoder layers."""
    chosen = dict(_chosen(model, spec))  # name -> parameter; a tied tensor comes once
    if not chosen:
        raise ValueError(f"grpo.trainable: {spec!r} selects no parameter of {type(model).__name__}")
    for p in model.parameters():
        p.requires_grad_(False)
    for p in chosen.values():
        p.requires_grad_(True)
    return TrainableSet(
        spec=spec,
        names=tuple(chosen),
        parameters=tuple(chosen.values()),
        masters=tuple(_master(p) for p in chosen.values()),
        total_parameters=sum(p.numel() for p in model.parameters()),
        tied_lm_head=spec == "lm_head" and _head_is_tied(model),
    )


def make_optimizer(trained: TrainableSet, name: str, lr: float) -> torch.optim.Optimizer:
    """AdamW (two fp32 moments per trained element) or plain SGD (no momentum: no state)."""
    params = list(trained.masters)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.0)
    raise ValueError(f"grpo.optimizer: {name!r} is not one of {_OPTIMIZERS}")


def optimizer_step(trained: TrainableSet, optimizer: torch.optim.Optimizer) -> None:
    """One step on the masters from the gradients backward left on the model's parameters."""
    for param, master in zip(trained.parameters, trained.masters, strict=True):
        # One tensor at a time: each low-precision gradient goes as its fp32 one comes.
        if master is not param:
            master.grad = None if param.grad is None else param.grad.float()
            param.grad = None
    optimizer.step()
    with torch.no_grad():
        for param, master in zip(trained.parameters, trained.masters, strict=True):
            if master is not param:
                param.copy_(master)


def zero_grad(trained: TrainableSet, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    for param in trained.parameters:
        param.grad = None


def initial_values(trained: TrainableSet) -> dict[str, torch.Tensor]:
    """The trained parameters as they start, by name: all a run changes, so all it must restore."""
    return {
        name: p.detach().clone() for name, p in zip(trained.names, trained.parameters, strict=True)
    }


def restored_state_dict(
    model: torch.nn.Module, trained: TrainableSet, initial: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The model's state dict with every trained tensor back at ``initial``: the checkpoint again.

    Matched by tensor, not name, so a tied name (``lm_head.weight`` of ``embed_tokens.weight``)
    gets the restored value too; the frozen rest never moved.
    """
    by_tensor = {
        _storage_key(p): initial[name]
        for name, p in zip(trained.names, trained.parameters, strict=True)
    }
    return {
        name: by_tensor.get(_storage_key(t), t.detach()) for name, t in model.state_dict().items()
    }


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes the optimizer keeps per parameter (AdamW's moments and step counts; SGD's none)."""
    return sum(
        value.numel() * value.element_size()
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    )


def trainer_record(trained: TrainableSet, optimizer_name: str, state_bytes: int) -> dict[str, Any]:
    """engine.json's account of the trainer: what trained, and the memory its training kept."""
    return {
        "trainable": trained.spec,
        "optimizer": optimizer_name,
        "trainable_parameters": trained.trainable_parameters,
        "parameters": trained.total_parameters,
        # A tied projection is the input embedding too: training "lm_head" trains both.
        "tied_lm_head": trained.tied_lm_head,
        "gradient_bytes": sum(p.numel() * p.element_size() for p in trained.masters),
        "optimizer_state_bytes": state_bytes,
    }


def _master(param: torch.nn.Parameter) -> torch.nn.Parameter:
    if param.dtype == torch.float32:
        return param
    return torch.nn.Parameter(param.detach().float().clone())


def _storage_key(tensor: torch.Tensor) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    return (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))


def _chosen(
    model: torch.nn.Module, spec: str | dict[str, int]
) -> list[tuple[str, torch.nn.Parameter]]:
    if spec == "all":
        return list(model.named_parameters())
    if spec == "lm_head":
        head = model.get_output_embeddings()
        return [
            (n, p)
            for n, p in model.named_parameters()
            if p is head.weight or p is getattr(head, "bias", None)
        ]
    if spec == "norms":
        return [
            (f"{module_name}.{n}" if module_name else n, p)
            for module_name, module in model.named_modules()
            if "norm" in type(module).__name__.lower()
            for n, p in module.named_parameters(recurse=False)
        ]
    if isinstance(spec, dict) and set(spec) == {"last_layers"}:
        return _last_layers(model, spec["last_layers"])
    raise ValueError(
        f"grpo.trainable: {spec!r} is not 'all', 'lm_head', 'norms' or {{last_layers: N}}"
    )


def _last_layers(model: torch.nn.Module, count: int) -> list[tuple[str, torch.nn.Parameter]]:
    layers = _decoder_layers(model)
    if not 1 <= count <= len(layers):
        raise ValueError(
            f"grpo.trainable: last_layers {count}, but the model has {len(layers)} decoder layers"
        )
    first = len(layers) - count
    return [
        (f"layers.{first + i}.{n}", p)
        for i, layer in enumerate(layers[first:])
        for n, p in layer.named_parameters()
    ]


def _decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder's stack of layers: ``layers`` in the transformers models RL stacks train, else
    the longest ModuleList directly under the decoder."""
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None)
    if isinstance(layers, torch.nn.ModuleList):
        return layers
    lists = [m for m in decoder.children() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        raise ValueError(
            f"grpo.trainable: last_layers: found no layer list in {type(decoder).__name__}"
        )
    return max(lists, key=len)


def _head_is_tied(model: torch.nn.Module) -> bool:
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    return head is not None and embed is not None and head.weight is embed.weight
