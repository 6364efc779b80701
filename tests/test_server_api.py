"""The OpenAI-compatible API of the built server: streaming and plain chat
and completions (raw HTTP and the real openai client), sampling with seeds,
stop sequences, logprobs, UTF-8 in streams, and /metrics. Runs against the
normal and the sanitizer build."""

import math
import re

import numpy as np
import openai
import pytest
import requests

from colibri_build import Engine
from conftest import RunningServer, sse_events, stop_checked

pytestmark = pytest.mark.slow

CHAT = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 12}
SAMPLED = {"temperature": 1.3, "top_k": 60, "top_p": 0.95, "min_p": 0.01}


@pytest.fixture(scope="module")
def server(server_exe, tiny_model):
    srv = RunningServer(server_exe, tiny_model, "--threads", "2")
    yield srv
    stop_checked(srv)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def stream(server, path, body):
    with requests.post(server.url + path, json={**body, "stream": True}, stream=True, timeout=60) as reply:
        assert reply.status_code == 200, reply.text
        assert reply.headers["Content-Type"].startswith("text/event-stream")
        return sse_events(reply)


def chat_text(server, body) -> dict:
    reply = server.post("/v1/chat/completions", body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_chat_stream_matches_the_plain_answer(server):
    plain = chat_text(server, {**CHAT, "colibri_trace": True})
    events = stream(server, "/v1/chat/completions", {**CHAT, "colibri_trace": True,
                                                      "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == plain["choices"][0]["message"]["content"]
    final, usage = chunks[-2], chunks[-1]
    n_stream = usage["usage"]["completion_tokens"]
    assert final["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]
    assert final["expert_activations"] == plain["expert_activations"]
    assert final["colibri_trace"] == plain["colibri_trace"]
    assert usage["choices"] == []
    # The same prompt again: the prefix cache gives all of it but the last token.
    cached = usage["usage"].pop("prompt_tokens_details")
    assert cached == {"cached_tokens": plain["usage"]["prompt_tokens"] - 1}
    plain["usage"].pop("prompt_tokens_details")
    assert usage["usage"] == plain["usage"]
    # With colibri_trace the timings give when each token went to the connection (ms after
    # arrival): one a token, in order, the first after the prompt, the last after the decode.
    for t, n in ((plain["timings"], plain["usage"]["completion_tokens"]), (usage["timings"], n_stream)):
        ms = t["token_ms"]
        assert len(ms) == n and ms == sorted(ms)
        assert ms[0] >= t["queued_ms"] + t["prompt_ms"] - 1e-3
        assert ms[-1] >= t["queued_ms"] + t["prompt_ms"] + t["decode_ms"] - 1e-3
    assert "token_ms" not in chat_text(server, CHAT)["timings"]


def test_completions_with_text_or_token_ids(server, tiny_model):
    by_text = server.post("/v1/completions", {"prompt": "Hello", "max_tokens": 8, "colibri_trace": True}).json()
    assert by_text["object"] == "text_completion"
    ids = by_text["colibri_trace"]["prompt_tokens"]
    assert ids == [256] + list(b"Hello")  # BOS, then the bytes
    by_ids = server.post("/v1/completions", {"prompt": ids, "max_tokens": 8, "colibri_trace": True}).json()
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]
    assert by_ids["colibri_trace"] == by_text["colibri_trace"]
    # Greedy by default: the in-process engine agrees.
    assert Engine(tiny_model).generate_ids(ids, max_tokens=8) == by_text["colibri_trace"]["completion_tokens"]
    events = stream(server, "/v1/completions", {"prompt": ids, "max_tokens": 8})
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == by_text["choices"][0]["text"]
    assert events[-2]["choices"][0]["finish_reason"] == by_text["choices"][0]["finish_reason"]


def test_openai_client_sync_and_streaming(client, tiny_config):
    messages = [{"role": "user", "content": "Hi there"}]
    sync = client.chat.completions.create(model=tiny_config["name"], messages=messages, max_tokens=10, seed=3,
                                          temperature=0.9)
    pieces = []
    for chunk in client.chat.completions.create(model=tiny_config["name"], messages=messages, max_tokens=10,
                                                seed=3, temperature=0.9, stream=True,
                                                stream_options={"include_usage": True}):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage:
            assert chunk.usage.completion_tokens == sync.usage.completion_tokens
    assert "".join(pieces) == sync.choices[0].message.content
    done = client.completions.create(model=tiny_config["name"], prompt="Once", max_tokens=6)
    assert done.choices[0].finish_reason in ("stop", "length") and done.usage.prompt_tokens == 5
    texts = [c.choices[0].text for c in client.completions.create(model=tiny_config["name"], prompt="Once",
                                                                    max_tokens=6, stream=True)]
    assert "".join(texts) == done.choices[0].text
    assert [m.id for m in client.models.list()] == [tiny_config["name"]]


def test_seeded_sampling_is_reproducible_and_seed_dependent(server):
    def tokens(seed):
        body = {**CHAT, **SAMPLED, "max_tokens": 24, "seed": seed, "colibri_trace": True}
        return chat_text(server, body)["colibri_trace"]["completion_tokens"]
    assert tokens(11) == tokens(11)
    outputs = {tuple(tokens(seed)) for seed in range(4)}
    assert len(outputs) > 1, "the seed does not change sampled outputs"
    greedy = chat_text(server, {**CHAT, "max_tokens": 24, "colibri_trace": True})["colibri_trace"]
    assert tuple(greedy["completion_tokens"]) not in outputs or len(outputs) > 1


def test_top_k_one_is_greedy_and_penalties_change_the_output(server):
    greedy = chat_text(server, {**CHAT, "max_tokens": 24, "colibri_trace": True})["colibri_trace"]
    top1 = chat_text(server, {**CHAT, "max_tokens": 24, "temperature": 1.5, "top_k": 1, "seed": 9,
                              "colibri_trace": True})["colibri_trace"]
    assert top1["completion_tokens"] == greedy["completion_tokens"]
    penalised = chat_text(server, {**CHAT, "max_tokens": 24, "frequency_penalty": 2.0, "presence_penalty": 2.0,
                                   "colibri_trace": True})["colibri_trace"]["completion_tokens"]
    # Greedy with strong penalties never repeats a token while others are close in logit.
    assert penalised != greedy["completion_tokens"] or len(set(penalised)) == len(penalised)


def test_stop_sequences_are_never_emitted(server):
    reply = chat_text(server, {**CHAT, "max_tokens": 40, "colibri_trace": True})
    full, tokens = reply["choices"][0]["message"]["content"], reply["colibri_trace"]["completion_tokens"]
    # Two printable ASCII tokens in a row, past the first: the stop sequence.
    at = next(i for i in range(1, len(tokens) - 1) if all(32 <= t < 127 for t in tokens[i:i + 2]))
    stop = bytes(tokens[at:at + 2]).decode()
    body = {**CHAT, "max_tokens": 40, "stop": [stop, "never-appears"]}
    cut = chat_text(server, body)
    assert cut["choices"][0]["finish_reason"] == "stop"
    text = cut["choices"][0]["message"]["content"]
    assert text == full[:full.index(stop)] and stop not in text
    streamed = "".join(e["choices"][0]["delta"].get("content", "")
                       for e in stream(server, "/v1/chat/completions", body)[:-1] if e["choices"])
    assert streamed == text


def test_streams_never_split_a_utf8_character(server):
    """Bytes of one character may come from different tokens: the stream
    holds them back until complete, so it matches the plain answer."""
    seen_multibyte = False
    for seed in range(6):
        body = {**CHAT, **SAMPLED, "max_tokens": 40, "seed": seed}
        plain = chat_text(server, body)["choices"][0]["message"]["content"]
        deltas = [e["choices"][0]["delta"].get("content", "")
                  for e in stream(server, "/v1/chat/completions", body)[:-1] if e["choices"]]
        assert "".join(deltas) == plain
        seen_multibyte |= any(ord(ch) > 0x7F and ch != "\ufffd" for ch in plain)
    assert seen_multibyte, "no multi-byte character was generated: the test proves nothing"


def test_logprobs(server, tiny_model):
    body = {**CHAT, "max_tokens": 6, "logprobs": True, "top_logprobs": 3, "colibri_trace": True}
    reply = chat_text(server, body)
    entries = reply["choices"][0]["logprobs"]["content"]
    trace = reply["colibri_trace"]
    assert len(entries) == len(trace["completion_tokens"]) == 6
    logits = Engine(tiny_model).forward(trace["prompt_tokens"] + trace["completion_tokens"][:-1])
    for i, (entry, token) in enumerate(zip(entries, trace["completion_tokens"])):
        row = logits[len(trace["prompt_tokens"]) - 1 + i].astype(np.float64)
        log_softmax = row - (row.max() + math.log(np.exp(row - row.max()).sum()))
        assert entry["logprob"] == pytest.approx(log_softmax[token], abs=1e-4)
        assert entry["bytes"] == list(bytes([token])) if token < 256 else entry["bytes"] == []
        tops = entry["top_logprobs"]
        assert len(tops) == 3 and [t["logprob"] for t in tops] == sorted((t["logprob"] for t in tops), reverse=True)
        assert tops[0]["logprob"] == pytest.approx(log_softmax.max(), abs=1e-4)
    legacy = server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "logprobs": 2}).json()
    lp = legacy["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 4
    assert lp["text_offset"][0] == 0 and all(len(t) <= 2 for t in lp["top_logprobs"])


def test_max_completion_tokens_and_usage(server):
    body = {"messages": CHAT["messages"], "max_completion_tokens": 3}
    reply = chat_text(server, body)
    assert reply["usage"]["completion_tokens"] <= 3


def test_server_timings_cover_prompt_and_decode(server):
    """The server's own timings (what `colibri-build bench` reads): a prompt
    phase and a decode phase of n_generated - 1 steps, consistent rates, and
    the CPU time spent sampling."""
    import time
    start = time.perf_counter()
    reply = requests.post(server.url + "/v1/completions",
                          json={"prompt": [5, 6, 7, 8], "max_tokens": 6, "ignore_eos": True}, timeout=60).json()
    wall_ms = (time.perf_counter() - start) * 1e3
    t, usage = reply["timings"], reply["usage"]
    assert usage["completion_tokens"] == 6
    assert t["queued_ms"] >= 0 and t["prompt_ms"] > 0 and t["decode_ms"] > 0
    assert t["queued_ms"] + t["prompt_ms"] + t["decode_ms"] <= wall_ms
    # CPU of the loop thread choosing the 6 tokens: some, and within the request's time
    assert 0 < t["sample_ms"] <= wall_ms
    assert t["decode_tokens_per_second"] == pytest.approx(5 / t["decode_ms"] * 1e3, rel=1e-6)
    assert t["prompt_tokens_per_second"] == pytest.approx(4 / t["prompt_ms"] * 1e3, rel=1e-6)


def metric(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
    assert match, f"{name}{labels} missing from /metrics"
    return float(match.group(1))


def test_metrics(server, tiny_config):
    before = server.get("/metrics").text
    chat_text(server, {**CHAT, "max_tokens": 5})
    server.post("/v1/chat/completions", {"messages": []})
    after = server.get("/metrics")
    assert after.status_code == 200 and after.headers["Content-Type"].startswith("text/plain")
    text = after.text
    assert metric(text, "colibri_requests_total", '{status="200"}') >= metric(before, "colibri_requests_total",
                                                                             '{status="200"}') + 1
    assert metric(text, "colibri_requests_total", '{status="400"}') == metric(before, "colibri_requests_total",
                                                                             '{status="400"}') + 1
    assert metric(text, "colibri_generated_tokens_total") >= metric(before, "colibri_generated_tokens_total") + 1
    assert metric(text, "colibri_prompt_tokens_total") >= metric(before, "colibri_prompt_tokens_total") + 9
    assert metric(text, "colibri_time_to_first_token_seconds_count") >= 1
    assert metric(text, "colibri_inter_token_latency_seconds_bucket", '{le="+Inf"}') >= 4
    assert metric(text, "colibri_busy_slots") == 0 and metric(text, "colibri_queue_length") == 0
    assert metric(text, "colibri_slots") == tiny_config["batch_slots"]
    routed = sum(metric(text, "colibri_expert_activations_total", f'{{layer="0",expert="{e}"}}')
                 for e in range(tiny_config["experts"]))
    assert routed > 0 and routed % tiny_config["top_k"] == 0
