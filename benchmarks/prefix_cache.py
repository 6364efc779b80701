"""Time to first token of a chat's second turn, with the prefix cache and
without it (--no-prefix-cache): turn 1 is a long user message (~1,450 tokens)
answered with 32 tokens; turn 2 sends the whole history back with a short
question (~1,520 tokens in all), and the cache lets it start after what the
slot holds.

    python benchmarks/prefix_cache.py SERVER_EXE MODEL_DIR [--runs 5] [--history 1450] [--threads 2]

The model's context must hold the history (synth presets: --context-length
2048). Both servers run side by side, one request at a time, the runs
alternating between them so both meet the machine's changing load alike;
every run is a new conversation (its first words differ), so only the
second turn finds its own history cached. Prints each run and the medians:
the client's TTFT (request sent to first streamed token), the server's
prompt_ms, and the cached tokens."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import requests

from colibri_build.bench import Server

WORDS = ("the quick brown fox jumps over a lazy dog while seven wise owls keep watch from an old oak "
         "tree and count every star that rises above the quiet hills").split()


def long_message(run: int, tokens: int, url: str) -> str:
    """A user message of about `tokens` tokens with the model's tokenizer,
    its first words unique to the run."""
    text, i = f"Conversation {run}.", 0
    while True:
        n = len(requests.post(url + "/tokenize", json={"content": text}, timeout=60).json()["tokens"])
        if n >= tokens:
            return text
        # Half the words still missing, by the tokens a word took so far: a
        # few /tokenize calls, not one per word.
        step = max(1, int((tokens - n) / (n / (i + 2)) / 2))
        text += " " + " ".join(WORDS[(i + j) % len(WORDS)] for j in range(step))
        i += step


def turn(url: str, messages: list, max_tokens: int) -> dict:
    """One streamed chat turn: client TTFT, the answer, the server's usage
    and timings. With logprobs every token is an event, so the first event
    is the first token even when its text is held back (a character not
    complete yet)."""
    body = {"messages": messages, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "logprobs": True, "stream_options": {"include_usage": True}}
    start, first, text, usage, timings = time.perf_counter(), None, "", {}, {}
    with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=600) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("choices") and event["choices"][0].get("logprobs"):
                first = first or time.perf_counter()
                text += event["choices"][0]["delta"].get("content", "")
            if event.get("usage"):
                usage, timings = event["usage"], event["timings"]
    return {"ttft_ms": ((first or time.perf_counter()) - start) * 1e3, "text": text, "usage": usage,
            "timings": timings}


def conversation(url: str, run: int, history: int) -> dict:
    messages = [{"role": "user", "content": long_message(run, history, url)}]
    one = turn(url, messages, 32)
    messages += [{"role": "assistant", "content": one["text"]},
                 {"role": "user", "content": "Say that again, in fewer words."}]
    two = turn(url, messages, 8)
    two["turn1_prompt_tokens"] = one["usage"]["prompt_tokens"]
    return two


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("server", type=Path, help="a built colibri-server")
    ap.add_argument("model", type=Path, help="its model folder")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--history", type=int, default=1450,
                    help="tokens of the first turn's message (turn 2's prompt is ~70 more)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    servers = {"cache": Server(args.server, args.model, args.threads).start(),
               "no cache": Server(args.server, args.model, args.threads, ("--no-prefix-cache",)).start()}
    results: dict = {name: [] for name in servers}
    try:
        for run in range(args.runs):
            for name, srv in servers.items():
                r = conversation(srv.url, run, args.history)
                results[name].append(r)
                print(f"run {run} {name:>8}: turn 2 of {r['usage']['prompt_tokens']} prompt tokens "
                      f"({r['turn1_prompt_tokens']} in turn 1), cached {r['usage']['prompt_tokens_details']['cached_tokens']}: "
                      f"TTFT {r['ttft_ms']:.0f} ms, server prompt {r['timings']['prompt_ms']:.0f} ms in "
                      f"{r['timings']['prompt_steps']} steps", flush=True)
    finally:
        for srv in servers.values():
            srv.stop()
    for name, rs in results.items():
        ttft = statistics.median(r["ttft_ms"] for r in rs)
        prompt = statistics.median(r["timings"]["prompt_ms"] for r in rs)
        cached = statistics.median(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in rs)
        tokens = statistics.median(r["usage"]["prompt_tokens"] for r in rs)
        print(f"{name:>8}: turn-2 TTFT median {ttft:.0f} ms (min {min(r['ttft_ms'] for r in rs):.0f}, max "
              f"{max(r['ttft_ms'] for r in rs):.0f}), server prompt {prompt:.0f} ms, cached {cached:.0f} of "
              f"{tokens:.0f} tokens (medians), over {len(rs)} runs")


if __name__ == "__main__":
    main()
