"""The smaller API gaps of issue 19, against the built server and with the
real openai client: logit_bias, prompt lists and n, /v1/models/{id} and the
context length, context overflow as context_length_exceeded, CORS, thinking
text as reasoning_content (and a reasoning item of /v1/responses), BOS only where the tokenizer adds one, and a
stream cut by shutdown."""

from __future__ import annotations

import json
import signal
import threading

import numpy as np
import openai
import pytest
import requests

from colibri_build import Engine, Tokenizer
from conftest import RunningServer, build_server, responses_events, run_cli, sse_events, stop_checked
from tokenizer_cases import TOKENIZERS

pytestmark = pytest.mark.slow

ORIGIN, OTHER = "https://app.example", "https://other.example:8443"
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def server(server_exe, tiny_model):
    srv = RunningServer(server_exe, tiny_model, "--threads", "2", "--cors-origin", ORIGIN, "--cors-origin", OTHER)
    yield srv
    stop_checked(srv)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def completion(server, body) -> dict:
    reply = server.post("/v1/completions", body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def error_of(reply, status=400) -> dict:
    assert reply.status_code == status, reply.text
    return reply.json()["error"]


# ---- 1. logit_bias ----

PROMPT = [256, 72, 105, 32, 116, 104, 101, 114, 101]  # BOS "Hi there"


def trace(server, body) -> dict:
    return completion(server, {"prompt": PROMPT, "max_tokens": 8, "colibri_trace": True, **body})["colibri_trace"]


def test_logit_bias_steers_greedy_and_sampled_tokens(server, client, tiny_config):
    """Before: any non-empty logit_bias was a 400."""
    greedy = trace(server, {})["completion_tokens"]
    banned = trace(server, {"logit_bias": {str(greedy[0]): -100}})["completion_tokens"]
    assert banned[0] != greedy[0]
    # A bias too small to overturn the first choice leaves the answer as it was.
    assert trace(server, {"logit_bias": {str(greedy[0]): 1e-6}})["completion_tokens"] == greedy
    for extra in ({}, {"temperature": 1.2, "seed": 5, "top_p": 0.9}):
        forced = trace(server, {"logit_bias": {"65": 100}, **extra})["completion_tokens"]
        assert forced == [65] * 8
    # The logits reported are the model's own, before the bias.
    plain, biased = trace(server, {}), trace(server, {"logit_bias": {str(greedy[0]): 0.5}})
    if biased["completion_tokens"][0] == greedy[0]:
        assert biased["completion_logits"][0] == plain["completion_logits"][0]
    # The openai client sends it as OpenAI defines it: token id strings.
    done = client.completions.create(model=tiny_config["name"], prompt="Hi", max_tokens=6, logit_bias={"66": 100})
    assert done.choices[0].text == "B" * 6
    chat = client.chat.completions.create(model=tiny_config["name"], messages=HELLO, max_tokens=5,
                                          logit_bias={"67": 100, "68": 99})
    assert chat.choices[0].message.content == "C" * 5
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=tiny_config["name"], messages=HELLO, max_tokens=5, logit_bias={"67": 100}, stream=True) if c.choices]
    assert "".join(pieces) == "C" * 5


def test_logit_bias_is_batch_independent(server):
    """Requests with different biases, sampled, run together: each gets the
    bits it gets alone."""
    bodies = [{"logit_bias": {str(t): b for t, b in zip(range(97, 97 + i), np.linspace(-3, 3, i))},
               "temperature": 0.8, "seed": i, "max_tokens": 16} for i in range(1, 7)]
    alone = [trace(server, body) for body in bodies]
    together = [None] * len(bodies)

    def run(i):
        together[i] = trace(server, bodies[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone


@pytest.mark.parametrize("bias, fragment", [
    ({"abc": 1}, "'logit_bias' key \"abc\" must be a token id from 0 to 261"),
    ({"-1": 1}, "key \"-1\""),
    ({"262": 1}, "key \"262\" must be a token id from 0 to 261"),
    ({"01": 1}, "key \"01\""),
    ({"": 1}, "key \"\""),
    ({"5": 101}, "'logit_bias[\"5\"]' must be a number from -100 to 100"),
    ({"5": "high"}, "'logit_bias[\"5\"]'"),
    ([5], "'logit_bias' must be an object"),
    ({str(i): 1 for i in range(301)}, "has 301 entries; at most 300"),
])
def test_bad_logit_bias_is_a_400_naming_the_key(server, bias, fragment):
    for path, body in [("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions", {"messages": HELLO})]:
        err = error_of(server.post(path, {**body, "max_tokens": 2, "logit_bias": bias}))
        assert fragment in err["message"] and err["param"] == "logit_bias", err


# ---- 2. prompt lists ----

PROMPTS = ["Hello", "Once upon a time", "x"]


def test_prompt_list_gives_one_choice_per_prompt(server, client, tiny_config):
    """Each prompt of a list runs in its own slot (all started together) and
    its choice is the answer it gets alone. Before: a list of strings was a
    400 ("must be a string or an array of token ids")."""
    body = {"max_tokens": 6, "temperature": 0.9, "seed": 4, "logit_bias": {"101": 2}}
    alone = [completion(server, {**body, "prompt": p, "colibri_trace": True}) for p in PROMPTS]
    listed = completion(server, {**body, "prompt": PROMPTS})
    assert [c["index"] for c in listed["choices"]] == [0, 1, 2]
    assert [c["text"] for c in listed["choices"]] == [a["choices"][0]["text"] for a in alone]
    assert [c["finish_reason"] for c in listed["choices"]] == [a["choices"][0]["finish_reason"] for a in alone]
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert listed["usage"][key] == sum(a["usage"][key] for a in alone)
    ids = [a["colibri_trace"]["prompt_tokens"] for a in alone]
    assert [c["text"] for c in completion(server, {**body, "prompt": ids})["choices"]] == \
        [c["text"] for c in listed["choices"]]
    # Streamed: each chunk names its choice; one [DONE] after the last; usage over all.
    with requests.post(server.url + "/v1/completions", json={**body, "prompt": PROMPTS, "stream": True,
                                                             "stream_options": {"include_usage": True}},
                       stream=True, timeout=60) as reply:
        events = sse_events(reply)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [e for e in events[:-1] if e["choices"]]
    for i, a in enumerate(alone):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == i]
        assert "".join(c["text"] for c in mine) == a["choices"][0]["text"]
        assert [c["finish_reason"] for c in mine if c["finish_reason"]] == [a["choices"][0]["finish_reason"]]
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")  # cached_tokens: what the cache holds by then
    assert events[-2]["choices"] == []
    assert [events[-2]["usage"][k] for k in counts] == [listed["usage"][k] for k in counts]
    # The openai client, and a list of one prompt.
    done = client.completions.create(model=tiny_config["name"], prompt=PROMPTS, max_tokens=6, temperature=0.9,
                                     seed=4, logit_bias={"101": 2})
    assert [c.text for c in done.choices] == [c["text"] for c in listed["choices"]]
    one = completion(server, {**body, "prompt": ["Hello"]})
    assert one["choices"] == [alone[0]["choices"][0]]


def test_n_samples_one_prompt_in_as_many_slots(server, client, tiny_config):
    """n choices of one prompt, each in its own slot: choice 0 is the request
    alone (its seed), the others sample their own random streams (greedy:
    all the same); usage counts the prompt once; a stream carries the same
    choices by index; the openai client reads them; /v1/completions too."""
    body = {"messages": HELLO, "max_tokens": 8, "temperature": 1.0, "seed": 11}
    alone = server.post("/v1/chat/completions", body).json()
    many = server.post("/v1/chat/completions", {**body, "n": 3}).json()
    assert [c["index"] for c in many["choices"]] == [0, 1, 2]
    texts = [c["message"]["content"] for c in many["choices"]]
    assert texts[0] == alone["choices"][0]["message"]["content"] and len(set(texts)) == 3
    assert many["usage"]["prompt_tokens"] == alone["usage"]["prompt_tokens"]
    assert all(c["finish_reason"] == "length" for c in many["choices"])
    assert many["usage"]["completion_tokens"] == 3 * 8
    assert server.post("/v1/chat/completions", {**body, "n": 3}).json()["choices"] == many["choices"]
    greedy = {"messages": HELLO, "max_tokens": 8}
    want = server.post("/v1/chat/completions", greedy).json()["choices"][0]["message"]["content"]
    assert [c["message"]["content"] for c in server.post("/v1/chat/completions", {**greedy, "n": 2}).json()[
        "choices"]] == [want, want]
    with requests.post(server.url + "/v1/chat/completions", json={**body, "n": 3, "stream": True,
                                                                  "stream_options": {"include_usage": True}},
                       stream=True, timeout=60) as reply:
        events = sse_events(reply)
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")  # cached_tokens: what the cache holds by then
    assert events[-1] == "[DONE]" and [events[-2]["usage"][k] for k in counts] == [many["usage"][k] for k in counts]
    chunks = [e["choices"][0] for e in events[:-1] if e["choices"]]
    assert ["".join(c["delta"].get("content") or "" for c in chunks if c["index"] == i) for i in range(3)] == texts
    got = client.chat.completions.create(model=tiny_config["name"], messages=HELLO, max_tokens=8, temperature=1.0,
                                         seed=11, n=3)
    assert [c.message.content for c in got.choices] == texts
    plain = completion(server, {"prompt": "Hello", "max_tokens": 6, "temperature": 1.0, "n": 2})
    assert [c["index"] for c in plain["choices"]] == [0, 1]
    assert plain["choices"][0] == completion(server, {"prompt": "Hello", "max_tokens": 6,
                                                      "temperature": 1.0})["choices"][0]
    err = error_of(server.post("/v1/completions", {"prompt": PROMPTS, "max_tokens": 2, "n": 2}))
    assert err["param"] == "n" and "with a list of prompts" in err["message"]


def test_a_prompt_list_waits_for_enough_slots(server):
    """With all but one slot busy, a list of three waits in the queue until
    three are free, then runs whole: the same choices as on an idle server."""
    slots = server.get("/health").json()["slots"]
    body = {"prompt": PROMPTS, "max_tokens": 5}
    idle = completion(server, body)["choices"]
    long = {"prompt": [1, 2, 3], "max_tokens": 240, "ignore_eos": True}
    # The tiny model writes 240 tokens in a fraction of a second: on a loaded
    # machine the first long request can end before the last one starts, so
    # the busy state is set up again (a few tries) rather than failed on.
    for _ in range(5):
        busy = [threading.Thread(target=completion, args=(server, long)) for _ in range(slots - 1)]
        for t in busy:
            t.start()
        try:
            while server.get("/health").json()["busy_slots"] < slots - 1:
                if not any(t.is_alive() for t in busy):
                    break
            else:
                assert completion(server, body)["choices"] == idle
                return
        finally:
            for t in busy:
                t.join()
    pytest.fail("the long requests never ran all at once in 5 tries")


def test_prompt_lists_that_cannot_run(server):
    slots = server.get("/health").json()["slots"]
    err = error_of(server.post("/v1/completions", {"prompt": ["a"] * (slots + 1), "max_tokens": 2}))
    assert err["param"] == "prompt"
    assert f"'prompt' holds {slots + 1} prompts; this server runs at most {slots} (its slots)" in err["message"]
    err = error_of(server.post("/v1/completions", {"prompt": ["a", [1, 2]], "max_tokens": 2}))
    assert "'prompt[1]': a list of prompts holds all strings or all arrays of token ids" in err["message"]
    err = error_of(server.post("/v1/completions", {"prompt": ["a", [], "b"][::2] + [[]], "max_tokens": 2}))
    assert err["param"] == "prompt"
    # A prompt of the list too long: the whole request is refused, naming the context.
    err = error_of(server.post("/v1/completions", {"prompt": ["a", "b" * 300], "max_tokens": 2}))
    assert err["code"] == "context_length_exceeded"
    # The refused lists gave their queue places back: a list still runs.
    assert len(completion(server, {"prompt": ["a", "b"], "max_tokens": 2})["choices"]) == 2


# ---- 3. /v1/models/{id} ----

def test_model_object_and_lookup(server, client, tiny_config):
    listed = server.get("/v1/models").json()["data"]
    assert listed == [{"id": tiny_config["name"], "object": "model", "created": 0, "owned_by": "colibri",
                       "context_length": tiny_config["context_length"],
                       "max_model_len": tiny_config["context_length"]}]
    one = server.get(f"/v1/models/{tiny_config['name']}")
    assert one.status_code == 200 and one.json() == listed[0]
    assert client.models.retrieve(tiny_config["name"]).id == tiny_config["name"]
    missing = server.get("/v1/models/gpt-4o")
    assert missing.status_code == 404
    assert missing.json() == {"error": {"message": f"The model 'gpt-4o' does not exist; this server serves "
                                                   f"'{tiny_config['name']}'", "type": "invalid_request_error",
                                        "param": "model", "code": "model_not_found"}}
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    wrong = server.post(f"/v1/models/{tiny_config['name']}", {})
    assert wrong.status_code == 405 and wrong.headers["Allow"] == "GET, HEAD"


# ---- 4. context overflow ----

def test_context_overflow_is_context_length_exceeded(server, client, tiny_config):
    ctx = tiny_config["context_length"]
    n_chat = server.post("/v1/chat/completions", {"messages": HELLO, "max_tokens": 1}).json()["usage"][
        "prompt_tokens"]
    err = error_of(server.post("/v1/chat/completions", {"messages": HELLO, "max_tokens": ctx - n_chat + 1}))
    assert err == {"message": f"This model's maximum context length is {ctx} tokens. However, you requested "
                              f"{ctx + 1} tokens ({n_chat} in the messages, {ctx - n_chat + 1} in the completion). "
                              f"Please reduce the length of the messages or completion.",
                   "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}
    fits = server.post("/v1/chat/completions", {"messages": HELLO, "max_tokens": ctx - n_chat, "ignore_eos": True})
    assert fits.status_code == 200 and fits.json()["usage"]["total_tokens"] == ctx
    ids = list(range(10))
    err = error_of(server.post("/v1/completions", {"prompt": ids, "max_completion_tokens": ctx - 9}))
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    assert f"you requested {ctx + 1} tokens (10 in the prompt, {ctx - 9} in the completion)" in err["message"]
    # Without max_tokens the answer may run to the end of the context.
    full = completion(server, {"prompt": ids, "ignore_eos": True})
    assert full["usage"]["completion_tokens"] == ctx - 10 and full["choices"][0]["finish_reason"] == "length"
    # The prompt alone too long.
    err = error_of(server.post("/v1/completions", {"prompt": list(range(ctx))}))
    assert err["code"] == "context_length_exceeded" and f"your prompt resulted in {ctx} tokens" in err["message"]
    err = error_of(server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * ctx}]}))
    assert err["code"] == "context_length_exceeded" and "your messages resulted in" in err["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=tiny_config["name"], messages=HELLO, max_tokens=ctx)
    assert caught.value.code == "context_length_exceeded" and "maximum context length" in caught.value.message


# ---- 5. CORS ----

def test_cors_on_answers_streams_errors_and_preflight(server):
    for origin in (ORIGIN, OTHER):
        reply = server.post("/v1/completions", {"prompt": "x", "max_tokens": 2}, headers={"Origin": origin})
        assert reply.status_code == 200
        assert reply.headers["Access-Control-Allow-Origin"] == origin and reply.headers["Vary"] == "Origin"
    foreign = server.post("/v1/completions", {"prompt": "x", "max_tokens": 2},
                          headers={"Origin": "https://evil.example"})
    assert foreign.status_code == 200 and "Access-Control-Allow-Origin" not in foreign.headers
    with requests.post(server.url + "/v1/chat/completions", json={"messages": HELLO, "max_tokens": 3, "stream": True},
                       headers={"Origin": ORIGIN}, stream=True, timeout=60) as streamed:
        assert streamed.headers["Access-Control-Allow-Origin"] == ORIGIN
        assert sse_events(streamed)[-1] == "[DONE]"
    bad = server.post("/v1/completions", {"prompt": []}, headers={"Origin": ORIGIN})
    assert bad.status_code == 400 and bad.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert server.get("/health", headers={"Origin": ORIGIN}).headers["Access-Control-Allow-Origin"] == ORIGIN
    asked = "authorization, content-type, x-stainless-os"
    pre = requests.options(server.url + "/v1/chat/completions", timeout=10, headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": asked})
    assert pre.status_code == 204 and pre.content == b"" and "Content-Length" not in pre.headers
    assert pre.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert pre.headers["Access-Control-Allow-Methods"] == "GET, HEAD, POST, OPTIONS"
    assert pre.headers["Access-Control-Allow-Headers"] == asked
    # The connection stays usable after a 204.
    session = requests.Session()
    assert session.options(server.url + "/v1/models", headers={"Origin": ORIGIN}, timeout=10).status_code == 204
    assert session.get(server.url + "/v1/models", timeout=10).status_code == 200
    assert requests.options(server.url + "/nothing", headers={"Origin": ORIGIN}, timeout=10).status_code == 404


def test_cors_any_origin_with_a_key_and_none_without_the_flag(server_exe, tiny_model, start_server):
    keyed = start_server(server_exe, tiny_model, "--cors-origin", "*", "--api-key", "k1")
    pre = requests.options(keyed.url + "/v1/completions", headers={"Origin": ORIGIN}, timeout=10)
    assert pre.status_code == 204 and pre.headers["Access-Control-Allow-Origin"] == "*"  # no key on a preflight
    refused = keyed.post("/v1/completions", {"prompt": "x"}, headers={"Origin": ORIGIN})
    assert refused.status_code == 401 and refused.headers["Access-Control-Allow-Origin"] == "*"
    stop_checked(keyed)
    bare = start_server(server_exe, tiny_model)
    reply = bare.post("/v1/completions", {"prompt": "x", "max_tokens": 2}, headers={"Origin": ORIGIN})
    assert reply.status_code == 200 and not any(h.startswith("Access-Control") for h in reply.headers)
    pre = requests.options(bare.url + "/v1/completions", headers={"Origin": ORIGIN}, timeout=10)
    assert pre.status_code == 405 and pre.headers["Allow"] == "POST"
    stop_checked(bare)


def test_a_bad_cors_origin_is_refused_at_start(server_exe, tiny_model):
    import subprocess
    usage = subprocess.run([str(server_exe), "--help"], capture_output=True, text=True, timeout=30)
    assert usage.returncode == 0 and "--cors-origin ORIGIN" in usage.stdout
    assert "answered 204; repeat for several origins, at most 16 (default: no CORS)" in usage.stdout
    for value in ("", "https://a.example, https://b.example"):
        done = subprocess.run([str(server_exe), "--model", str(tiny_model), "--cors-origin", value],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 2 and "--cors-origin: got" in done.stderr, done.stderr


# ---- 6. reasoning_content ----

@pytest.fixture(scope="module")
def qwen_model(qwen_tiny_model):
    return qwen_tiny_model


@pytest.fixture(scope="module")
def qwen(qwen_model, qwen_tiny_dist):
    srv = RunningServer(qwen_tiny_dist / "colibri-server", qwen_model, "--threads", "2")
    yield srv
    stop_checked(srv)


def chat_and_stream(srv, body):
    """The plain answer, and the stream's reasoning and content joined."""
    plain = srv.post("/v1/chat/completions", {**body, "colibri_trace": True})
    assert plain.status_code == 200, plain.text
    with requests.post(srv.url + "/v1/chat/completions", json={**body, "stream": True}, stream=True,
                       timeout=60) as reply:
        events = sse_events(reply)
    assert events[-1] == "[DONE]"
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e.get("choices")]
    return plain.json(), "".join(d.get("reasoning_content", "") for d in deltas), \
        "".join(d.get("content", "") for d in deltas)


def test_thinking_text_is_reasoning_content(qwen, qwen_model):
    """An answer that starts inside <think> (here an assistant prefill opens
    it) is reasoning_content up to </think>, content after it. The bias on
    </think> is chosen from the engine's logits so that greedy decoding
    picks it at some step k > 0 and not before."""
    tok = Tokenizer(qwen_model)
    close = tok.encode("</think>")[0]
    body = {"messages": [*HELLO, {"role": "assistant", "content": "<think>\nLet me"}], "max_tokens": 12}
    base, _, _ = chat_and_stream(qwen, body)
    prompt, greedy = base["colibri_trace"]["prompt_tokens"], base["colibri_trace"]["completion_tokens"]
    assert tok.decode(prompt).endswith("<think>\n\n</think>\n\n<think>\nLet me")  # the prefill opens a block
    engine = Engine(qwen_model)
    margins = []
    for j in range(len(greedy)):
        logits = np.asarray(engine.forward(prompt + greedy[:j], all_logits=False)).reshape(-1)
        assert int(np.argmax(logits)) == greedy[j]
        margins.append(float(logits.max() - logits[close]))
    k = next(k for k in range(1, len(margins)) if margins[k] < min(margins[:k]) - 1e-3)
    bias = (margins[k] + min(margins[:k])) / 2
    assert bias <= 100
    answer, reasoning, content = chat_and_stream(qwen, {**body, "logit_bias": {str(close): bias}})
    done = answer["colibri_trace"]["completion_tokens"]
    assert done[:k] == greedy[:k] and done[k] == close
    message = answer["choices"][0]["message"]
    assert message["reasoning_content"] == tok.decode(done[:k]).lstrip("\n")
    assert message["content"] == tok.decode(done[k + 1:]).lstrip("\n")
    assert (reasoning, content) == (message["reasoning_content"], message["content"])
    # The openai client reads both.
    client = openai.OpenAI(base_url=qwen.url + "/v1", api_key="unused", max_retries=0)
    got = client.chat.completions.create(model="qwen-tiny", messages=body["messages"], max_tokens=12,
                                         logit_bias={str(close): bias})
    assert got.choices[0].message.reasoning_content == message["reasoning_content"]
    assert got.choices[0].message.content == message["content"]
    # /v1/responses: a reasoning item, then the message; streamed, the same texts
    asked = {"input": body["messages"], "max_output_tokens": 12, "logit_bias": {str(close): bias}}
    response = qwen.post("/v1/responses", asked).json()
    want = [("reasoning", message["reasoning_content"])] + [("message", message["content"])] * bool(message["content"])
    assert [(o["type"], o["content"][0]["text"]) for o in response["output"]] == want
    assert response["usage"]["output_tokens_details"]["reasoning_tokens"] == k + 1  # the block and its </think>
    events = responses_events(qwen, asked)
    for kind, text in want:
        delta = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        assert "".join(p["delta"] for n, p in events if n == delta) == text
    assert [(o["type"], o["content"][0]["text"]) for o in events[-1][1]["response"]["output"]] == want


def test_a_first_think_token_opens_reasoning_and_no_think_is_content(qwen, qwen_model):
    tok = Tokenizer(qwen_model)
    think = tok.encode("<think>")[0]
    # The template's enable_thinking=false closes the block in the prompt: all is content.
    off = {"messages": HELLO, "max_tokens": 6, "chat_template_kwargs": {"enable_thinking": False}}
    answer, reasoning, content = chat_and_stream(qwen, off)
    assert answer["colibri_trace"]["prompt_tokens"][-2:] == tok.encode("</think>\n\n")
    message = answer["choices"][0]["message"]
    done = answer["colibri_trace"]["completion_tokens"]
    assert think not in done[:1]
    assert message["reasoning_content"] is None and message["content"] == tok.decode(done)
    assert (reasoning, content) == ("", message["content"])
    # A first <think> opens the block; later ones are its text.
    on = {"messages": HELLO, "max_tokens": 4, "logit_bias": {str(think): 100}}
    answer, reasoning, content = chat_and_stream(qwen, on)
    assert answer["colibri_trace"]["completion_tokens"] == [think] * 4
    assert answer["choices"][0]["message"]["reasoning_content"] == "<think>" * 3
    assert answer["choices"][0]["message"]["content"] == "" and (reasoning, content) == ("<think>" * 3, "")
    # /v1/completions is raw text, markers included.
    raw = completion(qwen, {"prompt": "Hi", "max_tokens": 2, "logit_bias": {str(think): 100}})
    assert raw["choices"][0]["text"] == "<think>" * 2


def test_no_reasoning_field_without_markers_in_the_template(server):
    message = server.post("/v1/chat/completions", {"messages": HELLO, "max_tokens": 3}).json()["choices"][0][
        "message"]
    assert set(message) == {"role", "content"}


HARMONY_SPECIALS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"]


@pytest.fixture(scope="module")
def harmony(tmp_path_factory):
    """The tiny model with Qwen3's tokenizer plus gpt-oss's harmony special
    tokens (on free ids) and gpt-oss's chat template."""
    from tokenizer_cases import TESTDATA
    template = TESTDATA / "chat_templates" / "openai-gpt-oss-120b.jinja"
    if not TOKENIZERS.exists() or not template.exists():
        pytest.skip("testdata is missing")
    work = tmp_path_factory.mktemp("harmony")
    tok = json.loads((TOKENIZERS / "qwen3" / "tokenizer.json").read_text())
    config = json.loads((TOKENIZERS / "qwen3" / "tokenizer_config.json").read_text())
    ids = {}
    for name in HARMONY_SPECIALS:
        ids[name] = max(t["id"] for t in tok["added_tokens"]) + 1
        entry = {"content": name, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
                 "special": True}
        tok["added_tokens"].append({"id": ids[name], **entry})
        config["added_tokens_decoder"][str(ids[name])] = entry
    config.pop("chat_template", None)
    config["eos_token"] = "<|return|>"
    (work / "tok").mkdir()
    (work / "tok" / "tokenizer.json").write_text(json.dumps(tok))
    (work / "tok" / "tokenizer_config.json").write_text(json.dumps(config))
    run_cli("synth", "--preset", "tiny", "--seed", "3", "--tokenizer", work / "tok", "--chat-template", template,
            work / "model")
    cfg = json.loads((work / "model" / "model-config.json").read_text())
    # the converter's end of turn: <|call|>, not <|end|> (which ends only a message)
    assert (cfg["tokenizer"]["eos_id"], cfg["tokenizer"]["chat_template"]["end_of_turn"]) == \
        (ids["<|return|>"], ids["<|call|>"])
    srv = RunningServer(build_server(work, work / "model", "native") / "colibri-server", work / "model",
                        "--threads", "2")
    yield srv, ids
    stop_checked(srv)


def test_harmony_markup_never_reaches_content(harmony):
    """gpt-oss headers are not text: an answer of <|channel|> tokens only is
    empty content (before: the markers verbatim); a forced call (tool_choice
    named, the markers' tokens favoured) goes through the channel splitter
    to a tool call, streamed and not."""
    srv, ids = harmony
    channel, message = ids["<|channel|>"], ids["<|message|>"]
    answer, reasoning, content = chat_and_stream(
        srv, {"messages": HELLO, "max_tokens": 5, "logit_bias": {str(channel): 100}})
    assert answer["colibri_trace"]["completion_tokens"] == [channel] * 5
    assert answer["choices"][0]["message"]["content"] == "" and (reasoning, content) == ("", "")
    assert answer["choices"][0]["message"]["reasoning_content"] is None
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string"}}, "required": ["city"]}}}]
    body = {"messages": HELLO, "max_tokens": 40, "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "logit_bias": {str(ids[n]): 100 for n in ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>")}}
    answer = srv.post("/v1/chat/completions", {**body, "colibri_trace": True}).json()
    done = answer["colibri_trace"]["completion_tokens"]
    assert done[0] == channel and message in done  # the markers came as their tokens
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and "city" in json.loads(call["arguments"])
    with requests.post(srv.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as reply:
        events = sse_events(reply)
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e.get("choices")]
    assert "".join(d.get("content") or "" for d in deltas) == ""
    streamed = [c for d in deltas for c in d.get("tool_calls", [])]
    assert streamed[0]["function"]["name"] == "get_weather"
    assert "".join(c["function"]["arguments"] for c in streamed) == call["arguments"]


# ---- 7. BOS only where the tokenizer adds one ----

@pytest.fixture(scope="module")
def mistral_model(tmp_path_factory):
    if not TOKENIZERS.exists():
        pytest.skip("testdata is missing")
    folder = tmp_path_factory.mktemp("spm") / "spm-tiny"
    run_cli("synth", "--preset", "tiny", "--seed", "3", "--tokenizer",
            TOKENIZERS / "mistral-v1" / "tokenizer.model.v1", folder)
    return folder


def test_completion_prompt_gets_bos_only_where_the_tokenizer_adds_one(qwen, qwen_model, mistral_model,
                                                                      tmp_path_factory):
    """Before: every text prompt got the BOS id first, and Qwen's (no BOS;
    its bos_id is <|endoftext|>) started with <|endoftext|>."""
    text = "Hello world"
    qtok = Tokenizer(qwen_model)
    assert json.loads((qwen_model / "model-config.json").read_text())["tokenizer"]["add_bos"] is False
    got = completion(qwen, {"prompt": text, "max_tokens": 1, "colibri_trace": True})
    assert got["colibri_trace"]["prompt_tokens"] == qtok.encode(text)
    cfg = json.loads((mistral_model / "model-config.json").read_text())["tokenizer"]
    assert cfg["add_bos"] is True and cfg["bos_id"] == 1
    dist = build_server(tmp_path_factory.mktemp("spm-build"), mistral_model, "native")
    srv = RunningServer(dist / "colibri-server", mistral_model, "--threads", "2")
    try:
        got = completion(srv, {"prompt": text, "max_tokens": 1, "colibri_trace": True})
        assert got["colibri_trace"]["prompt_tokens"] == [1] + Tokenizer(mistral_model).encode(text)
    finally:
        stop_checked(srv)


# ---- 8. a stream cut by shutdown ----

def test_a_stream_cut_by_shutdown_ends_with_an_error_and_done(server_exe, tiny_model):
    """SIGTERM with --grace-ms 0 during a stream: the openai client gets an
    APIError naming the shutdown (the error event), the raw stream ends with
    [DONE], and the server exits 0. Before: the connection was cut."""
    for attempt in range(3):  # the stream may finish before the signal is read; then try again
        srv = RunningServer(server_exe, tiny_model, "--threads", "1", "--grace-ms", "0")
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        stream = client.chat.completions.create(model="tiny", messages=HELLO, stream=True, extra_body={
            "ignore_eos": True})
        cut = None
        try:
            for i, _ in enumerate(stream):
                if i == 0:
                    srv.proc.send_signal(signal.SIGTERM)
        except openai.APIError as e:
            cut = e
        stop_checked(srv)
        if cut is not None:
            assert "the server shut down before the answer was complete" in cut.message
            assert cut.body["type"] == "server_error"
            return
    pytest.fail("the stream finished before SIGTERM was read, three times")
