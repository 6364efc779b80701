"""colibri-server --verbose: one stderr line per generation request as it
ends, with the figures its answer gives (id, status, tokens, times)."""

from __future__ import annotations

import json as _json
import re
import socket

import pytest

from conftest import stop_checked

pytestmark = pytest.mark.slow

LINE = re.compile(r"colibri-server: request id=(\S+) endpoint=(\w+) status=(\d+) outcome=(\S+) tokens_in=(\d+) "
                  r"tokens_out=(\d+) queue_ms=([\d.]+) prompt_ms=([\d.]+) decode_ms=([\d.]+)$")


def _lines(stderr: str) -> list[dict]:
    keys = ("id", "endpoint", "status", "outcome", "tokens_in", "tokens_out", "queue_ms", "prompt_ms", "decode_ms")
    return [dict(zip(keys, m.groups())) for line in stderr.splitlines() if (m := LINE.search(line))]


def test_verbose_logs_a_line_per_request_matching_its_answer(native_server_dist, tiny_model, start_server):
    server = start_server(native_server_dist / "colibri-server", tiny_model, "--verbose")
    ok = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 5})
    assert ok.status_code == 200
    bad = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})
    assert bad.status_code == 400
    done = server.post("/v1/completions", {"prompt": "Hi there", "max_tokens": 64, "seed": 3, "temperature": 1.0})
    assert done.status_code == 200
    response = server.post("/v1/responses", {"input": "Hello", "max_output_tokens": 4})
    assert response.status_code == 200
    stop_checked(server)
    lines = _lines(server.stderr)
    assert len(lines) == 4, server.stderr[-3000:]
    first, refused, third, fourth = lines
    body, t = ok.json(), ok.json()["timings"]
    assert first["id"] == "1" and first["endpoint"] == "chat" and first["status"] == "200"
    assert first["outcome"] == body["choices"][0]["finish_reason"] == "length"
    assert int(first["tokens_in"]) == body["usage"]["prompt_tokens"]
    assert int(first["tokens_out"]) == body["usage"]["completion_tokens"] == 5
    # The same clock readings as the answer's timings, rounded to 0.1 ms.
    for key, field in (("queue_ms", "queued_ms"), ("prompt_ms", "prompt_ms"), ("decode_ms", "decode_ms")):
        assert abs(float(first[key]) - t[field]) <= 0.051, (key, first[key], t[field])
    assert refused == {**refused, "id": "-", "status": "400", "outcome": "invalid", "tokens_out": "0"}
    body3 = done.json()
    assert third["id"] == "2" and third["endpoint"] == "completions"
    assert third["outcome"] == body3["choices"][0]["finish_reason"]
    assert int(third["tokens_out"]) == body3["usage"]["completion_tokens"]
    assert fourth["id"] == "3" and fourth["endpoint"] == "responses" and fourth["outcome"] == "length"
    assert int(fourth["tokens_out"]) == response.json()["usage"]["output_tokens"] == 4


def test_without_verbose_no_request_lines(native_server_dist, tiny_model, start_server):
    server = start_server(native_server_dist / "colibri-server", tiny_model)
    assert server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                "max_tokens": 2}).status_code == 200
    stop_checked(server)
    assert _lines(server.stderr) == []


def test_verbose_counts_a_client_that_left_and_a_full_queue(native_server_dist, tiny_model, start_server):
    """A request refused for a full queue logs 429; one whose client left
    while it waited logs 499 (nginx's 'client closed request')."""
    server = start_server(native_server_dist / "colibri-server", tiny_model, "--verbose", "--slots", "1",
                          "--queue", "1")
    body = _json.dumps({"prompt": "a", "max_tokens": 200, "ignore_eos": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    running = socket.create_connection(("127.0.0.1", server.port))
    running.sendall(head + body)
    waiting = socket.create_connection(("127.0.0.1", server.port))
    waiting.sendall(head + body)
    refused = server.post("/v1/completions", {"prompt": "b", "max_tokens": 1})
    waiting.close()
    running.settimeout(60)
    got = b""
    while b"chat" not in got and b"text_completion" not in got:
        chunk = running.recv(65536)
        if not chunk:
            break
        got += chunk
    running.close()
    stop_checked(server)
    assert refused.status_code == 429, refused.text
    lines = _lines(server.stderr)
    outcomes = sorted((line["status"], line["outcome"], line["id"]) for line in lines)
    assert outcomes == [("200", "length", "1"), ("429", "queue-full", "-"), ("499", "closed-in-queue", "2")], \
        server.stderr[-3000:]
    assert next(line for line in lines if line["id"] == "1")["tokens_out"] == "200"
