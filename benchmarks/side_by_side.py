"""Colibri and llama.cpp side by side on the same GGUF file, same machine,
same thread count, alternating.

For each GGUF file: `colibri-build convert` makes a Colibri model of it (every
weight keeps its type, bit for bit), a colibri-server is built for this
machine, and then each round runs, in alternating order:

- llama.cpp: `llama-bench -m FILE -t T -p 512,4096 -n 128 -r R -o json`
  (its pp512 / pp4096: one prompt processed from an empty cache, in its
  default batches; tg128: 128 tokens decoded one at a time from position 0;
  no HTTP, no sampling);
- Colibri through colibri-server (HTTP, toolkit/bench.py's requests): decode
  tokens/s at batch 1 (16-token prompt, 128 tokens, the server's own timing),
  prefill tokens/s of a 512- and a 4096-token prompt (the server's timing),
  and time to first token (TTFT: the client's wall time for a one-token
  completion, HTTP included);
- Colibri in-process (the Python Engine, the same C engine without HTTP or
  sampling: the path closest to llama-bench): prefill of the same prompts,
  128 tokens decoded one at a time from position 0;
- the machine's streaming read bandwidth (../shared/tools/membw.c), giving
  the decode ceiling: bandwidth / weight bytes one token reads.

Medians over rounds, min-max, the ratio Colibri / llama.cpp per phase and
the fraction of the bandwidth ceiling each engine's decode reaches are
printed as a table and written as JSON.

    python benchmarks/side_by_side.py models/gguf/bench-olmoe-Q8_0.gguf [more.gguf ...] \\
        [--llama-cpp ~/.cache/colibri/llama.cpp-0.3.36] [--threads 2] [--rounds 5] \\
        [--prompts 512,4096] [--gen 128] [--reps 1] [--out build/side_by_side]

llama.cpp comes from benchmarks/llamacpp_build.sh; the bench shapes' GGUF
files from benchmarks/llamacpp_gguf.py. --skip-llama-cpp runs Colibri's half
alone (a check of the harness: no ratios)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from colibri_build import bench, prefill_peak
from colibri_build.bench import MemoryBandwidth, Server, active_bytes_per_token, decode_rate, spread, timed_request

REPO = Path(__file__).resolve().parent.parent
MEMBW = REPO.parent / "shared" / "tools" / "membw.c"


def log(msg: str) -> None:
    sys.stderr.write(f"side_by_side: {msg}\n")
    sys.stderr.flush()


def default_llama_cpp() -> Path | None:
    cache = Path(os.environ.get("COLIBRI_CACHE", Path.home() / ".cache" / "colibri"))
    found = sorted(cache.glob("llama.cpp-*/bin/llama-bench"))
    return found[-1].parent.parent if found else None


def prompt_ids(n: int, seed: int) -> list[int]:
    return [(7 * i + seed) % 200 + 1 for i in range(n)]  # bench.timed_request's prompts


# --- llama.cpp ---------------------------------------------------------------

LLAMA_SETTINGS = ("build_commit", "cpu_info", "model_type", "model_size", "model_n_params", "n_threads", "n_batch",
                  "n_ubatch", "type_k", "type_v", "flash_attn", "use_mmap", "poll", "n_gpu_layers", "backends")


def llama_bench(tool: Path, gguf: Path, threads: int, prompts: list[int], gen: int, reps: int) -> dict:
    """One llama-bench run: tokens/s of each prompt length and of decode."""
    cmd = [str(tool), "-m", str(gguf), "-t", str(threads), "-p", ",".join(map(str, prompts)), "-n", str(gen),
           "-r", str(reps), "-o", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"side_by_side: {' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows = json.loads(done.stdout)
    out: dict = {"settings": {k: rows[0].get(k) for k in LLAMA_SETTINGS if k in rows[0]}}
    for r in rows:
        key = f"prefill_{r['n_prompt']}" if r["n_gen"] == 0 else "decode" if r["n_prompt"] == 0 else None
        if key:
            out[key] = r["avg_ts"]
            out[key + "_samples"] = r["samples_ts"]
    for n in prompts:  # the prompt's processing time: TTFT less sampling and HTTP
        out[f"prompt_time_{n}_ms"] = n / out[f"prefill_{n}"] * 1e3
    return out


# --- Colibri -----------------------------------------------------------------

def colibri_http(exe: Path, model: Path, threads: int, prompts: list[int], gen: int, seed: int,
                 kv_cache: str) -> dict:
    """Through colibri-server, as `colibri-build bench` measures (a server
    per round: an idle one must not share the cores with llama-bench)."""
    srv = Server(exe, model, threads, ("--no-prefix-cache", "--kv-cache", kv_cache)).start()
    try:
        timed_request(srv.url, 16, 8)  # every code path once
        out = {"decode": decode_rate(timed_request(srv.url, 16, gen, seed=seed))}
        for n in prompts:
            r = timed_request(srv.url, n, 1, seed=seed)
            out[f"prefill_{n}"] = r["timings"]["prompt_tokens_per_second"]
            out[f"ttft_{n}_ms"] = (r["end"] - r["start"]) * 1e3
    finally:
        srv.stop()
    return out


def colibri_engine(model: Path, threads: int, prompts: list[int], gen: int, seed: int, kv_cache: str) -> dict:
    """In-process (colibri_build.Engine): no HTTP, no JSON, argmax for
    sampling; prefill and decode from position 0, as llama-bench runs them."""
    from colibri_build import Engine
    if Engine is None:
        return {}
    with Engine(str(model), threads=threads, kv_cache=kv_cache) as e:
        e.forward([5], all_logits=False)
        out = {}
        for n in prompts:
            t0 = time.perf_counter()
            e.forward(prompt_ids(n, seed), all_logits=False)
            out[f"prefill_{n}"] = n / (time.perf_counter() - t0)
        tok = 1 + seed % 200
        t0 = time.perf_counter()
        for pos in range(gen):
            tok = int(np.argmax(e.forward([tok], start=pos)[0]))
        out["decode"] = gen / (time.perf_counter() - t0)
    return out


def colibri_model(gguf: Path, folder: Path, context: int, step_tokens: int | None = None) -> Path:
    """The converted model, reused while newer than the GGUF file; with
    step_tokens, its max_batch_tokens (the server's prefill chunk) set so."""
    from colibri_build.gguf_convert import convert_gguf
    cfg = folder / "model-config.json"
    if not (cfg.is_file() and cfg.stat().st_mtime > gguf.stat().st_mtime and
            json.loads(cfg.read_text())["context_length"] >= context):
        log(f"converting {gguf} -> {folder}")
        # One slot: the bench decodes one sequence; the KV cache of a 4096-token
        # context for 8 slots would be GBs the measurement does not use.
        convert_gguf(gguf, folder, context_length=context, batch_slots=1, progress=False, force=folder.exists())
    data = json.loads(cfg.read_text())
    if step_tokens and data["max_batch_tokens"] != step_tokens:
        data["max_batch_tokens"] = step_tokens
        cfg.write_text(json.dumps(data, indent=2) + "\n")
    return folder


# --- the run -----------------------------------------------------------------

def phases(prompts: list[int]) -> list[str]:
    return ["decode"] + [f"prefill_{n}" for n in prompts]


def summarise(rounds: list[dict], prompts: list[int], active_bytes: int, macs: dict | None = None,
              threads: int = 2) -> dict:
    s: dict = {}
    peaks = [r["int8_peak"]["gmac_s"] for r in rounds if r.get("int8_peak")]
    if peaks:
        s["int8_peak_gmac_s"] = spread(peaks)
        s["int8_peak_mix"] = next(r["int8_peak"]["mix"] for r in rounds if r.get("int8_peak"))
    bws = [r["bandwidth_gb_s"] for r in rounds if r.get("bandwidth_gb_s")]
    if bws:
        s["bandwidth_gb_s"] = spread(bws)
        s["decode_ceiling_tok_s"] = statistics.median(bws) * 1e9 / active_bytes
    for engine in ("llama_cpp", "colibri_http", "colibri_engine"):
        got = [r[engine] for r in rounds if r.get(engine)]
        if not got:
            continue
        keys = phases(prompts) + [k for k in got[0] if k.startswith(("ttft_", "prompt_time_"))]
        s[engine] = {k: spread([g[k] for g in got]) for k in keys if k in got[0]}
        if "decode_ceiling_tok_s" in s:
            s[engine]["decode_of_ceiling"] = s[engine]["decode"]["median"] / s["decode_ceiling_tok_s"]
        if peaks and macs:  # prefill's multiply-adds a second over the cores' int8 peak
            for n in prompts:
                if f"prefill_{n}" in s[engine]:
                    s[engine][f"prefill_{n}_of_peak"] = prefill_peak.of_peak(
                        s[engine][f"prefill_{n}"]["median"], macs[n], threads, s["int8_peak_gmac_s"]["median"])
    if "llama_cpp" in s:
        for engine in ("colibri_http", "colibri_engine"):
            if engine in s:
                # Per round (the two ran minutes apart at most), then the median.
                s[engine + "_over_llama_cpp"] = {
                    k: spread([r[engine][k] / r["llama_cpp"][k] for r in rounds if r.get(engine) and r.get("llama_cpp")])
                    for k in phases(prompts)}
    return s


def fmt(x: dict | None, digits: int = 1) -> str:
    if not x:
        return "-"
    return f"{x['median']:.{digits}f} ({x['min']:.{digits}f}-{x['max']:.{digits}f})"


def table(name: str, s: dict, prompts: list[int]) -> str:
    rows = [f"### {name}", "",
            "| phase | llama.cpp | Colibri server (HTTP) | Colibri in-process | server / llama.cpp "
            "| in-process / llama.cpp |", "|---|---|---|---|---|---|"]
    lc, http, eng = s.get("llama_cpp", {}), s.get("colibri_http", {}), s.get("colibri_engine", {})
    rh, re_ = s.get("colibri_http_over_llama_cpp", {}), s.get("colibri_engine_over_llama_cpp", {})
    labels = {"decode": "decode tok/s (batch 1)", **{f"prefill_{n}": f"prefill {n} tok/s" for n in prompts}}
    for k, label in labels.items():
        rows.append(f"| {label} | {fmt(lc.get(k))} | {fmt(http.get(k))} | {fmt(eng.get(k))} | "
                    f"{fmt(rh.get(k), 2)} | {fmt(re_.get(k), 2)} |")
    for n in prompts:
        rows.append(f"| TTFT {n} ms (llama.cpp: prompt time) | {fmt(lc.get(f'prompt_time_{n}_ms'), 0)} | "
                    f"{fmt(http.get(f'ttft_{n}_ms'), 0)} | - | - | - |")
    if s.get("int8_peak_gmac_s"):
        for n in prompts:
            key = f"prefill_{n}_of_peak"
            frac = [f"{e[key]:.0%}" if e.get(key) else "-" for e in (lc, http, eng)]
            rows.append(f"| prefill {n} of the int8 peak ({s['int8_peak_gmac_s']['median']:.0f} GMAC/s a core, "
                        f"{s['int8_peak_mix']}) | {frac[0]} | {frac[1]} | {frac[2]} | - | - |")
    if s.get("decode_ceiling_tok_s"):
        frac = [f"{e['decode_of_ceiling']:.0%}" if e.get("decode_of_ceiling") else "-" for e in (lc, http, eng)]
        rows.append(f"| decode of the bandwidth ceiling ({s['decode_ceiling_tok_s']:.0f} tok/s at "
                    f"{s['bandwidth_gb_s']['median']:.1f} GB/s) | {frac[0]} | {frac[1]} | {frac[2]} | - | - |")
    return "\n".join(rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("gguf", nargs="+", type=Path)
    ap.add_argument("--llama-cpp", type=Path, default=None, help="benchmarks/llamacpp_build.sh's folder")
    ap.add_argument("--skip-llama-cpp", action="store_true", help="Colibri's half only (no ratios)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="alternations")
    ap.add_argument("--reps", type=int, default=1, help="llama-bench -r (repetitions within a round)")
    ap.add_argument("--prompts", default="512,4096", help="prompt lengths for prefill")
    ap.add_argument("--gen", type=int, default=128, help="tokens decoded")
    ap.add_argument("--kv-cache", choices=("f16", "f32", "f16-llama"), default="f16",
                    help="Colibri's KV cache type (llama.cpp's default is f16)")
    ap.add_argument("--no-engine", action="store_true", help="skip the in-process Colibri measurement")
    ap.add_argument("--max-batch-tokens", type=int, default=None,
                    help="the server's prefill chunk (the converted config's max_batch_tokens; default: the "
                         "converter's). The in-process engine keeps the generic build's 64")
    ap.add_argument("--no-peak", action="store_true", help="skip the int8 peak (colibri-kernel-bench)")
    ap.add_argument("--target", default="native")
    ap.add_argument("--out", type=Path, default=REPO / "build" / "side_by_side")
    ap.add_argument("--cleanup", action="store_true", help="delete each converted model after its runs (disk)")
    args = ap.parse_args()
    prompts = [int(p) for p in args.prompts.split(",")]
    tool = None
    if not args.skip_llama_cpp:
        root = args.llama_cpp or default_llama_cpp()
        tool = root / "bin" / "llama-bench" if root else None
        if not tool or not tool.is_file():
            ap.error(f"no llama-bench in {root or '~/.cache/colibri/llama.cpp-*'}/bin: run "
                     "benchmarks/llamacpp_build.sh (or pass --llama-cpp DIR, or --skip-llama-cpp)")
    for g in args.gguf:
        if not g.is_file():
            ap.error(f"{g}: no such file")
    args.out.mkdir(parents=True, exist_ok=True)
    from colibri_build.build import build, build_generic_server
    membw = MemoryBandwidth(MEMBW, args.out, args.threads)
    kernel_bench = None
    if not args.no_peak:  # the int8 peak, measured each round beside the prefills it bounds
        log(f"building colibri-kernel-bench ({args.target})")
        kernel_bench = prefill_peak.build_kernel_bench(build_generic_server(args.target, args.out / "build"))
    results = {"command": " ".join(["python", *sys.argv]), "machine": bench.machine(), "threads": args.threads,
               "date": time.strftime("%Y-%m-%d %H:%M:%S"), "load_average_start": os.getloadavg(),
               "colibri_kv_cache": args.kv_cache, "prompts": prompts, "gen": args.gen, "files": {}}
    if tool:
        version = tool.parent.parent / "VERSION"
        results["llama_cpp"] = {"tool": str(tool),
                                "version": version.read_text().splitlines() if version.is_file() else None}
    json_path = args.out / "side_by_side.json"
    md = []
    for gguf in args.gguf:
        model = colibri_model(gguf, args.out / "models" / gguf.stem, max(prompts) + args.gen + 16,
                              args.max_batch_tokens)
        log(f"building colibri-server for {model.name} ({args.target})")
        exe = build(model, args.target, dist_root=args.out / "dist", build_root=args.out / "build",
                    quiet=True).executable
        weights = model / json.loads((model / "model-config.json").read_text())["weights"]["file"]
        bench.warm_page_cache(weights)
        active = active_bytes_per_token(model)
        macs = {n: prefill_peak.prefill_macs(model, n) for n in prompts}
        entry = {"gguf": str(gguf), "gguf_bytes": gguf.stat().st_size, "colibri_model": str(model),
                 "active_bytes_per_token": active, "prefill_macs_per_token": macs,
                 "max_batch_tokens": json.loads((model / "model-config.json").read_text())["max_batch_tokens"],
                 "rounds": []}
        results["files"][gguf.name] = entry
        for i in range(args.rounds):
            load = os.getloadavg()[0]
            log(f"{gguf.name}: round {i + 1}/{args.rounds} (load average {load:.1f})")
            r: dict = {"load_average": load, "order": []}
            steps = [("colibri_http", lambda: colibri_http(exe, model, args.threads, prompts, args.gen, i,
                                                           args.kv_cache))]
            if not args.no_engine:
                steps.append(("colibri_engine", lambda: colibri_engine(model, args.threads, prompts, args.gen, i,
                                                                       args.kv_cache)))
            if tool:
                step = ("llama_cpp", lambda: llama_bench(tool, gguf, args.threads, prompts, args.gen, args.reps))
                steps = [step, *steps] if i % 2 == 0 else [*steps, step]  # alternate who goes first
            bw = membw.measure(passes=3)
            if bw:
                r["bandwidth_gb_s"] = bw
            if kernel_bench:
                r["int8_peak"] = prefill_peak.int8_peak(kernel_bench)
            for name, fn in steps:
                r["order"].append(name)
                r[name] = fn()
                log(f"  {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in r[name].items()
                                              if isinstance(v, float)))
            entry["rounds"].append(r)
            entry["summary"] = summarise(entry["rounds"], prompts, active, macs, args.threads)
            json_path.write_text(json.dumps(results, indent=2))
        md.append(table(gguf.name, entry["summary"], prompts))
        if args.cleanup:
            import shutil
            shutil.rmtree(model)
    results["load_average_end"] = os.getloadavg()
    json_path.write_text(json.dumps(results, indent=2))
    m = results["machine"]
    head = (f"{m['cpu']}, {m['cpus']} CPUs; {args.threads} threads each; {results['date']}; load average "
            f"{results['load_average_start'][0]:.1f} at the start, {results['load_average_end'][0]:.1f} at the end; "
            f"medians (min-max) of {args.rounds} rounds\n")
    if tool:
        head += f"llama.cpp: {', '.join(results['llama_cpp']['version'] or ['?'])}\n"
    text = head + "\n" + "\n".join(md)
    (args.out / "side_by_side.md").write_text(text)
    print(text)
    log(f"wrote {json_path}")


if __name__ == "__main__":
    main()
