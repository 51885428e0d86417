"""The engine's passes over one request, as a table: name, when it runs, what it does.

:data:`ENGINE_PASSES` lists them in the order they run. :func:`run_passes` runs the enabled ones,
timing each as ``<name>_s`` (engine.json ``timings``); each adds its result to :class:`PassResults`.
The order is part of the contract: the weight-sync probe and the GRPO run push new weights into
the engine, so they come last (and ``validate_batch`` keeps them to the last request of a batch).

Imports only numpy and the standard library at module level; the engine-side modules (vllm,
torch, transformers) load inside the passes that need them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gate.request import WorkerRequest
from gate.worker import replay
from gate.worker.replay import Completions, PromptScores

if TYPE_CHECKING:
    from vllm import LLM

Say = Callable[[str], None]


@dataclass
class Timings:
    """Seconds per step, by engine.json timing key."""

    values: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def measure(self, key: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.values[key] = time.perf_counter() - start


@dataclass(frozen=True)
class Tokenized:
    """One request's prompts and reference continuations, tokenized in the engine environment."""

    prompt_ids: list[list[int]]
    reference_ids: list[list[int] | None]


@dataclass(frozen=True)
class PassInput:
    """What every pass may read: the live engine, the request and its tokens."""

    llm: LLM
    request: WorkerRequest
    tokenized: Tokenized
    say: Say  # progress, prefixed with the request's place in a batch
    hf_kwargs: dict[str, Any]  # load trainer-side copies as the engine loaded the model

    @property
    def order(self) -> np.ndarray | None:
        """The prompts' submission order (a permutation under ``order_seed``; None: as listed)."""
        return replay.submission_order(len(self.tokenized.prompt_ids), self.request.order_seed)

    @property
    def teacher_forced_rows(self) -> list[int]:
        """The prompts the teacher-forced pass scores: those with a reference continuation."""
        if not self.request.teacher_forced:
            return []
        return [i for i, ref in enumerate(self.tokenized.reference_ids) if ref]


@dataclass(frozen=True)
class TeacherForced:
    """The teacher-forced pass: fixed sequences (prompt + reference) and the engine's logprobs of them."""

    rows: list[int]  # prompts with a reference continuation
    seqs: list[list[int]]  # prompt + reference token ids
    scores: PromptScores


@dataclass
class PassResults:
    """What the passes produced, filled in pass by pass; None where a pass did not run."""

    sampled: Completions | None = None
    greedy: Completions | None = None
    teacher_forced: TeacherForced | None = None
    weight_sync: dict[str, Any] | None = None  # engine.json "weight_sync"
    grpo: dict[str, Any] | None = None  # engine.json "grpo"
    arrays: dict[str, np.ndarray] = field(default_factory=dict)  # ws_* and grpo_* evidence arrays


@dataclass(frozen=True)
class EnginePass:
    name: str  # progress and the timing key ``<name>_s``
    enabled: Callable[[PassInput], bool]
    run: Callable[[PassInput, PassResults], None]


def run_passes(passes: Sequence[EnginePass], inp: PassInput, timings: Timings) -> PassResults:
    """Run the enabled passes in table order, each timed as ``<name>_s``."""
    results = PassResults()
    for engine_pass in passes:
        if engine_pass.enabled(inp):
            with timings.measure(f"{engine_pass.name}_s"):
                engine_pass.run(inp, results)
    return results


# -- the passes ------------------------------------------------------------------------------------


def _sample(inp: PassInput, out: PassResults) -> None:
    s, order = inp.request.sampling, inp.order
    if order is not None:
        inp.say(f"submitting prompts in a permuted order (order_seed={inp.request.order_seed})")
    inp.say(
        f"sampling {len(inp.tokenized.prompt_ids)} prompts x {s.n} "
        f"(T={s.temperature}, top_p={s.top_p}, top_k={s.top_k}, seed={s.seed})"
    )
    out.sampled = replay.sample(inp.llm, inp.tokenized.prompt_ids, s, order)


def _greedy(inp: PassInput, out: PassResults) -> None:
    inp.say("greedy pass")
    out.greedy = replay.greedy(inp.llm, inp.tokenized.prompt_ids, inp.request.greedy_max_tokens,
                               inp.request.sampling.logprobs, inp.order)  # fmt: skip


def _teacher_forced(inp: PassInput, out: PassResults) -> None:
    rows = inp.teacher_forced_rows
    prompts, references = inp.tokenized.prompt_ids, inp.tokenized.reference_ids
    seqs = [prompts[i] + (references[i] or []) for i in rows]
    inp.say(f"teacher-forced pass over {len(seqs)} fixed sequences")
    order = replay.submission_order(len(seqs), inp.request.order_seed)
    out.teacher_forced = TeacherForced(rows, seqs, replay.score_sequences(inp.llm, seqs, order))


def _weight_sync(inp: PassInput, out: PassResults) -> None:
    from gate.worker.weight_sync import run_probe

    assert inp.request.weight_sync is not None  # enabled() says so
    arrays, out.weight_sync = run_probe(inp.llm, inp.request.model, inp.tokenized.prompt_ids,
                                        inp.tokenized.reference_ids, inp.request.weight_sync, inp.say,
                                        inp.hf_kwargs)  # fmt: skip
    out.arrays.update(arrays)


def _grpo(inp: PassInput, out: PassResults) -> None:
    from gate.worker.grpo import run_grpo
    from gate.worker.weight_sync import UnsupportedEngine, choose_adapter

    g, ws = inp.request.grpo, inp.request.weight_sync
    assert g is not None  # enabled() says so
    try:
        adapter = choose_adapter(inp.llm, ws.hook if ws else None)
    except UnsupportedEngine as exc:  # no weight push: no GRPO run; the evidence above stands
        inp.say(f"mini GRPO not run: {exc}")
        out.grpo = {"adapter": None, "unsupported": str(exc), "seeds": g.seeds, "steps": g.steps}
        return
    inp.say(f"mini GRPO: {len(g.seeds)} seed(s) x {g.steps} steps of {g.prompts_per_step} prompts "
            f"x {g.group_size}")  # fmt: skip
    answers = [p.answer for p in inp.request.prompts]
    out.arrays.update(run_grpo(inp.llm, inp.request.model, inp.tokenized.prompt_ids, answers, g,
                               adapter.push, inp.say, inp.hf_kwargs))  # fmt: skip
    out.grpo = {"adapter": adapter.name, "seeds": g.seeds, "steps": g.steps}


ENGINE_PASSES: tuple[EnginePass, ...] = (
    EnginePass("sample", lambda inp: True, _sample),
    EnginePass("greedy", lambda inp: inp.request.greedy_max_tokens > 0, _greedy),
    EnginePass("teacher_forced", lambda inp: bool(inp.teacher_forced_rows), _teacher_forced),
    # Last: these change the engine's weights.
    EnginePass("weight_sync", lambda inp: inp.request.weight_sync is not None, _weight_sync),
    EnginePass("grpo", lambda inp: inp.request.grpo is not None, _grpo),
)
