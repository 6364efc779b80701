"""The cost of constrained decoding in decode tokens/s at batch 1: the same
chats, one at a time, free and under response_format (a JSON Schema), greedy
and sampled, from the server's own `timings.decode_tokens_per_second`.

    python benchmarks/structured_outputs.py SERVER_EXE MODEL_DIR [--requests 8] [--max-tokens 100] [--threads 1]
        [--rounds 2]

Free chats run with ignore_eos for their whole max_tokens; constrained ones
end with their document, so rates (not times) are compared, from the first
streamed token on (the prompt behind); a document of one token ("{}" in
one) has no decode step and is left out. Modes run in turn, --rounds times
over, so all meet the machine's changing load alike; the table gives
medians, the min-max spread and the load average, and the server's CPU time
per decoded token over the same spans (Linux: /proc), which a loaded machine
moves far less than it moves rates. On a
random-weight model the model wants an invalid token at almost every
structural position, so each of those steps computes the full mask: the
adversarial case, not the typical one.

Three more columns compare like with like, so that a change in what is
sampled (a document's length and shape follow the sampled stream), or a
block of requests meeting a busier moment, cannot pass for a change in the
mask's cost. "vs same-length free": right after
each constrained request, a free one with the same messages and seed and
max_tokens = that document's tokens (ignore_eos), so both decode the same
number of tokens at the same positions, one after the other; the column is
the median (min-max) over those pairs of the constrained rate over the free
one. "sample us/token" is the server's `timings.sample_ms` (the CPU time
spent choosing the tokens: sampling, and under a constraint its draws,
masks and matcher) per generated token, and "mask share" its excess over
the free requests' (all of them) as a share of the server's CPU per free
decoded token: the masking's own cost, whatever was sampled, and CPU over
CPU, so a busy machine moves it little (where it moves the "vs free" rates
of two blocks of requests a lot)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import requests

from colibri_build.bench import Server

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags", "address"],
          "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0},
                         "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
                         "address": {"type": "object", "additionalProperties": False, "required": ["city"],
                                     "properties": {"city": {"type": "string"}, "zip": {"type": "string"}}}}}
MODES = {
    "free": {"ignore_eos": True},
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}},
    "json_object": {"response_format": {"type": "json_object"}},
}
SAMPLINGS = {"greedy": {}, "T=1": {"temperature": 1.0}}


def run(url: str, body: dict, pid: int) -> tuple[float, float, int, dict]:
    """One streamed request: its decode rate (the server's
    timings.decode_tokens_per_second: tokens after the first over the
    server's time from the first to the last, no HTTP tail, which would
    weigh more on a short document than on a long free answer), the
    server's CPU seconds from the first streamed token to the end, decode
    steps (tokens after the first), and the server's timings."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    cpu0 = None
    tokens, rate, timings = 0, 0.0, {}
    with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=600) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
                timings = event["timings"]
                rate = timings["decode_tokens_per_second"]
            elif cpu0 is None and event["choices"] and event["choices"][0]["delta"].get("content"):
                cpu0 = cpu_seconds(pid)  # the prompt is behind
        cpu1 = cpu_seconds(pid)
    if cpu0 is None or tokens < 2:
        return 0.0, 0.0, 0, timings
    return rate, cpu1 - cpu0, tokens - 1, timings


def cpu_seconds(pid: int) -> float:
    """CPU time of a process's threads, in nanoseconds where Linux's
    schedstat has them (/proc's user + system ticks are 10 ms, coarser than
    a short request), else ticks; 0 where /proc is missing."""
    try:
        return sum(int(f.read_text().split()[0]) for f in Path(f"/proc/{pid}/task").glob("*/schedstat")) * 1e-9
    except (OSError, ValueError, IndexError):
        pass
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("server", type=Path)
    ap.add_argument("model", type=Path)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    load = [os.getloadavg()[0]]
    srv = Server(args.server, args.model, args.threads).start()
    rates: dict = {}
    cpu: dict = {}
    sample: dict = {}  # (sampling, mode): (sample_ms, tokens) summed
    pairs: dict = {}  # (sampling, mode): constrained rate / same-length free rate - 1
    try:
        for _ in range(args.rounds):
            for sname, sampling in SAMPLINGS.items():
                for mode, extra in MODES.items():
                    for i in range(args.requests):
                        body = {"messages": [{"role": "user", "content": f"Describe person {i} as JSON."}],
                                "max_tokens": args.max_tokens, **sampling, **extra}
                        if sampling:
                            body["seed"] = i
                        r, used, n, timings = run(srv.url, body, srv.proc.pid)
                        if not n:
                            continue
                        rates.setdefault((sname, mode), []).append(r)
                        total, steps = cpu.get((sname, mode), (0.0, 0))
                        cpu[(sname, mode)] = (total + used, steps + n)
                        ms, toks = sample.get((sname, mode), (0.0, 0))
                        sample[(sname, mode)] = (ms + timings["sample_ms"], toks + n + 1)
                        if mode != "free":  # the same tokens, free: same seed, same length
                            same = {**body, "max_tokens": n + 1, **MODES["free"]}
                            del same["response_format"]
                            r_free, _, n_free, _ = run(srv.url, same, srv.proc.pid)
                            if n_free == n:
                                pairs.setdefault((sname, mode), []).append(r / r_free - 1)
            load.append(os.getloadavg()[0])
    finally:
        srv.stop()
    print("| sampling | mode | decode tokens/s, median (min-max, requests) | vs free | CPU ms per decoded token "
          "| vs free | vs same-length free, median (min-max, pairs) | sample us/token | mask share |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for sname in SAMPLINGS:
        free = statistics.median(rates[(sname, "free")])
        free_cpu = cpu[(sname, "free")][0] / cpu[(sname, "free")][1]
        free_sample = sample[(sname, "free")][0] / sample[(sname, "free")][1]  # ms a token
        for mode in MODES:
            got = rates.get((sname, mode))
            if not got:  # e.g. greedy json_object on a random model: "{}" every time
                print(f"| {sname} | {mode} | - (every document a single token: no decode step) | - | - | - | - | - "
                      "| - |")
                continue
            r = statistics.median(got)
            per = cpu[(sname, mode)][0] / cpu[(sname, mode)][1]
            ms, tokens = sample[(sname, mode)]
            paired = pairs.get((sname, mode), [])
            same = (f"{100 * statistics.median(paired):+.1f}% ({100 * min(paired):+.1f}..{100 * max(paired):+.1f}%, "
                    f"{len(paired)})" if paired else "-")
            share = "" if mode == "free" else f"{100 * (ms / tokens - free_sample) / (1000 * free_cpu):+.1f}%"
            print(f"| {sname} | {mode} | {r:.1f} ({min(got):.1f}-{max(got):.1f}, {len(got)}) | "
                  f"{100 * (r / free - 1):+.1f}% | {1000 * per:.2f} | {100 * (per / free_cpu - 1):+.1f}% | "
                  f"{same if mode != 'free' else ''} | {1000 * ms / tokens:.0f} | {share} |")
    print(f"load average (1 min) through the run: {min(load):.1f}-{max(load):.1f}")


if __name__ == "__main__":
    main()
