"""How much the time of one identical decode step varies on this machine:
the same token at the same position through the in-process engine, again
and again. Every step reads the same weights and does the same arithmetic,
so the spread of its times is the machine's (memory bandwidth shared with
other tenants, scheduling), the floor under any inter-token P99 / P50.

    python benchmarks/step_spread.py MODEL_DIR [--steps 256] [--threads 2]

Prints P50, P90, P99 and max in ms and P99 / P50."""

from __future__ import annotations

import argparse
import time

import numpy as np

from colibri_build import Engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="model folder (model-config.json, weights.cbw)")
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    engine = Engine(args.model, threads=args.threads)
    for _ in range(8):  # page the weights in, settle the thread pool
        engine.forward([5])
    ms = []
    for _ in range(args.steps):
        start = time.perf_counter()
        engine.forward([5])
        ms.append((time.perf_counter() - start) * 1e3)
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    print(f"{args.steps} identical steps, {args.threads} threads: P50 {p50:.2f} ms, P90 {p90:.2f}, "
          f"P99 {p99:.2f}, max {max(ms):.2f}; P99 / P50 {p99 / p50:.2f}")


if __name__ == "__main__":
    main()
