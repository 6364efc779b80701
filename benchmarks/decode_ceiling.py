"""Batch-1 decode of bench models against the bandwidth ceiling of the same
run, the two ways `colibri-build bench` measures it, without the bench's
other figures (a few minutes a model rather than many on a loaded machine):

- decode requests to the model's built server, each right after a `membw`
  streaming read (the ceiling: its GB/s over the weight bytes a token reads);
- colibri-decode-bench: each decode step paired with a read of as many bytes.

    python benchmarks/decode_ceiling.py MODEL_DIR... [--repeats 5] [--pairs 128]
        [--threads 2] [--out build/decode-ceiling] [--membw ../shared/tools/membw.c]

Prints, per model, the weight bytes and KV cache a token, the load average
before and after, each pair of (ceiling, decode), and a RESULT line: median
(min-max) decode, bandwidth and the fraction of the ceiling reached."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from colibri_build import bench
from colibri_build.build import build, build_generic_server
from colibri_build.weights import warm_page_cache


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("build/decode-ceiling"))
    ap.add_argument("--membw", type=Path, default=Path.cwd().parent / "shared" / "tools" / "membw.c")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    generic = build_generic_server("native", args.out / "build")
    tool = bench.build_decode_bench(generic)
    membw = bench.MemoryBandwidth(args.membw, args.out, args.threads)
    if not membw.exe:
        raise SystemExit(f"decode_ceiling: membw ({args.membw}) did not build")
    for model in args.models:
        exe = build(model, "native", dist_root=args.out / "dist", build_root=args.out / "build", quiet=True).executable
        cfg = json.loads((model / "model-config.json").read_text())
        warm_page_cache(model / cfg["weights"]["file"])
        active = bench.active_bytes_per_token(model)
        print(f"== {model.name}: {active} weight bytes a token; {bench.kv_text(bench.kv_bytes_per_token(model))}")
        print(f"load average before: {load()}", flush=True)
        paired = bench.paired_decode(tool, model, args.threads, args.pairs) if tool else {}
        srv = bench.Server(exe, model, args.threads, ("--no-prefix-cache",)).start()
        rates, bws = [], []
        try:
            bench.decode_request(srv.url, 16, 32)
            for _ in range(args.repeats):  # alternating: both see the machine's load of the moment
                bws.append(membw.measure(passes=3))
                rates.append(bench.decode_rate(bench.timed_request(srv.url, 16, 128)))
                ceiling = bws[-1] * 1e9 / active
                print(f"  membw {bws[-1]:.1f} GB/s: ceiling {ceiling:.1f} tok/s; decode {rates[-1]:.1f} tok/s "
                      f"({rates[-1] / ceiling:.0%})", flush=True)
        finally:
            srv.stop()
        ceiling = statistics.median(bws) * 1e9 / active
        each = [r / (b * 1e9 / active) for r, b in zip(rates, bws)]
        line = (f"RESULT {model.name}: decode {statistics.median(rates):.1f} tok/s ({min(rates):.1f}-{max(rates):.1f}); "
                f"membw {statistics.median(bws):.1f} GB/s ({min(bws):.1f}-{max(bws):.1f}); ceiling {ceiling:.1f} tok/s; "
                f"reached {statistics.median(rates) / ceiling:.0%} (pairs {min(each):.0%}-{max(each):.0%})")
        if paired:
            line += (f"; paired decode / read {paired['decode_over_read']:.0%} (P10 {paired['decode_over_read_p10']:.0%}, "
                     f"P90 {paired['decode_over_read_p90']:.0%}) at {paired['read_gb_s']:.1f} GB/s, the engine's "
                     f"{paired['active_bytes_per_token']} bytes a token")
        print(line)
        print(f"load average after: {load()}", flush=True)


if __name__ == "__main__":
    main()
