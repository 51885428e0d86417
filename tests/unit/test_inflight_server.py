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

import pytest

pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")

from gate.worker import inflight_server as srv  # noqa: E402
from gate.worker.inflight import Stream, switch_points  # noqa: E402
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
    points = switch_points(srv.UpdateRun("no_pause", handle._streams.order, handle.records, 0, 0.1, 0.2))
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
    assert handle.paused is False
    assert server.calls == ["/collective_rpc", "/pause?mode=abort&clear_cache=true", "/resume"]


def test_resubmission_extends_the_aborted_stream(monkeypatch):
    handle, _ = _handle(during=0, tokens=[20, 64])
    submitted = []
    monkeypatch.setattr(handle._streams, "submit", lambda stream, prompt, left: submitted.append((stream.request_id, len(prompt), left)))
    first, second = handle._streams.order
    first.finish, first.aborted_at = "abort", 20
    second.finish = "length"
    handle.resubmit_aborted()
    assert submitted == [("r0", 21, 44)]  # prompt + its 20 tokens, for the 44 it had left
    assert first.resubmitted_at == 20 and first.finish is None and second.resubmitted_at is None
    assert handle.records[-1].earliest is None  # placed where the aborted streams ended


class _SSE(BaseHTTPRequestHandler):
    events: list[str] = []
    status = 200

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
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


def _chunk(ids, lps, finish=None):
    choice = {"logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": lps}, "finish_reason": finish}
    return f"data: {json.dumps({'choices': [choice]})}\n\n"


def test_streams_read_tokens_logprobs_and_the_finish_reason(sse_server):
    _SSE.status = 200
    _SSE.events = [_chunk([11], [-0.1]), ": keep-alive\n\n", _chunk([12, 13], [-0.2, None]),
                   _chunk([], [], "abort"), "data: [DONE]\n\n"]  # fmt: skip
    client = Client(sse_server, 10, 4, lambda: [])
    streams = srv.ServerStreams(client)
    stream = Stream("r0", [1, 2], 8)
    streams.submit(stream, [1, 2], 8)
    assert streams.wait(lambda: stream.done, deadline=time.monotonic() + 10)
    assert stream.token_ids == [11, 12, 13] and stream.logprobs[:2] == [-0.1, -0.2]
    assert stream.logprobs[2] != stream.logprobs[2]  # NaN where the server sent none
    assert stream.finish == "abort" and stream.aborted_at == 3 and streams.errors == []


def test_an_http_error_on_a_stream_is_recorded_not_raised(sse_server):
    _SSE.status, _SSE.events = 500, ["boom"]
    client = Client(sse_server, 10, 4, lambda: ["engine log line"])
    with pytest.raises(ServerError, match="answered HTTP 500"):
        list(client.stream_events("/v1/completions", {}))
    streams = srv.ServerStreams(client)
    stream = Stream("r0", [1], 8)
    streams.submit(stream, [1], 8)
    assert streams.wait(lambda: stream.done, deadline=time.monotonic() + 10)
    assert stream.finish == "other" and "HTTP 500" in streams.errors[0]
