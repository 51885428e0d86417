"""The in-flight phase in server mode: real concurrent streams, the update through the dev endpoints.

Server-based stacks (prime-rl, SkyRL, vime, AReaL, verl's async server) keep requests streaming
from vLLM's OpenAI server and update it over HTTP: ``/pause?mode=keep&clear_cache=false``,
``/collective_rpc``, ``/resume``, ``/abort_requests`` (development mode). This driver does the
same: the requests are one streaming ``/v1/completions`` with a token-id prompt each (greedy,
``ignore_eos``, the sampled token's logprob), read by a thread of its own, and the update's calls go to those
endpoints while the streams run, through the real ``AsyncLLM`` and engine-core process.

**Where each call ran.** The client sees tokens only when they arrive, so a call's position is
known from what had arrived: exactly while the engine is paused (nothing is generated; the
streams are drained of what was on its way first), otherwise between the tokens that had arrived
when the call was sent and those that had arrived when it returned (:class:`CallRecord`'s
``earliest`` and ``tokens``). A pause's position is where the drained streams stopped; a call sent
while paused ran where they stand. The trainer's STALE is fitted inside the bounds
(gate.worker.inflight.attribution_scores); the bounds are in the evidence.

The completions API returns no weight-version spans (0.32 returns them on ``/inference/v1/generate``
only), so the built-in updates' labels are set (``/update_weight_version`` where served) but not read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from gate.contract.request import InflightRequest
from gate.worker import server_replay as http
from gate.worker.inflight import (
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
from gate.worker.server import SERVED_MODEL_NAME
from gate.worker.weight_push import Adapter, push_naming_failures, rpc_timeout_s

DRAIN_QUIET_S = 0.1  # a paused engine's streams are drained once nothing arrived for this long
DRAIN_LIMIT_S = 5.0  # ... or after this long at most (then the position is what had arrived)
ENDPOINTS = ("/pause", "/resume", "/is_paused", "/collective_rpc", "/abort_requests")
PAUSE_CONTRACT_TIMEOUT_S = 120.0
VERSIONS_NOTE = "the completions API returns no weight-version spans (vLLM 0.32 returns them on /inference/v1/generate only)"


class ServerStreams:
    """The probe's requests, streamed as completions: one HTTP request carries a batch of prompts
    (one choice each), read by a thread of its own.

    One request per batch, not one per prompt: the server adds a batch's prompts to the engine
    together, so the streams start on the same step. Separate connections started them apart on a
    busy machine (two streams had finished their 192 tokens before the other two had 18 at TP=2 on
    2 cores), and an update sent once *every* stream had ``switch_after`` tokens found the first
    ones done.
    """

    def __init__(self, client: http.Client, deadline: float = float("inf")) -> None:
        self._client = client
        self._deadline = deadline
        self._changed = threading.Condition()
        self._last_arrival = time.monotonic()
        self.order: list[Stream] = []
        self.errors: list[str] = []
        self.rejected = 0  # batches the server turned away while paused, sent again on resume

    def submit(self, batch: Sequence[tuple[Stream, list[int]]], max_tokens: int) -> None:
        """Stream each (stream, prompt) of ``batch`` for ``max_tokens`` more tokens, in one request
        (a resubmission extends its stream)."""
        if not batch:
            return
        for stream, _ in batch:
            if stream not in self.order:
                self.order.append(stream)
        body = {
            "model": SERVED_MODEL_NAME,
            "prompt": [prompt for _, prompt in batch],
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
        }
        streams = [stream for stream, _ in batch]
        threading.Thread(
            target=self._read,
            args=(streams, body),
            daemon=True,
            name=f"gate-inflight-{streams[0].request_id}",
        ).start()

    def _read(self, streams: list[Stream], body: dict[str, Any]) -> None:
        try:
            while True:
                try:
                    for event in self._client.stream_events(http.COMPLETIONS, body):
                        for choice in event.get("choices") or []:
                            self._receive(streams, choice)
                    break
                except http.ServerBusy:
                    # vLLM 0.33 on turns a request sent during an abort/wait pause away (503,
                    # retryable) before any token: a stack's client sends it again after resume
                    with self._changed:
                        self.rejected += 1
                    resumed_by(self._client, self._deadline)
        except Exception as exc:  # a stream the server ended (stopped after a timeout) or broke
            with self._changed:
                names = ", ".join(s.request_id for s in streams if not s.done)
                self.errors.append(f"{names}: {type(exc).__name__}: {exc}"[:300])
        with self._changed:
            for stream in streams:
                if not stream.done:
                    stream.finish = "other"
            self._changed.notify_all()

    def _receive(self, streams: list[Stream], choice: dict[str, Any]) -> None:
        index = choice.get("index", 0)
        if not isinstance(index, int) or not 0 <= index < len(streams):
            raise ValueError(
                f"a streamed choice has index {index!r}, not one of the {len(streams)} prompts sent"
            )
        found = choice.get("logprobs") or {}
        ids = [http.token_id(t) for t in found.get("tokens") or []]
        values = [float("nan") if v is None else v for v in found.get("token_logprobs") or []]
        stream = streams[index]
        with self._changed:
            stream.receive(ids, values)
            self._last_arrival = time.monotonic()
            if finish := choice.get("finish_reason"):
                stream.finish = finish
                if finish == "abort":
                    stream.aborted_at = len(stream.token_ids)
            self._changed.notify_all()

    def tokens(self) -> list[int]:
        with self._changed:
            return [len(s.token_ids) for s in self.order]

    def wait(self, ready: Callable[[], bool], deadline: float) -> bool:
        """Wait until ``ready()`` (checked under the streams' lock) or the deadline; whether it is."""
        with self._changed:
            while not ready():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.5))
            return True

    def drain(self) -> None:
        """Wait for what a paused engine generated before its pause to arrive: until nothing has
        arrived for :data:`DRAIN_QUIET_S` (at most :data:`DRAIN_LIMIT_S`)."""
        limit = time.monotonic() + DRAIN_LIMIT_S
        with self._changed:
            while (quiet := time.monotonic() - self._last_arrival) < DRAIN_QUIET_S:
                if time.monotonic() >= limit:
                    return
                self._changed.wait(DRAIN_QUIET_S - quiet)


RESUME_POLL_S = 0.05


def resumed_by(client: http.Client, deadline: float) -> None:
    """Return once the server says it is not paused; :class:`InflightTimeout` at ``deadline``."""
    while client.get("/is_paused").get("is_paused"):
        if time.monotonic() >= deadline:
            raise InflightTimeout("in-flight update: the server stayed paused past the deadline")
        time.sleep(RESUME_POLL_S)


PAUSE_MODES = ("abort", "wait", "keep")
QUEUED_AFTER_S = 2.0  # a request still unanswered this long into a pause counts as queued


def pause_contract(client: http.Client, prompt: list[int], deadline: float) -> dict[str, Any]:
    """What a new request meets while the server is paused, for each pause mode: ``queued``
    (answered after /resume: every mode up to vLLM 0.32, ``keep`` after), ``rejected`` (a
    retryable 503 before resume: ``abort`` and ``wait`` from 0.33, ``_reject_add_while_paused``),
    or ``served`` (answered while paused: the pause did not hold). The request is sent as a stack
    resubmits one, during the pause; a rejected one is sent again after /resume and must then be
    served (``after_resume``)."""
    found: dict[str, Any] = {}
    for mode in PAUSE_MODES:
        client.post(f"/pause?mode={mode}&clear_cache=false", {})
        try:
            first = _OneRequest(client, prompt)
            first.done.wait(QUEUED_AFTER_S)
            answered = first.done.is_set()
        finally:
            client.post("/resume", {})
        first.done.wait(max(deadline - time.monotonic(), 0))
        outcome = (
            ("rejected" if first.busy else "served" if first.error is None else "failed")
            if answered
            else "queued"
        )
        row: dict[str, Any] = {"while_paused": outcome}
        if first.error is not None:
            row["error"] = first.error
        if first.busy:
            again = _OneRequest(client, prompt)
            again.done.wait(max(deadline - time.monotonic(), 0))
            row["after_resume"] = (
                "served"
                if again.done.is_set() and again.error is None
                else (again.error or "no answer")
            )
        elif outcome == "failed":  # an error other than the pause's: the request is lost
            row["after_resume"] = first.error
        elif outcome == "queued":
            row["after_resume"] = (
                "served"
                if first.error is None and first.done.is_set()
                else (first.error or "no answer")
            )
        found[mode] = row
    return found


class _OneRequest:
    """One two-token streamed completion in a thread of its own: set ``done`` when it ends."""

    def __init__(self, client: http.Client, prompt: list[int]) -> None:
        self.done = threading.Event()
        self.busy = False
        self.error: str | None = None
        body = {"model": SERVED_MODEL_NAME, "prompt": [prompt], "max_tokens": 2,
                "temperature": 0.0, "ignore_eos": True}  # fmt: skip
        threading.Thread(
            target=self._run, args=(client, body), daemon=True, name="gate-pause-contract"
        ).start()

    def _run(self, client: http.Client, body: dict[str, Any]) -> None:
        try:
            for _ in client.stream_events(http.COMPLETIONS, body):
                pass
        except http.ServerBusy as exc:
            self.busy, self.error = True, str(exc.reason)[:300]
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            self.done.set()


class ServerInflightEngine:
    """What an in-flight update gets in server mode: the server's development endpoints.

    The methods are those of the offline handle (gate.worker.inflight_offline.InflightEngine), so
    one hook serves both modes where it calls workers by method name; ``collective_rpc`` takes
    only a name here (HTTP carries no function), ``call(fn)`` runs ``fn(base_url)``, and ``post``
    reaches any other endpoint (``/update_weights`` of a stack's own server, say).
    """

    def __init__(
        self,
        streams: ServerStreams,
        client: http.Client,
        adapter: Adapter,
        base_url: str,
        deadline: float,
        has_version_route: bool,
    ) -> None:
        self._streams, self._client, self._adapter = streams, client, adapter
        self.base_url = base_url
        self._deadline = deadline
        self._has_version_route = has_version_route
        self._paused = False
        self._started = time.perf_counter()
        self.records: list[CallRecord] = []

    def _run(
        self,
        name: str,
        fn: Callable[[], Any],
        paused_after: bool | None = None,
        at_send: bool = False,
    ) -> Any:
        """One call, recorded with where the streams were (also when it raised): exact while the
        engine is paused, or ``at_send`` (a call of the client alone, which the engine does not see)."""
        if time.monotonic() >= self._deadline:
            raise InflightTimeout(f"in-flight update: no time left for {name}")
        was_paused = self._paused
        sent = self._streams.tokens()
        try:
            result = fn()
            if paused_after is not None:
                self._paused = paused_after
            return result
        finally:
            self.records.append(self._record(name, sent, was_paused or at_send))

    def _record(self, name: str, sent: list[int], at_send: bool) -> CallRecord:
        seconds = time.perf_counter() - self._started
        if at_send:  # nothing ran while paused: the call ran where the drained streams stood
            return CallRecord(name, sent, seconds)
        if self._paused:  # this call paused it: where the streams stopped, once drained
            self._streams.drain()
            return CallRecord(name, self._streams.tokens(), seconds)
        return CallRecord(name, self._streams.tokens(), seconds, earliest=sent)

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        """Any endpoint of the server; ``/pause`` and ``/resume`` are tracked as the methods are."""
        paused = (
            True if path.startswith("/pause") else False if path.startswith("/resume") else None
        )
        return self._run(f"POST {path}", lambda: self._client.post(path, body or {}), paused)

    def pause(self, mode: str = "keep", clear_cache: bool = False) -> None:
        query = f"/pause?mode={mode}&clear_cache={str(bool(clear_cache)).lower()}"
        self._run(
            f"pause({mode}, clear_cache={clear_cache})", lambda: self._client.post(query, {}), True
        )

    def resume(self) -> None:
        self._run("resume", lambda: self._client.post("/resume", {}), False)

    def is_paused(self) -> bool:
        return bool(self._run("is_paused", lambda: self._client.get("/is_paused").get("is_paused")))

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        if not isinstance(method, str):
            raise TypeError(
                "in server mode collective_rpc takes a worker method's name: HTTP carries no function"
            )
        body = {
            "method": method,
            "args": list(args),
            "kwargs": kwargs or {},
            "timeout": rpc_timeout_s(),
        }
        answer = self._run(
            f"collective_rpc({method})", lambda: self._client.post("/collective_rpc", body)
        )
        return list((answer or {}).get("results") or [])

    def push(self, state_dict: dict[str, torch.Tensor]) -> None:
        """The whole state dict through the path gate uses for this server, as one call."""
        self._run(
            f"push via {self._adapter.name}", lambda: self._adapter.push(self.base_url, state_dict)
        )

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        path = f"/reset_prefix_cache?reset_running_requests={str(reset_running_requests).lower()}"
        answer = self._run("reset_prefix_cache", lambda: self._client.post(path, {}))
        return bool((answer or {}).get("success", True))

    def set_weight_version(self, version: str) -> bool:
        """``/update_weight_version``; False where the server has no such endpoint."""
        if not self._has_version_route:
            return False
        self._run(
            f"set_weight_version({version})",
            lambda: self._client.post("/update_weight_version", {"new_version": version}),
        )
        return True

    def abort(self) -> int:
        """``/abort_requests`` with no ids: every request the server is running; returns how many."""
        answer = self._run("abort", lambda: self._client.post("/abort_requests", {}))
        return int((answer or {}).get("aborted", 0))

    def resubmit_aborted(self) -> None:
        """Each aborted request again, as prompt + its partial output, for the tokens it had left
        (AReaL's client), once the stream has told its abort."""
        ended = lambda: all(s.done for s in self._streams.order)  # noqa: E731
        if not self._streams.wait(ended, self._deadline):
            raise InflightTimeout(
                "in-flight update: the aborted streams never ended (resubmit_aborted)"
            )
        # Where the aborted streams ended: what arrives after it comes from the resubmissions.
        self._run("resubmit", self._resubmit, at_send=True)

    def _resubmit(self) -> None:
        """One request per number of tokens left (a batch shares ``max_tokens``)."""
        by_left: dict[int, list[tuple[Stream, list[int]]]] = {}
        for stream, prompt, left in take_resubmissions(self._streams.order):
            by_left.setdefault(left, []).append((stream, prompt))
        for left, batch in by_left.items():
            self._streams.submit(batch, left)

    def call(self, fn: Callable[[str], Any]) -> Any:
        """``fn(base_url)``: anything else a stack does to the server."""
        return self._run(getattr(fn, "__name__", "call"), lambda: fn(self.base_url))


def run_update(
    client: http.Client,
    name: str,
    update: UpdateFn,
    adapter: Adapter,
    base_url: str,
    prompts: list[list[int]],
    request: InflightRequest,
    new_sd: dict[str, torch.Tensor],
    has_version_route: bool,
) -> UpdateRun:
    """Stream ``prompts`` greedily for ``request.max_tokens`` each; once every one has
    ``request.switch_after`` tokens, run ``update`` in its own thread while they keep streaming;
    return when every request has finished and the update has returned.

    Raises :class:`InflightLeftPaused` when the update returns with the server paused, and
    :class:`InflightTimeout` (naming the phase) past ``request.timeout_s``.
    """
    start = time.monotonic()
    deadline = start + request.timeout_s
    streams = ServerStreams(client, deadline)
    batch = [
        (Stream(f"gate-inflight-{name}-{i}", p, request.max_tokens), p)
        for i, p in enumerate(prompts)
    ]
    streams.submit(batch, request.max_tokens)
    handle = ServerInflightEngine(streams, client, adapter, base_url, deadline, has_version_route)
    reached = lambda: all(len(s.token_ids) >= request.switch_after or s.done for s in streams.order)  # noqa: E731
    if not streams.wait(reached, deadline):
        raise InflightTimeout(
            _timeout_message(
                name, "the requests never reached the switch", handle, request.timeout_s
            )
        )
    thread = UpdateThread(name, update, handle, new_sd)
    thread.join(max(deadline - time.monotonic(), 0))
    if thread.is_alive():
        raise InflightTimeout(
            _timeout_message(
                name,
                f"the update ({shown(name)}) had not returned",
                handle,
                request.timeout_s,
                thread.error,
            )
        )
    # Asked of the server, not of the calls seen: a hook may pause through an endpoint of its own.
    # Told at once: were every request done before the pause, no stream would wait for a resume.
    if client.get("/is_paused").get("is_paused"):
        raise InflightLeftPaused(left_paused_message(name, handle.records, thread.error))
    if not streams.wait(lambda: all(s.done for s in streams.order), deadline):
        what = f"requests were still unfinished after the update ({shown(name)}) returned"
        raise InflightTimeout(_timeout_message(name, what, handle, request.timeout_s, thread.error))
    records = handle.records
    inside = 0
    if len(records) > 1:  # tokens that surely arrived between the first call and the last one
        inside = max(
            (lo - hi for lo, hi in zip(records[-1].lower, records[0].tokens, strict=True)),
            default=0,
        )
    return UpdateRun(
        name=name,
        streams=streams.order,
        records=records,
        steps=0,
        update_s=thread.seconds,
        total_s=time.monotonic() - start,
        error=thread.error or _stream_error(streams),
        steps_inside=max(inside, 0),
        rejected_while_paused=streams.rejected,
    )


def _stream_error(streams: ServerStreams) -> str | None:
    return f"a stream failed: {streams.errors[0]}" if streams.errors else None


def _timeout_message(
    name: str, what: str, handle: ServerInflightEngine, limit: float, raised: str | None = None
) -> str:
    if raised:
        what += f", having raised {raised}"
    calls = ", ".join(r.name for r in handle.records[-5:]) or "none"
    return f"in-flight update: {what} after {limit:g}s (weight_sync.inflight.timeout_s); last calls: {calls}"


class ServerDriver:
    """The in-flight phase's view of a served engine (gate.worker.inflight.InflightDriver)."""

    versions_note = VERSIONS_NOTE

    def __init__(self, engine, adapter: Adapter, requests: int, dtype: torch.dtype) -> None:
        routes = engine.client.routes()
        missing = [p for p in ENDPOINTS if p not in routes]
        if missing:
            raise InflightUnsupported(
                f"the server offers no {missing} (development endpoints: set server.dev_mode, which "
                "sets VLLM_SERVER_DEV_MODE=1); in-flight updates pause, call and resume the server through them"
            )
        self.engine, self.adapter = engine, adapter
        self.max_model_len = int(engine.setting("model_config.max_model_len") or 2048)
        self.dtype = dtype
        self.has_version_route = "/update_weight_version" in routes
        # Streams and calls at once, apart from the replay's pool.
        self.client = http.Client(
            engine.base_url,
            engine.settings.request_timeout_s,
            2 * requests + 4,
            engine.server.lines,
        )

    def push_idle(self, state_dict: dict[str, torch.Tensor]) -> None:
        push_naming_failures(self.adapter, self.engine.base_url, state_dict)

    def run_update(
        self,
        name: str,
        update: UpdateFn,
        prompts: list[list[int]],
        request: InflightRequest,
        new_sd: dict[str, torch.Tensor],
    ) -> UpdateRun:
        return run_update(
            self.client,
            name,
            update,
            self.adapter,
            self.engine.base_url,
            prompts,
            request,
            new_sd,
            self.has_version_route,
        )

    def pause_contract(self, prompt: list[int]) -> dict[str, Any]:
        """What a request sent during each kind of pause meets (:func:`pause_contract`)."""
        return pause_contract(self.client, prompt, time.monotonic() + PAUSE_CONTRACT_TIMEOUT_S)

    def close(self) -> None:
        self.client.close()
