"""Server mode's in-flight driver: where each call ran, from the tokens that had arrived; the SSE reader.

The engine is a script here: a client whose calls advance the streams as a running server would
(tokens arriving while a call is under way, none while paused). The real servers run in
tests/integration/test_server_mode.py.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")

from gate.worker import inflight_server as srv  # noqa: E402
from gate.worker.inflight import (  # noqa: E402
    LATE_ATTEMPTS,
    Stream,
    earlier_switch,
    landed_late,
    run_landing,
    switch_points,
)
from gate.worker.server import ServerError  # noqa: E402
from gate.worker.server_replay import Client  # noqa: E402
from gate.worker.weight_push import Adapter  # noqa: E402


class ScriptedServer:
    """Answers the handle's calls; each call lets ``during`` tokens arrive on every running stream
    (none once paused) while it is under way."""

    def __init__(self, streams: srv.ServerStreams, during: int) -> None:
        self.streams, self.during, self.paused, self.calls = streams, during, False, []

    def _generate(self, n: int) -> None:
        for s in self.streams.order:
            if not s.done:
                s.receive([7] * n, [-0.5] * n)

    def post(self, path: str, body: dict) -> dict:
        self.calls.append(path)
        if not self.paused:
            self._generate(self.during)
        if path.startswith("/pause"):
            self.paused = True
        elif path.startswith("/resume"):
            self.paused = False
        return {"results": [None]}

    def get(self, path: str) -> dict:
        return {"is_paused": self.paused}


def _handle(during: int, tokens: list[int]):
    streams = srv.ServerStreams(client=None)  # type: ignore[arg-type]
    for i, n in enumerate(tokens):
        stream = Stream(f"r{i}", [1], 64)
        stream.receive([5] * n, [-1.0] * n)
        streams.order.append(stream)
    server = ScriptedServer(streams, during)
    adapter = Adapter("scripted push", lambda base_url, sd: server.post("/collective_rpc", {}))
    handle = srv.ServerInflightEngine(streams, server, adapter, "http://127.0.0.1:1", deadline=1e12,  # type: ignore[arg-type]
                                      has_version_route=True)  # fmt: skip
    return handle, server


def test_a_paused_update_is_placed_exactly(monkeypatch):
    monkeypatch.setattr(srv, "DRAIN_QUIET_S", 0.0)
    handle, _ = _handle(during=2, tokens=[16, 17])
    handle.pause("keep")  # two tokens arrive while the pause takes effect, then nothing
    handle.push({})
    handle.set_weight_version("gate-new")
    handle.resume()
    positions = [(r.name.split("(")[0], r.earliest, r.tokens) for r in handle.records]
    assert positions == [("pause", None, [18, 19]), ("push via scripted push", None, [18, 19]),
                         ("set_weight_version", None, [18, 19]), ("resume", None, [18, 19])]  # fmt: skip
    run = srv.UpdateRun("keep", handle._streams.order, handle.records, 0, 0.1, 0.2)
    points = switch_points(run)
    assert points.lower.tolist() == points.upper.tolist() == points.end.tolist() == [18, 19]


def test_an_unpaused_call_is_known_within_what_arrived_while_it_ran():
    handle, _ = _handle(during=3, tokens=[16, 20])
    handle.push({})
    [record] = handle.records
    assert record.earliest == [16, 20] and record.tokens == [19, 23]
    points = switch_points(
        srv.UpdateRun("no_pause", handle._streams.order, handle.records, 0, 0.1, 0.2)
    )
    assert points.lower.tolist() == [16, 20] and points.upper.tolist() == [19, 23]


def test_calls_by_name_only_and_the_endpoints_they_reach(monkeypatch):
    monkeypatch.setattr(srv, "DRAIN_QUIET_S", 0.0)
    handle, server = _handle(during=1, tokens=[16])
    with pytest.raises(TypeError, match="takes a worker method's name"):
        handle.collective_rpc(lambda worker: None)
    handle.collective_rpc("reload_weights", kwargs={"weights_path": "/x"})
    handle.pause("abort", clear_cache=True)
    assert handle.is_paused() is True
    handle.post("/resume")  # a raw endpoint is tracked like resume()
    handle.push({})  # after the resume: generation went on, so it is placed within bounds
    assert handle.records[-1].earliest is not None
    assert server.calls == [
        "/collective_rpc",
        "/pause?mode=abort&clear_cache=true",
        "/resume",
        "/collective_rpc",
    ]


def test_resubmission_extends_the_aborted_streams_one_request_per_tokens_left(monkeypatch):
    handle, _ = _handle(during=0, tokens=[20, 30, 20, 64])
    submitted = []
    monkeypatch.setattr(
        handle._streams,
        "submit",
        lambda batch, left: submitted.append(([(s.request_id, len(p)) for s, p in batch], left)),
    )
    *aborted, done = handle._streams.order
    for stream in aborted:
        stream.finish, stream.aborted_at = "abort", len(stream.token_ids)
    done.finish = "length"
    handle.resubmit_aborted()
    # Each as prompt + its tokens, for those it had left; the two with 44 left share a request.
    assert submitted == [([("r0", 21), ("r2", 21)], 44), ([("r1", 31)], 34)]
    assert [s.resubmitted_at for s in handle._streams.order] == [20, 30, 20, None]
    assert all(s.finish is None for s in aborted)
    assert handle.records[-1].earliest is None  # placed where the aborted streams ended


class _SSE(BaseHTTPRequestHandler):
    events: ClassVar[list[str]] = []
    status = 200

    bodies: ClassVar[list[dict]] = []

    def do_POST(self):
        self.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(self.status)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for event in self.events:
            self.wfile.write(event.encode())
            self.wfile.flush()

    def log_message(self, *args):
        pass


@pytest.fixture
def sse_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SSE)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _chunk(ids, lps, finish=None, index=0):
    choice = {"index": index, "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": lps},
              "finish_reason": finish}  # fmt: skip
    return f"data: {json.dumps({'choices': [choice]})}\n\n"


def test_streams_read_tokens_logprobs_and_the_finish_reason(sse_server):
    _SSE.status = 200
    _SSE.events = [_chunk([11], [-0.1]), ": keep-alive\n\n", _chunk([12, 13], [-0.2, None]),
                   _chunk([], [], "abort"), "data: [DONE]\n\n"]  # fmt: skip
    client = Client(sse_server, 10, 4, lambda: [])
    streams = srv.ServerStreams(client)
    stream = Stream("r0", [1, 2], 8)
    streams.submit([(stream, [1, 2])], 8)
    assert streams.wait(lambda: stream.done, deadline=time.monotonic() + 10)
    assert stream.token_ids == [11, 12, 13] and stream.logprobs[:2] == [-0.1, -0.2]
    assert stream.logprobs[2] != stream.logprobs[2]  # NaN where the server sent none
    assert stream.finish == "abort" and stream.aborted_at == 3 and streams.errors == []


def test_a_batch_is_one_request_whose_choices_go_to_their_streams(sse_server):
    _SSE.status = 200
    _SSE.events = [_chunk([11], [-0.1], index=1), _chunk([21], [-0.2], index=0),
                   _chunk([12], [-0.3], "abort", index=1), _chunk([22, 23], [-0.4, -0.5], "length", index=0),
                   "data: [DONE]\n\n"]  # fmt: skip
    _SSE.bodies = []
    client = Client(sse_server, 10, 4, lambda: [])
    streams = srv.ServerStreams(client)
    first, second = Stream("r0", [1, 2], 3), Stream("r1", [3], 3)
    streams.submit([(first, [1, 2]), (second, [3])], 3)
    assert streams.wait(lambda: first.done and second.done, deadline=time.monotonic() + 10)
    assert [body["prompt"] for body in _SSE.bodies] == [[[1, 2], [3]]] and _SSE.bodies[0][
        "max_tokens"
    ] == 3
    assert (first.token_ids, first.finish, first.aborted_at) == ([21, 22, 23], "length", None)
    assert (second.token_ids, second.finish, second.aborted_at) == ([11, 12], "abort", 2)
    assert streams.order == [first, second] and streams.errors == []


def test_a_choice_for_no_prompt_sent_ends_the_batch_as_an_error(sse_server):
    _SSE.status, _SSE.events = 200, [_chunk([11], [-0.1], index=0), _chunk([12], [-0.1], index=2)]
    streams = srv.ServerStreams(Client(sse_server, 10, 4, lambda: []))
    pair = [Stream("r0", [1], 8), Stream("r1", [2], 8)]
    streams.submit([(s, s.prompt) for s in pair], 8)
    assert streams.wait(lambda: all(s.done for s in pair), deadline=time.monotonic() + 10)
    assert [s.finish for s in pair] == ["other", "other"]
    assert streams.errors == [
        "r0, r1: ValueError: a streamed choice has index 2, not one of the 2 prompts sent"
    ]


def test_an_http_error_on_a_stream_is_recorded_not_raised(sse_server):
    _SSE.status, _SSE.events = 500, ["boom"]
    client = Client(sse_server, 10, 4, lambda: ["engine log line"])
    with pytest.raises(ServerError, match="answered HTTP 500"):
        list(client.stream_events("/v1/completions", {}))
    streams = srv.ServerStreams(client)
    stream = Stream("r0", [1], 8)
    streams.submit([(stream, [1])], 8)
    assert streams.wait(lambda: stream.done, deadline=time.monotonic() + 10)
    assert stream.finish == "other" and "HTTP 500" in streams.errors[0]


class ScriptedClient(ScriptedServer):
    """A server whose streams run to their end at once: every update it is given comes late."""

    def __init__(self) -> None:
        super().__init__(streams=None, during=0)  # type: ignore[arg-type]

    def _generate(self, n: int) -> None:
        pass

    def stream_events(self, path: str, body: dict):
        for _ in range(body["max_tokens"]):
            for i in range(len(body["prompt"])):
                yield {
                    "choices": [
                        {
                            "index": i,
                            "logprobs": {"tokens": ["token_id:7"], "token_logprobs": [-0.5]},
                        }
                    ]
                }
        yield {
            "choices": [{"index": i, "finish_reason": "length"} for i in range(len(body["prompt"]))]
        }


def _request(**overrides) -> srv.InflightRequest:
    return srv.InflightRequest(**{"updates": ["keep"], "requests": 2, "max_tokens": 8, "switch_after": 2,
                                  "timeout_s": 30.0, **overrides})  # fmt: skip


def test_an_update_that_returns_paused_is_told_at_once_though_no_request_waits():
    client = ScriptedClient()

    def never_resume(engine, state_dict):
        engine.pause("keep")

    adapter = Adapter("scripted push", lambda base_url, sd: None)
    began = time.monotonic()
    with pytest.raises(
        srv.InflightLeftPaused, match=r"returned with the engine still paused .*last calls: pause"
    ):
        srv.run_update(client, "never_resume", never_resume, adapter, "http://127.0.0.1:1",  # type: ignore[arg-type]
                       [[1, 2], [3]], _request(), {}, has_version_route=False)  # fmt: skip
    assert time.monotonic() - began < 10  # not after timeout_s (30)


def test_a_late_update_is_seen_as_late():
    client = ScriptedClient()
    adapter = Adapter("scripted push", lambda base_url, sd: None)

    def keep(engine, state_dict):
        engine.pause("keep")
        engine.resume()

    run = srv.run_update(client, "keep", keep, adapter, "http://127.0.0.1:1", [[1, 2], [3]],  # type: ignore[arg-type]
                         _request(), {}, has_version_route=False)  # fmt: skip
    # Its streams had their 8 tokens before the pause went out.
    assert [len(s.token_ids) for s in run.streams] == [8, 8] and landed_late(run, 2)
    # 12 tokens planned after the switch (2 requests x 8 - 2): a quarter is 3.
    on_time = srv.UpdateRun(
        "keep", run.streams, [srv.CallRecord("pause", [5, 8], 0.1)], 0, 0.1, 0.2
    )
    assert not landed_late(on_time, 2)  # 3 tokens after it
    nearly = srv.UpdateRun("keep", run.streams, [srv.CallRecord("pause", [7, 7], 0.1)], 0, 0.1, 0.2)
    assert landed_late(nearly, 2)  # 1 + 1: the check would find too few to attribute
    # A server's call known between two positions: where it surely had run, the later one.
    bounded = srv.UpdateRun(
        "keep", run.streams, [srv.CallRecord("x", [7, 7], 0.1, earliest=[2, 2])], 0, 0.1, 0.2
    )
    assert landed_late(bounded, 2)
    assert not landed_late(
        srv.UpdateRun("none", run.streams, [], 0, 0.1, 0.2), 2
    )  # no call: nothing to place
    aborted = [
        Stream("r0", [1], 8, token_ids=[7] * 5, finish="abort", aborted_at=5),
        run.streams[1],
    ]
    at_abort = srv.UpdateRun(
        "abort_without_resubmit", aborted, [srv.CallRecord("pause", [5, 8], 0.1)], 0, 0.1, 0.2
    )
    assert not landed_late(
        at_abort, 2
    )  # the request ended where the update aborted it: lost, not late
    resubmitted = [Stream("r0", [1], 8, token_ids=[7] * 8, finish="length", aborted_at=7, resubmitted_at=7),
                   Stream("r1", [1], 8, token_ids=[7] * 8, finish="length", aborted_at=7, resubmitted_at=7)]  # fmt: skip
    late_abort = srv.UpdateRun(
        "abort_resubmit", resubmitted, [srv.CallRecord("pause", [7, 7], 0.1)], 0, 0.1, 0.2
    )
    assert landed_late(late_abort, 2)  # aborted one token before the end: 2 tokens to attribute


@pytest.mark.parametrize("landed, switch_after, earlier", [([40, 41], 16, 1), ([20, 22], 16, 12), ([16, 16], 16, 15),
                                                         ([48, 48], 16, 1), ([3, 9], 2, 1)])  # fmt: skip
def test_a_late_update_starts_earlier_by_the_lag_it_saw(landed, switch_after, earlier):
    run = srv.UpdateRun("keep", [], [srv.CallRecord("pause", landed, 0.1)], 0, 0.1, 0.2)
    assert earlier_switch(run, switch_after) == earlier


class _Driver:
    """Runs an update as given: late ``late`` times, then on time; keeps each run's switch point."""

    def __init__(self, late: int) -> None:
        self.late, self.pushed, self.runs, self.switches = late, [], 0, []

    def push_idle(self, state_dict):
        self.pushed.append(state_dict["w"])

    def run_update(self, name, update, prompts, request, new_sd):
        self.runs += 1
        self.switches.append(request.switch_after)
        stream = Stream("r0", [1], 8)
        stream.receive([7] * 8, [-0.5] * 8)
        at = 8 if self.runs <= self.late else 4
        return srv.UpdateRun(name, [stream], [srv.CallRecord("pause", [at], 0.1)], 0, 0.1, 0.2)


@pytest.mark.parametrize("late, attempts", [(0, 1), (1, 2), (5, LATE_ATTEMPTS)])
def test_a_late_update_runs_again_from_the_old_weights_starting_earlier(late, attempts):
    driver, said = _Driver(late), []
    run = run_landing(driver, "keep", lambda e, sd: None, [[1]], _request(switch_after=4), {"w": "old"}, {"w": "new"},  # type: ignore[arg-type]
                      said.append)  # fmt: skip
    assert run.attempts == attempts == driver.runs and driver.pushed == ["old"] * attempts
    assert driver.switches == [4, 1, 1][:attempts] and run.switch_after == driver.switches[-1]
    assert landed_late(run, run.switch_after) is (late >= LATE_ATTEMPTS)
    assert all(
        "came at token 8 of 8, too late to attribute" in s and "once each request has 1" in s
        for s in said
    )
    assert len(said) == attempts - 1 and all("running it again" in s for s in said)


class _PausingServer(BaseHTTPRequestHandler):
    """vLLM's pause as each release answers a request sent meanwhile: 0.32 queues it until
    /resume; 0.33 on (``rejects``) streams a retryable 503 error event in abort and wait mode
    (EngineCore._reject_add_while_paused -> RetryableRequestError -> create_streaming_error_response)
    and queues it in keep mode."""

    rejects: ClassVar[bool] = False
    paused: ClassVar[str | None] = None  # the pause's mode
    completions: ClassVar[int] = 0

    def _json(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._json({"is_paused": type(self).paused is not None})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        cls = type(self)
        if self.path.startswith("/pause"):
            cls.paused = self.path.split("mode=")[1].split("&")[0]
            return self._json({"status": "paused"})
        if self.path.startswith("/resume"):
            cls.paused = None
            return self._json({"status": "resumed"})
        cls.completions += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if cls.rejects and cls.paused in ("abort", "wait"):
            error = {"message": "Generation is paused. Please retry after it resumes.",
                     "type": "ServiceUnavailableError", "param": None, "code": 503}  # fmt: skip
            self.wfile.write(f"data: {json.dumps({'error': error})}\n\ndata: [DONE]\n\n".encode())
            return
        while cls.paused is not None:  # queued until /resume
            time.sleep(0.01)
        for i in range(len(body["prompt"])):
            ids = [9] * body["max_tokens"]
            self.wfile.write(_chunk(ids, [-0.3] * len(ids), "length", index=i).encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


@pytest.fixture
def pausing_server():
    _PausingServer.paused, _PausingServer.completions = None, 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _PausingServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize(("rejects", "abort_and_wait"), [(False, "queued"), (True, "rejected")])
def test_the_pause_contract_tells_queued_from_turned_away(
    pausing_server, monkeypatch, rejects, abort_and_wait
):
    monkeypatch.setattr(srv, "QUEUED_AFTER_S", 0.3)
    monkeypatch.setattr(_PausingServer, "rejects", rejects)
    client = Client(pausing_server, 10, 4, lambda: [])
    found = srv.pause_contract(client, [1, 2], time.monotonic() + 20)
    assert {mode: row["while_paused"] for mode, row in found.items()} == {
        "abort": abort_and_wait,
        "wait": abort_and_wait,
        "keep": "queued",
    }
    # every request is served in the end: queued ones on resume, turned-away ones when sent again
    assert {row["after_resume"] for row in found.values()} == {"served"}
    assert _PausingServer.paused is None  # each pause resumed
    if rejects:
        assert "error 503" in found["abort"]["error"]


def test_a_stream_turned_away_during_a_pause_is_sent_again_after_resume(
    pausing_server, monkeypatch
):
    """A stack's resubmission after an abort can reach vLLM 0.33 before /resume: the 503 is not a
    lost request, the client retries once the server is resumed."""
    monkeypatch.setattr(_PausingServer, "rejects", True)
    monkeypatch.setattr(srv, "RESUME_POLL_S", 0.01)
    client = Client(pausing_server, 10, 4, lambda: [])
    client.post("/pause?mode=abort&clear_cache=false", {})
    streams = srv.ServerStreams(client, deadline=time.monotonic() + 20)
    stream = Stream("r0", [1], 3)
    streams.submit([(stream, [1])], 3)
    time.sleep(0.3)
    assert not stream.done and streams.rejected == 1  # turned away, waiting for the resume
    client.post("/resume", {})
    assert streams.wait(lambda: stream.done, deadline=time.monotonic() + 10)
    assert (stream.token_ids, stream.finish, streams.errors) == ([9, 9, 9], "length", [])
    assert _PausingServer.completions == 2


def test_an_error_event_in_a_stream_is_raised_and_a_503_is_the_servers_pause():
    from gate.worker.server import ServerBusy
    from gate.worker.server_replay import stream_error

    busy = stream_error(
        "/v1/completions", {"message": "paused", "type": "ServiceUnavailableError", "code": 503}, []
    )
    assert isinstance(busy, ServerBusy) and "error 503: paused" in busy.reason
    other = stream_error("/v1/completions", {"message": "Internal server error", "code": 500}, [])
    assert type(other) is ServerError
