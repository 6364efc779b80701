"""Server benchmark: time to first token and inter-token latency (P50/P99)
for 1 client and for `slots` concurrent clients, aggregate tokens/s, and
RSS at idle and under load.

    colibri-build synth --arch olmoe --preset bench-olmoe --dtype q8_0 models/bench  # or --preset small
    colibri-build --model models/bench --target native
    python benchmarks/server_bench.py --server dist/bench-native/colibri-server --model models/bench

Each client streams requests one after another (logprobs on, so every token
is its own event and its arrival time is seen); greedy decoding, fixed
prompts, so runs are comparable. Prints a table and writes JSON (--out)."""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def rss_kib(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", text, re.M).group(1))


def start_server(exe: Path, model: Path, extra: list[str]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([str(exe), "--model", str(model), "--port", "0", *extra], stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        match = re.search(r"listening on http://([^:]+):(\d+)", line)
        if match:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
            return proc, f"http://{match.group(1)}:{match.group(2)}"
    proc.kill()
    raise SystemExit("server did not start")


def one_request(url: str, client: int, round_no: int, max_tokens: int, prompt_len: int) -> dict:
    text = (f"client {client} round {round_no} " * prompt_len)[:prompt_len]
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "stream": True,
            "logprobs": True}
    start = time.perf_counter()
    stamps = []
    with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=600) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            choice = event["choices"][0] if event["choices"] else {}
            if choice.get("logprobs"):  # one event per generated token
                stamps.append(time.perf_counter())
    return {"ttft": stamps[0] - start if stamps else float("nan"),
            "itl": [b - a for a, b in zip(stamps, stamps[1:])], "tokens": len(stamps)}


def histogram(url: str, name: str) -> list[tuple[float, int]]:
    """(upper bound, cumulative count) of a server histogram from /metrics."""
    text = requests.get(url + "/metrics", timeout=30).text
    return [(float(le), int(n)) for le, n in re.findall(rf'^{name}_bucket{{le="([^"]+)"}} (\d+)$', text, re.M)]


def bucket_quantile(before, after, q: float) -> float:
    """The bucket bound under which q% of the observations between two
    scrapes fell (the server's own view, free of client overhead)."""
    counts = [(le, a - b) for (le, a), (_, b) in zip(after, before)]
    total = counts[-1][1] if counts else 0
    for le, n in counts:
        if total and n >= q / 100 * total:
            return le
    return float("nan")


def run_level(url: str, pid: int, clients: int, rounds: int, max_tokens: int, prompt_len: int) -> dict:
    itl_before = histogram(url, "colibri_inter_token_latency_seconds")
    results: list[dict] = []
    lock = threading.Lock()
    rss_peak = [0]
    stop = threading.Event()

    def client(i):
        for r in range(rounds):
            res = one_request(url, i, r, max_tokens, prompt_len)
            with lock:
                results.append(res)

    def sample_rss():
        while not stop.is_set():
            rss_peak[0] = max(rss_peak[0], rss_kib(pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample_rss)
    sampler.start()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    stop.set()
    sampler.join()
    ttft = [r["ttft"] for r in results]
    itl = [x for r in results for x in r["itl"]]
    tokens = sum(r["tokens"] for r in results)
    itl_after = histogram(url, "colibri_inter_token_latency_seconds")
    return {"server_itl_p50_le_ms": bucket_quantile(itl_before, itl_after, 50) * 1e3,
            "server_itl_p99_le_ms": bucket_quantile(itl_before, itl_after, 99) * 1e3,"clients": clients, "requests": len(results), "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "ttft_p50_ms": percentile(ttft, 50) * 1e3,
            "ttft_p99_ms": percentile(ttft, 99) * 1e3, "itl_p50_ms": percentile(itl, 50) * 1e3,
            "itl_p99_ms": percentile(itl, 99) * 1e3, "itl_mean_ms": statistics.fmean(itl) * 1e3 if itl else 0,
            "rss_peak_mib": rss_peak[0] / 1024}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", type=Path, required=True, help="colibri-server executable")
    ap.add_argument("--model", type=Path, required=True, help="model folder")
    ap.add_argument("--threads", type=int, default=0, help="server --threads (0: one per CPU)")
    ap.add_argument("--clients", default="", help="comma-separated concurrency levels (default: 1,slots)")
    ap.add_argument("--rounds", type=int, default=3, help="requests per client per level")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32, help="prompt bytes")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args(argv)

    extra = ["--threads", str(args.threads)] if args.threads else []
    proc, url = start_server(args.server, args.model, extra)
    try:
        health = requests.get(url + "/health", timeout=30).json()
        slots = health["slots"]
        levels = [int(c) for c in args.clients.split(",")] if args.clients else [1, slots]
        one_request(url, 0, -1, 4, args.prompt_len)  # warm-up: touch the weights once
        idle = rss_kib(proc.pid) / 1024
        rows = [run_level(url, proc.pid, c, args.rounds, args.max_tokens, args.prompt_len) for c in levels]
        idle_after = rss_kib(proc.pid) / 1024
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    report = {"server": str(args.server), "model": str(args.model), "slots": slots, "max_tokens": args.max_tokens,
              "prompt_len": args.prompt_len, "rss_idle_mib": idle, "rss_idle_after_mib": idle_after, "levels": rows}
    print(f"model {args.model.name}, {slots} slots, {args.max_tokens} tokens per request, RSS idle {idle:.1f} MiB "
          f"(after load {idle_after:.1f} MiB)")
    print(f"{'clients':>7} {'tok/s':>8} {'TTFT p50':>9} {'p99':>8} {'ITL p50':>8} {'p99':>8} {'p99/p50':>7} "
          f"{'RSS peak':>9}  server ITL p50/p99 <=")
    for r in rows:
        ratio = r["itl_p99_ms"] / r["itl_p50_ms"] if r["itl_p50_ms"] else float("nan")
        print(f"{r['clients']:>7} {r['tokens_per_s']:>8.1f} {r['ttft_p50_ms']:>7.1f}ms {r['ttft_p99_ms']:>6.1f}ms "
              f"{r['itl_p50_ms']:>6.2f}ms {r['itl_p99_ms']:>6.2f}ms {ratio:>7.2f} {r['rss_peak_mib']:>7.1f}MiB  "
              f"{r['server_itl_p50_le_ms']:g}/{r['server_itl_p99_le_ms']:g}ms")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
