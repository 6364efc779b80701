"""Bad input and bad clients: every malformed request gets an OpenAI-shaped
error naming the problem, slow or vanishing clients are cut off by time
limits without harming the server, a connection past the limit takes an idle one's slot,
the API key is enforced on /v1/, and SIGTERM finishes running requests.
Runs against the normal and the sanitizer build."""

import json
import re
import signal
import subprocess
import socket
import time

import pytest
import requests

from conftest import RunningServer, sse_events, stop_checked

pytestmark = pytest.mark.slow

HELLO = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
TIMEOUT_MS = 400


@pytest.fixture(scope="module")
def server(server_exe, tiny_model):
    srv = RunningServer(server_exe, tiny_model, "--threads", "2", "--request-timeout-ms", str(TIMEOUT_MS),
                        "--max-conns", "6")
    yield srv
    stop_checked(srv)


def post_raw(server, path, data: bytes):
    return requests.post(server.url + path, data=data, headers={"Content-Type": "application/json"}, timeout=30)


def error_of(reply, status):
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    return error["message"]


CHAT_ERRORS = [
    (b"{\"messages\": [", "not valid JSON"),
    (b"\"just a string\"", "must be a JSON object"),
    (json.dumps({"messages": "hi"}).encode(), "'messages' must be an array"),
    (json.dumps({"messages": []}).encode(), "'messages' must not be empty"),
    (json.dumps({"messages": [7]}).encode(), "'messages[0]' must be an object"),
    (json.dumps({"messages": [{"role": "user"}]}).encode(), "'messages[0].content'"),
    (json.dumps({**HELLO, "temperature": "hot"}).encode(), "'temperature' must be a number from 0 to 2"),
    (json.dumps({**HELLO, "temperature": 3}).encode(), "'temperature'"),
    (json.dumps({**HELLO, "top_p": 0}).encode(), "'top_p'"),
    (json.dumps({**HELLO, "top_k": -1}).encode(), "'top_k'"),
    (json.dumps({**HELLO, "seed": 1.5}).encode(), "'seed' must be an integer"),
    (json.dumps({**HELLO, "max_tokens": 0}).encode(), "'max_tokens'"),
    (json.dumps({**HELLO, "stream": "yes"}).encode(), "'stream' must be true or false"),
    (json.dumps({**HELLO, "stop": 5}).encode(), "'stop' must be a string or an array"),
    (json.dumps({**HELLO, "stop": ["a", "b", "c", "d", "e"]}).encode(), "at most 4"),
    (json.dumps({**HELLO, "top_logprobs": 3}).encode(), "needs 'logprobs'"),
    (json.dumps({**HELLO, "n": 1000}).encode(), "'n' is 1000; this server runs at most"),
    (json.dumps({**HELLO, "n": 0}).encode(), "'n' must be an integer from 1"),
    (json.dumps({**HELLO, "functions": [{"name": "f"}], "suffix": "x"}).encode(),
     "unsupported parameters: functions, suffix"),
    (json.dumps({**HELLO, "tools": [{"type": "function"}]}).encode(), "'tools[0]' must be"),
    (json.dumps({**HELLO, "tools": [{"type": "function", "function": {"name": "f"}}]}).encode(),
     "'tools' needs the model's chat template"),
    (json.dumps({**HELLO, "tool_choice": "sometimes"}).encode(), "'tool_choice' must be"),
    (json.dumps({**HELLO, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "pattern": "a+"}}}}).encode(),
     "'response_format': the JSON Schema keyword 'pattern' is not supported"),
    (json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}).encode(),
     "maximum context length is 256 tokens"),
]


@pytest.mark.parametrize("body, fragment", CHAT_ERRORS, ids=[f for _, f in CHAT_ERRORS])
def test_bad_chat_requests(server, body, fragment):
    message = error_of(post_raw(server, "/v1/chat/completions", body), 400)
    assert fragment in message


COMPLETION_ERRORS = [
    ({"max_tokens": 2}, "'prompt' is required"),
    ({"prompt": []}, "'prompt' must not be empty"),
    ({"prompt": [1, 2.5]}, "'prompt[1]' must be a token id"),
    ({"prompt": [99999]}, "'prompt[0]' must be a token id from 0 to 261"),
    ({"prompt": list(range(256))}, "your prompt resulted in 256 tokens, which leaves no room for the completion "
                                   "(at most 255 prompt tokens)"),
    ({"prompt": "y" * 300}, "maximum context length is 256 tokens"),
    ({"prompt": "x", "echo": True, "suffix": "z"}, "unsupported parameters: suffix, echo"),
    ({"prompt": "x", "logprobs": 9}, "'logprobs' must be an integer from 0 to 5"),
]


@pytest.mark.parametrize("body, fragment", COMPLETION_ERRORS, ids=[f for _, f in COMPLETION_ERRORS])
def test_bad_completion_requests(server, body, fragment):
    assert fragment in error_of(post_raw(server, "/v1/completions", json.dumps(body).encode()), 400)


def test_unknown_fields_and_harmless_extras_are_ignored(server):
    body = {**HELLO, "user": "u1", "metadata": {"k": "v"}, "something_new": [1, {"x": None}],
            "temperature": None, "logit_bias": {}, "n": 1, "response_format": {"type": "text"}}
    reply = server.post("/v1/chat/completions", body)
    assert reply.status_code == 200, reply.text


def test_a_body_over_the_limit_gets_413(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\n\r\n{")
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 413") and b"over the limit" in reply
    assert server.post("/v1/chat/completions", HELLO).status_code == 200


def closed_within(sock: socket.socket, seconds: float) -> float:
    """Waits for the server to close the connection; returns how long it took."""
    start = time.monotonic()
    sock.settimeout(seconds)
    data = b""
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            return time.monotonic() - start
        data += chunk


def test_a_client_sending_headers_byte_by_byte_is_cut_off(server):
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        try:
            for byte in head:
                sock.sendall(bytes([byte]))
                time.sleep(0.02)
        except (BrokenPipeError, ConnectionResetError):
            pass
        closed_within(sock, 5)
    assert time.monotonic() - start < TIMEOUT_MS / 1000 + 2
    assert server.post("/v1/chat/completions", HELLO).status_code == 200


def test_a_client_that_stops_mid_body_is_cut_off(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mess")
        took = closed_within(sock, 5)
    assert TIMEOUT_MS / 1000 * 0.8 < took < TIMEOUT_MS / 1000 + 2
    assert server.post("/v1/chat/completions", HELLO).status_code == 200


def test_a_connection_past_the_limit_takes_the_slot_of_an_idle_one(server):
    """The table is full of kept-alive idle connections: a newcomer is
    served and the one idle longest is closed for it (a table full of busy
    ones: test_server_protocol.py)."""
    idle = []
    try:
        for _ in range(6):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            idle.append(sock)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = extra.recv(4096)
            assert reply.startswith(b"HTTP/1.1 200") and b"Connection: keep-alive" in reply
        idle[0].settimeout(5)
        assert idle[0].recv(4096) == b""
    finally:
        for sock in idle:
            sock.close()
    assert server.post("/v1/chat/completions", HELLO).status_code == 200


def test_api_key(server_exe, tiny_model):
    srv = RunningServer(server_exe, tiny_model, "--api-key", "s3cret")
    try:
        assert requests.get(srv.url + "/health", timeout=10).status_code == 200
        assert "API key" in error_of(requests.get(srv.url + "/v1/models", timeout=10), 401)
        wrong = {"Authorization": "Bearer s3cres"}
        assert srv.post("/v1/chat/completions", HELLO, headers=wrong).status_code == 401
        right = {"Authorization": "Bearer s3cret"}
        assert requests.get(srv.url + "/v1/models", headers=right, timeout=10).status_code == 200
        assert srv.post("/v1/chat/completions", HELLO, headers=right).status_code == 200
    finally:
        stop_checked(srv)


def test_kv_cache_f16_halves_the_reserved_cache(server_exe, tiny_model):
    """--kv-cache f16 halves the reserved cache and answers; a bad value is
    refused at start with the flag, the value and what is expected."""
    body = {"prompt": [5, 6, 7, 8, 9, 10], "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    reserved = {}
    for kind in ("f32", "f16"):
        srv = RunningServer(server_exe, tiny_model, "--kv-cache", kind)
        try:
            reply = srv.post("/v1/completions", body).json()
            assert reply["usage"]["completion_tokens"] == 4
            reserved[kind] = float(re.search(rf"KV cache {kind} ([0-9.]+) MiB", srv.startup).group(1))
        finally:
            stop_checked(srv)
    assert reserved["f16"] * 2 == pytest.approx(reserved["f32"], rel=1e-3)
    srv = RunningServer(server_exe, tiny_model)  # unless told: f32 for f32 weights (f16 for others: test_engine)
    try:
        assert f"KV cache f32 {reserved['f32']:.1f} MiB" in srv.startup
    finally:
        stop_checked(srv)
    bad = subprocess.run([str(server_exe), "--model", str(tiny_model), "--kv-cache", "f8"], capture_output=True,
                         text=True, timeout=30)
    assert bad.returncode == 2 and "--kv-cache: got 'f8', expected f32, f16 or f16-llama" in bad.stderr


def stream_then_sigterm(srv, max_tokens):
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True}
    with requests.post(srv.url + "/v1/chat/completions", json=body, stream=True, timeout=30) as reply:
        assert reply.status_code == 200
        srv.proc.send_signal(signal.SIGTERM)
        try:
            return sse_events(reply)
        except requests.exceptions.ChunkedEncodingError:
            return None  # cut off


def test_sigterm_lets_running_requests_finish(server_exe, tiny_model):
    srv = RunningServer(server_exe, tiny_model, "--grace-ms", "20000")
    events = stream_then_sigterm(srv, 200)
    assert events is not None and events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    stop_checked(srv)  # already stopping: exit code 0, no sanitizer report


def test_sigterm_after_the_grace_period_cancels(server_exe, tiny_model):
    """The cut stream ends with an error event, then [DONE] (before: the
    connection was closed mid-stream, which clients report as a broken
    connection). tests/test_server_api_gaps.py checks it with the openai
    client."""
    srv = RunningServer(server_exe, tiny_model, "--grace-ms", "0")
    events = stream_then_sigterm(srv, 240)
    assert events is not None and events[-1] == "[DONE]"
    if "error" in events[-2]:  # cut (else it finished before the signal was read)
        assert events[-2]["error"]["type"] == "server_error" and "shut down" in events[-2]["error"]["message"]
    stop_checked(srv)  # already stopping: exit code 0, no sanitizer report
