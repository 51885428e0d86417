"""vLLM logits processors that inject known faults into a real engine (issue 6's fault matrix).

Loaded by the engine from its ``logits_processors`` argument ("fault_processors:DoubleTemperature")
with this folder on the engine's PYTHONPATH. They run inside the engine environment. Processed
logprobs include a logits processor's effect, so each fault reaches exactly what a trainer reads.
"""

import os

import torch
from vllm.v1.sample.logits_processor import LogitsProcessor


class _Fault(LogitsProcessor):
    def __init__(self, vllm_config, device, is_pin_memory):
        self.device = device

    def is_argmax_invariant(self) -> bool:
        return False  # make vLLM apply it on every request, greedy included

    def update_state(self, batch_update) -> None:
        pass


class DoubleTemperature(_Fault):
    """Temperature applied twice: the logits are divided by the CPU default's T=0.7 before vLLM does it again."""

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits / 0.7


class LogitNoise(_Fault):
    """Small Gaussian logit noise of scale GATE_FAULT_SIGMA (the "numerics drift" case), seeded."""

    def __init__(self, vllm_config, device, is_pin_memory):
        super().__init__(vllm_config, device, is_pin_memory)
        self.sigma = float(os.environ.get("GATE_FAULT_SIGMA", "0.05"))
        self.generator = torch.Generator(device="cpu").manual_seed(
            int(os.environ.get("GATE_FAULT_SEED", "0"))
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(logits.shape, generator=self.generator, dtype=torch.float32)
        return logits + self.sigma * noise.to(logits.device, logits.dtype)
