"""Inter-token latency and time to first token of 8 chat clients arriving
together, for several values of the server's --step-tokens (the most tokens a
step carries while requests decode): the trade between flat inter-token
latency and the first token of prompts that arrive while others decode.

    python benchmarks/step_tokens.py SERVER_EXE MODEL_DIR [--values 8,16,0] [--rounds 5] [--threads 2]

Each value gets a fresh server, a first round that brings every slot's KV
cache in (its pages come at a slot's first token), then the measured rounds
of 8 concurrent ~20-token chats of 32 tokens (colibri-build bench's 8 clients).
The values are run in turn, twice, so that both passes meet the machine's
changing bandwidth alike."""

from __future__ import annotations

import argparse
from pathlib import Path

from colibri_build.bench import Server, chat_request, concurrent, latency, percentile


def measure(exe: Path, model: Path, threads: int, value: str, rounds: int) -> str:
    # The chats share most of their ~20 tokens: --no-prefix-cache keeps every
    # prompt computed whole, as when the figures in docs/server.md were taken.
    srv = Server(exe, model, threads, ("--step-tokens", value, "--no-prefix-cache")).start()
    try:
        concurrent(lambda i: chat_request(srv.url, 900 + i), 8)
        results = []
        for r in range(rounds):
            out, _ = concurrent(lambda i: chat_request(srv.url, 100 * r + i), 8)
            results += out
    finally:
        srv.stop()
    lat = latency(results)
    itl = [(b - a) * 1e3 for res in results for a, b in zip(res["stamps"], res["stamps"][1:])]
    return (f"--step-tokens {value:>3}: ITL P50 {lat['itl_p50_ms']:.1f} ms, P90 {percentile(itl, 90):.1f}, "
            f"P99 {lat['itl_p99_ms']:.1f} (P99 / P50 {lat['itl_p99_over_p50']:.2f}); "
            f"TTFT P50 {lat['ttft_p50_ms']:.0f} ms, P99 {lat['ttft_p99_ms']:.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("server", type=Path, help="a built colibri-server")
    ap.add_argument("model", type=Path, help="its model folder")
    ap.add_argument("--values", default="8,16,0", help="--step-tokens values, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    for _ in range(2):
        for value in args.values.split(","):
            print(measure(args.server, args.model, args.threads, value, args.rounds), flush=True)


if __name__ == "__main__":
    main()
