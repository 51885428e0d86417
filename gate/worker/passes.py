"""The engine's passes over one request, as a table: name, when it runs, what it does.

:data:`ENGINE_PASSES` lists them in the order they run. :func:`run_passes` runs the enabled ones,
timing each as ``<name>_s`` (engine.json ``timings``); each adds its result to :class:`PassResults`.
The order is part of the contract: the weight-sync probe and the GRPO run push new weights into
the engine, so they come last (and ``validate_batch`` keeps them to the last request of a batch).

Those two (:data:`RL_PASSES`) may fail on their own: a push that raises (a user's hook, a rank
that fails) is recorded as that pass's ``error`` in engine.json, the passes after it are recorded
as not run (the engine's weights are then unknown), and the replay's evidence, already gathered,
is written and judged as usual. A failure in any other pass ends the worker, as before.

Bounds: every call into the workers has a timeout (``weight_push.call_workers``); each pass may
also be bounded by ``GATE_WORKER_PHASE_TIMEOUT_S`` (seconds), which ends it with an error naming it.

Imports only numpy and the standard library at module level; the engine-side modules (vllm,
torch, transformers) load inside the passes that need them.
"""

from __future__ import annotations

import re
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gate import host
from gate.contract import keys
from gate.contract.request import WorkerRequest
from gate.worker import replay
from gate.worker.replay import Completions, PromptScores

if TYPE_CHECKING:
    from gate.worker.engine_handle import EngineHandle
    from gate.worker.memory import PeakMemory
    from gate.worker.weight_push import Adapter

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


def no_log_tail() -> list[str]:
    return []


@dataclass(frozen=True)
class PassInput:
    """What every pass may read: the live engine, the request and its tokens."""

    # The live engine, offline (engine_handle.OfflineEngine) or served (server_engine.ServedEngine).
    engine: EngineHandle
    request: WorkerRequest
    tokenized: Tokenized
    say: Say  # progress, prefixed with the request's place in a batch
    hf_kwargs: dict[str, Any]  # load trainer-side copies as the engine loaded the model
    # The last lines the engine's processes wrote (log_tail.OutputTail.lines), for a failure
    # on one rank; returns nothing where they are not captured.
    log_tail: Callable[[], list[str]] = no_log_tail
    memory: PeakMemory | None = None  # peak memory per pass (engine.json memory_peaks)
    # vLLM's batch-invariant mode as the engine was started (batch_invariant_mode()).
    batch_invariant_mode: bool | None = None

    @property
    def scratch_dir(self) -> Path:
        """Beside the request's output dir: where a push folder goes when /dev/shm has no room."""
        return Path(self.request.output_dir).resolve().parent

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

    def teacher_forced_sequences(self) -> tuple[list[int], list[list[int]], np.ndarray | None]:
        """(rows, prompt + reference ids, submission order): the teacher-forced pass's input, the
        same whichever way the engine is driven (offline or over HTTP)."""
        rows = self.teacher_forced_rows
        prompts, references = self.tokenized.prompt_ids, self.tokenized.reference_ids
        seqs = [prompts[i] + (references[i] or []) for i in rows]
        return rows, seqs, replay.submission_order(len(seqs), self.request.order_seed)


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
    batch_invariance: dict[str, Any] | None = None  # engine.json "batch_invariance"
    weight_sync: dict[str, Any] | None = None  # engine.json "weight_sync"
    weight_sync_inflight: dict[str, Any] | None = None  # engine.json "weight_sync_inflight"
    grpo: dict[str, Any] | None = None  # engine.json "grpo"
    prompt_ids: dict[str, Any] | None = None  # engine.json "prompt_ids" (replay.prompt_ids_record)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)  # ws_* and grpo_* evidence arrays
    not_run: list[str] = field(default_factory=list)  # enabled passes skipped after a failed one


@dataclass(frozen=True)
class EnginePass:
    name: str  # progress and the timing key ``<name>_s``
    enabled: Callable[[PassInput], bool]
    run: Callable[[PassInput, PassResults], None]


RL_PASSES = (
    "weight_sync",
    "weight_sync_inflight",
    "grpo",
)  # they push weights; a failure there costs only their own checks
PHASE_TIMEOUT_ENV = host.PHASE_TIMEOUT_ENV


class PhaseTimeout(TimeoutError):
    """A pass ran past ``GATE_WORKER_PHASE_TIMEOUT_S``; the message names it."""


def phase_timeout_s() -> float | None:
    return host.settings().worker_phase_timeout_s  # a malformed value: ValueError naming it


@contextmanager
def phase_deadline(name: str, seconds: float | None) -> Iterator[None]:
    """Raise :class:`PhaseTimeout` in this (the main) thread when the pass outlives ``seconds``.

    A timer signal, so it also ends a pass waiting in Python on an engine that never answers; no
    bound where ``seconds`` is None or off the main thread (signals are delivered only there).
    """
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: object) -> None:
        raise PhaseTimeout(f"the {name} pass ran past its {seconds:g}s limit ({PHASE_TIMEOUT_ENV})")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_passes(passes: Sequence[EnginePass], inp: PassInput, timings: Timings) -> PassResults:
    """Run the enabled passes in table order, each timed as ``<name>_s``.

    An RL pass that raises is recorded (:func:`failure_record`) and every RL pass after it is
    listed in ``not_run``; any other pass that raises ends the run.
    """
    results = PassResults()
    limit = phase_timeout_s()
    failed: str | None = None
    for engine_pass in passes:
        if not engine_pass.enabled(inp):
            continue
        if failed is not None:  # after a failed push the engine's weights are unknown
            results.not_run.append(engine_pass.name)
            _record(results, engine_pass.name, {"not_run": f"the {failed} pass failed before it"})
            continue
        phase = inp.memory.phase(engine_pass.name) if inp.memory is not None else nullcontext()
        with timings.measure(f"{engine_pass.name}_s"), phase:
            try:
                with phase_deadline(engine_pass.name, limit):
                    engine_pass.run(inp, results)
            except Exception as exc:
                if engine_pass.name not in RL_PASSES:
                    raise
                failed = engine_pass.name
                inp.say(f"{engine_pass.name} failed: {type(exc).__name__}: {exc}"[:500])
                _record(results, engine_pass.name, failure_record(exc, inp.log_tail(), _hook(inp)))
    return results


def _record(results: PassResults, pass_name: str, entry: dict[str, Any]) -> None:
    """Merge ``entry`` into the pass's engine.json section (``weight_sync`` or ``grpo``)."""
    setattr(results, pass_name, {**(getattr(results, pass_name) or {}), **entry})


def _hook(inp: PassInput) -> str | None:
    if inp.request.lora is not None:
        return inp.request.lora.hook
    ws = inp.request.weight_sync
    return ws.hook if ws is not None else None


# A line an engine worker process logged, as vLLM prefixes it: "(Worker_TP1 pid=4242) ERROR ...".
_WORKER_LINE = re.compile(r"\((?P<proc>\w*Worker\w*) pid=\d+\)(?P<rest>.*)")
_FAILURE_WORDS = ("ERROR", "Error", "Exception", "Traceback")
TRACEBACK_LINES = 25
LOG_TAIL_LINES = 40


def failed_ranks(lines: Sequence[str]) -> list[str]:
    """The worker processes (``Worker_TP1``, ``Worker_PP0_TP1``) whose log lines report a failure."""
    found = []
    for line in lines:
        match = _WORKER_LINE.search(line)
        if match and any(word in match["rest"] for word in _FAILURE_WORDS):
            found.append(match["proc"])
    return sorted(set(found))


def failure_record(
    exc: BaseException, log_lines: Sequence[str], hook: str | None
) -> dict[str, Any]:
    """engine.json's ``error`` for a pass that raised: what, through which path, where it failed."""
    tb = "".join(traceback.format_exception(exc)).rstrip().splitlines()
    adapter = getattr(exc, "adapter", None)
    cause = exc.__cause__ if adapter and exc.__cause__ is not None else exc  # the hook's own error
    return {
        "error": {
            "message": f"{type(cause).__name__}: {cause}"[:2000],
            "adapter": adapter,
            "hook": hook,
            "traceback_tail": "\n".join(tb[-TRACEBACK_LINES:]),
            "failed_ranks": failed_ranks(log_lines),
            "log_tail": "\n".join(log_lines[-LOG_TAIL_LINES:]),
        }
    }


# -- the passes ------------------------------------------------------------------------------------


def _sample(inp: PassInput, out: PassResults) -> None:
    out.sampled, out.prompt_ids = inp.engine.sample(
        inp.request, inp.tokenized.prompt_ids, inp.order, inp.say
    )


def _greedy(inp: PassInput, out: PassResults) -> None:
    inp.say(f"greedy pass{inp.engine.over}")
    out.greedy = inp.engine.greedy(
        inp.tokenized.prompt_ids,
        inp.request.greedy_max_tokens,
        inp.request.sampling.logprobs,
        inp.order,
    )


def _prefill_decode(inp: PassInput, out: PassResults) -> None:
    _rescore_greedy(inp, out, inp.engine.score_sequences, inp.engine.max_model_len())


def _rescore_greedy(
    inp: PassInput,
    out: PassResults,
    score: Callable[[list[list[int]], np.ndarray | None], PromptScores],
    max_model_len: int,
) -> None:
    """The greedy sequences scored again as prompts by the same engine (``score``): each greedy
    token's prefill logprob beside its decode one (gate/worker/prefill.py)."""
    from gate.worker.prefill import decode_positions, rescoring_input

    if out.greedy is None:
        return
    seqs, starts = rescoring_input(inp.tokenized.prompt_ids, out.greedy, max_model_len)
    inp.say(f"prefill-decode pass: {len(seqs)} greedy sequence(s) scored again by prefill")
    scores = score(seqs, replay.submission_order(len(seqs), inp.request.order_seed))
    out.arrays[f"{keys.GREEDY}_{keys.PREFILL_LOGPROB}"] = decode_positions(
        scores, starts, out.greedy
    )


def _teacher_forced(inp: PassInput, out: PassResults) -> None:
    rows, seqs, order = inp.teacher_forced_sequences()
    inp.say(f"teacher-forced pass over {len(seqs)} fixed sequences{inp.engine.over}")
    out.teacher_forced = TeacherForced(rows, seqs, inp.engine.score_sequences(seqs, order))


def batch_invariant_mode() -> bool | None:
    """Whether vLLM runs in its batch-invariant mode; None where this release has no such mode."""
    import vllm.envs as envs

    if "VLLM_BATCH_INVARIANT" not in getattr(envs, "environment_variables", {}):
        return None
    return bool(envs.VLLM_BATCH_INVARIANT)


def _measures_batch_invariance(inp: PassInput) -> bool:
    return bool(inp.teacher_forced_rows) and (
        inp.request.batch_invariance or bool(inp.batch_invariant_mode)
    )


def _batch_invariance(inp: PassInput, out: PassResults) -> None:
    """The teacher-forced sequences scored again in two other batch compositions: reversed, and one
    sequence per call. A batch-invariant engine gives bitwise the same logprobs. An engine that
    cannot be given batch compositions records why (determinism-parity SKIPs with it)."""
    unavailable = inp.engine.batch_invariance_unavailable()
    if unavailable is not None:
        out.batch_invariance = {"not_run": unavailable}
        return
    tf = out.teacher_forced
    if tf is None:
        return
    inp.say(
        f"batch-invariance pass: {len(tf.seqs)} fixed sequences again, reversed and one at a time"
    )
    first = tf.scores.logprob
    reversed_order = np.arange(len(tf.seqs))[::-1].copy()
    again = {
        "reversed": inp.engine.score_sequences(tf.seqs, reversed_order).logprob,
        "one at a time": np.concatenate(
            [inp.engine.score_sequences([s], None).logprob for s in tf.seqs]
        ),
    }
    out.batch_invariance = {
        "mode": inp.batch_invariant_mode,
        "sequences": len(tf.seqs),
        "tokens": len(first),
        "bitwise": all(np.array_equal(first, v) for v in again.values()),
        "max_abs_diff": {
            k: float(np.abs(v.astype(np.float64) - first).max()) for k, v in again.items()
        },
    }


def _weight_sync(inp: PassInput, out: PassResults) -> None:
    from gate.worker.weight_sync import probe

    ws = inp.request.weight_sync
    assert ws is not None  # enabled() says so
    if inp.request.lora is not None:
        _weight_sync_lora(inp, out)
        return
    adapter = _push_adapter(inp, "weight-sync probe", ws.hook)
    if isinstance(adapter, str):
        out.weight_sync = {"adapter": None, "unsupported": adapter, **inp.engine.push_facts()}
        return
    arrays, meta = probe(
        inp.engine.probe_target(adapter),
        inp.request.model,
        inp.tokenized.prompt_ids,
        inp.tokenized.reference_ids,
        ws,
        inp.say,
        inp.hf_kwargs,
    )
    out.weight_sync = {**meta, **inp.engine.push_facts()}
    out.arrays.update(arrays)


def _weight_sync_lora(inp: PassInput, out: PassResults) -> None:
    """LoRA mode: the probe pushes adapter versions through vLLM's LoRA path (gate/worker/lora_sync.py)."""
    from gate.worker import lora_sync

    ws = inp.request.weight_sync
    assert ws is not None
    llm, policy = getattr(inp.engine, "llm", None), getattr(inp.engine, "policy", None)
    if llm is None or policy is None:  # the config refuses server mode with LoRA
        out.weight_sync = {"adapter": None, "unsupported": "LoRA mode runs offline only"}
        return
    arrays, meta = lora_sync.probe(
        llm,
        policy,
        inp.request.model,
        inp.tokenized.prompt_ids,
        inp.tokenized.reference_ids,
        ws,
        inp.say,
        inp.hf_kwargs,
    )
    out.weight_sync = meta
    out.arrays.update(arrays)


def _push_adapter(inp: PassInput, what: str, hook: str | None) -> Adapter | str:
    """The engine's weight push for a pass, or (said) why the engine offers none."""
    from gate.worker.weight_push import UnsupportedEngine

    try:
        return inp.engine.push_adapter(hook, inp.scratch_dir)
    except UnsupportedEngine as exc:
        inp.say(f"{what} not run: {exc}")
        return str(exc)


def inflight_enabled(inp: PassInput) -> bool:
    ws = inp.request.weight_sync
    return ws is not None and ws.inflight is not None


def _weight_sync_inflight(inp: PassInput, out: PassResults) -> None:
    ws = inp.request.weight_sync
    assert ws is not None and ws.inflight is not None  # enabled() says so
    adapter = _push_adapter(inp, "in-flight updates", ws.hook)
    if isinstance(adapter, str):
        out.weight_sync_inflight = {"adapter": None, "unsupported": adapter}
        return
    inflight = ws.inflight
    run_inflight(inp, out, lambda: inp.engine.inflight_driver(adapter, inflight), adapter.name)


def run_inflight(
    inp: PassInput, out: PassResults, make_driver: Callable[[], Any], adapter: str
) -> None:
    """The in-flight phase through the driver ``make_driver`` builds (offline or served); an engine
    it cannot drive records why (``unsupported``), and the check SKIPs with it."""
    from gate.worker import inflight

    ws = inp.request.weight_sync
    assert ws is not None and ws.inflight is not None  # enabled() says so
    out.weight_sync_inflight = {"adapter": adapter}  # kept if the phase fails
    try:
        driver = make_driver()
        try:
            perturbation = (
                ws.perturbation if ws.inflight.perturbation is None else ws.inflight.perturbation
            )
            arrays, meta = inflight.run_probe(
                driver,
                inp.request.model,
                inp.tokenized.prompt_ids,
                ws.inflight,
                perturbation,
                ws.seed,
                inp.say,
                inp.hf_kwargs,
            )
        finally:
            getattr(driver, "close", lambda: None)()
    except inflight.InflightUnsupported as exc:
        inp.say(f"in-flight updates not run: {exc}")
        out.weight_sync_inflight["unsupported"] = str(exc)
        return
    out.arrays.update(arrays)
    out.weight_sync_inflight.update(meta)


def _grpo(inp: PassInput, out: PassResults) -> None:
    from gate.worker.grpo import run_grpo
    from gate.worker.weight_push import push_naming_failures

    g, ws = inp.request.grpo, inp.request.weight_sync
    assert g is not None  # enabled() says so
    adapter = _push_adapter(inp, "mini GRPO", ws.hook if ws else None)
    if isinstance(adapter, str):  # no weight push: no GRPO run; the evidence above stands
        out.grpo = {"adapter": None, "unsupported": adapter, "seeds": g.seeds, "steps": g.steps}
        return
    inp.say(
        f"mini GRPO{inp.engine.over}: {len(g.seeds)} seed(s) x {g.steps} steps of "
        f"{g.prompts_per_step} prompts x {g.group_size}"
        + (f", eval {len(g.eval_prompts)} prompts x {g.eval_samples}" if g.eval_prompts else "")
    )
    out.grpo = {"adapter": adapter.name, "seeds": g.seeds, "steps": g.steps}  # kept if it fails
    target, rollout, dtype = inp.engine.grpo_target()
    run = run_grpo(
        target,
        inp.request.model,
        inp.tokenized.prompt_ids,
        [p.answer for p in inp.request.prompts],
        g,
        partial(push_naming_failures, adapter),
        inp.say,
        inp.hf_kwargs,
        rollout=rollout,
        dtype=dtype,
    )
    out.arrays.update(run.arrays)
    out.grpo["trainer"] = run.trainer
    out.grpo["eval_s"] = run.eval_s


ENGINE_PASSES: tuple[EnginePass, ...] = (
    EnginePass("sample", lambda inp: True, _sample),
    EnginePass("greedy", lambda inp: inp.request.greedy_max_tokens > 0, _greedy),
    EnginePass("prefill_decode", lambda inp: inp.request.greedy_max_tokens > 0, _prefill_decode),
    EnginePass("teacher_forced", lambda inp: bool(inp.teacher_forced_rows), _teacher_forced),
    EnginePass("batch_invariance", _measures_batch_invariance, _batch_invariance),
    # Last: these change the engine's weights.
    EnginePass("weight_sync", lambda inp: inp.request.weight_sync is not None, _weight_sync),
    EnginePass("weight_sync_inflight", inflight_enabled, _weight_sync_inflight),
    EnginePass("grpo", lambda inp: inp.request.grpo is not None, _grpo),
)
