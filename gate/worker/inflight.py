"""In-flight weight updates: new weights pushed while the engine is generating, every token attributed.

Async RL stacks push weights while rollouts are running (docs/checks.md, "In-flight weight
updates", has each stack's path). What a running request sees depends on the path and the release:
pausing with ``keep`` leaves its KV cache as the old weights computed it, ``keep`` with a cache
clear recomputes it, an abort loses it unless the client resubmits, and an update made of several
calls without a pause lets decode steps run on half-updated weights. This phase reproduces that
on the live engine and records where every request was when each call of the update ran.

Two drivers run the same updates: :mod:`gate.worker.inflight_offline` runs vLLM's engine-core loop
in the worker's process (every call lands between two steps, its position exact), and
:mod:`gate.worker.inflight_server` streams real concurrent requests from vLLM's OpenAI server and
calls its development endpoints (a call's position is exact while the engine is paused, otherwise
known within the tokens that arrived while the call was under way). This module holds what they
share: the streams, the record of each call, the built-in updates, the trainer's three scores of
every token and the evidence.

**The update** is one of :data:`BUILTIN_UPDATES` (each mirrors stacks' paths) or a hook
``fn(engine, state_dict)`` (``weight_sync.inflight.updates`` entries with a ``:``), where
``engine`` is the driver's handle: ``pause``, ``resume``, ``is_paused``, ``collective_rpc``,
``push``, ``reset_prefix_cache``, ``abort``, ``resubmit_aborted``, ``set_weight_version``, ``call``.
The engine starts each update on the old weights: the probe pushes them back first, idle.

**Evidence** (``wsi_*`` arrays, docs/evidence.md): per request its greedy tokens and the engine's
logprobs, where the update's first and last calls ran, how it finished, the engine's own
weight-version spans where the release returns them; and the trainer's logprobs of the same
tokens under the old weights (OLD), under the new weights recomputed from scratch (REC), and under
the new weights on top of the old weights' KV for the tokens before the switch (STALE:
transformers continues from the cache the old model computed). The orchestrator's
``inflight-update`` check labels each token (gate/checks/inflight.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import torch

from gate.contract import keys
from gate.contract.request import InflightRequest
from gate.worker.weight_push import load_hook

UpdateFn = Callable[[Any, dict[str, torch.Tensor]], None]

# The label the phase gives the engine's weights before each update, and the one the built-in
# paused updates set after their push (as SkyRL and vime's finish_weight_update(weight_version)).
OLD_VERSION, NEW_VERSION = "gate-old", "gate-new"


class InflightTimeout(TimeoutError):
    """An update (or the requests after it) did not finish within the phase limit; names the phase."""


class InflightLeftPaused(RuntimeError):
    """An update returned with the engine paused: nothing would resume it, so nothing after it runs."""


class InflightUnsupported(RuntimeError):
    """This engine cannot be driven during an update here; the message says why."""


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
    # The engine's weight-version spans (version, first token, end), where the release returns them.
    versions: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.finish is not None

    def receive(self, token_ids: Sequence[int], logprobs: Sequence[float]) -> None:
        """Append tokens and their logprobs (NaN where the engine returned none)."""
        self.token_ids.extend(int(t) for t in token_ids)
        values = [float(v) for v in logprobs][: len(token_ids)]
        self.logprobs.extend(values + [float("nan")] * (len(token_ids) - len(values)))

    def add_versions(self, spans: Sequence[Any], offset: int) -> None:
        """vLLM's ``WeightVersionSpan``s of one request, shifted by the tokens before it (a resubmission)."""
        for span in spans:
            self.versions.append(
                (str(span.version), offset + int(span.start), offset + int(span.end))
            )


def take_resubmissions(streams: Sequence[Stream]) -> list[tuple[Stream, list[int], int]]:
    """The aborted streams to submit again (AReaL's client): each as (stream, prompt + its partial
    output, the tokens it had left). Marks them resubmitted; one with none left ends as ``length``."""
    found = []
    for stream in streams:
        if stream.finish != "abort" or stream.resubmitted_at is not None:
            continue
        left = stream.max_tokens - len(stream.token_ids)
        stream.finish, stream.resubmitted_at = None, len(stream.token_ids)
        if left <= 0:
            stream.finish = "length"
            continue
        found.append((stream, stream.prompt + stream.token_ids, left))
    return found


@dataclass(frozen=True)
class CallRecord:
    """One call of the update: what, and where each request (in stream order) was when it ran.

    ``tokens`` is exact where ``earliest`` equals it; a call the server ran while generation went
    on is known only to lie between ``earliest`` (tokens that had arrived when it was sent) and
    ``tokens`` (tokens that had arrived when it returned).
    """

    name: str
    tokens: list[int]
    seconds: float  # from the update's start
    earliest: list[int] | None = None  # None: exact (tokens)
    steps: int = 0  # engine steps the driver saw before this call (offline: counted; server: 0)

    @property
    def lower(self) -> list[int]:
        return self.tokens if self.earliest is None else self.earliest


@dataclass
class UpdateRun:
    """What the driver saw of one update: the streams, the calls, and how it ended."""

    name: str
    streams: list[Stream]
    records: list[CallRecord]
    steps: int  # engine steps during the whole update run (server mode: None known, 0)
    update_s: float
    total_s: float
    error: str | None = None  # what the update raised
    steps_inside: int | None = (
        None  # steps between the update's first and last call (a lower bound)
    )
    versions_returned: bool = False  # whether the release returned weight-version spans
    attempts: int = 1  # runs of this update, the late ones included (run_landing)
    switch_after: int | None = None  # where this run's update started (earlier after a late run)
    # requests the server turned away while paused (HTTP 503, vLLM 0.33 on), sent again on resume
    rejected_while_paused: int = 0


class UpdateThread:
    """``update(handle, new_sd)`` in a daemon thread of its own: the update runs while the driver
    keeps the requests going; what it raised (``error``) and its duration are kept, never raised."""

    def __init__(
        self, name: str, update: UpdateFn, handle: Any, new_sd: dict[str, torch.Tensor]
    ) -> None:
        self.error: str | None = None
        self.seconds = 0.0
        self._thread = threading.Thread(
            target=self._run,
            args=(update, handle, new_sd),
            name=f"gate-inflight-{name}",
            daemon=True,
        )
        self._thread.start()

    def _run(self, update: UpdateFn, handle: Any, new_sd: dict[str, torch.Tensor]) -> None:
        began = time.perf_counter()
        try:
            update(handle, new_sd)
        except BaseException as exc:  # a hook's failure is evidence, not the phase's crash
            self.error = f"{type(exc).__name__}: {exc}"
        self.seconds = time.perf_counter() - began

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)


class InflightDriver(Protocol):
    """What the probe needs of a running engine to run in-flight updates, offline or served."""

    max_model_len: int
    dtype: torch.dtype
    versions_note: str | None  # why no weight-version spans come back, where none do

    def push_idle(self, state_dict: dict[str, torch.Tensor]) -> None: ...

    def run_update(
        self,
        name: str,
        update: UpdateFn,
        prompts: list[list[int]],
        request: InflightRequest,
        new_sd: dict[str, torch.Tensor],
    ) -> UpdateRun: ...


# -- the built-in updates: each mirrors stacks' paths (docs/checks.md keeps the table) ---------------


def keep(engine, state_dict: dict[str, torch.Tensor]) -> None:
    """PipelineRL, prime-rl, SkyRL: freeze running requests with their KV, push, resume."""
    engine.pause("keep", clear_cache=False)
    engine.push(state_dict)
    engine.set_weight_version(NEW_VERSION)
    engine.resume()


def keep_clear(engine, state_dict: dict[str, torch.Tensor]) -> None:
    """Keep, with the cache cleared: running requests are recomputed on the new weights."""
    engine.pause("keep", clear_cache=True)
    engine.push(state_dict)
    engine.set_weight_version(NEW_VERSION)
    engine.resume()


def abort_resubmit(engine, state_dict: dict[str, torch.Tensor]) -> None:
    """AReaL, verl's async server: abort (cache cleared), push, resume, resubmit prompt + partial output."""
    engine.pause("abort", clear_cache=True)
    engine.push(state_dict)
    engine.set_weight_version(NEW_VERSION)
    engine.resume()
    engine.resubmit_aborted()


def no_pause(engine, state_dict: dict[str, torch.Tensor]) -> None:
    """NeMo-RL's async path: the push alone, while requests run on (no version label: one call)."""
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


def shown(name: str) -> str:
    """An update as messages name it: a hook's file without its folder."""
    from pathlib import Path

    module, sep, func = name.rpartition(":")
    return f"{Path(module).name}:{func}" if sep else name


def left_paused_message(name: str, records: Sequence[CallRecord], raised: str | None) -> str:
    """InflightLeftPaused's message: the update, what it raised, its last calls."""
    what = f"the update ({shown(name)}) returned with the engine still paused (no resume)"
    if raised:
        what += f", having raised {raised}"
    calls = ", ".join(r.name for r in records[-5:]) or "none"
    return f"in-flight update: {what}; last calls: {calls}"


# -- where the weights changed, per request ----------------------------------------------------------


@dataclass(frozen=True)
class SwitchPoints:
    """Per request (stream order): bounds on where the weights changed, from where the update's
    first call ran (its lower bound) to where its last call ran (its upper bound, also ``end``).
    An update that runs whole under a pause changes them at one known point: ``lower == upper``."""

    lower: np.ndarray
    upper: np.ndarray
    end: np.ndarray
    # The last call ran while the server generated: the client counted the tokens that had reached
    # it, and on a loaded machine the server's stream runs behind its engine (TP=2 on 2 busy cores:
    # one token per request, and a whole push read "partial"), so the engine may have passed
    # ``upper`` when the call ran, even where no token arrived during it.
    upper_may_lag: bool = False


def switch_points(run: UpdateRun) -> SwitchPoints:
    """Where the weights can have changed, per request: between the update's first and last call.

    An update that made no call on the engine (a hook that did nothing) switches nothing: every
    bound is the request's final length.
    """
    if not run.records:
        final = np.array([len(s.token_ids) for s in run.streams], dtype=np.int64)
        return SwitchPoints(final, final, final)
    first, last = run.records[0], run.records[-1]
    end = np.asarray(last.tokens, dtype=np.int64)
    return SwitchPoints(
        np.asarray(first.lower, dtype=np.int64), end, end, upper_may_lag=last.earliest is not None
    )


def departure(engine: Sequence[float], old: np.ndarray, lower: int) -> int | None:
    """The first token from ``lower`` on whose engine logprob leaves the old weights' by more than
    the engine's own spread before ``lower`` allows (4x its largest miss there, at least 1e-5): the
    weights had changed by then, whatever the client had seen. None: it never left them."""
    diff = np.abs(np.asarray(engine, dtype=np.float64) - old)
    before = diff[:lower]
    before = before[np.isfinite(before)]
    limit = max(4.0 * float(before.max()) if before.size else 0.0, 1e-5)
    left = np.flatnonzero(diff[lower:] > limit)  # NaN (no logprob) never counts as leaving
    return int(lower + left[0]) if left.size else None


# -- the trainer's side: OLD, REC and STALE logprobs of every generated token -------------------------


@dataclass(frozen=True)
class Scores:
    """The trainer's logprobs of every generated token, flat in request order, and the switch each
    request's STALE was computed at (the exact one, or the best fit inside its bounds)."""

    old: np.ndarray
    rec: np.ndarray
    stale: np.ndarray
    switch: np.ndarray
    # the upper bound each fit used: ``upper``, or the engine's departure past it
    upper: np.ndarray


@torch.inference_mode()
def attribution_scores(
    model,
    old_sd: dict[str, torch.Tensor],
    new_sd: dict[str, torch.Tensor],
    seqs: list[tuple[list[int], list[int]]],
    lower: Sequence[int],
    device: str,
    upper: Sequence[int] | None = None,
    engine: Sequence[Sequence[float]] | None = None,
    upper_may_lag: bool = False,
) -> Scores:
    """OLD, REC and STALE raw logprobs of each request's generated tokens.

    ``seqs``: (prompt, generated) per request; the weights changed once request ``i`` had between
    ``lower[i]`` and ``upper[i]`` generated tokens (``upper`` None: exactly ``lower[i]``). STALE is
    the engine's view after a switch that kept the KV: token ``j >= switch`` is predicted by the
    new weights from the input token ``j - 1`` with the old weights' keys and values for every
    position before it (before the switch STALE is OLD). Where the bounds differ (an update of
    several calls with steps between them, or a call the server ran while generating), STALE is
    computed at each switch they allow and the one closest to the engine's own logprobs
    (``engine``, per request; least total absolute difference, earliest on a tie) is kept: a
    measured fit inside bounds the driver observed, never outside them. ``upper_may_lag``: the
    upper bounds are what a client had read of a live stream, and a request whose engine logprobs
    leave the old weights' only after its bound (:func:`departure`) is fitted up to that token.
    """
    upper = list(lower) if upper is None else list(upper)
    model.load_state_dict(old_sd)
    old, caches = [], []
    for i, ((prompt, gen), lo) in enumerate(zip(seqs, lower, strict=True)):
        ids = torch.tensor([prompt + gen], device=device)
        old.append(_picked(model(ids).logits[0], ids[0], len(prompt)))
        if upper_may_lag and engine is not None:
            left = departure(engine[i], old[-1], int(lo))
            upper[i] = max(int(upper[i]), left if left is not None else 0)
        hi = upper[i]
        # The KV the engine held at each candidate switch: a forward of its own over exactly those
        # positions (Cache.crop's meaning differs between transformers releases).
        caches.append(
            {
                c: model(ids[:, : len(prompt) + c - 1], use_cache=True).past_key_values
                for c in _candidates(lo, hi, len(gen))
            }
        )
    model.load_state_dict(new_sd)
    rec, stale, chosen = [], [], []
    for i, ((prompt, gen), by_switch) in enumerate(zip(seqs, caches, strict=True)):
        ids = torch.tensor([prompt + gen], device=device)
        rec.append(_picked(model(ids).logits[0], ids[0], len(prompt)))
        options = {
            c: _stale_from(model, ids, len(prompt), c, cache, old[i])
            for c, cache in by_switch.items()
        }
        if not options:  # the switch came after the last token: OLD throughout
            stale.append(old[i])
            chosen.append(min(int(lower[i]), len(gen)))
            continue
        c = _closest(options, engine[i] if engine is not None else None)
        stale.append(options[c])
        chosen.append(c)
    flat = [
        np.concatenate(x).astype(np.float32) if x else np.zeros(0, np.float32)
        for x in (old, rec, stale)
    ]
    return Scores(
        flat[0],
        flat[1],
        flat[2],
        np.asarray(chosen, dtype=np.int64),
        np.asarray(upper, dtype=np.int64),
    )


def _candidates(lo: int, hi: int, generated: int) -> list[int]:
    """Switch points inside [lo, hi] that leave a token after them (at least 1: the first token
    has no KV of its own before it)."""
    first = max(int(lo), 1)
    return list(range(first, min(max(int(hi), first), generated - 1) + 1))


def _stale_from(
    model, ids: torch.Tensor, start: int, c: int, cache, old_lp: np.ndarray
) -> np.ndarray:
    tail = ids[:, start + c - 1 :]
    logits = model(tail, past_key_values=cache, use_cache=True).logits[0]
    after = torch.log_softmax(logits[:-1].float(), dim=-1).gather(-1, tail[0, 1:, None])[:, 0]
    return np.concatenate([old_lp[:c], after.cpu().numpy().astype(np.float32)])


def _closest(options: dict[int, np.ndarray], engine: Sequence[float] | None) -> int:
    if len(options) == 1 or engine is None:
        return min(options)
    eng = np.asarray(engine, dtype=np.float64)
    # A token without a logprob counts as far from every candidate alike.
    cost = {c: float(np.nansum(np.abs(eng - v))) for c, v in options.items()}
    return min(sorted(cost), key=cost.__getitem__)


def _picked(logits: torch.Tensor, ids: torch.Tensor, start: int) -> np.ndarray:
    """log_softmax of each position's logits at the next token, for the tokens from ``start`` on."""
    logp = torch.log_softmax(logits[start - 1 : -1].float(), dim=-1)
    return logp.gather(-1, ids[start:, None])[:, 0].cpu().numpy().astype(np.float32)


# -- the phase: every configured update on the live engine, then the trainer's scores ----------------

FINISH_CODES = {"stop": 0, "length": 1, "abort": 2}
FINISH_OTHER = 3


def inflight_prompts(
    prompt_ids: list[list[int]], count: int, max_tokens: int, max_model_len: int
) -> list[list[int]]:
    """The first ``count`` distinct prompts that leave room for ``max_tokens`` generated tokens."""
    fits = [p for p in prompt_ids if len(p) > 0 and len(p) + max_tokens <= max_model_len]
    chosen = [list(p) for p in dict.fromkeys(map(tuple, fits))][:count]
    if not chosen:
        raise ValueError(
            f"weight_sync.inflight: no prompt leaves room for {max_tokens} tokens within "
            f"max_model_len {max_model_len}; lower weight_sync.inflight.max_tokens"
        )
    return chosen


def run_probe(
    driver: InflightDriver,
    model_path: str,
    prompt_ids: list[list[int]],
    request: InflightRequest,
    perturbation: float,
    seed: int,
    progress,
    hf_kwargs: dict | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Every update of ``request.updates`` in turn, each from the old weights; (arrays, meta).

    The weights are the idle probe's: old = the checkpoint as the trainer loads it, new = it
    perturbed by ``perturbation`` x each tensor's std (``seed``). An update that raised is recorded
    with its error and the tokens it left; a timeout raises :class:`InflightTimeout`.
    """
    from transformers import AutoModelForCausalLM

    from gate.worker.policy_weights import host_state_dict, perturbed
    from gate.worker.weight_sync import _load_trainer

    prompts = inflight_prompts(
        prompt_ids, request.requests, request.max_tokens, driver.max_model_len
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    trainer = _load_trainer(AutoModelForCausalLM, model_path, device, hf_kwargs, driver.dtype)
    old_sd = host_state_dict(trainer.state_dict(), device == "cuda")
    new_sd = perturbed(old_sd, perturbation, seed)
    updates = [
        (entry, update_function(entry)) for entry in request.updates
    ]  # a bad hook fails first
    runs = []
    for entry, update in updates:
        progress(
            f"in-flight update {shown(entry)}: {len(prompts)} requests x {request.max_tokens} "
            f"tokens, the update once each has {request.switch_after}"
        )
        runs.append(run_landing(driver, entry, update, prompts, request, old_sd, new_sd, progress))
    contract = getattr(driver, "pause_contract", None)
    pauses = None
    if callable(contract):
        try:
            pauses = contract(prompts[0])
        except Exception as exc:  # a server without a mode (an older /pause): said, not fatal
            pauses = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    driver.push_idle(new_sd)  # the engine ends on the new weights, as after the idle probe
    arrays, meta = evidence(trainer, old_sd, new_sd, runs, request, device)
    if pauses is not None:
        meta["pause_contract"] = pauses
    meta["perturbation"] = perturbation
    if driver.versions_note and not any(r.versions_returned for r in runs):
        meta["weight_versions"] = driver.versions_note
    return arrays, meta


LATE_ATTEMPTS = 3  # runs of one update that may land too late to attribute
LATE_SHARE = 0.25  # of the tokens planned after the switch: fewer left after the first call is late


def landed_late(run: UpdateRun, switch_after: int) -> bool:
    """Whether the update's first call left too few tokens after it to attribute: fewer than
    :data:`LATE_SHARE` of those planned (each request's tokens past ``switch_after``), none at
    all when it came once every request had finished. A server's client starts the update when it
    has *seen* ``switch_after`` tokens; on a loaded machine the engine is further on by then
    (measured on 2 cores, switch_after 16 of 48: the first call at token 17-19 idle, 32-33 beside
    three busy loops). A request the update aborted and did not resubmit ended where the update
    ran: on time (the check says it is lost)."""
    if not run.records or run.error:
        return False
    if any(s.aborted_at is not None and s.resubmitted_at is None for s in run.streams):
        return False
    # Where the call surely had run (a server's call lies between two positions): the later one.
    first = run.records[0].tokens
    after = sum(max(len(s.token_ids) - at, 0) for at, s in zip(first, run.streams, strict=True))
    planned = sum(max(s.max_tokens - switch_after, 0) for s in run.streams)
    return after < LATE_SHARE * planned


def earlier_switch(run: UpdateRun, switch_after: int) -> int:
    """The switch point for the next run of a late update: earlier by how far past ``switch_after``
    its first call landed (the lag of the client behind the engine), at least the first token."""
    lag = max(min(run.records[0].tokens, default=switch_after) - switch_after, 0)
    return max(1, switch_after - max(lag, 1))


def run_landing(
    driver: InflightDriver,
    name: str,
    update: UpdateFn,
    prompts: list[list[int]],
    request: InflightRequest,
    old_sd: dict[str, torch.Tensor],
    new_sd: dict[str, torch.Tensor],
    progress,
) -> UpdateRun:
    """One update from the old weights (pushed idle first), run again while it
    :func:`landed_late`, starting earlier each time, up to :data:`LATE_ATTEMPTS` runs; the run's
    ``attempts`` counts them and ``switch_after`` is where its update started."""
    attempt = 1
    while True:
        driver.push_idle(old_sd)  # idle: every run starts from the old weights
        run = driver.run_update(name, update, prompts, request, new_sd)
        run.attempts, run.switch_after = attempt, request.switch_after
        if attempt == LATE_ATTEMPTS or not landed_late(run, request.switch_after):
            return run
        attempt += 1
        landed = min(run.records[0].tokens, default=request.max_tokens)
        request = replace(request, switch_after=earlier_switch(run, request.switch_after))
        progress(
            f"in-flight update {shown(name)}: its first call came at token {landed} of "
            f"{request.max_tokens}, too late to attribute; running it again from the old weights, "
            f"the update once each request has {request.switch_after} ({attempt} of {LATE_ATTEMPTS})"
        )


def evidence(
    trainer, old_sd, new_sd, runs: list[UpdateRun], request: InflightRequest, device: str
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The ``wsi_*`` arrays and engine.json's ``weight_sync_inflight`` facts of the updates' runs."""
    per_token: dict[str, list[np.ndarray]] = {
        k: []
        for k in ("token_ids", "engine_logprob", "old_logprob", "rec_logprob", "stale_logprob")
    }
    per_sequence: dict[str, list[Any]] = {k: [] for k in _PER_SEQUENCE}
    exact = []
    for u, run in enumerate(runs):
        points = switch_points(run)
        exact.append(bool(np.array_equal(points.lower, points.upper)) and not points.upper_may_lag)
        seqs = [(s.prompt, s.token_ids) for s in run.streams]
        scores = attribution_scores(
            trainer,
            old_sd,
            new_sd,
            seqs,
            points.lower,
            device,
            points.upper,
            [s.logprobs for s in run.streams],
            upper_may_lag=points.upper_may_lag,
        )
        per_token["old_logprob"].append(scores.old)
        per_token["rec_logprob"].append(scores.rec)
        per_token["stale_logprob"].append(scores.stale)
        for i, s in enumerate(run.streams):
            per_token["token_ids"].append(np.asarray(s.token_ids, dtype=np.int64))
            per_token["engine_logprob"].append(np.asarray(s.logprobs, dtype=np.float32))
            row = {
                "update_index": u,
                "length": len(s.token_ids),
                "switch_start": scores.switch[i],
                "switch_lower": points.lower[i],
                "switch_upper": scores.upper[i],
                "switch_end": points.end[i],
                "finish": FINISH_CODES.get(s.finish or "", FINISH_OTHER),
                "aborted_at": -1 if s.aborted_at is None else s.aborted_at,
                "resubmitted_at": -1 if s.resubmitted_at is None else s.resubmitted_at,
                "version_switch": first_new_version(s),
            }
            for key, value in row.items():
                per_sequence[key].append(value)
    lengths = per_sequence.pop("length")
    arrays = {keys.WSI_OFFSETS: np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)}
    for key, parts in per_token.items():
        dtype = np.int64 if key == "token_ids" else np.float32
        arrays[keys.pass_key(keys.WSI, key)] = (
            np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)
        )
    arrays |= {
        keys.pass_key(keys.WSI, key): np.asarray(values, dtype=np.int64)
        for key, values in per_sequence.items()
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
                "steps_inside": run.steps_inside,
                # one known point, else STALE fitted inside bounds (a live stream's never is one)
                "switch_exact": exact[u],
                "versions_returned": run.versions_returned,
                "attempts": run.attempts,
                "switch_after": run.switch_after,
                "update_s": run.update_s,
                "total_s": run.total_s,
                "error": run.error,
                "rejected_while_paused": run.rejected_while_paused,
            }
            for u, run in enumerate(runs)
        ],
    }
    return arrays, meta


_PER_SEQUENCE = ("update_index", "length", "switch_start", "switch_lower", "switch_upper", "switch_end",
                 "finish", "aborted_at", "resubmitted_at", "version_switch")  # fmt: skip


def first_new_version(stream: Stream) -> int:
    """The first token the engine labelled with a version other than the phase's old one; -1 where
    it labelled none (or returned no spans)."""
    for version, start, end in stream.versions:
        if version != OLD_VERSION and end > start:
            return start
    return -1
