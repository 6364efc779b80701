"""Three colibri-server instances x 1 thread behind nginx (deploy/nginx/colibri.conf)
against one instance x 2 threads, on the same cores, and what nginx adds.

    colibri-build synth --arch mixtral --preset small models/small
    colibri-build --model models/small --target native --dist dist
    python benchmarks/nginx_scaleout.py --server dist/small-native/colibri-server --model models/small

Each setup gets C concurrent clients (default 8), each sending N streamed chat
requests one after another, all with the same prompt, max_tokens and
ignore_eos (so every answer has max_tokens tokens). Prints, per setup, the
aggregate generated tokens/s (all tokens / wall time) and the time to first
token (request sent -> first content event at the client) P50 / P99; then
nginx's added latency: the median of GET /health and of a 1-token completion,
one at a time, through nginx minus directly. The point is correctness and
overhead on a small machine, not scale: instances x threads = the cores."""

from __future__ import annotations

import argparse
import json
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
NGINX_CONF = ROOT / "deploy" / "nginx" / "colibri.conf"


class Instance:
    def __init__(self, exe: str, model: str, threads: int):
        # Every request sends the same prompt: without --no-prefix-cache all of
        # it but a token would come from the cache, and the figures measured before it
        # would no longer compare.
        self.proc = subprocess.Popen([exe, "--model", model, "--port", "0", "--threads", str(threads),
                                      "--no-prefix-cache"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            found = re.search(r"listening on http://[^:]+:(\d+)", line)
            if found:
                self.port = int(found.group(1))
                break
        else:
            raise SystemExit(f"colibri-server did not start (exit {self.proc.wait()})")
        # Keep reading its log so that it never blocks on a full pipe.
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


class Nginx:
    def __init__(self, nginx: str, ports: list[int], folder: Path):
        text = NGINX_CONF.read_text()
        servers = re.findall(r"^\s*server 127\.0\.0\.1:\d+ max_fails=0;\n", text, re.M)
        text = text.replace("".join(servers), "".join(f"    server 127.0.0.1:{p} max_fails=0;\n" for p in ports))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        text = text.replace("listen 8080;", f"listen 127.0.0.1:{self.port};")
        (folder / "colibri.conf").write_text(text)
        main = folder / "nginx.conf"
        main.write_text(f"pid {folder}/nginx.pid;\nerror_log stderr;\ndaemon off;\nworker_processes 1;\n"
                        f"events {{}}\nhttp {{\n  access_log off;\n  client_body_temp_path {folder}/body;\n"
                        f"  proxy_temp_path {folder}/proxy;\n  include {folder}/colibri.conf;\n}}\n")
        self.proc = subprocess.Popen([nginx, "-p", str(folder), "-c", str(main)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                requests.get(self.url + "/health", timeout=5)
                return
            except requests.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("nginx did not start")
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def one_stream(session: requests.Session, url: str, body: dict) -> tuple[float, int]:
    """(seconds to the first content event, completion tokens) of one streamed request."""
    start = time.perf_counter()
    ttft, tokens = None, 0
    with session.post(url + "/v1/chat/completions", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            if ttft is None and event["choices"] and event["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - start
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    if ttft is None or tokens == 0:
        raise RuntimeError("a stream ended without content or usage")
    return ttft, tokens


def load(url: str, clients: int, per_client: int, body: dict) -> dict:
    def client() -> list[tuple[float, int]]:
        with requests.Session() as s:
            return [one_stream(s, url, body) for _ in range(per_client)]

    with ThreadPoolExecutor(clients) as pool:
        start = time.perf_counter()
        results = [r for f in [pool.submit(client) for _ in range(clients)] for r in f.result()]
        wall = time.perf_counter() - start
    ttfts = sorted(t for t, _ in results)
    return {"tokens_per_s": sum(n for _, n in results) / wall, "wall_s": wall,
            "ttft_p50_ms": 1000 * percentile(ttfts, 50), "ttft_p99_ms": 1000 * percentile(ttfts, 99),
            "requests": len(results)}


def percentile(sorted_values: list[float], p: float) -> float:
    # Nearest rank: with few samples P99 is the largest but one or the largest.
    k = max(0, min(len(sorted_values) - 1, round(p / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[k]


def median_latency_ms(session: requests.Session, call, n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call(session)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def added_latency(direct: str, proxied: str, n: int) -> dict:
    """Median of GET /health and of a 1-token completion, one at a time, each way."""
    def health(url):
        return lambda s: s.get(url + "/health", timeout=30).raise_for_status()

    def one_token(url):
        body = {"prompt": "hi", "max_tokens": 1, "ignore_eos": True}
        return lambda s: s.post(url + "/v1/completions", json=body, timeout=30).raise_for_status()

    out = {}
    with requests.Session() as s:
        for name, make in (("health", health), ("1-token completion", one_token)):
            make(direct)(s), make(proxied)(s)  # warm connections
            d = median_latency_ms(s, make(direct), n)
            p = median_latency_ms(s, make(proxied), n)
            out[name] = (d, p)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True, help="colibri-server executable")
    ap.add_argument("--model", required=True, help="model folder")
    ap.add_argument("--nginx", default="/usr/sbin/nginx")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=32, help="the prompt: this many words")
    ap.add_argument("--latency-samples", type=int, default=200)
    args = ap.parse_args()
    body = {"messages": [{"role": "user", "content": " ".join(["benchmark"] * args.prompt_words)}],
            "max_tokens": args.max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0}
    print(f"{args.clients} clients x {args.requests} streamed chat requests, max_tokens {args.max_tokens} "
          f"(ignore_eos), prompt {args.prompt_words} words; model {args.model}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        one = Instance(args.server, args.model, 2)
        try:
            load(one.url, 2, 1, body)  # warm up (weights paged in)
            rows.append(("1 x 2 threads, direct", load(one.url, args.clients, args.requests, body)))
            (Path(tmp) / "n1").mkdir()
            proxy = Nginx(args.nginx, [one.port], Path(tmp) / "n1")
            try:
                rows.append(("1 x 2 threads, via nginx", load(proxy.url, args.clients, args.requests, body)))
                latency = added_latency(one.url, proxy.url, args.latency_samples)
            finally:
                proxy.stop()
        finally:
            one.stop()
        three = [Instance(args.server, args.model, 1) for _ in range(3)]
        try:
            (Path(tmp) / "n3").mkdir()
            proxy = Nginx(args.nginx, [i.port for i in three], Path(tmp) / "n3")
            try:
                load(proxy.url, 3, 1, body)
                rows.append(("3 x 1 thread, via nginx", load(proxy.url, args.clients, args.requests, body)))
            finally:
                proxy.stop()
        finally:
            for i in three:
                i.stop()
    print(f"{'setup':28} {'tokens/s':>9} {'TTFT P50 ms':>12} {'TTFT P99 ms':>12} {'wall s':>7}")
    for name, r in rows:
        print(f"{name:28} {r['tokens_per_s']:9.1f} {r['ttft_p50_ms']:12.1f} {r['ttft_p99_ms']:12.1f} "
              f"{r['wall_s']:7.1f}")
    for name, (d, p) in latency.items():
        print(f"nginx added latency, {name} (median of {args.latency_samples}): direct {d:.3f} ms, "
              f"via nginx {p:.3f} ms, added {p - d:.3f} ms")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
