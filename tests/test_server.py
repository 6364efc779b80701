"""The built server end to end: health, models, chat completions with
expert_activations (raw HTTP and the real openai client), agreement with the
in-process engine, and OpenAI-shaped errors."""

import json
import signal
import socket

import numpy as np
import openai
import pytest
import requests

from colibri_build import Engine

pytestmark = pytest.mark.slow

HELLO = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16}


@pytest.fixture(scope="module")
def server(server_exe, tiny_model):
    from conftest import RunningServer, stop_checked
    srv = RunningServer(server_exe, tiny_model, "--threads", "2")
    yield srv
    stop_checked(srv)


def test_health_and_models(server, tiny_config):
    health = requests.get(server.url + "/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert health.json()["slots"] == tiny_config["batch_slots"]
    models = requests.get(server.url + "/v1/models", timeout=10).json()
    assert models["object"] == "list" and models["data"][0]["id"] == tiny_config["name"]


def test_chat_completion_carries_expert_activations(server, tiny_config):
    reply = server.post("/v1/chat/completions", HELLO)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["object"] == "chat.completion" and body["model"] == tiny_config["name"]
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    # BOS, <user>, 5 bytes, <end_of_turn>, <assistant>
    assert usage["prompt_tokens"] == 9
    assert 1 <= usage["completion_tokens"] <= 16
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    layers = body["expert_activations"]
    assert [entry["layer"] for entry in layers] == list(range(tiny_config["layers"]))
    fed = usage["total_tokens"] - 1  # the last generated token is never fed back
    for entry in layers:
        assert all(0 <= e < tiny_config["experts"] for e in entry["experts"])
        assert entry["experts"] == sorted(set(entry["experts"]))
        assert sum(entry["counts"]) == fed * tiny_config["top_k"]


def test_server_agrees_with_the_python_engine(server, tiny_model, tiny_config):
    reply = server.post("/v1/chat/completions", {**HELLO, "max_tokens": 12, "colibri_trace": True}).json()
    trace = reply["colibri_trace"]
    engine = Engine(tiny_model)
    prompt, completion = trace["prompt_tokens"], trace["completion_tokens"]
    assert engine.generate_ids(prompt, max_tokens=12) == completion
    fed = prompt + completion[:-1]
    logits = engine.forward(fed)
    for i, token in enumerate(completion):
        row = logits[len(prompt) - 1 + i]
        assert int(np.argmax(row)) == token
        assert abs(row[token] - trace["completion_logits"][i]) <= 1e-5 * max(1.0, abs(row[token]))
    np.testing.assert_array_equal(np.array(trace["experts"]), engine.last_routing)
    counts = np.zeros((tiny_config["layers"], tiny_config["experts"]), int)
    for layer_experts in engine.last_routing:
        for layer, chosen in enumerate(layer_experts):
            counts[layer, chosen] += 1
    for entry in reply["expert_activations"]:
        expected = {e: int(c) for e, c in enumerate(counts[entry["layer"]]) if c}
        assert dict(zip(entry["experts"], entry["counts"])) == expected


def test_outputs_are_deterministic(server):
    a = server.post("/v1/chat/completions", {**HELLO, "colibri_trace": True}).json()
    b = server.post("/v1/chat/completions", {**HELLO, "colibri_trace": True}).json()
    assert a["colibri_trace"] == b["colibri_trace"]
    assert a["choices"] == b["choices"]


def test_openai_client(server, tiny_config):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    completion = client.chat.completions.create(
        model=tiny_config["name"], messages=[{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "Hi"}], max_tokens=8)
    assert completion.choices[0].message.role == "assistant"
    assert completion.usage.completion_tokens <= 8
    assert len(completion.model_extra["expert_activations"]) == tiny_config["layers"]
    assert [m.id for m in client.models.list()] == [tiny_config["name"]]


@pytest.mark.parametrize("body, status, fragment", [
    (b"{not json", 400, "not valid JSON"),
    (b"[]", 400, "must be a JSON object"),
    (json.dumps({"max_tokens": 4}).encode(), 400, "'messages' is required"),
    (json.dumps({"messages": []}).encode(), 400, "must not be empty"),
    (json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(), 400, "messages[0].content"),
    (json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode(), 400, "messages[0].role"),
    (json.dumps({**HELLO, "max_tokens": "many"}).encode(), 400, "'max_tokens'"),
    (json.dumps({**HELLO, "messages": [{"role": "user", "content": "x" * 5000}]}).encode(), 400,
     "maximum context length"),
])
def test_bad_requests_get_openai_shaped_errors(server, body, status, fragment):
    reply = requests.post(server.url + "/v1/chat/completions", data=body,
                          headers={"Content-Type": "application/json"}, timeout=10)
    assert reply.status_code == status
    error = reply.json()["error"]
    assert fragment in error["message"] and error["type"] == "invalid_request_error"


def test_unknown_path_and_wrong_method(server):
    assert requests.get(server.url + "/v2/nothing", timeout=10).status_code == 404
    assert requests.get(server.url + "/v1/chat/completions", timeout=10).status_code == 405


def test_a_client_that_leaves_mid_request_does_not_harm_the_server(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mess")
    assert server.post("/v1/chat/completions", HELLO).status_code == 200


def test_sigterm_stops_the_server_cleanly(native_server_dist, tiny_model, start_server):
    srv = start_server(native_server_dist / "colibri-server", tiny_model)
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=10) == 0
