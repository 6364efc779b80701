"""The server's prefix cache against the real built server and the real
openai client: a request that begins with the tokens a free slot's KV cache
holds (its last request's prompt and answer) starts after them, reports them
as usage.prompt_tokens_details.cached_tokens, and answers exactly what a
server without the cache (--no-prefix-cache) or a fresh one answers: text,
logprobs, sampled tokens, logits and experts, alone or batched."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import requests

from conftest import RunningServer, stop_checked

pytestmark = pytest.mark.slow

SAMPLED = {"temperature": 0.9, "top_p": 0.95, "seed": 41}


@pytest.fixture(scope="module")
def exe(native_server_dist):
    return native_server_dist / "colibri-server"


def client_of(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def chat(srv, model: str, messages: list, **kw) -> dict:
    """One chat answer through the openai client: what must not depend on
    the cache, and what it reports as cached."""
    done = client_of(srv).chat.completions.create(
        model=model, messages=messages, max_tokens=kw.pop("max_tokens", 12), logprobs=True, top_logprobs=3,
        extra_body={"colibri_trace": True, "ignore_eos": True}, **kw)
    lp = [(t.token, t.logprob, [(x.token, x.logprob) for x in t.top_logprobs]) for t in done.choices[0].logprobs.content]
    trace = done.model_extra["colibri_trace"]
    return {"answer": {"text": done.choices[0].message.content, "logprobs": lp, "trace": trace,
                       "experts": done.model_extra["expert_activations"]},
            "cached": done.usage.prompt_tokens_details.cached_tokens, "prompt_tokens": done.usage.prompt_tokens}


def completion(srv, prompt, max_tokens=8) -> dict:
    reply = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                                         "logprobs": 2, "colibri_trace": True})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    return {"answer": {"text": body["choices"][0]["text"], "logprobs": body["choices"][0]["logprobs"],
                       "trace": body["colibri_trace"], "experts": body["expert_activations"]},
            "cached": body["usage"]["prompt_tokens_details"]["cached_tokens"]}


def conversation(n_turns: int, tag: str) -> list[list[dict]]:
    """The user turns of a chat; the assistant turns come from the server."""
    return [{"role": "user", "content": f"{tag} turn {t}: " + "tell me more " * (t + 1)}
            for t in range(n_turns)]


def metric(srv, name: str) -> int:
    return int(float(re.search(rf"^{name} (\S+)$", srv.get("/metrics").text, re.M).group(1)))


def test_turns_of_a_conversation_reuse_the_cache_and_answer_the_same(server_exe, tiny_model, tiny_config):
    """Three turns (greedy, sampled with a seed, greedy): turns 2 and 3 take
    their history from the cache, and every turn's answer is the same bits
    as on a server with --no-prefix-cache and on a fresh server; the /metrics
    counters add up the cached tokens. Plain and ASan/UBSan builds."""
    model = tiny_config["name"]
    cached_srv = RunningServer(server_exe, tiny_model, "--threads", "2")
    plain_srv = RunningServer(server_exe, tiny_model, "--threads", "2", "--no-prefix-cache")
    try:
        messages, total_cached = [], 0
        for turn, user in enumerate(conversation(3, "chat")):
            messages.append(user)
            kw = SAMPLED if turn == 1 else {}
            got = chat(cached_srv, model, messages, **kw)
            ref = chat(plain_srv, model, messages, **kw)
            fresh_srv = RunningServer(server_exe, tiny_model, "--threads", "2")
            try:
                fresh = chat(fresh_srv, model, messages, **kw)
            finally:
                stop_checked(fresh_srv)
            assert got["answer"] == ref["answer"] == fresh["answer"], f"turn {turn + 1}"
            assert ref["cached"] == fresh["cached"] == 0
            if turn == 0:
                assert got["cached"] == 0
            else:  # the history: at least the previous turn's prompt
                assert prev_prompt <= got["cached"] < got["prompt_tokens"], (turn, got["cached"])
            total_cached += got["cached"]
            prev_prompt = got["prompt_tokens"]
            messages.append({"role": "assistant", "content": got["answer"]["text"]})
        assert metric(cached_srv, "colibri_prompt_tokens_cached_total") == total_cached
        assert metric(cached_srv, "colibri_prefix_cache_hits_total") == 2
        assert metric(plain_srv, "colibri_prompt_tokens_cached_total") == 0
    finally:
        stop_checked(cached_srv)
        stop_checked(plain_srv)


def test_f16_llama_reuses_only_positions_attended_the_same_way(exe, tiny_model, tiny_config):
    """f16-llama attends a prompt of 64 tokens or more as llama.cpp's tiled
    flash attention does, a shorter one and generated tokens through its
    float16 accumulator (engine.h): a prompt that grows past 64 reuses none of
    a short one's rows, and a longer one none of the answer's; each answer is
    still the bits a server without the cache gives."""
    ids = [(7 * i + 3) % tiny_config["vocab_size"] for i in range(120)]
    cached_srv = RunningServer(exe, tiny_model, "--threads", "2", "--kv-cache", "f16-llama")
    plain_srv = RunningServer(exe, tiny_model, "--threads", "2", "--kv-cache", "f16-llama", "--no-prefix-cache")
    try:
        prompt, expect_cached = ids[:40], []
        for turn, more in enumerate((0, 40, 10)):
            prompt = prompt + ids[40:40 + more] if turn else prompt
            got, ref = completion(cached_srv, prompt), completion(plain_srv, prompt)
            assert got["answer"] == ref["answer"], f"turn {turn + 1}"
            expect_cached.append(got["cached"])
            prompt = prompt + got["answer"]["trace"]["completion_tokens"]
        # 40 (short) -> 88 (tiled from position 0): nothing; 88 -> 106: the 88 prompt positions, not the answer
        assert expect_cached == [0, 0, 88], expect_cached
    finally:
        stop_checked(cached_srv)
        stop_checked(plain_srv)


def test_streamed_usage_reports_cached_tokens(exe, tiny_model, tiny_config):
    """stream_options.include_usage: the last chunk's usage carries
    cached_tokens, and the streamed text and logprobs are the plain ones."""
    srv = RunningServer(exe, tiny_model, "--threads", "2")
    try:
        messages = conversation(1, "stream")
        first = chat(srv, tiny_config["name"], messages)
        messages += [{"role": "assistant", "content": first["answer"]["text"]}, {"role": "user", "content": "and?"}]
        text, logprobs, usage = "", [], None
        for chunk in client_of(srv).chat.completions.create(
                model=tiny_config["name"], messages=messages, max_tokens=16, logprobs=True, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            if chunk.choices and chunk.choices[0].logprobs:
                logprobs += [(t.token, t.logprob) for t in chunk.choices[0].logprobs.content]
            usage = chunk.usage or usage
        assert usage.prompt_tokens_details.cached_tokens >= first["prompt_tokens"]
    finally:
        stop_checked(srv)
    ref_srv = RunningServer(exe, tiny_model, "--threads", "2", "--no-prefix-cache")
    try:
        ref = chat(ref_srv, tiny_config["name"], messages, max_tokens=16)["answer"]
        assert text == ref["text"] and logprobs == [(t, lp) for t, lp, _ in ref["logprobs"]]
    finally:
        stop_checked(ref_srv)


def test_a_diverging_prompt_reuses_only_the_common_part(exe, tiny_model):
    """One slot, token-id prompts: B shares A's first 70 tokens and reuses
    exactly those; A again after B overwrote positions 70.. reuses 70, not
    its old 120; A followed by its own answer reuses the prompt and the
    answer's tokens fed back (all but the last). Every answer equals the
    uncached server's."""
    a = [(7 * i) % 250 + 1 for i in range(120)]
    b = a[:70] + [(11 * i) % 250 + 2 for i in range(50)]
    srv = RunningServer(exe, tiny_model, "--threads", "2", "--slots", "1")
    ref_srv = RunningServer(exe, tiny_model, "--threads", "2", "--slots", "1", "--no-prefix-cache")
    try:
        def both(prompt, cached):
            got, ref = completion(srv, prompt), completion(ref_srv, prompt)
            assert got["answer"] == ref["answer"] and ref["cached"] == 0
            assert got["cached"] == cached, (got["cached"], cached)
            return got

        both(a, 0)
        both(b, 70)
        first = both(a, 70)  # positions 70..119 now hold b's tokens: only the common part is taken
        answer = first["answer"]["trace"]["completion_tokens"]
        both(a + answer + [5, 6, 7], len(a) + len(answer) - 1)  # the last sampled token was never fed
        both(a[:40], 39)  # a prompt inside the cache: all but its last token
    finally:
        stop_checked(srv)
        stop_checked(ref_srv)


def test_a_client_that_left_mid_answer_leaves_a_usable_cache(exe, tiny_model):
    """A stream closed after a few tokens frees its slot at once; the tokens
    fed until then are cached, and the next request built on them answers as
    the uncached server does."""
    prompt = [(3 * i) % 240 + 5 for i in range(60)]
    srv = RunningServer(exe, tiny_model, "--threads", "2", "--slots", "1")
    try:
        with requests.post(srv.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 180, "stream": True,
                                                               "ignore_eos": True, "colibri_trace": True},
                           stream=True, timeout=60) as reply:
            for n, _ in enumerate(reply.iter_lines()):
                if n > 6:
                    break
        got = completion(srv, prompt + [9, 9, 9])
        assert got["cached"] >= len(prompt)
    finally:
        stop_checked(srv)
    ref_srv = RunningServer(exe, tiny_model, "--threads", "2", "--no-prefix-cache")
    try:
        assert completion(ref_srv, prompt + [9, 9, 9])["answer"] == got["answer"]
    finally:
        stop_checked(ref_srv)


def test_cached_and_uncached_requests_batched_answer_as_alone(exe, tiny_model, tiny_config):
    """Turn 2 of four conversations (cached) and eight new chats, sampled and
    greedy, sent at once by 12 clients over 8 slots: each answer equals the
    same request alone on a server without the cache."""
    model = tiny_config["name"]
    srv = RunningServer(exe, tiny_model, "--threads", "2")
    ref_srv = RunningServer(exe, tiny_model, "--threads", "2", "--no-prefix-cache")
    try:
        bodies = []
        for i in range(4):
            messages = conversation(1, f"client {i}")
            first = chat(srv, model, messages)
            bodies.append((messages + [{"role": "assistant", "content": first["answer"]["text"]},
                                       {"role": "user", "content": f"go on, {i}"}], SAMPLED if i % 2 else {}))
        bodies += [(conversation(1, f"new {i}"), SAMPLED if i % 2 else {}) for i in range(8)]
        alone = [chat(ref_srv, model, m, **kw)["answer"] for m, kw in bodies]
        with ThreadPoolExecutor(len(bodies)) as pool:
            together = list(pool.map(lambda b: chat(srv, model, b[0], **b[1]), bodies))
        for i, got in enumerate(together):
            assert got["answer"] == alone[i], f"request {i} differs batched with the cache"
        assert any(got["cached"] > 0 for got in together[:4])
    finally:
        stop_checked(srv)
        stop_checked(ref_srv)


def test_a_new_conversation_takes_the_least_recently_used_slot(exe, tiny_model):
    """Two slots. X's turn 1, then an unrelated prompt Y: Y goes to the
    empty slot, not onto X's cache (they share only the first tokens), so
    X's turn 2 still finds its history; then Z goes to the least recently
    used slot (Y's), and X's turn 3 finds its history again."""
    x1 = [1] + [(5 * i) % 200 + 10 for i in range(50)]
    y = [1] + [(13 * i) % 200 + 10 for i in range(90)]
    srv = RunningServer(exe, tiny_model, "--threads", "2", "--slots", "2")
    try:
        ans = completion(srv, x1)["answer"]["trace"]["completion_tokens"]
        assert completion(srv, y)["cached"] == 0  # the empty slot: nothing cached there
        x2 = x1 + ans + [20, 21, 22]
        got = completion(srv, x2)
        assert got["cached"] == len(x1) + len(ans) - 1
        assert completion(srv, [1, 2] + y[2:])["cached"] == 1  # Z: the LRU slot held y
        x3 = x2 + got["answer"]["trace"]["completion_tokens"] + [30]
        assert completion(srv, x3)["cached"] == len(x3) - 2
    finally:
        stop_checked(srv)


def test_help_lists_the_flag(exe):
    import subprocess
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True).stdout
    assert "--no-prefix-cache" in out


TINY_GPT_OSS = Path(__file__).resolve().parents[1].parent / "shared" / "testdata" / "tiny_moe" / "gpt_oss"


@pytest.mark.skipif(not TINY_GPT_OSS.is_dir(), reason="../shared/testdata not present")
def test_a_prefix_whose_window_the_ring_overwrote_is_not_reused(tmp_path):
    """gpt-oss's sliding layers (window 4) keep a ring of 67 positions. One
    slot answers a 200-token prompt, then a prompt sharing only its first
    20 tokens: position 20's window was overwritten long ago, so nothing
    is reused and the answer is a fresh server's (it was a 500: the engine
    refuses a window the ring no longer holds). A prompt that continues the
    first one still reuses it."""
    from colibri_build.convert import convert
    from conftest import build_server, set_max_batch_tokens
    model = set_max_batch_tokens(convert(TINY_GPT_OSS, tmp_path / "gpt_oss", progress=False), 64)
    exe = build_server(tmp_path, model, "native") / "colibri-server"
    first = [(5 * j) % 250 + 1 for j in range(200)]
    diverging = first[:20] + [(3 * j) % 250 + 1 for j in range(30)]
    continuing = first + [7, 8, 9]

    def ask(srv, prompt):
        reply = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": 6, "ignore_eos": True, "logprobs": 2})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        return body["choices"][0]["logprobs"], body["usage"]["prompt_tokens_details"]["cached_tokens"]

    cached = RunningServer(exe, model, "--slots", "1", "--threads", "1")
    fresh = RunningServer(exe, model, "--slots", "1", "--threads", "1", "--no-prefix-cache")
    try:
        ask(cached, first)
        got, reused = ask(cached, diverging)
        assert reused == 0 and got == ask(fresh, diverging)[0]
        ask(cached, first)
        got, reused = ask(cached, continuing)
        assert reused > 0 and got == ask(fresh, continuing)[0]
    finally:
        stop_checked(cached)
        stop_checked(fresh)
