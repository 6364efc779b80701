"""POST /v1/responses (OpenAI's Responses API) against the built server,
plain and AddressSanitizer builds, with the real openai client: the same
tokens as the chat completion the request means, the response object and
its stream events (sequence numbers, item ids shared by the stream and the
final response, the SDK's own stream helper), and a 400 naming the field
for what the server cannot honour. Tool calls and reasoning items:
test_tool_calls.py and test_server_api_gaps.py."""

from __future__ import annotations

import json
import random
import signal

import openai
import pytest
import requests

from conftest import RunningServer, responses_events, stop_checked

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def server(server_exe, tiny_model):
    srv = RunningServer(server_exe, tiny_model, "--threads", "2")
    yield srv
    stop_checked(srv)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_a_response_is_the_chat_completion_it_means(server, client):
    """Instructions and input become the messages; the output text, token
    counts and finish are the chat answer's."""
    messages = [{"role": "system", "content": "Be brief."}, *HELLO]
    chat = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 9, "colibri_trace": True}).json()
    got = server.post("/v1/responses", {"instructions": "Be brief.", "input": "Hello", "max_output_tokens": 9,
                                        "colibri_trace": True})
    assert got.status_code == 200, got.text
    r = got.json()
    assert r["object"] == "response" and r["id"].startswith("resp_") and r["model"] == chat["model"]
    assert r["colibri_trace"]["prompt_tokens"] == chat["colibri_trace"]["prompt_tokens"]
    assert r["colibri_trace"]["completion_tokens"] == chat["colibri_trace"]["completion_tokens"]
    (item,) = r["output"]
    assert item["type"] == "message" and item["role"] == "assistant"
    assert item["content"][0]["type"] == "output_text"
    assert item["content"][0]["text"] == chat["choices"][0]["message"]["content"]
    # 9 tokens without an end: cut by max_output_tokens, as OpenAI reports it
    assert chat["choices"][0]["finish_reason"] == "length"
    assert (r["status"], r["incomplete_details"], item["status"]) == \
        ("incomplete", {"reason": "max_output_tokens"}, "incomplete")
    assert r["max_output_tokens"] == 9
    usage = chat["usage"]
    assert r["usage"]["input_tokens"] == usage["prompt_tokens"]
    assert r["usage"]["output_tokens"] == usage["completion_tokens"] == 9
    assert r["usage"]["total_tokens"] == usage["total_tokens"]
    assert [a["layer"] for a in r["expert_activations"]] == [a["layer"] for a in chat["expert_activations"]]
    # Input as items with text parts (and a past assistant turn) is the same conversation.
    turns = [*HELLO, {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Again"}]
    chat = server.post("/v1/chat/completions", {"messages": turns, "max_tokens": 5, "colibri_trace": True}).json()
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hel"},
                                                             {"type": "input_text", "text": "lo"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi."}]},
             {"role": "user", "content": "Again"}]
    r = server.post("/v1/responses", {"input": items, "max_output_tokens": 5, "colibri_trace": True}).json()
    assert r["colibri_trace"]["prompt_tokens"] == chat["colibri_trace"]["prompt_tokens"]
    assert r["output"][0]["content"][0]["text"] == chat["choices"][0]["message"]["content"]


def test_the_openai_sdk_reads_responses_streamed_and_not(server, client):
    plain = client.responses.create(model="tiny", input="Hello", max_output_tokens=12, temperature=0.7,
                                    extra_body={"seed": 3})
    assert plain.status == "incomplete" and plain.output_text and plain.usage.output_tokens == 12
    assert plain.temperature == pytest.approx(0.7)
    kinds, text, last = [], "", None
    for event in client.responses.create(model="tiny", input="Hello", max_output_tokens=12, temperature=0.7,
                                         extra_body={"seed": 3}, stream=True):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        last = event
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert text == plain.output_text == last.response.output_text  # the same seed, the same tokens
    assert [(o.type, o.status) for o in last.response.output] == [(o.type, o.status) for o in plain.output]


def test_text_format_constrains_the_output_for_the_sdks_parse(client):
    """responses.parse with a pydantic model sends text.format json_schema
    (strict); the output is that schema's JSON, parsed by the SDK."""
    pydantic = pytest.importorskip("pydantic")

    class City(pydantic.BaseModel):
        name: str
        population: int

    reply = client.responses.parse(model="tiny", input="A city", text_format=City, max_output_tokens=60)
    assert reply.status == "completed" and isinstance(reply.output_parsed, City)
    assert City.model_validate_json(reply.output_text) == reply.output_parsed
    assert reply.text.format.type == "json_schema"


def test_stream_events_name_one_item_from_start_to_end(server):
    events = responses_events(server, {"input": "Hello", "max_output_tokens": 7})
    names = [n for n, _ in events]
    assert names[0] == "response.created" and names[-1] == "response.incomplete"
    assert events[0][1]["response"]["status"] == "in_progress" and events[0][1]["response"]["output"] == []
    added = [p for n, p in events if n == "response.output_item.added"]
    done = [p for n, p in events if n == "response.output_item.done"]
    assert len(added) == len(done) == 1 and added[0]["item"]["id"] == done[0]["item"]["id"]
    item_id = added[0]["item"]["id"]
    deltas = [p for n, p in events if n == "response.output_text.delta"]
    assert deltas and all(p["item_id"] == item_id and p["output_index"] == 0 for p in deltas)
    text = "".join(p["delta"] for p in deltas)
    final = events[-1][1]["response"]
    assert final["output"] == [done[0]["item"]] and final["output"][0]["content"][0]["text"] == text
    assert [p["text"] for n, p in events if n == "response.output_text.done"] == [text]
    assert final["usage"]["output_tokens"] == 7


@pytest.mark.parametrize("body, field", [
    ({}, "'input' is required"),
    ({"input": []}, "'input' must not be empty"),
    ({"input": 3}, "'input' must be a string or an array of items"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "top_logprobs": 2}, "top_logprobs"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "'input[0].content[0]' is a input_image part"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "'input[0].type' \"web_search_call\""),
    ({"input": [{"role": "robot", "content": "hi"}]}, "'input[0].role'"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "needs 'call_id', 'name' and 'arguments'"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "'tools[0]': only function tools"),
    ({"input": "x", "tool_choice": {"type": "file_search"}}, "'tool_choice' must be"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "'text.format.type'"),
    ({"input": "x", "max_output_tokens": 0}, "'max_output_tokens' must be an integer"),
    ({"input": "x", "instructions": ["a"]}, "'instructions' must be a string"),
    ({"input": "x", "temperature": 9}, "'temperature' must be a number from 0 to 2"),
])
def test_what_cannot_be_honoured_is_a_400_naming_it(server, body, field):
    got = server.post("/v1/responses", body)
    assert got.status_code == 400, got.text
    error = got.json()["error"]
    assert field in error["message"] and error["type"] == "invalid_request_error"


def test_a_stored_response_is_a_404_saying_none_are_kept(server, client):
    for method in ("get", "delete"):
        got = getattr(requests, method)(server.url + "/v1/responses/resp_1", timeout=10)
        assert got.status_code == 404 and "keeps no responses" in got.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_1")


def test_the_context_limit_is_worded_for_the_input(server, tiny_config):
    ctx = tiny_config["context_length"]
    got = server.post("/v1/responses", {"input": "Hello", "max_output_tokens": ctx})
    error = got.json()["error"]
    assert got.status_code == 400 and error["code"] == "context_length_exceeded" and error["param"] == "input"
    assert "in the input" in error["message"]


def test_mutated_responses_bodies_are_answered_or_refused(server):
    """A seeded fuzz of Responses bodies (fields dropped, retyped, nested
    wrongly): each gets a 200 or a 4xx with an error object, and the
    server (its sanitizer build too) keeps serving."""
    base = {"model": "tiny", "instructions": "Be brief.", "max_output_tokens": 3, "temperature": 0.5,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                      {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
                      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                      {"type": "function_call_output", "call_id": "c1", "output": "ok"},
                      {"type": "message", "role": "assistant", "content": "done"}],
            "text": {"format": {"type": "json_object"}}, "reasoning": {"effort": "low"},
            "tool_choice": "auto", "parallel_tool_calls": True}
    values = [None, 0, -1, 1.5, "", "x", [], {}, [1], {"type": "function"}, True, "a" * 300]
    rng = random.Random(7)

    def paths(node, at=()):
        yield at
        if isinstance(node, dict):
            for k, v in node.items():
                yield from paths(v, at + (k,))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield from paths(v, at + (i,))

    every = [p for p in paths(base) if p]
    seen = set()
    for _ in range(150):
        body = json.loads(json.dumps(base))
        for _ in range(rng.randint(1, 3)):
            at = rng.choice(every)
            parent = body
            try:
                for k in at[:-1]:
                    parent = parent[k]
                if rng.random() < 0.3 and isinstance(parent, dict):
                    parent.pop(at[-1], None)
                else:
                    parent[at[-1]] = rng.choice(values)
            except (KeyError, IndexError, TypeError):
                pass
        got = server.post("/v1/responses", body)
        assert got.status_code in (200, 400), (got.status_code, got.text, body)
        seen.add(got.status_code)
        if got.status_code == 400:
            assert got.json()["error"]["message"]
        else:
            assert got.json()["object"] == "response"
    assert seen == {200, 400}
    assert server.get("/health").status_code == 200


def test_a_stream_cut_by_shutdown_ends_with_response_failed(server_exe, tiny_model):
    """SIGTERM with --grace-ms 0 during a Responses stream: its last event
    is response.failed naming the shutdown, and the server exits 0."""
    for attempt in range(3):  # the stream may finish before the signal is read; then try again
        srv = RunningServer(server_exe, tiny_model, "--threads", "1", "--grace-ms", "0")
        events = []
        with requests.post(srv.url + "/v1/responses", json={"input": "Hello", "stream": True, "ignore_eos": True},
                           stream=True, timeout=60) as reply:
            for line in reply.iter_lines():
                if line.startswith(b"data: "):
                    events.append(json.loads(line[6:]))
                    if len(events) == 1:
                        srv.proc.send_signal(signal.SIGTERM)
        stop_checked(srv)
        if events[-1]["type"] == "response.failed":
            failed = events[-1]["response"]
            assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
            assert "the server shut down before the answer was complete" in failed["error"]["message"]
            assert [e["sequence_number"] for e in events] == list(range(len(events)))
            return
    pytest.fail("the stream finished before SIGTERM was read, three times")
