"""A running engine as the passes drive it: one interface, two implementations.

:class:`EngineHandle` is everything a pass (gate/worker/passes.py) asks of the engine it runs on:
sample, score fixed sequences, choose a weight push, and hand the weight-sync probe, the in-flight
phase and the GRPO run what each drives. :class:`OfflineEngine` implements it over a ``vllm.LLM``
in this process; ``gate.worker.server_engine.ServedEngine`` over vLLM's OpenAI-compatible server.
So there is one pass table, and a pass that one mode cannot run says why (``batch_invariance``
in server mode) instead of being absent from that mode's table.

Imports only the standard library at module level: the engine-side modules (vllm, torch,
transformers) load inside the methods that need them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch

    from gate.contract.request import InflightRequest, WorkerRequest
    from gate.worker.grpo import Rollout
    from gate.worker.lora import PolicyAdapter
    from gate.worker.replay import Completions, PromptScores
    from gate.worker.weight_push import Adapter
    from gate.worker.weight_sync import ProbeTarget


class EngineHandle(Protocol):
    """What the passes need of a running engine, offline or served."""

    # Where the passes run, for progress lines: "" offline, " over HTTP" in server mode.
    over: str

    def sample(
        self,
        request: WorkerRequest,
        prompt_ids: list[list[int]],
        order: np.ndarray | None,
        say: Callable[[str], None],
    ) -> tuple[Completions, dict[str, Any]]:
        """The rollout pass's completions, and engine.json's ``prompt_ids`` record (the prompts
        as the engine ran them against the trainer's ``prompt_ids``, which a server that renders
        chat prompts itself replaces in place with its own)."""
        ...

    def greedy(
        self, prompt_ids: list[list[int]], max_tokens: int, logprobs: int, order: np.ndarray | None
    ) -> Completions: ...

    def score_sequences(self, seqs: list[list[int]], order: np.ndarray | None) -> PromptScores:
        """Prompt logprobs of fixed sequences (teacher-forced, prefill rescoring)."""
        ...

    def max_model_len(self) -> int: ...

    def batch_invariance_unavailable(self) -> str | None:
        """Why this engine cannot be asked for chosen batch compositions; None where it can."""
        ...

    def push_adapter(self, hook: str | None, scratch_dir: Path | None) -> Adapter:
        """The weight push: the user's hook, else a path the engine offers; raises
        ``weight_push.UnsupportedEngine`` with the reason where there is none."""
        ...

    def push_facts(self) -> dict[str, Any]:
        """What the push passes record beside their own results (a server's ``push_probe``)."""
        ...

    def probe_target(self, adapter: Adapter) -> ProbeTarget:
        """What the weight-sync probe drives (gate/worker/weight_sync.py)."""
        ...

    def inflight_driver(self, adapter: Adapter, request: InflightRequest) -> Any:
        """What the in-flight phase drives (gate.worker.inflight.InflightDriver)."""
        ...

    def grpo_target(self) -> tuple[Any, Rollout | None, torch.dtype | None]:
        """What the GRPO run takes: the push's first argument, the rollout (None: the LLM's own)
        and the trainer's frozen dtype (None: read from the LLM)."""
        ...


@dataclass
class OfflineEngine:
    """:class:`EngineHandle` over a ``vllm.LLM`` in this process."""

    llm: Any
    over: str = ""
    # Score teacher-forced sequences one per call (layout.prompt_logprobs_per_call says why).
    one_sequence_per_call: bool = False
    # LoRA mode: the policy adapter every pass generates through (gate/worker/lora.py).
    policy: PolicyAdapter | None = None

    @property
    def lora_request(self) -> Any:
        return None if self.policy is None else self.policy.current

    def sample(
        self,
        request: WorkerRequest,
        prompt_ids: list[list[int]],
        order: np.ndarray | None,
        say: Callable[[str], None],
    ) -> tuple[Completions, dict[str, Any]]:
        from gate.worker import replay

        s = request.sampling
        if order is not None:
            say(f"submitting prompts in a permuted order (order_seed={request.order_seed})")
        say(
            f"sampling {len(prompt_ids)} prompts x {s.n} "
            f"(T={s.temperature}, top_p={s.top_p}, top_k={s.top_k}, seed={s.seed})"
        )
        sampled = replay.sample(self.llm, prompt_ids, s, order, self.lora_request)
        record = replay.prompt_ids_record(
            prompt_ids,
            sampled.engine_prompt_ids or [None] * len(prompt_ids),
            [p.id for p in request.prompts],
            "RequestOutput.prompt_token_ids",
        )
        return sampled, record

    def greedy(
        self, prompt_ids: list[list[int]], max_tokens: int, logprobs: int, order: np.ndarray | None
    ) -> Completions:
        from gate.worker import replay

        return replay.greedy(self.llm, prompt_ids, max_tokens, logprobs, order, self.lora_request)

    def score_sequences(self, seqs: list[list[int]], order: np.ndarray | None) -> PromptScores:
        from gate.worker import replay

        return replay.score_sequences(
            self.llm, seqs, order, self.one_sequence_per_call, self.lora_request
        )

    def max_model_len(self) -> int:
        from gate.worker import replay

        return replay.max_model_len(self.llm)

    def batch_invariance_unavailable(self) -> str | None:
        if self.one_sequence_per_call:
            return (
                "sequences are scored one per call here (engine.json gate_settings: "
                "prompt_logprobs_one_sequence_per_call), so there are no batch compositions to compare"
            )
        return None

    def push_adapter(self, hook: str | None, scratch_dir: Path | None) -> Adapter:
        from gate.worker.weight_push import choose_adapter

        return choose_adapter(self.llm, hook, scratch_dir)

    def push_facts(self) -> dict[str, Any]:
        return {}

    def probe_target(self, adapter: Adapter) -> ProbeTarget:
        from gate.worker.weight_sync import offline_target

        return offline_target(self.llm, adapter)

    def inflight_driver(self, adapter: Adapter, request: InflightRequest) -> Any:
        from gate.worker.inflight_offline import OfflineDriver

        return OfflineDriver(self.llm, adapter)

    def grpo_target(self) -> tuple[Any, Rollout | None, torch.dtype | None]:
        return self.llm, None, None
