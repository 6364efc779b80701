"""How much the time of one identical decode step varies on this machine:
the same token at the same position through the in-process engine, again
and again. Every step reads the same weights and does the same arithmetic,
so the spread of its times is the machine's (memory bandwidth shared with
other tenants, scheduling), the floor under any inter-token P99 / P50.
`colibri-build bench` measures it too, beside each model's latencies.

    python benchmarks/step_spread.py MODEL_DIR [--steps 256] [--threads 2]

Prints P50, P90, P99 and max in ms and P99 / P50."""

from __future__ import annotations

import argparse

from colibri_build.bench import identical_step_spread


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="model folder (model-config.json, weights.cbw)")
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    s = identical_step_spread(args.model, args.threads, args.steps)
    if not s:
        raise SystemExit("step_spread: the compiled engine binding (colibri_build._engine) is not installed")
    print(f"{args.steps} identical steps, {args.threads} threads: P50 {s['p50_ms']:.2f} ms, P90 {s['p90_ms']:.2f}, "
          f"P99 {s['p99_ms']:.2f}, max {s['max_ms']:.2f}; P99 / P50 {s['p99_over_p50']:.2f}")


if __name__ == "__main__":
    main()
