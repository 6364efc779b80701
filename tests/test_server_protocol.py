"""The server's HTTP protocol edges (issue 17): a full connection table
never locks out health checks or new clients, /metrics takes a key,
HEAD and absolute-form targets work, time limits answer 408, keys can stay
out of the process list, and every error names its own cause. Runs against
the normal and the sanitizer build."""

import json
import signal
import socket
import subprocess
import time

import pytest
import requests

from conftest import RunningServer, sse_events, stop_checked

pytestmark = pytest.mark.slow

HELLO = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}


def error_of(reply, status):
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    return error["message"]


def connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def read_head(sock: socket.socket, buf: bytearray) -> tuple[int, dict]:
    """Reads one response head from sock (bytes beyond it stay in buf)."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response head: {bytes(buf)!r}"
        buf += chunk
    end = buf.index(b"\r\n\r\n")
    lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
    del buf[:end + 4]
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), headers


def read_response(sock: socket.socket, buf: bytearray) -> tuple[int, dict, bytes]:
    """One Content-Length response."""
    status, headers = read_head(sock, buf)
    n = int(headers["content-length"])
    while len(buf) < n:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside a body"
        buf += chunk
    body = bytes(buf[:n])
    del buf[:n]
    return status, headers, body


def exchange(sock: socket.socket, request: bytes) -> tuple[int, dict, bytes]:
    sock.sendall(request)
    return read_response(sock, bytearray())


def closed_by_server(sock: socket.socket, seconds: float = 5) -> bytes:
    """Everything the server still sends before it closes the connection."""
    sock.settimeout(seconds)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


# ---- item 6: a full connection table ----

MAX_CONNS = 4


@pytest.fixture(scope="module")
def small_server(server_exe, tiny_model):
    srv = RunningServer(server_exe, tiny_model, "--threads", "2", "--max-conns", str(MAX_CONNS),
                        "--request-timeout-ms", "60000")
    yield srv
    stop_checked(srv)


def test_idle_keep_alive_connections_do_not_lock_anyone_out(small_server):
    """Twice as many idle keep-alive connections as slots: each newcomer
    takes the slot of the longest-idle one, and the ones closed for it are
    the oldest. Before: the fifth got 503 for 30 s (the idle timeout)."""
    idle = []
    try:
        for i in range(2 * MAX_CONNS):
            sock = connect(small_server)
            status, headers, _ = exchange(sock, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status == 200, f"connection {i} got {status}"
            assert headers["connection"] == "keep-alive"
            idle.append(sock)
        # The first MAX_CONNS were closed (oldest first) to make room.
        for sock in idle[:MAX_CONNS]:
            assert closed_by_server(sock) == b""
        assert requests.get(small_server.url + "/health", timeout=10).status_code == 200
        assert small_server.post("/v1/chat/completions", HELLO).status_code == 200
    finally:
        for sock in idle:
            sock.close()


def test_health_answers_when_every_connection_is_busy(small_server):
    """Every slot holds a request mid-body: /health is still answered (on a
    spare entry, then closed) and other requests get an OpenAI-shaped 503
    with Retry-After. Before: 503 for /health too."""
    busy = []
    try:
        for _ in range(MAX_CONNS):
            sock = connect(small_server)
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mess")
            busy.append(sock)
        time.sleep(0.2)
        with connect(small_server) as sock:
            status, headers, body = exchange(sock, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status == 200 and json.loads(body)["status"] == "ok"
            assert headers["connection"] == "close"
        with connect(small_server) as sock:
            status, headers, body = exchange(sock, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status == 503 and headers["retry-after"] == "1"
            assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}
    finally:
        for sock in busy:
            sock.close()
    assert small_server.post("/v1/chat/completions", HELLO).status_code == 200


def test_health_answers_while_every_connection_streams(server_exe, tiny_model):
    """Every connection streams a generation: /health answers at once."""
    srv = RunningServer(server_exe, tiny_model, "--threads", "2", "--max-conns", "2")
    body = {**HELLO, "max_tokens": 200, "stream": True, "ignore_eos": True}
    try:
        streams = [requests.post(srv.url + "/v1/chat/completions", json=body, stream=True, timeout=60)
                   for _ in range(2)]
        try:
            assert all(s.status_code == 200 for s in streams)
            reply = requests.get(srv.url + "/health", timeout=10)
            assert reply.status_code == 200 and reply.json()["status"] == "ok"
            for s in streams:
                assert sse_events(s)[-1] == "[DONE]"
        finally:
            for s in streams:
                s.close()
    finally:
        stop_checked(srv)


def test_max_conns_is_clamped_to_the_descriptor_limit(server_exe, tiny_model):
    """With a hard limit of 200 descriptors, --max-conns 1000 is clamped
    (and said so) rather than failing accept() later; the server serves."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, 200))

    proc = subprocess.Popen([str(server_exe), "--model", str(tiny_model), "--port", "0", "--max-conns", "1000"],
                            stderr=subprocess.PIPE, text=True, preexec_fn=limit)
    try:
        seen = ""
        while "listening on" not in seen:
            line = proc.stderr.readline()
            assert line, seen
            seen += line
        assert "--max-conns 1000 needs 1072 file descriptors but the limit (ulimit -n) is 200: " \
               "serving 128 connections" in seen
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
    assert proc.returncode == 0


# ---- item 8: keys, HEAD, absolute-form, 408, /tokenize ----

@pytest.fixture(scope="module")
def server(server_exe, tiny_model):
    srv = RunningServer(server_exe, tiny_model, "--threads", "2", "--request-timeout-ms", "400")
    yield srv
    stop_checked(srv)


@pytest.mark.parametrize("path", ["/health", "/v1/models", "/metrics"])
def test_head_is_get_without_the_body(server, path):
    """HEAD gets GET's status and headers, Content-Length included, and no
    body: the GET pipelined behind it is the next thing on the wire.
    Before: 405."""
    with connect(server) as sock:
        get_status, get_headers, get_body = exchange(sock, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        sock.sendall(f"HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        buf = bytearray()
        status, headers = read_head(sock, buf)
        assert status == get_status == 200
        assert headers["content-type"] == get_headers["content-type"]
        # /metrics grows between the two answers (it counts the GET).
        if path != "/metrics":
            assert headers["content-length"] == get_headers["content-length"] == str(len(get_body))
        status, _, body = read_response(sock, buf)
        assert status == 200 and json.loads(body)["status"] == "ok"


def test_post_endpoints_do_not_answer_head_and_say_what_is_allowed(server):
    reply = requests.head(server.url + "/v1/chat/completions", timeout=10)
    assert reply.status_code == 405 and reply.headers["allow"] == "POST"
    reply = requests.put(server.url + "/health", timeout=10)
    assert reply.status_code == 405 and reply.headers["allow"] == "GET, HEAD"
    assert "not allowed" in error_of(reply, 405)


def test_absolute_form_targets_route_like_their_path(server):
    """RFC 9112 3.2.2: a server must accept absolute-form targets. Before:
    404 'no such endpoint'."""
    with connect(server) as sock:
        host = f"127.0.0.1:{server.port}"
        status, _, body = exchange(sock, f"GET http://{host}/health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        assert status == 200 and json.loads(body)["status"] == "ok"
        payload = json.dumps(HELLO).encode()
        status, _, body = exchange(sock, f"POST http://{host}/v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
                                         f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
                                         .encode() + payload)
        assert status == 200 and json.loads(body)["object"] == "chat.completion"


@pytest.mark.parametrize("partial", [b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n",
                                     b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"me"],
                         ids=["head", "body"])
def test_a_request_cut_off_by_the_timeout_gets_408(server, partial):
    """Before: closed without a word."""
    with connect(server) as sock:
        sock.sendall(partial)
        data = closed_by_server(sock)
    assert data.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), data
    assert b"Connection: close\r\n" in data and b"within 400 ms" in data


def test_a_quiet_connection_is_closed_silently(server):
    """Nothing of a request arrived: no 408, just the close (RFC 9110 allows it)."""
    with connect(server) as sock:
        assert closed_by_server(sock) == b""


def test_tokenize_of_a_huge_text_is_413_naming_the_limit(server):
    """A text whose token list does not fit the answer: 413 with the count
    and the limit. Before: 500 'response too large'."""
    reply = server.post("/tokenize", {"content": "x" * 300000})
    message = error_of(reply, 413)
    assert "'content' is 300000 tokens; /tokenize answers at most 262128 at once" in message
    assert len(server.post("/tokenize", {"content": "x" * 200000}).json()["tokens"]) == 200000


def keyed_server(server_exe, tiny_model, *args, env=None):
    return RunningServer(server_exe, tiny_model, "--threads", "2", *args, env=env)


def status(srv, path, key=None, scheme="Bearer"):
    headers = {"Authorization": f"{scheme} {key}"} if key else {}
    return requests.get(srv.url + path, headers=headers, timeout=10).status_code


def test_metrics_needs_the_api_key(server_exe, tiny_model):
    """/metrics shows traffic and per-layer expert counts: with --api-key it
    needs the key; /health stays open. Before: /metrics answered anyone."""
    srv = keyed_server(server_exe, tiny_model, "--api-key", "k1")
    try:
        assert status(srv, "/metrics") == 401
        assert status(srv, "/metrics", "wrong") == 401
        assert status(srv, "/metrics", "k1") == 200
        assert status(srv, "/health") == 200
    finally:
        stop_checked(srv)


def test_metrics_key_and_metrics_public(server_exe, tiny_model):
    srv = keyed_server(server_exe, tiny_model, "--api-key", "k1", "--metrics-key", "m1")
    try:
        assert status(srv, "/metrics") == 401
        assert status(srv, "/metrics", "m1") == 200
        assert status(srv, "/metrics", "k1") == 200
        assert status(srv, "/v1/models", "m1") == 401  # the metrics key opens /metrics only
    finally:
        stop_checked(srv)
    srv = keyed_server(server_exe, tiny_model, "--api-key", "k1", "--metrics-public")
    try:
        assert status(srv, "/metrics") == 200
        assert status(srv, "/v1/models") == 401
    finally:
        stop_checked(srv)


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer  "])
def test_the_bearer_scheme_is_case_insensitive(server_exe, tiny_model, scheme):
    """RFC 9110 11.1: auth schemes are case-insensitive. Before: 401."""
    srv = keyed_server(server_exe, tiny_model, "--api-key", "k1")
    try:
        assert status(srv, "/v1/models", "k1", scheme) == 200
        assert status(srv, "/v1/models", "k2", scheme) == 401
    finally:
        stop_checked(srv)


def test_api_key_from_a_file_or_the_environment(server_exe, tiny_model, tmp_path):
    """--api-key-file keeps the key out of ps; either flag overrides
    $COLIBRI_API_KEY."""
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    srv = keyed_server(server_exe, tiny_model, "--api-key-file", str(key_file), env={"COLIBRI_API_KEY": "env"})
    try:
        assert "from-file" not in " ".join(srv.proc.args)
        assert status(srv, "/v1/models", "from-file") == 200
        assert status(srv, "/v1/models", "env") == 401
    finally:
        stop_checked(srv)
    srv = keyed_server(server_exe, tiny_model, env={"COLIBRI_API_KEY": "env"})
    try:
        assert status(srv, "/v1/models", "env") == 200
        assert status(srv, "/v1/models") == 401
    finally:
        stop_checked(srv)


@pytest.mark.parametrize("args, message", [
    (["--api-key-file", "/nonexistent/key"], "--api-key-file: cannot open '/nonexistent/key'"),
    (["--api-key", "a", "--api-key-file", "/dev/null"], "--api-key and --api-key-file both given"),
    (["--api-key-file", "/dev/null"], "'/dev/null': the first line holds no key"),
    # An empty key used to turn authentication off without a word.
    (["--api-key", ""], "--api-key: the key is empty"),
    (["--api-key", "k", "--metrics-key", ""], "--metrics-key: the key is empty"),
])
def test_bad_key_flags_are_refused_at_start(server_exe, tiny_model, args, message):
    done = subprocess.run([str(server_exe), "--model", str(tiny_model), *args], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2 and message in done.stderr, done.stderr


# ---- item 9: each error names its own cause ----

def test_a_role_error_does_not_blame_the_context(server):
    body = {"messages": [{"role": "wizard", "content": "hi"}], "max_tokens": 2}
    message = error_of(server.post("/v1/chat/completions", body), 400)
    assert message == "messages[0].role: got 'wizard', expected system, user or assistant"


def test_a_long_prompt_says_how_long_it_is(server):
    message = error_of(server.post("/v1/completions", {"prompt": "y" * 300}), 400)
    assert message == ("This model's maximum context length is 256 tokens. However, your prompt resulted in 301 "
                       "tokens, which leaves no room for the completion (at most 255 prompt tokens). Please reduce "
                       "the length of the prompt.")
    body = {"messages": [{"role": "user", "content": "x" * 300}], "max_tokens": 2}
    message = error_of(server.post("/v1/chat/completions", body), 400)
    assert "However, your messages resulted in 30" in message and "(at most 255 prompt tokens)" in message


@pytest.fixture(scope="module")
def model_without_tokenizer(tiny_model, tmp_path_factory):
    """The tiny model as a conversion without a tokenizer writes it (kind
    'none' in the config and the weights header)."""
    from colibri_build import config as config_mod
    from colibri_build.synth import random_tensors
    from colibri_build.weights import write_weights

    folder = tmp_path_factory.mktemp("no-tokenizer")
    cfg = json.loads((tiny_model / "model-config.json").read_text())
    cfg["tokenizer"] = {"kind": "none", "bos_id": 256, "eos_id": 257}
    cfg = config_mod.validate(cfg, source="test")
    cfg["weights"]["sha256"] = write_weights(cfg, folder / cfg["weights"]["file"], random_tensors(cfg, cfg["seed"]))
    (folder / "model-config.json").write_text(json.dumps(cfg))
    return folder


def test_a_model_without_tokenizer_says_so(server_exe, model_without_tokenizer):
    """Before: a text prompt got 'the prompt is longer than 255 tokens', a
    chat 'this model has no chat template ... (context_length 256, ...)',
    /detokenize an empty text."""
    srv = RunningServer(server_exe, model_without_tokenizer, "--threads", "2")
    try:
        for path, body in [("/v1/completions", {"prompt": "hello", "max_tokens": 2}),
                           ("/v1/chat/completions", HELLO),
                           ("/tokenize", {"content": "hello"}),
                           ("/detokenize", {"tokens": [1, 2]}),
                           ("/apply-template", {"messages": HELLO["messages"]})]:
            message = error_of(srv.post(path, body), 400)
            assert "converted without one" in message and "context_length" not in message, (path, message)
        reply = srv.post("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2, "ignore_eos": True})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 2
    finally:
        stop_checked(srv)


def test_health_says_503_while_the_server_stops(server_exe, tiny_model):
    """SIGTERM with a stream running: /health must turn 503 ("draining"), so
    a load balancer or readiness probe that reads only the status code stops
    sending work that would get 503. Before: 200 with "draining" in the body.
    The server is SIGSTOPped while the signal and the health check arrive, so
    the stream is still running (within --grace-ms) when it answers."""
    srv = RunningServer(server_exe, tiny_model, "--threads", "1", "--grace-ms", "30000")
    try:
        body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 240, "ignore_eos": True,
                "stream": True}
        with requests.post(srv.url + "/v1/chat/completions", json=body, stream=True, timeout=30) as stream:
            lines = stream.iter_lines()
            assert next(line for line in lines if line).startswith(b"data: ")
            srv.proc.send_signal(signal.SIGSTOP)
            try:
                srv.proc.send_signal(signal.SIGTERM)
                sock = connect(srv)
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            finally:
                srv.proc.send_signal(signal.SIGCONT)
            status, _, payload = read_response(sock, bytearray())
            sock.close()
            assert json.loads(payload)["status"] == "draining"
            assert status == 503
            rest = [line for line in lines if line]
            assert rest[-1] == b"data: [DONE]"  # the running stream still finishes
    finally:
        stop_checked(srv)  # exit 0 (the drain ended) and no sanitizer report
