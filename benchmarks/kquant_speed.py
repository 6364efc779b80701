"""Batch-1 decode of the bench models in q8_0, q4_k_m and q6_k against the
memory bandwidth of the same moment, for one or more builds of the engine
side by side (e.g. before and after a kernel change), alternating.

Each build is a colibri-decode-bench executable (`ninja -C BUILD
colibri-decode-bench` in a generic build, as `colibri-build bench` makes
it): every decode step is paired with a streaming read of as many bytes,
so decode / read is the step's share of the bandwidth ceiling at that
moment. Rounds alternate builds and types so that a change in the shared
machine's bandwidth hits them all alike; medians over rounds are printed.

    python benchmarks/kquant_speed.py --tool before=PATH --tool after=PATH \
        [--presets bench-olmoe,bench-mixtral] [--dtypes q8_0,q4_k_m,q6_k] \
        [--rounds 3] [--pairs 64] [--models-dir models] [--json OUT]

The models are `colibri-build bench`'s (made when missing: the K-quant
ones as random valid blocks, speed only)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
from pathlib import Path

from colibri_build.bench import PAIRED, ensure_model


def run_pair(tool: str, model: Path, threads: int, pairs: int) -> dict | None:
    done = subprocess.run([tool, str(model), "--pairs", str(pairs), "--threads", str(threads)], capture_output=True,
                          text=True, timeout=900)
    got = PAIRED.search(done.stdout)
    if done.returncode != 0 or not got:
        print(f"  {tool} {model.name} failed: {done.stdout[-300:]}{done.stderr[-300:]}")
        return None
    g = got.groups()
    return {"bytes": int(g[2]), "tok_s": float(g[3]), "gb_s": float(g[4]), "read_gb_s": float(g[5]),
            "ratio": float(g[8])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", action="append", required=True, help="NAME=path to colibri-decode-bench")
    ap.add_argument("--presets", default="bench-olmoe,bench-mixtral")
    ap.add_argument("--dtypes", default="q8_0,q4_k_m,q6_k")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models-dir", type=Path, default=Path("models"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    tools = dict(t.split("=", 1) for t in args.tool)
    models = {(p, d): ensure_model(args.models_dir, p, d) for p in args.presets.split(",")
              for d in args.dtypes.split(",")}
    runs: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        load = os.getloadavg()[0]
        print(f"round {r + 1}/{args.rounds} (load average {load:.1f})", flush=True)
        order = list(tools.items()) if r % 2 == 0 else list(tools.items())[::-1]
        for (preset, dtype), model in models.items():
            for name, tool in order:
                got = run_pair(tool, model, args.threads, args.pairs)
                if got:
                    got["load"] = load
                    runs.setdefault(f"{preset}:{dtype}:{name}", []).append(got)
                    print(f"  {preset} {dtype} {name}: {got['tok_s']:.1f} tok/s, {got['gb_s']:.1f} GB/s, "
                          f"read {got['read_gb_s']:.1f} GB/s, decode/read {got['ratio']:.2f}", flush=True)
    print("\n| model | weights | build | decode tok/s (median) | MB a token | decode / read, paired (median, min-max) |")
    print("|---|---|---|---|---|---|")
    for key, rs in runs.items():
        preset, dtype, name = key.split(":")
        ratios = [x["ratio"] for x in rs]
        print(f"| {preset} | {dtype} | {name} | {statistics.median(x['tok_s'] for x in rs):.1f} | "
              f"{rs[0]['bytes'] / 1e6:.0f} | {statistics.median(ratios):.0%} ({min(ratios):.0%}-{max(ratios):.0%}) |")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2) + "\n")


if __name__ == "__main__":
    main()
