"""The cost of constrained decoding in decode tokens/s at batch 1: the same
chats, one at a time, free and under response_format (a JSON Schema), greedy
and sampled, from the server's own `timings.decode_tokens_per_second`.

    python benchmarks/structured_outputs.py SERVER_EXE MODEL_DIR [--requests 8] [--max-tokens 100] [--threads 1]

Free chats run with ignore_eos for their whole max_tokens; constrained ones
end with their document, so rates (not times) are compared. Modes run in
turn, twice over, so both meet the machine's changing load alike. On a
random-weight model the model wants an invalid token at almost every
structural position, so each of those steps computes the full mask: the
adversarial case, not the typical one."""

from __future__ import annotations

import argparse
import statistics
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


def rate(url: str, body: dict) -> float:
    reply = requests.post(url + "/v1/chat/completions", json=body, timeout=600)
    reply.raise_for_status()
    return reply.json()["timings"]["decode_tokens_per_second"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("server", type=Path)
    ap.add_argument("model", type=Path)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    srv = Server(args.server, args.model, args.threads).start()
    rates: dict = {}
    try:
        for _ in range(2):
            for sname, sampling in SAMPLINGS.items():
                for mode, extra in MODES.items():
                    for i in range(args.requests):
                        body = {"messages": [{"role": "user", "content": f"Describe person {i} as JSON."}],
                                "max_tokens": args.max_tokens, **sampling, **extra}
                        if sampling:
                            body["seed"] = i
                        rates.setdefault((sname, mode), []).append(rate(srv.url, body))
    finally:
        srv.stop()
    print(f"| sampling | mode | decode tokens/s (median of {2 * args.requests}) | vs free |")
    print("|---|---|---:|---:|")
    for sname in SAMPLINGS:
        free = statistics.median(rates[(sname, "free")])
        for mode in MODES:
            r = statistics.median(rates[(sname, mode)])
            print(f"| {sname} | {mode} | {r:.1f} | {100 * (r / free - 1):+.1f}% |")


if __name__ == "__main__":
    main()
