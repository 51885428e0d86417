"""The in-flight phase offline: vLLM's engine-core loop in the worker's process, updates between steps.

vLLM's engine core runs one loop: take every queued client call (an RPC, a pause, an abort), then
run one engine step, again (``EngineCoreProc.run_busy_loop``). The gate keeps its engine in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so :class:`EngineLoop` runs that loop here, over
the same ``EngineCore``: the update runs in a thread of its own, as a trainer's does, and every
call it makes on :class:`InflightEngine` is queued and run by the loop between two steps, while the
requests keep decoding. A hook that makes N calls without pausing therefore leaves N-1 gaps in which
steps run, and the loop records exactly how many tokens each request had when each call ran.

What this does not reproduce: ZMQ between the client and the engine core, and
``EngineCoreProc``'s wait for an empty output queue on ``keep`` (the in-process pause completes at
once; vLLM's in-process core also refuses ``wait``). Server mode (gate/worker/inflight_server.py)
drives the real ``AsyncLLM`` behind vLLM's server.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from gate.contract.request import InflightRequest
from gate.worker.inflight import (
    OLD_VERSION,
    CallRecord,
    InflightLeftPaused,
    InflightTimeout,
    InflightUnsupported,
    Stream,
    UpdateFn,
    UpdateRun,
    UpdateThread,
    left_paused_message,
    shown,
    take_resubmissions,
)
from gate.worker.replay import max_model_len
from gate.worker.weight_push import Adapter, call_workers, push_naming_failures

_IDLE_WAIT_S = 0.002  # how long the loop waits for a queued call when it has no step to run


class EngineLoop:
    """vLLM's engine-core loop over the in-process engine: queued calls first, then one step."""

    def __init__(self, llm, streams: list[Stream], params_for: Callable[[int], Any]) -> None:
        client = llm.llm_engine.engine_core
        core = getattr(client, "engine_core", None)
        if core is None or not callable(getattr(core, "pause_scheduler", None)):
            raise InflightUnsupported(
                "the engine core is not in this process or has no pause_scheduler "
                f"({type(client).__name__}); the in-flight phase drives vLLM's in-process EngineCore"
            )
        self.llm, self.engine, self.core = llm, llm.llm_engine, core
        self.order = list(streams)  # one per request, as submitted
        self.streams = {s.request_id: s for s in streams}  # engine request id -> its stream
        self.offsets: dict[
            str, int
        ] = {}  # engine request id -> tokens its stream had at submission
        self._params_for = params_for
        self._calls: queue.SimpleQueue[tuple[str, Callable[[], Any], Future]] = queue.SimpleQueue()
        self._queued = threading.Event()  # set by call(): wakes an idle loop at once
        self.records: list[CallRecord] = []
        self.steps = 0
        self.versions_returned = False
        self._started = time.perf_counter()

    # -- called from the update's thread ---------------------------------------------------------

    def call(self, name: str, fn: Callable[[], Any], timeout: float) -> Any:
        """Run ``fn`` in the loop, between two engine steps, and return its result."""
        done: Future = Future()
        self._calls.put((name, fn, done))
        self._queued.set()
        return done.result(timeout=timeout)

    # -- the loop itself (the worker's main thread) ----------------------------------------------

    def add(self, stream: Stream, request_id: str, prompt: list[int], max_tokens: int) -> None:
        self.streams[request_id] = stream
        self.offsets[request_id] = len(stream.token_ids)
        self.engine.add_request(
            request_id, {"prompt_token_ids": prompt}, self._params_for(max_tokens)
        )

    def tokens(self) -> list[int]:
        return [len(s.token_ids) for s in self.order]

    def run_calls(self) -> None:
        while True:
            try:
                name, fn, done = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                done.set_result(fn())
            except BaseException as exc:  # the hook's thread gets it
                done.set_exception(exc)
            self.records.append(
                CallRecord(
                    name, self.tokens(), time.perf_counter() - self._started, steps=self.steps
                )
            )

    def step(self) -> bool:
        """One engine step when there is something to run; False when paused or idle."""
        if self.core.is_scheduler_paused() or not self.engine.has_unfinished_requests():
            return False
        for out in self.engine.step():
            stream = self.streams.get(out.request_id)
            if stream is None:  # not one of the probe's requests
                continue
            completion = out.outputs[0]
            stream.receive(completion.token_ids, _sampled_logprobs(completion))
            spans = getattr(completion, "weight_versions", None)  # vLLM >= 0.32, when finished
            if spans:
                stream.add_versions(spans, self.offsets.get(out.request_id, 0))
                self.versions_returned = True
            if out.finished and stream.finish is None:
                stream.finish = completion.finish_reason or "other"
        self.steps += 1
        return True

    def wait_for_call(self) -> None:
        """Idle (paused, or nothing left to step): wait briefly for a call; run_calls runs it."""
        self._queued.wait(_IDLE_WAIT_S)
        self._queued.clear()  # a call queued meanwhile is still in the queue for run_calls


def _sampled_logprobs(completion) -> list[float]:
    """Each new token's own logprob from vLLM's per-token ``{id: Logprob}`` (NaN where missing)."""
    entries = list(completion.logprobs or [])
    values = []
    for i, tok in enumerate(completion.token_ids):
        entry = entries[i] if i < len(entries) else None
        found = entry.get(int(tok)) if entry else None
        values.append(float(found.logprob) if found is not None else float("nan"))
    return values


class InflightEngine:
    """What an in-flight update gets: the running engine, every call run between two of its steps.

    Each method blocks the update's thread until the loop has run it. The calls mirror vLLM's
    ``AsyncLLM`` (``pause_generation`` / ``resume_generation`` / ``collective_rpc``) and the
    server's dev endpoints (``/pause``, ``/resume``, ``/collective_rpc``, ``/abort_requests``).
    """

    def __init__(self, loop: EngineLoop, adapter: Adapter, deadline: float) -> None:
        self._loop, self._adapter, self._deadline = loop, adapter, deadline

    def _run(self, name: str, fn: Callable[[], Any]) -> Any:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise InflightTimeout(f"in-flight update: no time left for {name}")
        return self._loop.call(name, fn, left)

    def pause(self, mode: str = "keep", clear_cache: bool = False) -> None:
        """``pause_generation(mode=..., clear_cache=...)``: ``keep`` freezes running requests with
        their KV; ``abort`` ends them (the caller sees finish reason ``abort``)."""
        if mode == "abort":
            self._run("abort", self._loop_abort)
        self._run(
            f"pause({mode}, clear_cache={clear_cache})",
            lambda: self._loop.core.pause_scheduler(mode=mode, clear_cache=clear_cache),
        )

    def resume(self) -> None:
        self._run("resume", self._loop.core.resume_scheduler)

    def is_paused(self) -> bool:
        return bool(self._run("is_paused", self._loop.core.is_scheduler_paused))

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        name = method if isinstance(method, str) else getattr(method, "__name__", "function")
        return self._run(
            f"collective_rpc({name})",
            lambda: call_workers(self._loop.llm, method, "in-flight update", args, kwargs),
        )

    def push(self, state_dict: dict[str, torch.Tensor]) -> None:
        """The whole state dict through the path gate uses for this engine, as one call."""
        self._run(
            f"push via {self._adapter.name}", lambda: self._adapter.push(self._loop.llm, state_dict)
        )

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        return bool(
            self._run(
                "reset_prefix_cache",
                lambda: self._loop.core.reset_prefix_cache(reset_running_requests),
            )
        )

    def set_weight_version(self, version: str) -> bool:
        """Label the weights (``set_weight_version``; vLLM >= 0.32 returns each request's spans);
        False where the release has no label."""
        setter = getattr(self._loop.core, "set_weight_version", None)
        if setter is None:
            return False
        self._run(f"set_weight_version({version})", lambda: setter(version))
        return True

    def abort(self) -> list[str]:
        """Abort every unfinished request (``/abort_requests``); returns their ids."""
        return self._run("abort", self._loop_abort)

    def resubmit_aborted(self) -> None:
        """Each aborted request again, as prompt + its partial output, for the tokens it had left
        (AReaL's client: the continuation is computed afresh, on whatever weights the engine has)."""
        self._run("resubmit", self._loop_resubmit)

    def call(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(llm)`` between two engine steps: anything else a stack does to the engine."""
        return self._run(getattr(fn, "__name__", "call"), lambda: fn(self._loop.llm))

    def _loop_abort(self) -> list[str]:
        running = [rid for rid, s in self._loop.streams.items() if not s.done]
        self._loop.engine.abort_request(running)
        for rid in running:
            stream = self._loop.streams[rid]
            stream.finish, stream.aborted_at = "abort", len(stream.token_ids)
        return running

    def _loop_resubmit(self) -> None:
        for stream, prompt, left in take_resubmissions(self._loop.order):
            # Its outputs extend the same stream.
            self._loop.add(stream, f"{stream.request_id}.r", prompt, left)


def run_update(
    llm,
    name: str,
    update: UpdateFn,
    adapter: Adapter,
    prompts: list[list[int]],
    request: InflightRequest,
    new_sd: dict[str, torch.Tensor],
    params_for: Callable[[int], Any],
) -> UpdateRun:
    """Start ``prompts`` greedily for ``request.max_tokens`` each; once every one has
    ``request.switch_after`` tokens, run ``update`` in its own thread while the loop keeps stepping;
    return when every request has finished and the update has returned.

    Raises :class:`InflightTimeout` (naming the phase) when that takes longer than
    ``request.timeout_s``: a hook that never returns, or pauses and never resumes while requests
    wait; :class:`InflightLeftPaused` when it returned paused after every request had ended.
    """
    start = time.monotonic()
    deadline = start + request.timeout_s
    streams = [
        Stream(f"gate-inflight-{name}-{i}", p, request.max_tokens) for i, p in enumerate(prompts)
    ]
    loop = EngineLoop(llm, streams, params_for)
    setter = getattr(loop.core, "set_weight_version", None)
    if setter is not None:
        setter(OLD_VERSION)  # the engine's label for the old weights, before any request runs
    for s in streams:
        loop.add(s, s.request_id, s.prompt, s.max_tokens)
    handle = InflightEngine(loop, adapter, deadline)
    thread: UpdateThread | None = None
    while True:
        loop.run_calls()
        # The switch point, or every request ended before it (a request that stopped early).
        if thread is None and all(
            len(s.token_ids) >= request.switch_after or s.done for s in streams
        ):
            thread = UpdateThread(name, update, handle, new_sd)
        finished = all(s.done for s in streams)
        if thread is not None and not thread.is_alive() and finished:
            loop.run_calls()
            break
        if time.monotonic() > deadline:
            raise InflightTimeout(_timeout_message(name, thread, loop, request.timeout_s))
        if not loop.step():  # paused, or every request done while the update runs
            loop.wait_for_call()
    if loop.core.is_scheduler_paused():  # every request ended before its pause: none waited on it
        raise InflightLeftPaused(
            left_paused_message(name, loop.records, thread.error if thread else None)
        )
    records = loop.records
    return UpdateRun(
        name=name,
        streams=streams,
        records=records,
        steps=loop.steps,
        update_s=thread.seconds if thread else 0.0,
        total_s=time.monotonic() - start,
        error=thread.error if thread else None,
        steps_inside=records[-1].steps - records[0].steps if records else 0,
        versions_returned=loop.versions_returned,
    )


def _timeout_message(name: str, thread: UpdateThread | None, loop: EngineLoop, limit: float) -> str:
    raised = thread.error if thread else None
    paused = loop.core.is_scheduler_paused()
    if thread is not None and thread.is_alive():
        what = f"the update ({shown(name)}) had not returned"
    elif paused:
        what = f"the update ({shown(name)}) returned with the engine still paused (no resume)"
    else:
        what = f"requests were still unfinished after the update ({shown(name)}) returned"
    if raised:
        what += f", having raised {raised}"
    calls = ", ".join(r.name for r in loop.records[-5:]) or "none"
    return f"in-flight update: {what} after {limit:g}s (weight_sync.inflight.timeout_s); last calls: {calls}"


def sampling_params(max_tokens: int):
    """Greedy, a fixed length (``ignore_eos``), the sampled token's logprob, outputs as deltas."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        temperature=0.0,
        max_tokens=max_tokens,
        ignore_eos=True,
        logprobs=0,
        output_kind=RequestOutputKind.DELTA,
    )


class OfflineDriver:
    """The in-flight phase's view of an offline ``vllm.LLM`` (gate.worker.inflight.InflightDriver)."""

    versions_note = "this release returns no weight-version spans (vLLM < 0.32)"

    def __init__(self, llm, adapter: Adapter) -> None:
        from gate.worker.weight_sync import engine_dtype

        self.llm, self.adapter = llm, adapter
        self.max_model_len = max_model_len(llm)
        self.dtype = engine_dtype(llm)

    def push_idle(self, state_dict: dict[str, torch.Tensor]) -> None:
        push_naming_failures(self.adapter, self.llm, state_dict)

    def run_update(
        self,
        name: str,
        update: UpdateFn,
        prompts: list[list[int]],
        request: InflightRequest,
        new_sd: dict[str, torch.Tensor],
    ) -> UpdateRun:
        return run_update(
            self.llm, name, update, self.adapter, prompts, request, new_sd, sampling_params
        )
