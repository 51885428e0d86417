"""In-flight weight updates: new weights pushed while the engine is generating, every token attributed.

Async RL stacks push weights while rollouts are running (docs/checks.md, "In-flight weight
updates", has each stack's path). What a running request sees depends on the path and the release:
pausing with ``keep`` leaves its KV cache as the old weights computed it, ``keep`` with a cache
clear recomputes it, an abort loses it unless the client resubmits, and an update made of several
calls without a pause lets decode steps run on half-updated weights. This phase reproduces that
on the live engine and records exactly where every request was when each call of the update ran.

**The loop.** vLLM's engine core runs one loop: take every queued client call (an RPC, a pause, an
abort), then run one engine step, again (``EngineCoreProc.run_busy_loop``). The gate keeps its
engine in this process, so :class:`EngineLoop` runs that loop here, over the same ``EngineCore``:
the update runs in a thread of its own, as a trainer's does, and every call it makes on
:class:`InflightEngine` is queued and run by the loop between two steps, while the requests keep
decoding. A hook that makes N calls without pausing therefore leaves N-1 gaps in which steps run.

**The update** is one of :data:`BUILTIN_UPDATES` (each mirrors stacks' paths) or a hook
``fn(engine: InflightEngine, state_dict)`` (``weight_sync.inflight.updates`` entries with a
``:``). The engine starts each update on the old weights: the probe pushes them back first, idle.

**Evidence** (``wsi_*`` arrays, docs/evidence.md): per request its greedy tokens and the engine's
logprobs, how many tokens it had when the update's first and last calls ran, how it finished; and
the trainer's logprobs of the same tokens under the old weights (OLD), under the new weights
recomputed from scratch (REC), and under the new weights on top of the old weights' KV for the
tokens before the switch (STALE: transformers continues from the cache the old model computed).
The orchestrator's ``inflight-update`` check labels each token (gate/checks/inflight.py).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gate.request import InflightRequest
from gate.worker.weight_push import Adapter, call_workers, load_hook, push_naming_failures

UpdateFn = Callable[["InflightEngine", dict[str, torch.Tensor]], None]

_IDLE_WAIT_S = 0.002  # how long the loop waits for a queued call when it has no step to run


class InflightTimeout(TimeoutError):
    """An update (or the requests after it) did not finish within the phase limit; names the phase."""


class InflightUnsupported(RuntimeError):
    """This engine cannot be driven step by step here; the message says why."""


@dataclass
class Stream:
    """One request's tokens as the engine returned them, across a resubmission."""

    request_id: str
    prompt: list[int]
    max_tokens: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None  # vLLM's finish reason; "abort" for one the update aborted
    aborted_at: int | None = None  # tokens it had when aborted
    resubmitted_at: int | None = None  # tokens it had when resubmitted (prompt + partial output)

    @property
    def done(self) -> bool:
        return self.finish is not None

    def receive(self, token_ids: Sequence[int], logprobs: Sequence[Any] | None) -> None:
        """Append one DELTA output: token ids and, per token, vLLM's {id: Logprob} (or nothing)."""
        self.token_ids.extend(int(t) for t in token_ids)
        entries = list(logprobs or [])
        for i, tok in enumerate(token_ids):
            entry = entries[i] if i < len(entries) else None
            found = entry.get(int(tok)) if entry else None
            self.logprobs.append(float(found.logprob) if found is not None else float("nan"))


@dataclass(frozen=True)
class CallRecord:
    """One call of the update, as the loop ran it: what, and each request's tokens at that moment."""

    name: str
    tokens: list[int]  # per request, in stream order
    seconds: float  # from the update's start


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
        self._params_for = params_for
        self._calls: queue.SimpleQueue[tuple[str, Callable[[], Any], Future]] = queue.SimpleQueue()
        self._queued = threading.Event()  # set by call(): wakes an idle loop at once
        self.records: list[CallRecord] = []
        self.steps = 0
        self._started = time.perf_counter()

    # -- called from the update's thread ---------------------------------------------------------

    def call(self, name: str, fn: Callable[[], Any], timeout: float) -> Any:
        """Run ``fn`` in the loop, between two engine steps, and return its result."""
        done: Future = Future()
        self._calls.put((name, fn, done))
        self._queued.set()
        return done.result(timeout=timeout)

    # -- the loop itself (the worker's main thread) ----------------------------------------------

    def add(self, stream: Stream, prompt: list[int], max_tokens: int) -> None:
        self.engine.add_request(stream.request_id, {"prompt_token_ids": prompt},
                                self._params_for(max_tokens))  # fmt: skip

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
                CallRecord(name, self.tokens(), time.perf_counter() - self._started)
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
            stream.receive(completion.token_ids, completion.logprobs)
            if out.finished and stream.finish is None:
                stream.finish = completion.finish_reason or "other"
        self.steps += 1
        return True

    def wait_for_call(self) -> None:
        """Idle (paused, or nothing left to step): wait briefly for a call; run_calls runs it."""
        self._queued.wait(_IDLE_WAIT_S)
        self._queued.clear()  # a call queued meanwhile is still in the queue for run_calls


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
        self._run(f"pause({mode}, clear_cache={clear_cache})",
                  lambda: self._loop.core.pause_scheduler(mode=mode, clear_cache=clear_cache))  # fmt: skip

    def resume(self) -> None:
        self._run("resume", self._loop.core.resume_scheduler)

    def is_paused(self) -> bool:
        return bool(self._run("is_paused", self._loop.core.is_scheduler_paused))

    def collective_rpc(self, method: str | Callable[..., Any], args: tuple = (),
                       kwargs: dict[str, Any] | None = None) -> list[Any]:  # fmt: skip
        name = method if isinstance(method, str) else getattr(method, "__name__", "function")
        return self._run(f"collective_rpc({name})",
                         lambda: call_workers(self._loop.llm, method, "in-flight update", args, kwargs))  # fmt: skip

    def push(self, state_dict: dict[str, torch.Tensor]) -> None:
        """The whole state dict through the path gate uses for this engine, as one call."""
        self._run(
            f"push via {self._adapter.name}", lambda: self._adapter.push(self._loop.llm, state_dict)
        )

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        return bool(self._run("reset_prefix_cache",
                              lambda: self._loop.core.reset_prefix_cache(reset_running_requests)))  # fmt: skip

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
        running = {rid: s for rid, s in self._loop.streams.items() if not s.done}
        self._loop.engine.abort_request(list(running))
        for stream in running.values():
            stream.finish, stream.aborted_at = "abort", len(stream.token_ids)
        return list(running)

    def _loop_resubmit(self) -> None:
        for stream in self._loop.order:
            if stream.finish != "abort" or stream.resubmitted_at is not None:
                continue
            left = stream.max_tokens - len(stream.token_ids)
            stream.finish, stream.resubmitted_at = None, len(stream.token_ids)
            if left <= 0:
                stream.finish = "length"
                continue
            resubmitted = Stream(f"{stream.request_id}.r", stream.prompt, left)
            self._loop.streams[resubmitted.request_id] = stream  # its outputs extend this stream
            self._loop.add(resubmitted, stream.prompt + stream.token_ids, left)


# -- the built-in updates: each mirrors stacks' paths (docs/checks.md keeps the table) ---------------


def keep(engine: InflightEngine, state_dict: dict[str, torch.Tensor]) -> None:
    """PipelineRL, prime-rl, SkyRL: freeze running requests with their KV, push, resume."""
    engine.pause("keep", clear_cache=False)
    engine.push(state_dict)
    engine.resume()


def keep_clear(engine: InflightEngine, state_dict: dict[str, torch.Tensor]) -> None:
    """Keep, with the cache cleared: running requests are recomputed on the new weights."""
    engine.pause("keep", clear_cache=True)
    engine.push(state_dict)
    engine.resume()


def abort_resubmit(engine: InflightEngine, state_dict: dict[str, torch.Tensor]) -> None:
    """AReaL, verl's async server: abort (cache cleared), push, resume, resubmit prompt + partial output."""
    engine.pause("abort", clear_cache=True)
    engine.push(state_dict)
    engine.resume()
    engine.resubmit_aborted()


def no_pause(engine: InflightEngine, state_dict: dict[str, torch.Tensor]) -> None:
    """NeMo-RL's async path: the push alone, while requests run on."""
    engine.push(state_dict)


BUILTIN_UPDATES: dict[str, UpdateFn] = {
    "keep": keep,
    "keep_clear": keep_clear,
    "abort_resubmit": abort_resubmit,
    "no_pause": no_pause,
}


def update_function(entry: str) -> UpdateFn:
    """A built-in update by name, else a hook ``module:function`` / ``file.py:function``."""
    if entry in BUILTIN_UPDATES:
        return BUILTIN_UPDATES[entry]
    if ":" in entry:  # fn(engine, state_dict); the idle probe's hook takes (llm, state_dict)
        return load_hook(entry)
    raise ValueError(
        f"weight_sync.inflight.updates: {entry!r} is neither a built-in update "
        f"({', '.join(BUILTIN_UPDATES)}) nor a hook 'module:function'"
    )


# -- one in-flight update, start to finish -----------------------------------------------------------


@dataclass
class UpdateRun:
    """What the loop saw of one update: the streams, the calls, and how it ended."""

    name: str
    streams: list[Stream]
    records: list[CallRecord]
    steps: int
    update_s: float
    total_s: float
    error: str | None = None  # what the update raised


def run_update(llm, name: str, update: UpdateFn, adapter: Adapter, prompts: list[list[int]],
               request: InflightRequest, new_sd: dict[str, torch.Tensor],
               params_for: Callable[[int], Any]) -> UpdateRun:  # fmt: skip
    """Start ``prompts`` greedily for ``request.max_tokens`` each; once every one has
    ``request.switch_after`` tokens, run ``update`` in its own thread while the loop keeps stepping;
    return when every request has finished and the update has returned.

    Raises :class:`InflightTimeout` (naming the phase) when that takes longer than
    ``request.timeout_s``: a hook that never returns, or pauses and never resumes.
    """
    start = time.monotonic()
    deadline = start + request.timeout_s
    streams = [
        Stream(f"gate-inflight-{name}-{i}", p, request.max_tokens) for i, p in enumerate(prompts)
    ]
    loop = EngineLoop(llm, streams, params_for)
    for s in streams:
        loop.add(s, s.prompt, s.max_tokens)
    handle = InflightEngine(loop, adapter, deadline)
    outcome: dict[str, Any] = {}
    thread: threading.Thread | None = None

    def updating() -> None:
        began = time.perf_counter()
        try:
            update(handle, new_sd)
        except BaseException as exc:
            outcome["error"] = f"{type(exc).__name__}: {exc}"
        outcome["update_s"] = time.perf_counter() - began

    while True:
        loop.run_calls()
        # The switch point, or every request ended before it (a request that stopped early).
        if thread is None and all(
            len(s.token_ids) >= request.switch_after or s.done for s in streams
        ):
            thread = threading.Thread(target=updating, name=f"gate-inflight-{name}", daemon=True)
            thread.start()
        finished = all(s.done for s in streams)
        if thread is not None and not thread.is_alive() and finished:
            loop.run_calls()
            break
        if time.monotonic() > deadline:
            raise InflightTimeout(
                _timeout_message(name, thread, loop, request.timeout_s, outcome.get("error"))
            )
        if not loop.step():  # paused, or every request done while the update runs
            loop.wait_for_call()
    return UpdateRun(name=name, streams=streams, records=loop.records, steps=loop.steps,
                     update_s=float(outcome.get("update_s", 0.0)), total_s=time.monotonic() - start,
                     error=outcome.get("error"))  # fmt: skip


def _timeout_message(name: str, thread: threading.Thread | None, loop: EngineLoop, limit: float,
                     raised: str | None) -> str:  # fmt: skip
    paused = loop.core.is_scheduler_paused()
    module, sep, func = name.rpartition(":")
    name = f"{Path(module).name}:{func}" if sep else name  # a hook's file without its folder
    if thread is not None and thread.is_alive():
        what = f"the update ({name}) had not returned"
    elif paused:
        what = f"the update ({name}) returned with the engine still paused (no resume)"
    else:
        what = f"requests were still unfinished after the update ({name}) returned"
    if raised:
        what += f", having raised {raised}"
    calls = ", ".join(r.name for r in loop.records[-5:]) or "none"
    return f"in-flight update: {what} after {limit:g}s (weight_sync.inflight.timeout_s); last calls: {calls}"


def switch_points(run: UpdateRun) -> tuple[np.ndarray, np.ndarray]:
    """Per request, its tokens when the update's first call ran and when its last call ran.

    An update that made no call on the engine (a hook that did nothing) switches nothing: both
    are the request's final length.
    """
    if not run.records:
        final = np.array([len(s.token_ids) for s in run.streams], dtype=np.int64)
        return final, final
    return (np.asarray(run.records[0].tokens, dtype=np.int64),
            np.asarray(run.records[-1].tokens, dtype=np.int64))  # fmt: skip


# -- the trainer's side: OLD, REC and STALE logprobs of every generated token -------------------------


@torch.inference_mode()
def attribution_scores(model, old_sd: dict[str, torch.Tensor], new_sd: dict[str, torch.Tensor],
                       seqs: list[tuple[list[int], list[int]]], switch: Sequence[int],
                       device: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """(OLD, REC, STALE) raw logprobs of each request's generated tokens, flat in request order.

    ``seqs``: (prompt, generated) per request; ``switch[i]``: generated tokens request ``i`` had
    when the weights changed. STALE is the engine's view after a switch that kept the KV: token
    ``j >= switch`` is predicted by the new weights from the input token ``j - 1`` with the old
    weights' keys and values for every position before it (before the switch STALE is OLD).
    """
    model.load_state_dict(old_sd)
    old, caches = [], []
    for (prompt, gen), c in zip(seqs, switch, strict=True):
        ids = torch.tensor([prompt + gen], device=device)
        old.append(_picked(model(ids).logits[0], ids[0], len(prompt)))
        # The KV the engine held when the weights changed: a forward of its own over exactly those
        # positions (Cache.crop's meaning differs between transformers releases).
        held = len(prompt) + max(int(c), 1) - 1
        caches.append(model(ids[:, :held], use_cache=True).past_key_values)
    model.load_state_dict(new_sd)
    rec, stale = [], []
    for (prompt, gen), c, cache, old_lp in zip(seqs, switch, caches, old, strict=True):
        ids = torch.tensor([prompt + gen], device=device)
        rec.append(_picked(model(ids).logits[0], ids[0], len(prompt)))
        c = max(int(c), 1)
        if c >= len(gen):
            stale.append(old_lp)
            continue
        tail = ids[:, len(prompt) + c - 1 :]
        logits = model(tail, past_key_values=cache, use_cache=True).logits[0]
        after = torch.log_softmax(logits[:-1].float(), dim=-1).gather(-1, tail[0, 1:, None])[:, 0]
        stale.append(np.concatenate([old_lp[:c], after.cpu().numpy().astype(np.float32)]))
    flat = [
        np.concatenate(x).astype(np.float32) if x else np.zeros(0, np.float32)
        for x in (old, rec, stale)
    ]
    return flat[0], flat[1], flat[2]


def _picked(logits: torch.Tensor, ids: torch.Tensor, start: int) -> np.ndarray:
    """log_softmax of each position's logits at the next token, for the tokens from ``start`` on."""
    logp = torch.log_softmax(logits[start - 1 : -1].float(), dim=-1)
    return logp.gather(-1, ids[start:, None])[:, 0].cpu().numpy().astype(np.float32)


# -- the phase: every configured update on the live engine, then the trainer's scores ----------------

FINISH_CODES = {"stop": 0, "length": 1, "abort": 2}
FINISH_OTHER = 3


def inflight_prompts(prompt_ids: list[list[int]], count: int, max_tokens: int,
                  max_model_len: int) -> list[list[int]]:  # fmt: skip
    """The first ``count`` distinct prompts that leave room for ``max_tokens`` generated tokens."""
    fits = [p for p in prompt_ids if len(p) > 0 and len(p) + max_tokens <= max_model_len]
    chosen = [list(p) for p in dict.fromkeys(map(tuple, fits))][:count]
    if not chosen:
        raise ValueError(
            f"weight_sync.inflight: no prompt leaves room for {max_tokens} tokens within "
            f"max_model_len {max_model_len}; lower weight_sync.inflight.max_tokens"
        )
    return chosen


def sampling_params(max_tokens: int):
    """Greedy, a fixed length (``ignore_eos``), the sampled token's logprob, outputs as deltas."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0,
                          output_kind=RequestOutputKind.DELTA)  # fmt: skip


def run_probe(llm, model_path: str, prompt_ids: list[list[int]], request: InflightRequest,
              perturbation: float, seed: int, adapter: Adapter, progress,
              hf_kwargs: dict | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:  # fmt: skip
    """Every update of ``request.updates`` in turn, each from the old weights; (arrays, meta).

    The weights are the idle probe's: old = the checkpoint as the trainer loads it, new = it
    perturbed by ``perturbation`` x each tensor's std (``seed``). An update that raised is recorded
    with its error and the tokens it left; a timeout raises :class:`InflightTimeout`.
    """
    from transformers import AutoModelForCausalLM

    from gate.worker.policy_weights import host_state_dict, perturbed
    from gate.worker.weight_sync import _load_trainer, engine_dtype

    config = getattr(llm.llm_engine, "vllm_config", None)
    max_model_len = int(getattr(getattr(config, "model_config", None), "max_model_len", 2048))
    prompts = inflight_prompts(prompt_ids, request.requests, request.max_tokens, max_model_len)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    trainer = _load_trainer(AutoModelForCausalLM, model_path, device, hf_kwargs, engine_dtype(llm))
    old_sd = host_state_dict(trainer.state_dict(), device == "cuda")
    new_sd = perturbed(old_sd, perturbation, seed)
    updates = [
        (entry, update_function(entry)) for entry in request.updates
    ]  # a bad hook fails first
    runs = []
    for entry, update in updates:
        progress(f"in-flight update {entry}: {len(prompts)} requests x {request.max_tokens} tokens, "
                 f"the update once each has {request.switch_after}")  # fmt: skip
        push_naming_failures(adapter, llm, old_sd)  # idle: every update starts from the old weights
        runs.append(
            run_update(llm, entry, update, adapter, prompts, request, new_sd, sampling_params)
        )
    push_naming_failures(
        adapter, llm, new_sd
    )  # the engine ends on the new weights, as after the idle probe
    return _evidence(trainer, old_sd, new_sd, runs, request, device)


def _evidence(trainer, old_sd, new_sd, runs: list[UpdateRun], request: InflightRequest,
              device: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:  # fmt: skip
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("old", "rec", "stale")}
    tokens, engine_lp, lengths, update_index = [], [], [], []
    starts, ends, finish, aborted_at, resubmitted_at = [], [], [], [], []
    for u, run in enumerate(runs):
        start, end = switch_points(run)
        seqs = [(s.prompt, s.token_ids) for s in run.streams]
        old, rec, stale = attribution_scores(trainer, old_sd, new_sd, seqs, start, device)
        parts["old"].append(old)
        parts["rec"].append(rec)
        parts["stale"].append(stale)
        for s in run.streams:
            tokens.append(np.asarray(s.token_ids, dtype=np.int64))
            engine_lp.append(np.asarray(s.logprobs, dtype=np.float32))
            lengths.append(len(s.token_ids))
            update_index.append(u)
            finish.append(FINISH_CODES.get(s.finish or "", FINISH_OTHER))
            aborted_at.append(-1 if s.aborted_at is None else s.aborted_at)
            resubmitted_at.append(-1 if s.resubmitted_at is None else s.resubmitted_at)
        starts.append(start)
        ends.append(end)
    flat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
    arrays = {
        "wsi_offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        "wsi_update_index": np.asarray(update_index, dtype=np.int64),
        "wsi_token_ids": flat(tokens, np.int64),
        "wsi_engine_logprob": flat(engine_lp, np.float32),
        "wsi_old_logprob": flat(parts["old"], np.float32),
        "wsi_rec_logprob": flat(parts["rec"], np.float32),
        "wsi_stale_logprob": flat(parts["stale"], np.float32),
        "wsi_switch_start": flat(starts, np.int64),
        "wsi_switch_end": flat(ends, np.int64),
        "wsi_finish": np.asarray(finish, dtype=np.int64),
        "wsi_aborted_at": np.asarray(aborted_at, dtype=np.int64),
        "wsi_resubmitted_at": np.asarray(resubmitted_at, dtype=np.int64),
    }
    meta = {
        "requests": len(runs[0].streams) if runs else 0,
        "max_tokens": request.max_tokens,
        "switch_after": request.switch_after,
        "updates": [
            {
                "name": run.name,
                "builtin": run.name in BUILTIN_UPDATES,
                "calls": [r.name for r in run.records],
                "steps": run.steps,
                "update_s": run.update_s,
                "total_s": run.total_s,
                "error": run.error,
            }
            for run in runs
        ],
    }
    return arrays, meta
